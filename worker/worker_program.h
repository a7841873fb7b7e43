// edgetrain-worker as a library (programs/worker_main.cc only calls it): one settings table
// for every mode, the registry of modes, and the stats file each mode writes.
//
// A mode is a WorkerMode in worker_modes(): its settings rows, the checks that turn the
// settings into its loop's configuration before any data is loaded (std::invalid_argument:
// exit status 2, the message on stderr), its run over the loaded data set, and its stats
// file's JSON (below; the emulator, the report program and the tests read these keys).
// A new mode is a file of its own (worker/mode_*.cc) plus one line in worker_modes().
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/settings.h"
#include "model/dataset.h"
#include "worker/compression_settings.h"
#include "worker/gan_worker.h"
#include "worker/gossip_peer.h"
#include "worker/round_worker.h"
#include "worker/worker.h"

namespace edgetrain::runtime {

// What the settings table fills: WorkerConfig's own fields where they fit, and the settings
// that the modes' checks turn into the rest.
struct WorkerSettings {
  WorkerConfig config;
  std::string server = "coaps://127.0.0.1:5684", identity, key_file, key_hex, data = "mnist";
  // A sharded server: every shard's URI, comma-separated, in shard order; server_given says
  // whether --server was set too (which is refused with it).
  std::string shards;
  bool server_given = false;
  CompressionSettings compression;
  bool insecure = false, quiet = false, log_acks = false;
  std::string log_level = "info";
  std::string cert, cert_key, ca, stats_file;
  // Filter dropout (DISTREAL): static rates, or a table and a budget in ms.
  std::string drop_rates, dropout_rescale = "inverted";
  double step_time_budget_ms = 0;
  // Compression that follows the link (worker/link_adaptation.h): --byte-budget's text and
  // --budget-counts (both, upload).
  std::string byte_budget, budget_counts = "both";
  // --pull-values: fp32, or fp16-increment (WorkerConfig::fp16_increment_pulls).
  std::string pull_values = "fp32";
  double request_timeout = 60;
  double longest_request = 0;  // seconds; WorkerConfig::longest_request_ms
  std::string mode = "async";
  double lr = 0.05;
  // Federated rounds (worker/round_worker.h).
  double deadline_share = 0.8;
  std::uint64_t max_rounds = 0;
  std::string test_secagg_dump_dir;          // tests only: worker/round_worker.h
  std::string test_secagg_drop_after = "none";  // tests only: "shares" or "input"
  // Gossip (peer mode, worker/gossip_peer.h).
  GossipPeerConfig gossip;
  std::string topology_file, peer_name, listen, gossip_algorithm = "d-psgd", state_dir, port_file;
  double balance_target = 0, consensus_step = 0;
  // MD-GAN (worker/gan_worker.h).
  int gan_discriminator_steps = 1;
  std::string gan_arch = "mlp";
  bool gan_fp16 = false;
  double gan_swap_wait = 10;
};

// One mode's run, made by its checks once the settings hold.
class WorkerModeRun {
 public:
  virtual ~WorkerModeRun() = default;
  // The examples the run's loop will sample from `train` (its shard: the loop's own
  // function, worker_shard() or gossip_shard()). The program loads only their images
  // (load_dataset_part): `train` here has every label and no image yet.
  virtual std::vector<std::uint32_t> shard(const Dataset& train) const = 0;
  // Runs the mode's loop on `train` (a partial load holding the images of shard(train))
  // until it ends; writes its stats file; the exit status.
  virtual int run(const Dataset& train) = 0;
};

struct WorkerMode {
  std::string_view name;
  // The mode's own settings rows, declared in its group of the table (may be null).
  void (*declare)(settings::Table& table, WorkerSettings& settings);
  // Checks the settings and makes the run; throws std::invalid_argument naming the problem.
  std::unique_ptr<WorkerModeRun> (*prepare)(WorkerSettings& settings);
};

// Every mode, in the order --help lists them: async, rounds, gossip, gan.
const std::vector<WorkerMode>& worker_modes();
const WorkerMode* find_worker_mode(std::string_view name);

// The whole table: the shared rows and each mode's.
void declare_worker_settings(settings::Table& table, WorkerSettings& settings);
// What the program does once the table is read: checks, the data (every label, and the
// images of the mode's shard only), signals, the mode's run. `program` names it in the
// message of a bad setting.
int run_worker_program(WorkerSettings& settings, const char* program = "edgetrain-worker");

// The shared checks of the modes that talk to a server (async, rounds, gan): the server or
// shards, the identity (PSK, X.509 or declared), timing, compression and filter dropout.
WorkerConfig worker_config(WorkerSettings& settings);

// The stats files (--stats-file), one schema per mode, each a JSON object with "state"
// ("running" or "stopped"); rounds', gossip's and gan's also carry "mode".
// The server versions at which this run's updates were acknowledged (2.04), in bounded
// memory: a board runs for weeks at a few updates a second, and the whole list (8 bytes an
// update, the stats file rewritten whole after each step) would grow without end. Kept: how
// many, the first, the highest, whether each was above the one before, and the last kRecent.
struct AcknowledgedVersions {
  static constexpr std::size_t kRecent = 1024;
  std::uint64_t count = 0, first = 0, highest = 0;
  bool increasing = true;
  std::deque<std::uint64_t> recent;
  void add(std::uint64_t version);
};

// async: every WorkerStats field by its name, "acknowledged_versions" (the last
// AcknowledgedVersions::kRecent server versions answered 2.04 in this run, in order; all of
// them in a run of fewer), "acknowledged_count", "acknowledged_first", "acknowledged_highest",
// "acknowledged_increasing" and, sharded, "shard_versions".
std::string async_stats_json(const WorkerStats& stats, const AcknowledgedVersions& acknowledged,
                             bool running);
// rounds: its counters and "acknowledged_versions", the rounds whose delta got a 2.04 (round
// r is model version r, so the emulator's checks of acknowledged versions hold for them).
std::string rounds_stats_json(const RoundWorkerStats& stats, bool running);
std::string gossip_stats_json(const GossipPeerStats& stats, const std::string& peer, bool running);
std::string gan_stats_json(const GanWorkerStats& stats, bool running);

}  // namespace edgetrain::runtime
