#include "common/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace edgetrain::plot {
namespace {

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// 1.5 MB, 20 kB, 300 B; plain numbers otherwise.
std::string tick_label(double value, bool bytes) {
  char buffer[32];
  if (bytes) {
    const char* units[] = {"B", "kB", "MB", "GB", "TB"};
    int unit = 0;
    while (std::fabs(value) >= 1000 && unit < 4) {
      value /= 1000;
      unit++;
    }
    std::snprintf(buffer, sizeof buffer, "%g %s", value, units[unit]);
  } else {
    std::snprintf(buffer, sizeof buffer, "%g", value);
  }
  return buffer;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> ticks;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  }
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(t);
  return ticks;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                         "#9467bd", "#8c564b", "#e377c2", "#17becf"};

}  // namespace

std::string render_svg_line_chart(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  const double left = 70, right = 20, top = 40, bottom = 55;
  const double plot_w = o.width - left - right, plot_h = o.height - top - bottom;
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  for (const auto& s : series) {
    for (double x : s.x) {
      if (o.log_x && x <= 0) continue;
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
    }
  }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1;
  auto fx = [&](double x) { return o.log_x ? std::log10(std::max(x, 1e-300)) : x; };
  double a = fx(x_lo), b = fx(x_hi);
  if (o.log_x) a = std::floor(a), b = std::ceil(b);
  if (b <= a) b = a + 1;
  auto px = [&](double x) { return left + (fx(x) - a) / (b - a) * plot_w; };
  auto py = [&](double y) { return top + (1 - (y - o.y_min) / (o.y_max - o.y_min)) * plot_h; };
  const bool bytes_axis = o.x_label.find("bytes") != std::string::npos;

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << o.width << "\" height=\""
      << o.height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << o.width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">"
      << escape(o.title) << "</text>\n";
  // Grid and ticks.
  for (double t : nice_ticks(o.y_min, o.y_max, 5)) {
    svg << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << py(t) << "\" y2=\""
        << py(t) << "\" stroke=\"#ddd\"/>\n<text x=\"" << left - 6 << "\" y=\"" << py(t) + 4
        << "\" text-anchor=\"end\">" << tick_label(t, false) << "</text>\n";
  }
  std::vector<double> x_ticks;
  if (o.log_x) {
    for (double e = a; e <= b; e++) x_ticks.push_back(std::pow(10.0, e));
  } else {
    x_ticks = nice_ticks(x_lo, x_hi, 6);
  }
  for (double t : x_ticks) {
    svg << "<line x1=\"" << px(t) << "\" x2=\"" << px(t) << "\" y1=\"" << top << "\" y2=\""
        << top + plot_h << "\" stroke=\"#eee\"/>\n<text x=\"" << px(t) << "\" y=\""
        << top + plot_h + 18 << "\" text-anchor=\"middle\">" << tick_label(t, bytes_axis)
        << "</text>\n";
  }
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\""
      << plot_h << "\" fill=\"none\" stroke=\"#333\"/>\n";
  svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << o.height - 12
      << "\" text-anchor=\"middle\">" << escape(o.x_label) << (o.log_x ? " (log scale)" : "")
      << "</text>\n";
  svg << "<text transform=\"translate(18," << top + plot_h / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape(o.y_label) << "</text>\n";
  if (o.reference_y >= o.y_min && o.reference_y <= o.y_max) {
    svg << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << py(o.reference_y)
        << "\" y2=\"" << py(o.reference_y) << "\" stroke=\"#888\" stroke-dasharray=\"6,4\"/>\n";
  }
  // Series and legend.
  for (std::size_t i = 0; i < series.size(); i++) {
    const auto& s = series[i];
    const char* color = kColors[i % (sizeof kColors / sizeof *kColors)];
    svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (std::size_t j = 0; j < s.x.size() && j < s.y.size(); j++) {
      if (o.log_x && s.x[j] <= 0) continue;
      svg << px(s.x[j]) << "," << py(std::clamp(s.y[j], o.y_min, o.y_max)) << " ";
    }
    svg << "\"/>\n";
    // Bottom right: accuracy curves end high, so the top right is where they are.
    const double ly = top + plot_h - 12 - 18.0 * static_cast<double>(series.size() - 1 - i);
    svg << "<line x1=\"" << left + plot_w - 190 << "\" x2=\"" << left + plot_w - 165 << "\" y1=\""
        << ly - 4 << "\" y2=\"" << ly - 4 << "\" stroke=\"" << color
        << "\" stroke-width=\"3\"/>\n<text x=\"" << left + plot_w - 158 << "\" y=\"" << ly << "\">"
        << escape(s.label) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace edgetrain::plot
