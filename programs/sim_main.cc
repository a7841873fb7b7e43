// edgetrain-sim: N virtual workers in one process, in one of the modes of
// sim/sim_program.h: dense ASGD against AdaComp (async, the default), federated rounds
// (FedAvg) with dense against AdaComp-compressed deltas, or gossip with no server. See
// sim/README.md and `edgetrain-sim --help`; its settings are one table (common/settings.h):
// flags, or the same names in a TOML file (--config).
#include "common/settings.h"
#include "sim/sim_program.h"

int main(int argc, char** argv) {
  using namespace edgetrain;
  sim::SimSettings settings;
  settings::Table table("edgetrain-sim",
                        "edgetrain-sim: N virtual workers train a model asynchronously in one "
                        "process, with the real trainer,\n"
                        "compressor, codec and server staleness rule, and compare dense ASGD with "
                        "AdaComp by test accuracy\n"
                        "against the bytes the server ingests; or, with --mode rounds, in "
                        "federated rounds (FedAvg) with dense\n"
                        "against AdaComp-compressed deltas; or, with --mode gossip, with no "
                        "server: peers average models with their\n"
                        "neighbours (D-PSGD, AD-PSGD; compressed gossip, workload balancing, "
                        "accuracy-aware training).\n"
                        "Writes a CSV, SVG plots and a summary to --out.");
  sim::declare_sim_settings(table, settings);
  return table.run_program(argc, argv, [&] { return sim::run_sim_program(settings, table); });
}
