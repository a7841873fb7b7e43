// What edgetrain-sim writes and prints about its runs (sim/sim_program.h): the summary
// tables (summary.md, also printed on stdout), sim.csv and the SVG plots. The target accuracy
// they compare with is given (--target-accuracy, or common/target_accuracy.h's rule).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sim/gossip_simulation.h"
#include "sim/simulator.h"

namespace edgetrain::sim {

// "407.17 kB": powers of 1000, two decimals ("512 B" below a kB).
std::string human_bytes(double bytes);
// A virtual time rounded to a step time, or "never".
std::string time_text(std::optional<double> time);

// --mode async: a row per run (ASGD, AdaComp), the stalled runs, the target and, with two
// runs, the traffic ratio of the first to the second until each first reached the target.
std::string async_summary_table(const std::vector<SimResult>& results, double target_accuracy);
// --mode rounds: what a round costs and brings. Ingress counts every delta that reached the
// server, stragglers' too (the server receives them and refuses them); the aggregate only
// those before the close. With two runs, dense against AdaComp deltas' traffic ratio.
std::string rounds_summary_table(const std::vector<SimResult>& results, double target_accuracy);
// --mode gossip: the run's row, a row per speed class, the target, the consensus distance
// and, with accuracy-aware training, its counts.
std::string gossip_summary_table(const GossipResult& result, double target_accuracy);

// summary.json of --mode async and rounds, for scripts: {"target_accuracy", "runs": [{"label",
// "final_accuracy", "best_accuracy", "updates_applied", "updates_refused", "updates_lost",
// "ingress_bytes", "virtual_time", "round_stragglers", "round_deltas_refused",
// "round_deltas_clipped", "stalled"}]}.
std::string runs_summary_json(const std::vector<SimResult>& results, double target_accuracy);

// What a plot's title names besides the runs: --data, --model, --workers.
struct PlotContext {
  std::string data, model;
  int workers = 0;
};

// The plots write_sim_curves() writes besides sim.csv: in rounds mode the x axis of the
// second plot is rounds closed.
std::vector<std::string> sim_plot_files(bool rounds);
// sim.csv (one row per evaluation of every run; with --mode rounds `updates` holds the rounds
// closed, each close one model version as on the server) and the three plots, in `out_dir`.
void write_sim_curves(const std::string& out_dir, const PlotContext& context, bool rounds,
                      const std::vector<SimResult>& results, double target_accuracy);
// --mode gossip: sim.csv, accuracy-vs-time.svg and accuracy-vs-bytes.svg in `out_dir`.
void write_gossip_curves(const std::string& out_dir, const PlotContext& context,
                         const GossipResult& result, double target_accuracy);

}  // namespace edgetrain::sim
