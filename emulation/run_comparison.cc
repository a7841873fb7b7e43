#include "emulation/run_comparison.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/svg_plot.h"
#include "common/target_accuracy.h"
#include "emulation/report_files.h"

namespace edgetrain::emulation {

namespace fs = std::filesystem;

ComparedRun read_compared_run(const std::string& directory) {
  ComparedRun run{directory, fs::path(directory).filename().string(), {}};
  if (std::ifstream label(directory + "/run.label"); label) std::getline(label, run.label);
  std::ifstream in(directory + "/timeline.csv");
  if (!in) throw std::invalid_argument("no timeline.csv in " + directory);
  std::string line;
  std::getline(in, line);
  if (line.rfind("elapsed_s,version,test_accuracy,ingress_payload_bytes,ingress_socket_bytes", 0) !=
      0) {
    throw std::invalid_argument(directory + "/timeline.csv: unexpected header '" + line + "'");
  }
  for (int number = 2; std::getline(in, line); number++) {
    TimelineRow r;
    char comma;
    std::istringstream fields(line);
    if (!(fields >> r.seconds >> comma >> r.version >> comma >> r.accuracy >> comma >>
          r.payload_bytes >> comma >> r.socket_bytes) ||
        !std::isfinite(r.accuracy)) {
      throw std::invalid_argument(directory + "/timeline.csv line " + std::to_string(number) +
                                  " is malformed");
    }
    run.rows.push_back(r);
  }
  const CsvTable links = read_csv(fs::path(directory) / "links.csv");
  for (std::size_t r = 0; r < links.rows.size(); r++)
    run.egress_bytes += links.number(r, "to_worker_bytes_in");
  return run;
}

const TimelineRow* first_reaching(const ComparedRun& run, double target) {
  for (const TimelineRow& r : run.rows)
    if (r.accuracy >= target) return &r;
  return nullptr;
}

double best_accuracy(const ComparedRun& run) {
  double best = 0;
  for (const TimelineRow& r : run.rows) best = std::max(best, r.accuracy);
  return best;
}

// common/target_accuracy.h's rule over the compared runs.
double default_target(const std::vector<ComparedRun>& runs) {
  double lowest_best = 1;
  for (const ComparedRun& r : runs) lowest_best = std::min(lowest_best, best_accuracy(r));
  return default_target_accuracy(lowest_best);
}

void write_comparison_plots(const std::vector<ComparedRun>& runs, double target,
                            const std::string& out) {
  std::vector<plot::PlotSeries> by_ingress, by_time;
  for (const ComparedRun& run : runs) {
    // The legend has room for ~20 characters: the label without its parenthesized
    // setting ("(MLP, 10)"), or else the run directory's name (the table has the label).
    std::string legend = run.label.substr(0, run.label.find(" ("));
    if (legend.size() > 20) legend = fs::path(run.directory).filename().string();
    plot::PlotSeries ingress{legend, {}, {}}, time{legend, {}, {}};
    for (const TimelineRow& r : run.rows) {
      if (r.socket_bytes > 0)
        ingress.x.push_back(static_cast<double>(r.socket_bytes)), ingress.y.push_back(r.accuracy);
      time.x.push_back(r.seconds), time.y.push_back(r.accuracy);
    }
    by_ingress.push_back(std::move(ingress));
    by_time.push_back(std::move(time));
  }
  plot::PlotOptions plot;
  plot.y_label = "test accuracy";
  plot.reference_y = target;
  plot.title = "edgetrain-emulate: test accuracy against bytes at the server's socket";
  plot.x_label = "UDP bytes received by the server (DTLS, CoAP, handshakes, retransmissions)";
  plot.log_x = true;
  std::ofstream(out + "/accuracy-vs-ingress.svg") << plot::render_svg_line_chart(by_ingress, plot);
  plot.title = "edgetrain-emulate: test accuracy against time";
  plot.x_label = "seconds since the server started";
  plot.log_x = false;
  std::ofstream(out + "/accuracy-vs-time.svg") << plot::render_svg_line_chart(by_time, plot);
}

std::string comparison_table_row(const ComparedRun& run, double target,
                                 const TimelineRow* reference) {
  const TimelineRow last = run.rows.empty() ? TimelineRow{} : run.rows.back();
  const TimelineRow* reached = first_reaching(run, target);
  std::string ratio = "—";
  if (reached && reference && reached->socket_bytes) {
    char r[32];
    std::snprintf(r, sizeof r, "**%.1fx**",
                  static_cast<double>(reference->socket_bytes) / reached->socket_bytes);
    ratio = r;
  }
  const std::string time =
      reached ? std::to_string(static_cast<int>(reached->seconds)) + " s" : "not reached";
  std::string speedup = "—";
  if (reached && reference && reached->seconds > 0) {
    char r[32];
    std::snprintf(r, sizeof r, "%.1fx", reference->seconds / reached->seconds);
    speedup = r;
  }
  const std::string bytes = reached ? bytes_text(reached->socket_bytes) : "—";
  const double overhead =
      last.payload_bytes ? 100.0 * (static_cast<double>(last.socket_bytes) / last.payload_bytes - 1)
                         : 0;
  char line[512];
  std::snprintf(line, sizeof line,
                "| %s | %.2f%% | %.2f%% | %llu | %s | %s | %+.0f%% | %s | %s | %s | %s | %s |\n",
                run.label.c_str(), best_accuracy(run) * 100, last.accuracy * 100,
                static_cast<unsigned long long>(last.version),
                bytes_text(last.socket_bytes).c_str(), bytes_text(last.payload_bytes).c_str(),
                overhead, time.c_str(), speedup.c_str(), bytes.c_str(), ratio.c_str(),
                run.egress_bytes > 0 ? bytes_text(run.egress_bytes).c_str() : "—");
  return line;
}

std::string comparison_table(const std::vector<ComparedRun>& runs, double target) {
  std::ostringstream table;
  char target_text[32];
  std::snprintf(target_text, sizeof target_text, "%.1f%%", target * 100);
  table << "| run | best test acc | final | updates | socket ingress | payload ingress | transport "
           "overhead | time to "
        << target_text << " | time ratio " << runs.front().label << " / this | socket bytes to "
        << target_text << " | ratio " << runs.front().label
        << " / this | socket egress (whole run) |\n"
        << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  const TimelineRow* reference = first_reaching(runs.front(), target);
  for (const ComparedRun& run : runs) table << comparison_table_row(run, target, reference);
  return table.str();
}

std::string compare_runs(const std::vector<std::string>& directories, const std::string& out,
                         double target, bool write_summary) {
  if (directories.empty()) throw std::invalid_argument("compare needs run directories");
  std::vector<ComparedRun> runs;
  for (const auto& d : directories) runs.push_back(read_compared_run(d));
  if (target < 0) target = default_target(runs);
  fs::create_directories(out);
  write_comparison_plots(runs, target, out);
  const std::string table = comparison_table(runs, target);
  if (write_summary) std::ofstream(out + "/summary.md") << table;
  return table;
}

}  // namespace edgetrain::emulation
