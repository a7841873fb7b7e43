// The summary of a finished server run (`edgetrain-emulation-report summarize`, async or
// rounds; gossip runs: gossip_report.h): workers.csv, outcome.json, the plots and
// summary.md, and whether an acknowledged update was lost.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/settings.h"
#include "emulation/report_files.h"
#include "emulation/run_checks.h"

namespace edgetrain::emulation {

struct SummarizeOptions {
  std::string run;
  std::string stop_kind;                // target, time or workers-gone
  std::string stopped;                  // the stop, in words
  std::string network;                  // loopback or netns
  std::string mode = "async";           // async, rounds or gossip (summarize_gossip's)
  std::uint32_t checkpoint_every = 20;  // gossip: the peers' --checkpoint-every
  std::string reached;  // the timeline row that met the target: elapsed_s,version,accuracy,...
  double target = -1;   // the table's target accuracy (< 0: default_target)
};

// `edgetrain-emulation-report summarize`'s flags (RUN_DIR aside): --stop-kind, --stopped and
// --network (required), --reached, --target-accuracy, --mode and --checkpoint-every, bound to
// OPTIONS, which must outlive the table's parse().
void declare_summarize_settings(settings::Table& table, SummarizeOptions& options);

// RUN/workers.csv: the plan's columns (address, delay_ms, jitter_ms, loss, bandwidth_kbps,
// slowdown) and each worker's counters over its incarnations (restarts = incarnations - 1).
// Returns the counters, one per row of PLAN.
std::vector<WorkerTotals> write_workers_csv(const std::filesystem::path& run, const CsvTable& plan);

// outcome.json: the stop, the network, the restart checks, the row that reached the target
// (null when OPTIONS.reached has fewer than 3 fields), each worker's versions_increase and
// lost_acknowledged_updates (a restart check lost or a worker's versions went back).
nlohmann::json outcome_json(const SummarizeOptions& options,
                            const std::vector<WorkerTotals>& totals,
                            const nlohmann::json& restarts);

// The lines of summary.md after the launcher's settings (settings.md): the stop, whether
// acknowledged updates were lost, updates accepted, and where the bytes went (timeline.csv's
// last row, links.csv's sums, the workers' payload).
std::string outcome_lines(const SummarizeOptions& options, const nlohmann::json& outcome,
                          const std::vector<WorkerTotals>& totals);

// workers.csv, outcome.json, the plots and summary.md of one run (its comparison table
// alone, or "(no table: why)" when its timeline cannot be read). Prints a "LOST ACKNOWLEDGED
// UPDATES" line for each worker whose versions went back. Returns 3 when an acknowledged
// update was lost, otherwise 0; throws std::invalid_argument without plan.csv. A gossip run
// (mode "gossip") is summarize_gossip's (gossip_report.h).
int summarize(const SummarizeOptions& options);

}  // namespace edgetrain::emulation
