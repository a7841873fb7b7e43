// A line chart from a CSV of (series, x, y) rows (`edgetrain-emulation-report plot`):
// scripts (experiments/regenerate.sh, experiments/aggregate_results.py) draw their aggregated curves with
// the programs' own plotting code.
#pragma once

#include <string>

#include "common/settings.h"
#include "common/svg_plot.h"

namespace edgetrain::emulation {

// Reads CSV (columns series, x and y, in any order, others ignored; one line per series in
// order of first appearance) and writes the SVG chart to OUT. Throws std::invalid_argument
// for a missing or empty file, a row with another number of fields than the header (naming
// its line), a missing column, or y_max not above y_min; std::runtime_error when OUT cannot
// be written.
void plot_csv(const std::string& csv, const std::string& out, const plot::PlotOptions& options);

// `edgetrain-emulation-report plot`'s chart flags: --title, --x-label, --y-label (its default
// set to "test accuracy" here), --log-x, --y-min, --y-max and --reference-y, bound to
// OPTIONS, which must outlive the table's parse().
void declare_chart_settings(settings::Table& table, plot::PlotOptions& options);

}  // namespace edgetrain::emulation
