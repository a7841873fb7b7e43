#include "emulation/csv_plot.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "emulation/report_files.h"

namespace edgetrain::emulation {

void declare_chart_settings(settings::Table& t, plot::PlotOptions& options) {
  options.y_label = "test accuracy";
  t.add("title", options.title, "chart title");
  t.add("x-label", options.x_label, "x axis label");
  t.add("y-label", options.y_label, "y axis label");
  t.add("log-x", options.log_x, "logarithmic x axis");
  t.add("y-min", options.y_min, "bottom of the y axis");
  t.add("y-max", options.y_max, "top of the y axis (e.g. 10 for an MNIST score)");
  t.add("reference-y", options.reference_y,
        "a dashed horizontal line at this y, e.g. a target (none outside --y-min..--y-max)");
}

void plot_csv(const std::string& csv, const std::string& out, const plot::PlotOptions& options) {
  const CsvTable table = read_csv(csv);
  if (table.header.empty()) throw std::invalid_argument(csv + ": missing or empty");
  if (!(options.y_max > options.y_min))
    throw std::invalid_argument("--y-max must be above --y-min");
  const std::size_t series_column = table.column("series"), x_column = table.column("x"),
                    y_column = table.column("y");
  std::vector<plot::PlotSeries> series;
  for (std::size_t row = 0; row < table.rows.size(); ++row) {
    const auto& fields = table.rows[row];
    if (fields.size() != table.header.size())
      throw std::invalid_argument(csv + " line " + std::to_string(row + 2) + ": expected " +
                                  std::to_string(table.header.size()) + " fields");
    const std::string& name = fields[series_column];
    auto it =
        std::find_if(series.begin(), series.end(), [&](const auto& s) { return s.label == name; });
    if (it == series.end()) it = series.insert(series.end(), {name, {}, {}});
    it->x.push_back(std::stod(fields[x_column]));
    it->y.push_back(std::stod(fields[y_column]));
  }
  std::ofstream file(out);
  file << plot::render_svg_line_chart(series, options);
  if (!file.flush()) throw std::runtime_error("cannot write " + out);
}

}  // namespace edgetrain::emulation
