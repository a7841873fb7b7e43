// --mode async (the default): the AdaComp worker of the paper, one compressed gradient per
// step to POST /update (worker/worker.h).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "worker/program_support.h"
#include "worker/worker_exit_codes.h"
#include "worker/worker_program.h"

namespace edgetrain::runtime {

// Every WorkerStats field under its own name, for the --stats-file object.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(WorkerStats, steps, updates_accepted, updates_refused,
                                   updates_rejected, pulls, delta_pulls, delta_mismatches, first_pull,
                                   first_pull_bytes, seeded_first_pull_fallbacks,
                                   bytes_sent, bytes_received, server_version, retries,
                                   non_finite_steps, last_loss, dropout, offline, offline_seconds,
                                   offline_steps, buffered_steps, offline_updates_accepted,
                                   offline_updates_refused, offline_steps_refused,
                                   last_offline_from_version, last_offline_acknowledged_version,
                                   last_offline_steps, offline_tries, offline_try_seconds, compression_rate, uplink_bytes_per_second,
                                   uplink_fixed_seconds, step_seconds, turn_seconds_without_send,
                                   budget_spent_bytes, budget_counted_bytes, budget_waiting,
                                   budget_waits, budget_wait_seconds)

void AcknowledgedVersions::add(std::uint64_t version) {
  if (count == 0) first = version;
  if (count > 0 && version <= recent.back()) increasing = false;
  highest = std::max(highest, version);
  ++count;
  recent.push_back(version);
  if (recent.size() > kRecent) recent.pop_front();
}

std::string async_stats_json(const WorkerStats& s, const AcknowledgedVersions& acknowledged,
                             bool running) {
  nlohmann::json j = s;
  j["state"] = running ? "running" : "stopped";
  j["acknowledged_versions"] = acknowledged.recent;
  j["acknowledged_count"] = acknowledged.count;
  j["acknowledged_first"] = acknowledged.first;
  j["acknowledged_highest"] = acknowledged.highest;
  j["acknowledged_increasing"] = acknowledged.increasing;
  j["peak_rss_bytes"] = program::peak_rss_bytes();
  if (!s.shard_versions.empty())
    j["shard_versions"] = s.shard_versions;  // sharded: per shard, the highest acknowledged
  return j.dump(2) + "\n";
}

namespace {

using program::log_error;
using program::log_line;

class AsyncRun : public WorkerModeRun {
 public:
  AsyncRun(const WorkerSettings& s, WorkerConfig config) : s_(s), config_(std::move(config)) {}

  std::vector<std::uint32_t> shard(const Dataset& train) const override {
    return worker_shard(config_, train);
  }

  int run(const Dataset& train) override {
    program::log_server_worker_start(s_, config_, train);
    WorkerStats stats;
    AcknowledgedVersions acknowledged;
    program::StatsFileWriter stats_file(s_.stats_file, [&](bool running) {
      return async_stats_json(stats, acknowledged, running);
    });
    // One push per step, so at most one new acknowledgement per call.
    auto take = [&](const WorkerStats& current) {
      if (current.updates_accepted > stats.updates_accepted)
        acknowledged.add(current.server_version);
      stats = current;
    };
    WorkerRun result;
    {
      program::ProgressLine progress(s_.quiet);
      std::uint64_t acks_logged = 0;
      result = run_worker(
          config_, train, program::stop_requested, program::write_line,
          [&](const WorkerStats& current) {
            stats_file.update([&] { take(current); });
            // The line lets anyone check afterwards that the server never
            // went back behind a version it acknowledged.
            if (s_.log_acks && current.updates_accepted > acks_logged) {
              acks_logged = current.updates_accepted;
              log_line("acknowledged: server version " + std::to_string(current.server_version));
            }
            if (progress.due()) progress.show(progress_text(current));
          });
    }
    stats_file.finish([&] { take(result.stats); });
    const WorkerStats& st = result.stats;
    log_line("stopped after " + std::to_string(st.steps) +
             " steps: " + std::to_string(st.updates_accepted) + " updates accepted, " +
             std::to_string(st.updates_refused) + " refused as stale, " +
             std::to_string(st.bytes_sent) + " bytes sent, " + std::to_string(st.retries) +
             " retries; " + std::to_string(st.pulls) + " pulls (" + std::to_string(st.delta_pulls) +
             " as deltas), " + std::to_string(st.bytes_received) + " bytes pulled");
    if (config_.offline_training())
      log_line("offline: " + std::to_string(st.offline_seconds) + " s, " +
               std::to_string(st.offline_steps) + " local steps; " +
               std::to_string(st.offline_updates_accepted) + " offline updates accepted, " +
               std::to_string(st.offline_updates_refused) + " not applied (" +
               std::to_string(st.offline_steps_refused) + " steps); " +
               std::to_string(st.buffered_steps) + " buffered steps not sent");
    if (config_.link.enabled())
      log_line("link: last c " + std::to_string(st.compression_rate) + ", uplink " +
               std::to_string(st.uplink_bytes_per_second) + " bytes/s + " +
               std::to_string(st.uplink_fixed_seconds) + " s per exchange" +
               (config_.link.budget.enabled()
                    ? "; budget " + byte_budget_text(config_.link.budget) + ": " +
                          std::to_string(st.budget_counted_bytes) + " bytes counted, " +
                          std::to_string(st.budget_waits) + " waits (" +
                          std::to_string(st.budget_wait_seconds) + " s)"
                    : std::string()));
    if (result.exit != WorkerExit::kStopped)
      log_error("exit status " + std::to_string(exit_status(result.exit)) + ": " + result.reason);
    return exit_status(result.exit);
  }

 private:
  static std::string progress_text(const WorkerStats& s) {
    char line[300];
    int used = std::snprintf(line, sizeof line,
                             "step %llu  loss %.3f  server version %llu  accepted %llu  refused "
                             "%llu  sent %.2f MB  pulled %.1f MB",
                             static_cast<unsigned long long>(s.steps), s.last_loss,
                             static_cast<unsigned long long>(s.server_version),
                             static_cast<unsigned long long>(s.updates_accepted),
                             static_cast<unsigned long long>(s.updates_refused), s.bytes_sent / 1e6,
                             s.bytes_received / 1e6);
    if (s.offline_seconds > 0 && used > 0 && static_cast<std::size_t>(used) < sizeof line)
      used += std::snprintf(line + used, sizeof line - used, "  %s %.0f s  buffered %llu",
                            s.offline ? "OFFLINE" : "offline", s.offline_seconds,
                            static_cast<unsigned long long>(s.buffered_steps));
    if (s.uplink_bytes_per_second > 0 && used > 0 && static_cast<std::size_t>(used) < sizeof line)
      used += std::snprintf(line + used, sizeof line - used, "  c %.3g  uplink %.0f kB/s%s",
                            s.compression_rate, s.uplink_bytes_per_second / 1e3,
                            s.budget_waiting ? "  BUDGET SPENT" : "");
    if (!s.dropout.drop_rates.empty() && used > 0 && static_cast<std::size_t>(used) < sizeof line)
      std::snprintf(line + used, sizeof line - used, "  drop %s", s.dropout.drop_rates.c_str());
    return line;
  }

  const WorkerSettings& s_;
  WorkerConfig config_;
};

std::unique_ptr<WorkerModeRun> prepare_async(WorkerSettings& s) {
  WorkerConfig config = worker_config(s);
  // A sharded server's update is split by shard with each shard's own fetched version;
  // how an accumulated offline update should meet several shards' staleness is not built.
  if (config.offline_training() && !config.shards.empty())
    throw std::invalid_argument(
        "--offline-steps / --offline-seconds do not work with --shards yet");
  return std::make_unique<AsyncRun>(s, std::move(config));
}

}  // namespace

extern const WorkerMode kAsyncMode{"async", nullptr, prepare_async};

}  // namespace edgetrain::runtime
