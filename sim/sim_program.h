// edgetrain-sim as a library (programs/sim_main.cc only calls it): one settings table for
// every mode, the registry of modes, and the data every mode runs on.
//
// A mode is a SimModeEntry in sim_modes() (the name SimMode is simulator.h's enum of the
// server-based simulation): its settings rows, the checks that turn the settings into its
// simulation's configuration before any data is loaded (std::invalid_argument: exit status
// 2, "edgetrain-sim: " and the message on stderr), and its run over the loaded data, which
// prints its progress on stderr, writes its files to --out, prints its summary on stdout
// and returns the exit status. async and rounds share sim/sim_mode_async_rounds.cc (one
// simulation, two SimMode values), gossip is sim/sim_mode_gossip.cc; the summary tables and
// curves are sim/sim_reports.h. A new mode is a file of its own plus one line in
// sim_modes() (and its name in the --mode choices of declare_sim_settings()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/settings.h"
#include "model/dataset.h"
#include "sim/gossip_simulation.h"
#include "sim/simulator.h"
#include "worker/compression_settings.h"

namespace edgetrain::sim {

// What the settings table fills besides SimConfig's own fields.
struct SimSettings {
  SimConfig config;
  std::string drop_rates, dropout_rescale = "inverted";
  std::string data = "mnist", staleness = "sigma", out_dir = "sim-results", kernels = "xnnpack";
  std::string pull_values = "fp32";  // --pull-values: the cheap pull's value encoding
  std::string pull_selection = "largest";  // --pull-selection: the cheap pull's rule
  std::string first_pull = "dense";  // --first-pull: dense, or seeded (a delta from version 0)
  std::string lr_decay_at;           // --lr-decay-at V1,V2,...: the server's lr schedule
  std::string mode = "async", aggregation = "masked", round_policy = "drop-stragglers";
  std::string dp_noise = "gaussian";  // --dp-noise: with --dp-noise-survivors, gaussian or skellam
  std::uint64_t eval_every = 0;  // 0: 100 updates, or every round with --mode rounds
  runtime::CompressionSettings compression{"both"};
  std::string train_images, train_labels, test_images, test_labels, save_model;
  double target_accuracy = 0, stop_at_accuracy = 0;
  bool bin_local = false, quiet = false;
  // --mode gossip (sim/gossip_simulation.h): what the table fills besides GossipConfig's fields.
  GossipConfig gossip;
  std::string topology = "ring", topology_file, gossip_algorithm = "d-psgd", speed_classes,
              speed_schedule, attack = "bias:1e30";
  double consensus_step = 0;  // 0: the default for dense or compressed gossip
  int malicious_peers = 0;    // rounds and gossip: attackers (sim/model_attack.h)
};

// The training and test sets: --data, or the four IDX files (std::invalid_argument when
// --train-images comes without the other three).
struct SimData {
  runtime::Dataset train, test;
};
SimData load_sim_data(const SimSettings& settings);

// One mode's run, made by its checks once the settings hold.
class SimModeRun {
 public:
  virtual ~SimModeRun() = default;
  virtual int run(const SimData& data) = 0;
};

struct SimModeEntry {
  std::string_view name;
  // The heading of the mode's own group of the table (empty: none).
  std::string_view group;
  // The mode's own settings rows, declared under `group` (null: none).
  void (*declare)(settings::Table& table, SimSettings& settings);
  // Checks the settings (`table` says which were given) and makes the run; throws
  // std::invalid_argument naming the problem, first for a setting of another mode that was
  // given. The run keeps references to both.
  std::unique_ptr<SimModeRun> (*prepare)(const SimSettings& settings, const settings::Table& table);
};

// Every mode, in the order --help lists them: async, rounds, gossip.
const std::vector<SimModeEntry>& sim_modes();
const SimModeEntry* find_sim_mode(std::string_view name);

// The whole table: the shared rows and each mode's.
void declare_sim_settings(settings::Table& table, SimSettings& settings);
// What the program does once the table is read: the mode's checks (exit status 2), the
// data, the mode's run.
int run_sim_program(const SimSettings& settings, const settings::Table& table);

// Refuses a setting given (flag or file) of --mode `owner`'s own group: "--FLAG is a setting
// of --mode OWNER" (std::invalid_argument).
void refuse_settings_of_mode(const settings::Table& table, std::string_view owner);

}  // namespace edgetrain::sim
