// --mode gan: the MD-GAN worker (worker/gan_worker.h): trains a discriminator on its shard
// and sends the server's generator its error feedback; with --topology, its peer endpoint
// for discriminator swaps serves on a thread of its own, as a gossip peer's does.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <optional>

#include "worker/program_support.h"
#include "worker/worker_exit_codes.h"
#include "worker/worker_program.h"

namespace edgetrain::runtime {

std::string gan_stats_json(const GanWorkerStats& st, bool running) {
  return nlohmann::json{{"state", running ? "running" : "stopped"},
                        {"mode", "gan"},
                        {"iterations", st.iterations},
                        {"feedbacks_refused", st.feedbacks_refused},
                        {"feedbacks_out_of_bounds", st.feedbacks_out_of_bounds},
                        {"feedbacks_not_sent", st.feedbacks_not_sent},
                        {"swaps_not_sent", st.swaps_not_sent},
                        {"waits", st.waits},
                        {"retries", st.retries},
                        {"swaps_sent", st.swaps_sent},
                        {"swaps_received", st.swaps_received},
                        {"swaps_missed", st.swaps_missed},
                        {"peer_requests_refused", st.peer_requests_refused},
                        {"bytes_sent", st.bytes_sent},
                        {"bytes_received", st.bytes_received},
                        {"peer_bytes_sent", st.peer_bytes_sent},
                        {"peer_bytes_received", st.peer_bytes_received},
                        {"last_iteration", st.last_iteration},
                        {"d_loss_real", st.d_loss_real},
                        {"d_loss_fake", st.d_loss_fake},
                        {"g_loss", st.g_loss},
                        {"compute_seconds", st.compute_seconds},
                        {"peak_rss_bytes", program::peak_rss_bytes()}}
             .dump(2) +
         "\n";
}

namespace {

using program::log_error;
using program::log_line;

void declare_gan(settings::Table& t, WorkerSettings& s) {
  t.group(
      "MD-GAN (--mode gan: worker/README.md \"MD-GAN\"; --batch must be the server's "
      "--gan-batch)");
  t.add("gan-arch", s.gan_arch,
        "this worker's discriminator architecture (model/gan_network.h); the peers it "
        "swaps with must have the same")
      .choices({"mlp", "cnn"});
  t.add("gan-discriminator-steps", s.gan_discriminator_steps,
        "L: discriminator steps per iteration, each on a "
        "real batch of this worker's shard and the server's X_d")
      .range(1, 100);
  t.add("gan-fp16", s.gan_fp16, "send the error feedback as fp16 (half the bytes)");
  t.add("gan-swap-wait", s.gan_swap_wait,
        "in a discriminator swap round: how long to wait for the discriminator "
        "a peer sends (none came: train on this one). Peers are the --topology file's, reached "
        "with --cert/--cert-key/"
        "--ca (or --insecure); without --topology swaps are skipped")
      .range(0, 3600)
      .unit("seconds");
}

std::string progress_text(const GanWorkerStats& st) {
  char line[300];
  std::snprintf(line, sizeof line,
                "iteration %llu  D loss real %.3f fake %.3f  G loss %.3f  swaps %llu/%llu  "
                "sent %.2f MB  received %.2f MB",
                static_cast<unsigned long long>(st.last_iteration), st.d_loss_real, st.d_loss_fake,
                st.g_loss, static_cast<unsigned long long>(st.swaps_received),
                static_cast<unsigned long long>(st.swaps_received + st.swaps_missed),
                st.bytes_sent / 1e6, st.bytes_received / 1e6);
  return line;
}

class GanRun : public WorkerModeRun {
 public:
  // Throws std::invalid_argument for settings that cannot work.
  explicit GanRun(WorkerSettings& s) : s_(s) {
    const WorkerConfig config = worker_config(s);
    config_.worker = config;
    config_.gan.batch = config.batch;
    config_.gan.seed = config.seed;
    config_.gan.discriminator_steps = s.gan_discriminator_steps;
    config_.gan.architecture = parse_gan_architecture(s.gan_arch);
    config_.feedback_encoding =
        s.gan_fp16 ? transport::ValueEncoding::kFp16 : transport::ValueEncoding::kFp32;
    config_.max_iterations = s.gossip.max_iterations;
    config_.swap_wait_seconds = s.gan_swap_wait;
    name_ = s.peer_name.empty() ? s.identity : s.peer_name;
    if (s.topology_file.empty()) return;
    if (s.peer_name.empty() && !s.cert.empty())
      throw std::invalid_argument(
          "with --topology give --peer-name: this worker's name there (its certificate's CN, "
          "the name the server announces to its peers)");
    topology_ = read_topology_file(s.topology_file);
    self_ = program::find_self(*topology_, name_, s.topology_file);
    const bool certificates = !s.cert.empty() && !s.cert_key.empty() && !s.ca.empty();
    if (!s.insecure && !certificates)
      throw std::invalid_argument(
          "discriminator swaps between peers use X.509 certificates from the fleet's CA: give "
          "--cert, --cert-key and --ca (or --insecure)");
  }

  std::vector<std::uint32_t> shard(const Dataset& train) const override {
    return worker_shard(config_.worker, train);
  }

  int run(const Dataset& train) override {
    const WorkerConfig& config = config_.worker;
    log_line("MD-GAN worker " + std::to_string(config.worker_id) + "/" +
             std::to_string(config.worker_count) + " (" + config.identity + ") -> " + s_.server +
             ", batch " + std::to_string(config.batch) + ", L " +
             std::to_string(s_.gan_discriminator_steps) + ", " + std::to_string(train.size()) +
             " examples in the data set" + program::held_images(train));
    std::optional<program::PeerEndpoint> endpoint;
    if (topology_)  // a discriminator fits (MLP: 2.7 MB)
      endpoint.emplace(s_, *topology_, self_, 16u << 20);
    CoapServerChannel channel(coap_client_options(config, program::stop_requested));
    GanWorker worker(config_, train, channel, endpoint ? &endpoint->channel() : nullptr,
                     topology_ ? &*topology_ : nullptr, program::stop_requested,
                     [](const std::string& line) { log_line(line); });
    if (endpoint) {
      worker.attach(endpoint->server());
      endpoint->start_serving(s_.port_file);
      log_line("MD-GAN peer endpoint of " + name_ + " on port " + std::to_string(endpoint->port()));
    }
    GanWorkerRun result;
    {
      program::StatsFileWriter stats_file(
          s_.stats_file, [&](bool running) { return gan_stats_json(result.stats, running); });
      program::ProgressLine progress(s_.quiet);
      try {
        const GanWorkerStats last = worker.run([&](const GanWorkerStats& st) {
          stats_file.update([&] { result.stats = st; });
          if (progress.due()) progress.show(progress_text(st));
        });
        stats_file.update([&] { result.stats = last; });
      } catch (const WorkerFailure& e) {
        stats_file.update([&] {
          result.stats = worker.stats();
          result.exit = e.exit();
          result.reason = e.what();
        });
      }
      if (endpoint) endpoint->stop_serving();
      stats_file.finish();
    }
    log_line("stopped after " + std::to_string(result.stats.iterations) + " GAN iterations (" +
             std::to_string(result.stats.feedbacks_refused) + " feedbacks refused as late, " +
             std::to_string(result.stats.swaps_received) + " discriminators swapped in, " +
             std::to_string(result.stats.swaps_missed) + " swaps missed, " +
             std::to_string(result.stats.bytes_sent) + " bytes sent)");
    if (result.exit == WorkerExit::kStopped && result.stats.iterations == 0)
      end_without_anything_applied(WorkerExit::kStopped, "", "GAN feedback", result.exit,
                                   result.reason);
    if (result.exit != WorkerExit::kStopped)
      log_error("exit status " + std::to_string(exit_status(result.exit)) + ": " + result.reason);
    return exit_status(result.exit);
  }

 private:
  const WorkerSettings& s_;
  GanWorkerConfig config_;
  std::string name_;
  std::optional<GossipTopology> topology_;  // outlives the endpoint's channel
  std::uint32_t self_ = 0;
};

std::unique_ptr<WorkerModeRun> prepare_gan(WorkerSettings& s) {
  return std::make_unique<GanRun>(s);
}

}  // namespace

extern const WorkerMode kGanMode{"gan", declare_gan, prepare_gan};

}  // namespace edgetrain::runtime
