// Server runs of edgetrain-emulate side by side (`edgetrain-emulation-report compare`, the
// table of every run's summary.md): accuracy against the bytes at the server's socket and
// against time, one line per run, and a markdown table with the ratio of the first run's
// socket bytes to each run's, to a target accuracy. The first run is the reference (give
// the ASGD run first).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace edgetrain::emulation {

// One row of timeline.csv (elapsed_s,version,test_accuracy,ingress_payload_bytes,
// ingress_socket_bytes; the byte counts cumulative over server restarts).
struct TimelineRow {
  double seconds = 0;
  std::uint64_t version = 0;
  double accuracy = 0;
  std::uint64_t payload_bytes = 0, socket_bytes = 0;
};

struct ComparedRun {
  std::string directory;
  std::string label;  // run.label's first line, or the directory's name
  std::vector<TimelineRow> rows;
  // What the server's socket sent over the whole run, as the impairer received it
  // (links.csv to_worker_bytes_in; 0 without links.csv).
  double egress_bytes = 0;
};

// DIRECTORY/timeline.csv (required; a wrong header or a malformed line throws
// std::invalid_argument naming it), run.label and links.csv (optional).
ComparedRun read_compared_run(const std::string& directory);

// The first row at or above TARGET, or nullptr.
const TimelineRow* first_reaching(const ComparedRun& run, double target);
// The run's best test accuracy (0 without rows).
double best_accuracy(const ComparedRun& run);
// The target rule when none is given: half a point below the lowest best accuracy of the
// runs, rounded down to a tenth of a point (0.9123 and 0.95 give 0.907).
double default_target(const std::vector<ComparedRun>& runs);

// The table row of RUN: label, best and final accuracy, updates, socket and payload ingress,
// transport overhead (socket bytes over payload bytes, last row), time to TARGET, the time
// ratio and the socket-byte ratio REFERENCE / this (REFERENCE: the first run's row reaching
// the target; "—" when either did not reach it), socket egress.
std::string comparison_table_row(const ComparedRun& run, double target,
                                 const TimelineRow* reference);
// The markdown table (header and a row per run; RUNS must not be empty).
std::string comparison_table(const std::vector<ComparedRun>& runs, double target);
// OUT/accuracy-vs-ingress.svg (log x) and OUT/accuracy-vs-time.svg, TARGET drawn dashed.
void write_comparison_plots(const std::vector<ComparedRun>& runs, double target,
                            const std::string& out);

// Reads DIRECTORIES, writes the plots in OUT (created) and returns the table, also written
// to OUT/summary.md when WRITE_SUMMARY. TARGET < 0: default_target. No directories: throws
// std::invalid_argument.
std::string compare_runs(const std::vector<std::string>& directories, const std::string& out,
                         double target, bool write_summary);

}  // namespace edgetrain::emulation
