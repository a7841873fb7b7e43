// edgetrain-emulation-report: turns the timelines of one or more emulation runs into plots
// (accuracy against socket ingress, accuracy against time; one line per run) and a markdown
// table with the traffic ratio to a target accuracy. The first run is the reference of the
// ratio (give the ASGD run first).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/svg_plot.h"

namespace {

struct Row {
  double seconds = 0;
  std::uint64_t version = 0;
  double accuracy = 0;
  std::uint64_t payload_bytes = 0, socket_bytes = 0;
};

struct Run {
  std::string directory, label;
  std::vector<Row> rows;
};

// timeline.csv, written by edgetrain-emulate: elapsed_s,version,test_accuracy,
// ingress_payload_bytes,ingress_socket_bytes (cumulative over server restarts).
Run read_run(const std::string& directory) {
  Run run{directory, std::filesystem::path(directory).filename().string(), {}};
  if (std::ifstream label(directory + "/run.label"); label) std::getline(label, run.label);
  std::ifstream in(directory + "/timeline.csv");
  if (!in) throw std::invalid_argument("no timeline.csv in " + directory);
  std::string line;
  std::getline(in, line);
  if (line.rfind("elapsed_s,version,test_accuracy,ingress_payload_bytes,ingress_socket_bytes", 0) != 0) {
    throw std::invalid_argument(directory + "/timeline.csv: unexpected header '" + line + "'");
  }
  int number = 1;
  while (std::getline(in, line)) {
    number++;
    Row r;
    char comma;
    std::istringstream fields(line);
    if (!(fields >> r.seconds >> comma >> r.version >> comma >> r.accuracy >> comma >> r.payload_bytes >> comma >>
          r.socket_bytes) ||
        !std::isfinite(r.accuracy)) {
      throw std::invalid_argument(directory + "/timeline.csv line " + std::to_string(number) + " is malformed");
    }
    run.rows.push_back(r);
  }
  return run;
}

std::string bytes_text(double b) {
  char text[32];
  if (b >= 1e9) std::snprintf(text, sizeof text, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(text, sizeof text, "%.2f MB", b / 1e6);
  else std::snprintf(text, sizeof text, "%.1f kB", b / 1e3);
  return text;
}

const Row* first_reaching(const Run& run, double target) {
  for (const Row& r : run.rows)
    if (r.accuracy >= target) return &r;
  return nullptr;
}

double best_accuracy(const Run& run) {
  double best = 0;
  for (const Row& r : run.rows) best = std::max(best, r.accuracy);
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace edgetrain;
  CLI::App app{"edgetrain-emulation-report: plots and a markdown table from edgetrain-emulate run directories.\n"
               "The first run is the reference of the traffic ratio (give the ASGD run first)."};
  std::vector<std::string> directories;
  std::string out;
  double target = -1;
  app.add_option("runs", directories, "run directories (each with timeline.csv, written by edgetrain-emulate)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--out", out, "directory for accuracy-vs-ingress.svg, accuracy-vs-time.svg and summary.md")->required();
  app.add_option("--target", target,
                 "target test accuracy of the ratio (default: half a point below the lowest best accuracy)");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<Run> runs;
    for (const auto& d : directories) runs.push_back(read_run(d));
    if (target < 0) {
      double lowest_best = 1;
      for (const Run& r : runs) lowest_best = std::min(lowest_best, best_accuracy(r));
      target = std::floor((lowest_best - 0.005) * 1000) / 1000;
    }
    std::filesystem::create_directories(out);
    std::vector<plot::PlotSeries> by_ingress, by_time;
    for (const Run& run : runs) {
      // The legend has room for ~20 characters: the label without its parenthesized
      // setting ("(MLP, 10)"), or else the run directory's name (the table has the label).
      std::string legend = run.label.substr(0, run.label.find(" ("));
      if (legend.size() > 20) legend = std::filesystem::path(run.directory).filename().string();
      plot::PlotSeries ingress{legend, {}, {}}, time{legend, {}, {}};
      for (const Row& r : run.rows) {
        if (r.socket_bytes > 0) ingress.x.push_back(static_cast<double>(r.socket_bytes)), ingress.y.push_back(r.accuracy);
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

    std::ostringstream table;
    char target_text[32];
    std::snprintf(target_text, sizeof target_text, "%.1f%%", target * 100);
    table << "| run | best test acc | final | updates | socket ingress | payload ingress | transport overhead | time to "
          << target_text << " | socket bytes to " << target_text << " | ratio " << runs.front().label << " / this |\n"
          << "|---|---|---|---|---|---|---|---|---|---|\n";
    const Row* reference = first_reaching(runs.front(), target);
    for (const Run& run : runs) {
      const Row last = run.rows.empty() ? Row{} : run.rows.back();
      const Row* reached = first_reaching(run, target);
      char line[512];
      const double overhead = last.payload_bytes ? 100.0 * (static_cast<double>(last.socket_bytes) / last.payload_bytes - 1) : 0;
      std::snprintf(line, sizeof line, "| %s | %.2f%% | %.2f%% | %llu | %s | %s | %+.0f%% | %s | %s | %s |\n",
                    run.label.c_str(), best_accuracy(run) * 100, last.accuracy * 100,
                    static_cast<unsigned long long>(last.version), bytes_text(last.socket_bytes).c_str(),
                    bytes_text(last.payload_bytes).c_str(), overhead,
                    reached ? (std::to_string(static_cast<int>(reached->seconds)) + " s").c_str() : "not reached",
                    reached ? bytes_text(reached->socket_bytes).c_str() : "—",
                    reached && reference && reached->socket_bytes
                        ? ([&] {
                            char r[32];
                            std::snprintf(r, sizeof r, "**%.1fx**",
                                          static_cast<double>(reference->socket_bytes) / reached->socket_bytes);
                            return std::string(r);
                          })()
                              .c_str()
                        : "—");
      table << line;
    }
    std::ofstream(out + "/summary.md") << table.str();
    std::fputs(table.str().c_str(), stdout);
    std::printf("plots: %s/accuracy-vs-ingress.svg, %s/accuracy-vs-time.svg\n", out.c_str(), out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgetrain-emulation-report: %s\n", e.what());
    return 1;
  }
}
