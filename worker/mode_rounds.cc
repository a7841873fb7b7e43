// --mode rounds: federated rounds (worker/round_worker.h): poll GET /round, train the round's
// local steps, send the model delta to POST /round/update.
#include <nlohmann/json.hpp>

#include "worker/program_support.h"
#include "worker/worker_exit_codes.h"
#include "worker/worker_program.h"

namespace edgetrain::runtime {

std::string rounds_stats_json(const RoundWorkerStats& st, bool running) {
  const nlohmann::json j = {{"state", running ? "running" : "stopped"},
                            {"mode", "rounds"},
                            {"rounds_trained", st.rounds_trained},
                            {"deltas_refused", st.deltas_refused},
                            {"deltas_rejected", st.deltas_rejected},
                            {"polls", st.polls},
                            {"pulls", st.pulls},
                            {"steps", st.steps},
                            {"retries", st.retries},
                            {"bytes_sent", st.bytes_sent},
                            {"bytes_received", st.bytes_received},
                            {"secagg_requests", st.secagg_requests},
                            {"secagg_not_yet", st.secagg_not_yet},
                            {"secagg_unsent_norm", st.secagg_unsent_norm},
                            {"last_round", st.last_round},
                            {"last_loss", st.last_loss},
                            {"dropout", st.dropout},
                            {"acknowledged_versions", st.acknowledged_rounds},
                            {"peak_rss_bytes", program::peak_rss_bytes()}};
  return j.dump(2) + "\n";
}

namespace {

using program::log_error;
using program::log_line;

void declare_rounds(settings::Table& t, WorkerSettings& s) {
  t.add("rounds", s.max_rounds,
        "rounds: stop after this many accepted deltas (0: run until stopped)")
      .unit("rounds");
  t.add("test-secagg-dump", s.test_secagg_dump_dir,
        "TESTS ONLY, reveals this device's delta: secure rounds write the start model, the clipped "
        "delta and its quantized values to files in this folder");
  t.add("test-secagg-drop-after", s.test_secagg_drop_after,
        "TESTS ONLY: leave the run right after a secure round's shares, masked input or "
        "consistency signature (signed keys) were accepted, as a device that drops out then")
      .choices({"none", "shares", "input", "consistency"});
}

class RoundsRun : public WorkerModeRun {
 public:
  RoundsRun(const WorkerSettings& s, WorkerConfig config) : s_(s) {
    config_.worker = std::move(config);
    config_.lr = static_cast<float>(s.lr);
    config_.max_rounds = s.max_rounds;
    config_.deadline_share = s.deadline_share;
    config_.test_secagg_dump_dir = s.test_secagg_dump_dir;
    config_.test_secagg_drop_after = s.test_secagg_drop_after;
  }

  std::vector<std::uint32_t> shard(const Dataset& train) const override {
    return worker_shard(config_.worker, train);
  }

  int run(const Dataset& train) override {
    program::log_server_worker_start(s_, config_.worker, train);
    RoundWorkerStats stats;
    program::StatsFileWriter stats_file(
        s_.stats_file, [&](bool running) { return rounds_stats_json(stats, running); });
    const RoundWorkerRun result = run_round_worker(
        config_, train, program::stop_requested, program::write_line,
        [&](const RoundWorkerStats& st) { stats_file.update([&] { stats = st; }); });
    stats_file.finish([&] { stats = result.stats; });
    log_line("stopped after " + std::to_string(result.stats.rounds_trained) + " rounds (" +
             std::to_string(result.stats.deltas_refused) + " deltas refused, " +
             std::to_string(result.stats.bytes_sent) + " bytes sent, " +
             std::to_string(result.stats.bytes_received) + " bytes pulled)");
    if (result.exit != WorkerExit::kStopped)
      log_error("exit status " + std::to_string(exit_status(result.exit)) + ": " + result.reason);
    return exit_status(result.exit);
  }

 private:
  const WorkerSettings& s_;
  RoundWorkerConfig config_;
};

std::unique_ptr<WorkerModeRun> prepare_rounds(WorkerSettings& s) {
  return std::make_unique<RoundsRun>(s, worker_config(s));
}

}  // namespace

extern const WorkerMode kRoundsMode{"rounds", declare_rounds, prepare_rounds};

}  // namespace edgetrain::runtime
