// --mode gossip: no server; this board is a CoAP/DTLS peer that averages its model with its
// topology neighbours' (worker/gossip_peer.h), serving its own on a thread of its own.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "model/model.h"
#include "transport/codec.h"
#include "worker/program_support.h"
#include "worker/worker_program.h"

namespace edgetrain::runtime {

std::string gossip_stats_json(const GossipPeerStats& st, const std::string& name, bool running) {
  const nlohmann::json j = {{"state", running ? "running" : "stopped"},
                            {"mode", "gossip"},
                            {"peer", name},
                            {"iteration", st.iteration},
                            {"resumed_iteration", st.resumed_iteration},
                            {"steps", st.steps},
                            {"wait_steps", st.wait_steps},
                            {"examples", st.examples},
                            {"exchanges", st.exchanges},
                            {"neighbours_skipped", st.neighbours_skipped},
                            {"models_refused", st.models_refused},
                            {"requests_refused", st.requests_refused},
                            {"bytes_sent", st.bytes_sent},
                            {"bytes_received", st.bytes_received},
                            {"batch", st.batch},
                            {"learning_rate", st.learning_rate},
                            {"examples_per_second", st.examples_per_second},
                            {"last_iteration_seconds", st.last_iteration_seconds},
                            {"validation_accuracy", st.validation_accuracy},
                            {"training_stopped", st.training_stopped},
                            {"last_loss", st.last_loss},
                            {"refused", st.refused},
                            {"peak_rss_bytes", program::peak_rss_bytes()}};
  // Per neighbour: what this peer mixed in, refused and clipped of it (worker/README.md
  // "Neighbours"): where an operator finds a neighbour that sends poisoned models.
  nlohmann::json neighbours = nlohmann::json::object();
  for (const auto& [neighbour, n] : st.neighbours)
    neighbours[neighbour] = {{"mixed", n.mixed},
                             {"refused", n.refused},
                             {"clipped", n.clipped},
                             {"last_refusal", n.last_refusal}};
  nlohmann::json out = j;
  out["neighbours"] = std::move(neighbours);
  return out.dump(2) + "\n";
}

namespace {

using program::log_error;
using program::log_line;

void declare_gossip(settings::Table& t, WorkerSettings& s) {
  t.group("Gossip (--mode gossip, no server: worker/README.md \"Gossip\")");
  t.add("topology", s.topology_file,
        "the fleet's topology file (edgetrain-topology writes one): peers, their "
        "addresses and the edges; this peer's shard is its index in it");
  t.add("peer-name", s.peer_name,
        "this peer's name in the topology: the CN of its certificate (with --insecure, "
        "declared); default --identity");
  t.add("listen", s.listen,
        "HOST:PORT to serve this peer's model on (default: its address in the topology; port 0: "
        "any, see --port-file)");
  t.add("port-file", s.port_file, "write the UDP port this peer listens on here once it does");
  t.add("gossip", s.gossip_algorithm,
        "d-psgd (each iteration: a step, then average with every neighbour's model of "
        "that iteration) or ad-psgd (a step, then a pairwise average with one random neighbour, no "
        "barrier)")
      .choices({"d-psgd", "ad-psgd"});
  t.add("publish-fraction", s.gossip.publish_fraction,
        "d-psgd: share of each tensor's entries a neighbour's copy "
        "of this model moves by per iteration (1: dense; e.g. 0.01: compressed gossip with error "
        "feedback)")
      .range(1e-6, 1);
  t.add("consensus-step", s.consensus_step,
        "d-psgd: gamma, how far a peer moves toward its neighbours' "
        "copies per iteration (0: 1 with dense gossip, 0.1 with compressed)")
      .range(0, 1);
  t.add("neighbour-wait", s.gossip.neighbour_wait_seconds,
        "d-psgd: how long to wait for a neighbour that is "
        "behind before averaging without it")
      .range(0, 3600)
      .unit("seconds");
  t.add("max-neighbour-magnitude", s.gossip.max_neighbour_magnitude,
        "refuse a neighbour's model (or average request) with any value of larger magnitude "
        "(and always one that is not finite); honest models measured in the simulator stay "
        "below 0.6 at lr 0.1 and 6.2 at lr 0.8, so the default 1e4 leaves a wide margin "
        "(worker/README.md \"Neighbours\"; 0: no bound)")
      .range(0, 1e30);
  t.add("neighbour-clip", s.gossip.neighbour_clip,
        "d-psgd: clip each neighbour's difference x_j - x_i to this L2 norm before the mix "
        "(clipped gossip, He, Karimireddy & Jaggi 2022; a fixed tau is ours; 0: off)")
      .range(0, 1e30);
  t.add("wait-steps", s.gossip.wait_steps,
        "d-psgd: while a neighbour is behind, take up to this many more local "
        "steps per iteration instead of idling at the barrier (a fast peer's way to use its speed; "
        "0: off)")
      .range(0, 1000);
  t.add("balance-target", s.balance_target,
        "workload balancing: size each step's batch so that it takes this long "
        "at the speed measured now, lr scaled with the batch (0: off)")
      .range(0, 3600)
      .unit("seconds");
  t.add("min-batch", s.gossip.balance.min_batch, "with --balance-target: the least batch")
      .range(1, 4096);
  t.add("max-batch", s.gossip.balance.max_batch, "with --balance-target: the largest batch")
      .range(1, 4096);
  t.add("max-lr-factor", s.gossip.balance.max_lr_factor,
        "with --balance-target: the lr follows the batch linearly "
        "up to this many times --lr (a fast peer's large batch with a linear lr can make the fleet "
        "diverge)")
      .range(1, 64);
  t.add("plateau-patience", s.gossip.plateau.patience,
        "accuracy-aware training: validations without improvement "
        "before the lr halves (twice), then local training stops (0: off)")
      .range(0, 1000);
  t.add("validation-fraction", s.gossip.validation_fraction,
        "share of the shard held out for validation")
      .range(0, 0.49);
  t.add("validate-every", s.gossip.validate_every, "iterations between validations")
      .range(1, 1e6)
      .unit("iterations");
  t.add("iterations", s.gossip.max_iterations,
        "gossip: stop at this iteration; gan: after this many feedbacks "
        "accepted (0: run until stopped or --duration)")
      .unit("iterations");
  t.add("state-dir", s.state_dir,
        "checkpoint this peer's model here (peer.safetensors, every --checkpoint-every "
        "iterations and at exit) and resume from it at start");
  t.add("checkpoint-every", s.gossip.checkpoint_every, "iterations between checkpoints")
      .range(1, 1e9)
      .unit("iterations");
}

// The peer's configuration from its settings; throws std::invalid_argument.
GossipPeerConfig gossip_config(WorkerSettings& s) {
  GossipPeerConfig g = s.gossip;
  if (s.topology_file.empty())
    throw std::invalid_argument(
        "--mode gossip needs --topology FILE (edgetrain-topology writes one)");
  g.topology = read_topology_file(s.topology_file);
  if (s.peer_name.empty()) s.peer_name = s.identity;
  if (s.peer_name.empty())
    throw std::invalid_argument(
        "--mode gossip needs --peer-name (this peer's name in the topology)");
  g.self = program::find_self(g.topology, s.peer_name, s.topology_file);
  const bool certificates = !s.cert.empty() || !s.cert_key.empty() || !s.ca.empty();
  if (s.insecure && certificates)
    throw std::invalid_argument("--insecure gossip is plain CoAP: no --cert/--cert-key/--ca");
  if (!s.insecure && (s.cert.empty() || s.cert_key.empty() || s.ca.empty()))
    throw std::invalid_argument(
        "gossip peers prove who they are with X.509 certificates from the fleet's CA: give "
        "--cert, --cert-key and --ca (or --insecure on every peer for plain CoAP)");
  if (s.insecure)
    program::log_warning(
        "WARNING: --insecure: plain CoAP between peers, NO encryption and NO authentication; "
        "neighbours are known by the names they declare");
  const WorkerConfig& c = s.config;
  g.model = c.model;
  g.seed = c.seed;
  g.threads = c.threads;
  g.label_skewed = c.label_skewed;
  g.slowdown = c.slowdown;
  g.max_seconds = c.max_seconds;
  g.algorithm = parse_gossip_algorithm(s.gossip_algorithm);
  g.balance.base_batch = c.batch;
  g.balance.base_lr = s.lr;
  g.balance.target_seconds = s.balance_target;
  g.consensus_step =
      s.consensus_step > 0 ? s.consensus_step : default_consensus_step(g.publish_fraction);
  if (g.balance.target_seconds == 0) g.balance.min_batch = g.balance.max_batch = c.batch;
  if (!s.state_dir.empty()) {
    std::filesystem::create_directories(s.state_dir);
    g.checkpoint_path = (std::filesystem::path(s.state_dir) / "peer.safetensors").string();
  }
  check_gossip_peer_config(g);
  Model(model_spec_from_argument(g.model));  // a bad model spec fails here, before any data
  return g;
}

std::string progress_text(const GossipPeerStats& st) {
  char line[300];
  std::snprintf(line, sizeof line,
                "iteration %llu  loss %.3f  batch %d  lr %.4f  %.0f ex/s  exchanges %llu  "
                "skipped %llu  sent %.2f MB  received %.2f MB%s",
                static_cast<unsigned long long>(st.iteration), st.last_loss, st.batch,
                st.learning_rate, st.examples_per_second,
                static_cast<unsigned long long>(st.exchanges),
                static_cast<unsigned long long>(st.neighbours_skipped), st.bytes_sent / 1e6,
                st.bytes_received / 1e6, st.training_stopped ? "  (training stopped)" : "");
  return line;
}

class GossipRun : public WorkerModeRun {
 public:
  GossipRun(const WorkerSettings& s, GossipPeerConfig config) : s_(s), config_(std::move(config)) {}

  std::vector<std::uint32_t> shard(const Dataset& train) const override {
    return gossip_shard(config_, train);
  }

  int run(const Dataset& train) override {
    const std::string& name = config_.topology.peers[config_.self].name;
    // AD-PSGD posts whole models: the body limit must hold one, whatever the model.
    const std::size_t model_bytes =
        transport::dense_model_bytes(
            Model(model_spec_from_argument(config_.model)).tensor_sizes()) +
        1024;
    program::PeerEndpoint endpoint(s_, config_.topology, config_.self, model_bytes);
    GossipPeer peer(config_, train, endpoint.channel(), program::stop_requested,
                    [](const std::string& line) { log_line(line); });
    peer.attach(endpoint.server());
    endpoint.start_serving(s_.port_file);
    log_line("gossip peer " + name + " (" + std::to_string(config_.self) + " of " +
             std::to_string(config_.topology.size()) + ", " +
             gossip_algorithm_name(config_.algorithm) + ", " +
             std::to_string(config_.topology.neighbours[config_.self].size()) +
             " neighbours) serving on " + endpoint.host() + ":" + std::to_string(endpoint.port()) +
             ", from iteration " + std::to_string(peer.stats().iteration));
    GossipPeerStats stats = peer.stats();
    int status = 0;
    {
      program::StatsFileWriter stats_file(
          s_.stats_file, [&](bool running) { return gossip_stats_json(stats, name, running); });
      program::ProgressLine progress(s_.quiet);
      try {
        const GossipPeerStats last = peer.run([&](const GossipPeerStats& st) {
          stats_file.update([&] { stats = st; });
          if (progress.due()) progress.show(progress_text(st));
        });
        stats_file.update([&] { stats = last; });
      } catch (const std::exception& e) {
        log_error(std::string("gossip peer failed: ") + e.what());
        stats_file.update([&] { stats = peer.stats(); });
        status = 1;
      }
      endpoint.stop_serving();
      stats_file.finish();
    }
    log_line("stopped at iteration " + std::to_string(stats.iteration) + ": " +
             std::to_string(stats.exchanges) + " exchanges, " +
             std::to_string(stats.neighbours_skipped) + " neighbours skipped, " +
             std::to_string(stats.models_refused + stats.requests_refused) +
             " models or requests refused, " + std::to_string(stats.bytes_sent) + " bytes sent");
    return status;
  }

 private:
  const WorkerSettings& s_;
  GossipPeerConfig config_;
};

std::unique_ptr<WorkerModeRun> prepare_gossip(WorkerSettings& s) {
  return std::make_unique<GossipRun>(s, gossip_config(s));
}

}  // namespace

extern const WorkerMode kGossipMode{"gossip", declare_gossip, prepare_gossip};

}  // namespace edgetrain::runtime
