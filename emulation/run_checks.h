// The checks of a server run (edgetrain-emulate's, async or rounds) from the workers' stats
// files (logs/worker-I.K.stats.json, one per incarnation) and the launcher's restarts.csv:
// no update a worker saw acknowledged may be lost, across server restarts and worker
// restarts alike (emulation/README.md, "Failures").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>

namespace edgetrain::emulation {

// The highest server version any of the first WORKERS workers got in a 2.04 (over every
// incarnation); with SHARD, the highest version that shard of a sharded server acknowledged
// (a --shards worker's stats file keeps it per shard: shard_versions; a worker that has
// none yet counts 0). Throws when a stats file cannot be read.
std::uint64_t highest_acknowledged(const std::filesystem::path& run, unsigned workers,
                                   std::optional<unsigned> shard = {});
// The same for every worker of RUN/plan.csv (`edgetrain-emulation-report acknowledged`).
std::uint64_t highest_acknowledged_in_run(const std::filesystem::path& run,
                                          std::optional<unsigned> shard = {});

// A worker's counters summed over its incarnations (one killed with SIGKILL counts up to
// its last stats write), and whether its acknowledged versions kept strictly increasing
// from one incarnation to the next. A round worker (mode "rounds") counts its deltas
// accepted (rounds_trained) and refused (deltas_refused) as updates accepted and refused.
struct WorkerTotals {
  std::uint64_t steps = 0, accepted = 0, refused = 0, bytes_sent = 0, retries = 0, incarnations = 0;
  // Offline training (issue 38 part 1; 0 from workers without it): time and local steps
  // offline, accumulated updates accepted and refused (with the refused ones' steps), and
  // the steps still buffered in the last incarnation when the run ended.
  double offline_seconds = 0;
  std::uint64_t offline_steps = 0, offline_updates_accepted = 0, offline_updates_refused = 0,
                offline_steps_refused = 0, buffered_steps = 0;
  bool versions_increase = true;
};

WorkerTotals worker_totals(const std::filesystem::path& run, unsigned worker);

// RUN/restarts.csv (elapsed_s,highest_acknowledged,recovered_version: one row per server
// restart) as a JSON array of {elapsed_s, highest_acknowledged, recovered_version (null when
// the restarted server reported none), lost}; lost when the recovered version is missing or
// below the highest acknowledged one. No file: an empty array.
nlohmann::json restart_checks(const std::filesystem::path& run);

}  // namespace edgetrain::emulation
