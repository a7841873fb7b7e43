// A small SVG line chart: enough to show accuracy against bytes or time for a few runs,
// readable in any browser, with no plotting library on the machine.
#pragma once

#include <string>
#include <vector>

namespace edgetrain::plot {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;
};

struct PlotOptions {
  std::string title;
  std::string x_label, y_label;
  bool log_x = false;
  double y_min = 0, y_max = 1;  // fixed y range (accuracy)
  // Horizontal dashed reference line (e.g. the target accuracy); NaN for none.
  double reference_y = -1;
  int width = 820, height = 480;
};

// Renders the chart as an SVG document.
std::string render_svg_line_chart(const std::vector<PlotSeries>& series,
                                  const PlotOptions& options);

}  // namespace edgetrain::plot
