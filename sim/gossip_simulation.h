// Gossip training (EdgeGossip, Han et al., TPDS 2021; edgetrain-sim --mode gossip) in one
// process, on a virtual clock: N peers with no server, each with its own copy of the model
// (all initialised from the same seed), its own shard and the real trainer (plain SGD),
// exchanging models with their neighbours in a topology (worker/gossip.h). The rules the
// real peer mode of edgetrain-worker uses come from worker/gossip.h: the topology, the
// Metropolis weights, the workload balancer, the plateau rule, the check of the settings both
// have and γ's default, and the step rules (the local SGD step, D-PSGD's mix in the peer's
// float, AD-PSGD's midpoint as both sides of an average take it); and the published model.
//
// D-PSGD (Lian et al. 2017), with CHOCO-SGD's compressed variant (Koloskova et al. 2019):
// each iteration t a peer trains one minibatch, x_i ← x_i − lr·g_i, publishes, and mixes
// with its neighbours' published copies of the same iteration:
//     x_i ← x_i + γ Σ_j w_ij (x̂_j − x̂_i)       (w: Metropolis weights)
// Dense (publish fraction 1): x̂ = x, and with γ = 1 this is x_i ← Σ_j w_ij x_j. Compressed:
// x̂_i is peer i's runtime::PublishedModel, advanced once per iteration by the largest
// `fraction` of x_i − x̂_i per tensor; the rest waits for later steps (error feedback).
// Time: a local barrier. Peer i starts iteration t+1 when it has finished iteration t and
// every neighbour has published iteration t:
//     finish_i(t+1) = max(finish_i(t), max_j finish_j(t)) + compute_i(t+1).
// The arithmetic does not depend on the timing, so the simulation runs the peers in
// lockstep over t and carries each peer's clock alongside; an evaluation after iteration t
// is stamped with the time the last peer finished it.
//
// AD-PSGD (Lian et al. 2018), dense only: no barrier. Each peer loops: compute the gradient
// of a minibatch on its model as it is at the start, apply it at the end of the compute
// time (its model may have been averaged meanwhile), pick a uniformly random neighbour, and
// both take the midpoint at that moment, each by its side's rule of the real peers' average
// (runtime::adpsgd_exchange: the neighbour (x_j + x_i)/2, the peer x_i + (x_j − x_i)/2).
// Events run in virtual-time order, ties by peer id, so a run is deterministic for its seed.
//
// Time is in mean step times of the fastest speed class at the base batch. A peer's step
// of b examples takes b / base batch × (fastest class / its class) × a log-normal jitter,
// its class's budget taken at the step's start (speed schedule). Exchanges take no time,
// as transfers in the other modes.
//
// Bytes: what each peer sends. D-PSGD dense: the dense model to each neighbour per
// iteration; compressed: per neighbour, the encoded model delta of its published model
// since the version that neighbour holds (transport::encode_changes_since), or the dense
// model when that is not smaller; AD-PSGD: the dense model both ways per exchange.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/dataset.h"
#include "model/trainer.h"
#include "sim/model_attack.h"
#include "worker/gossip.h"

namespace edgetrain::sim {

// The real peer's (worker/gossip.h).
using runtime::gossip_algorithm_name;
using runtime::GossipAlgorithm;
using runtime::kDefaultCompressedConsensusStep;
using runtime::parse_gossip_algorithm;

// From `at` on (virtual time), speed class `speed_class` runs at `factor` × its budget
// (0.5: half its CPU, twice its step times), until a later change of the same class.
struct SpeedChange {
  double at = 0;
  std::uint32_t speed_class = 0;
  double factor = 1;
};
// "T:CLASS:FACTOR,..." (e.g. "200:0:0.25,400:0:1"); std::invalid_argument naming
// --speed-schedule for a malformed entry.
std::vector<SpeedChange> parse_speed_schedule(const std::string& text);
// "0.12,0.08,0.05,0.03": positive numbers; std::invalid_argument naming --speed-classes.
std::vector<double> parse_speed_classes(const std::string& text);

// Forward-only work is taken as a third of a training step per example (ours: a forward
// and a backward pass that costs about twice the forward), so a validation costs time.
inline constexpr double kForwardShareOfStep = 1.0 / 3.0;


struct GossipConfig {
  std::string model = "mlp";  // built-in name or spec text
  int peers = 8;
  int batch = 10;  // base batch
  float learning_rate =
      0.1f;  // base learning rate (plain SGD); 0 is allowed (a test of mixing alone)
  GossipAlgorithm algorithm = GossipAlgorithm::kDpsgd;
  // The graph: generated (kind, degree, seeded by `seed`), or `topology` when given (its
  // peer count must equal `peers`).
  runtime::TopologyKind topology_kind = runtime::TopologyKind::kRing;
  std::uint32_t degree = 4;
  std::optional<runtime::GossipTopology> topology;
  // Compressed gossip (D-PSGD only): share of each tensor a publish step copies (1: dense)
  // and at least this many entries per tensor (the server's default).
  double publish_fraction = 1;
  std::uint32_t publish_min_entries = 32;
  // γ; unset: runtime::default_consensus_step() (1 for dense, kDefaultCompressedConsensusStep
  // with a publish fraction below 1), the real peer's default.
  std::optional<double> consensus_step;
  bool label_skewed = false;
  runtime::LabelSkew skew;
  // Relative CPU budgets; peer i is in class i mod size (by index). Empty: one class.
  std::vector<double> speed_classes;
  std::vector<SpeedChange> speed_schedule;
  double step_jitter = 0.1;  // sigma of the log-normal per-step jitter
  // Workload balancing: 0 off; else each peer's runtime::WorkloadBalancer aims at this
  // compute time per iteration (in step times), batch between min and max.
  double balance_target = 0;
  int balance_min_batch = 1;
  int balance_max_batch = 256;
  double balance_max_lr_factor =
      8;  // the lr follows the batch linearly up to this many times learning_rate
  // D-PSGD: while a peer waits for a neighbour at the barrier it takes up to this many more
  // local steps (0: off), as the real peer's --wait-steps: a step is started only if it
  // would end within the wait of the peer's last iteration.
  std::uint32_t wait_steps = 0;
  // Accuracy-aware training: 0 off; else runtime::PlateauDetector's patience, fed with the
  // peer's validation accuracy every validate_every of its iterations.
  // The validation split is validation_fraction of the shard, held out of training (ours, as
  // the real peer's default; only when plateau_patience > 0, so the other runs train on the
  // whole shard).
  int plateau_patience = 0;
  std::uint32_t validate_every = 20;
  double validation_fraction = 0.05;
  int plateau_max_decays = 2;
  double plateau_min_delta = 0.002;
  // The run ends at the first of: the peers' mean iterations reach max_iterations, virtual
  // time reaches time_budget (0: none), mean peer accuracy reaches stop_at_accuracy, or
  // every peer has stopped (accuracy-aware).
  std::uint64_t max_iterations = 200;
  double time_budget = 0;
  std::optional<double> stop_at_accuracy;
  std::uint64_t eval_every = 20;     // mean peer iterations between evaluations
  std::size_t eval_examples = 1000;  // test examples per peer per evaluation (0: all)
  // Peer i starts from the model initialised with seed + i instead of all from `seed`
  // (ours: for tests of the mixing, and to watch consensus form).
  bool distinct_initialisation = false;
  bool keep_final_models = false;  // GossipResult::final_models (N copies: tests)
  // What an honest peer takes from a neighbour, the real peer's rule (runtime::
  // check_neighbour_model, runtime::neighbour_clip_scale; --max-neighbour-magnitude,
  // --neighbour-clip).
  double max_neighbour_magnitude = runtime::kDefaultMaxNeighbourMagnitude;
  double neighbour_clip = 0;
  // An experiment knob (ours; sim/README.md "Malicious neighbours"): peers 0..N-1 are
  // malicious. They train as the others but publish (D-PSGD) or send and answer (AD-PSGD)
  // a poisoned copy of their model, and do not mix; the mean, min and max accuracy and the
  // consensus are over the honest peers only.
  int malicious_peers = 0;
  ModelAttack attack;  // what peers 0..malicious_peers-1 do (sim/model_attack.h)
  std::uint64_t seed = 1;
  int threads = 1;
  runtime::KernelBackend kernels = runtime::KernelBackend::kXnnpack;

  double effective_consensus_step() const;
  // The settings the real peer has too, as the simulation uses them (worker/gossip.h).
  runtime::GossipSettings settings() const;
};

struct GossipEvalPoint {
  double time = 0;             // virtual
  double mean_iterations = 0;  // over the peers
  double bytes_per_peer = 0;   // mean bytes sent per peer, cumulative
  double mean_accuracy = 0, min_accuracy = 0, max_accuracy = 0;  // the peers' own models
  double consensus_accuracy = 0;  // of the average of all peers' models
  double mean_loss = 0, consensus_loss = 0;
  std::uint64_t local_steps = 0;  // cumulative, over all peers
};

struct SpeedClassStats {
  double budget = 1;  // the class's nominal relative CPU budget
  int peers = 0;
  double compute_per_step = 0;     // mean compute time of a local step
  double steps_per_iteration = 0;  // local steps per iteration (above 1 with wait_steps)
  double wait_per_iteration = 0;   // D-PSGD: mean time waiting for neighbours per iteration
  double mean_batch = 0;           // examples per local step
};

struct GossipResult {
  std::string label;
  std::string topology;  // kind, peers, edges
  std::vector<GossipEvalPoint> curve;
  double virtual_time = 0;
  double mean_iterations = 0;
  std::uint64_t local_steps = 0;    // minibatches trained, all peers
  std::uint64_t skipped_steps = 0;  // D-PSGD: iterations a stopped peer mixed without training
  std::uint64_t exchanges = 0;      // AD-PSGD: pairwise averagings; D-PSGD: neighbour reads
  // Honest peers' neighbour models (or average requests and answers) refused, and
  // neighbour differences clipped (GossipConfig::max_neighbour_magnitude, neighbour_clip).
  std::uint64_t neighbour_models_refused = 0, neighbour_terms_clipped = 0;
  int malicious_peers = 0;
  double honest_max_abs_parameter = 0;  // the largest |value| of an honest peer's model at the end
  std::uint64_t validations = 0;
  int peers_stopped = 0, lr_decays = 0;
  double bytes_per_peer = 0;  // mean
  std::vector<SpeedClassStats> classes;
  double consensus_distance = 0;  // at the end: mean ‖x_i − x̄‖ / ‖x̄‖
  double wall_seconds = 0;
  std::vector<std::vector<float>> final_models;  // GossipConfig::keep_final_models
  std::vector<float> consensus_parameters;       // the average model at the end

  const GossipEvalPoint* first_reaching(double target) const;  // mean peer accuracy ≥ target
  const GossipEvalPoint* consensus_first_reaching(double target) const;
  double best_mean_accuracy() const;
};

struct GossipProgress {
  double mean_iterations;
  std::uint64_t max_iterations;
  double time;
  double mean_accuracy;  // -1 before the first evaluation after the start
  double consensus_accuracy;
  double bytes_per_peer;
};
using GossipProgressCallback = std::function<void(const GossipProgress&)>;

// Throws std::invalid_argument, naming the setting, for a configuration the simulation
// refuses (the checks that need no data): what the real peer has too by the peer's own check
// (runtime::check_gossip_settings), then what only the simulation has.
void check_gossip_config(const GossipConfig& config);

GossipResult run_gossip_simulation(const GossipConfig& config, const runtime::Dataset& train,
                                   const runtime::Dataset& test, const std::string& label,
                                   const GossipProgressCallback& progress = {});

}  // namespace edgetrain::sim
