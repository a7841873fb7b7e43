// edgetrain-emulate's settings: one table for its flags and its --config TOML file (a key is
// its flag's name with '_': `pull_every = 10`), their defaults, ranges and help, and the
// checks that relate them. The launcher (bash) evaluates what
// `edgetrain-emulation-report settings` prints: one shell assignment per setting, the
// variable named like the TOML key.
#pragma once

#include <cstdint>
#include <string>

#include "common/settings.h"

namespace edgetrain::emulation {

struct EmulatorSettings {
  std::uint32_t workers = 10, pull_every = 1, batch = 10, max_staleness = 0, qemu_workers = 0;
  std::string model = "paper-cnn", data = "mnist", compressor = "adacomp", network = "auto";
  std::string label, link, impaired = "all", slowdown = "0", fail, out = "emulation-results/run";
  std::string build_dir, aarch64_build_dir;
  std::string cpu_classes, cpu_schedule;  // emulation/cpu_plan.h; empty classes: no CPU quotas
  std::uint32_t cpu_period = 100000;      // µs
  bool cpu_priority = false;  // the run's cgroup gets the largest CPU weight
  // Intermittent links (issue 38 part 1): each worker's link up a share `reachable` of the
  // time, down in one window of every `outage_period` s from `outage_start` on, phases spread
  // over the fleet (emulation/down_schedule.h); the workers' offline training and the
  // server's credit for it pass through.
  double reachable = 1, outage_period = 120, outage_start = 30;
  std::uint32_t offline_steps = 0, offline_step_credit = 0;
  bool offline_average = false;
  double offline_seconds = 0, offline_lr = 0.1, offline_max_rate = 0;
  double offline_try_timeout = 0, offline_try_share = 0.1, longest_request = 0;
  std::uint32_t shards = 0, shard_checkpoint_every = 50;  // 0: one unsharded server
  double max_parameter_magnitude = 0;                     // 0: the server's default
  std::uint32_t publish_every = 0;                        // 0: workers pull the exact model
  double publish_fraction = 0.01;
  // The server's cheap pull (--pull-fraction, --pull-min-entries; 0: exact pulls), the
  // workers' --dense-pull and --seeded-first-pull (issue 38: both directions at the socket).
  double pull_fraction = 0;
  std::uint32_t pull_min_entries = 32;
  bool dense_pull = false, seeded_first_pull = true;
  // The server's --entry-staleness (σ per entry) and --pull-values with the workers' (the
  // cheap pull's values as fp16 increments both sides: fp16-increment).
  bool entry_staleness = false;
  // The server's learning-rate schedule (--lr-decay-at V1,V2,… and its factor); empty: none.
  std::string lr_decay_at;
  double lr_decay_factor = 0.1;
  std::string pull_values = "fp32";
  double rate = 0.01, lr = 0.1, duration = 300, target_accuracy = 0, eval_interval = 2,
         request_timeout = 30;
  std::uint64_t seed = 1;
  bool error_feedback = false, fp16 = false, sign_scale = false, quiet = false, label_skew = false;
  // Federated rounds (the server's and the worker's --mode rounds).
  std::string mode = "async", round_policy = "drop-stragglers", aggregation = "masked";
  double round_deadline = 30, client_fraction = 1, local_lr = 0.05, server_lr = 1;
  std::uint32_t local_steps = 10, local_epochs = 0;
  // Client-level differential privacy (--aggregation dp-fedavg; the server's settings, its
  // expected devices per round = client fraction × workers).
  double round_clip_norm = 0, dp_noise_multiplier = 0, dp_target_epsilon = 0,
         dp_adaptive_clip_quantile = 0;
  // Secure aggregation (the server's --secure-aggregation); a share of the workers leaves
  // right after its masked input in the first secure round (the worker's
  // --test-secagg-drop-after input).
  bool secure_aggregation = false;
  double secagg_drop_fraction = 0;
  // The server's --min-clients (0: its default, 1). With dp-fedavg and secure aggregation it
  // is c, the survivors the devices' noise shares are calibrated to (docs/privacy.md).
  std::uint32_t min_clients = 0;
  // The server's --dp-noise: the devices' noise under secure aggregation (gaussian or skellam).
  std::string dp_noise = "gaussian";
  // Filter dropout (DISTREAL): one vector for every worker, one per CPU class, or a table.
  std::string drop_rates, class_drop_rates, dropout_table;
  double step_time_budget = 0, deadline_share = 0.8;
  // Gossip (no server; the worker's --mode gossip): emulation/README.md "Gossip runs".
  std::string topology = "ring", gossip = "d-psgd";
  std::uint32_t degree = 4, plateau_patience = 0, validate_every = 50, checkpoint_every = 10,
                eval_examples = 1000;
  std::uint32_t wait_steps = 0;
  double gossip_publish_fraction = 1, consensus_step = 0, neighbour_wait = 5, balance_target = 0,
         max_lr_factor = 8;
  // What an honest peer takes from a neighbour (the worker's --max-neighbour-magnitude and
  // --neighbour-clip), and the attackers: peers 0..malicious_peers-1 run
  // edgetrain-gossip-attacker with `attack` (empty: bias:1e30).
  double max_neighbour_magnitude = 1e4, neighbour_clip = 0;
  std::uint32_t malicious_peers = 0;
  std::string attack;
};

// Every setting of S in TABLE, by group (the order of --help and of the assignments).
void declare_emulator_settings(settings::Table& table, EmulatorSettings& s);

// Checks that relate settings, or read one's text (the table checks each alone): value
// encodings, dropout choices, gossip's and shards' limits, --impaired, --link, --slowdown,
// --cpu-classes and --cpu-schedule. Throws std::invalid_argument saying what is wrong.
void check_emulator_settings(const EmulatorSettings& s);

// An attacker's --attack: bias:V or scale:F, V and F finite floats (the simulator's and
// edgetrain-gossip-attacker's syntax, sim/model_attack.h). Throws std::invalid_argument.
void check_gossip_attack(const std::string& text);

// One line NAME='VALUE' per setting of TABLE, NAME its TOML key: strings as they are
// (quoted for the shell), booleans 1 or 0, numbers with at most 15 significant digits
// (0.01, not 0.010000000000000000208).
std::string shell_assignments(const settings::Table& table);

// `edgetrain-emulation-report settings ARGS` (ARGV[0] is "settings"): parses and checks the
// emulator's settings as edgetrain-emulate's command line and prints their assignments.
// Returns the exit status: 0 (also after --help and --version), 2 for a setting that fails a
// check (the message on stderr, prefixed with "edgetrain-emulate: "), Table::parse's status
// for a command line it cannot read.
int print_emulator_settings(int argc, const char* const* argv);

}  // namespace edgetrain::emulation
