// What gossip training (EdgeGossip; worker/README.md "Gossip") shares between the peer
// mode of edgetrain-worker (worker/gossip_peer.h) and the simulator (edgetrain-sim --mode
// gossip): the topology and its file, the mixing weights, the workload balancer, the
// accuracy-aware stop, the settings' check and γ's default, and the step rules (the local
// SGD step, D-PSGD's mix, AD-PSGD's midpoint), so that both compute the same floats. No
// network and no model here: plain rules, unit-tested on their own.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace edgetrain::runtime {

// ---- Algorithms ---------------------------------------------------------------------------

// D-PSGD (Lian et al. 2017: a step, then a weighted average with every neighbour) and
// AD-PSGD (Lian et al. 2018: a step, then a pairwise average with one random neighbour).
enum class GossipAlgorithm { kDpsgd, kAdpsgd };
const char* gossip_algorithm_name(GossipAlgorithm algorithm);     // "d-psgd", "ad-psgd"
GossipAlgorithm parse_gossip_algorithm(const std::string& name);  // std::invalid_argument otherwise

// ---- Topology -----------------------------------------------------------------------------

enum class TopologyKind { kRing, kRandomRegular, kFull, kExplicit };
const char* topology_kind_name(TopologyKind kind);  // "ring", "random-regular", "full", "explicit"
TopologyKind parse_topology_kind(std::string_view name);  // std::invalid_argument otherwise

struct GossipPeerAddress {
  std::string name;     // the peer's identity: its certificate's CN (transport::is_plain_identity)
  std::string address;  // "host:port" where it listens; may be empty (simulator, or set later)
};

// An undirected graph of peers: neighbours[i] lists i's neighbours, increasing, no self
// loops, symmetric (j in neighbours[i] iff i in neighbours[j]).
struct GossipTopology {
  TopologyKind kind = TopologyKind::kExplicit;
  std::vector<GossipPeerAddress> peers;
  std::vector<std::vector<std::uint32_t>> neighbours;

  std::size_t size() const { return peers.size(); }
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges() const;  // i < j, sorted
  // The index of the peer named `name`, if any.
  std::optional<std::uint32_t> find(std::string_view name) const;
  // Whether every peer can reach every other.
  bool connected() const;
};

// N peers named NAME_PREFIX0..N-1 (addresses empty). kRing: each peer's neighbours are i±1
// (N ≥ 2; for N = 2 one edge). kRandomRegular: every peer has exactly `degree` neighbours,
// drawn with `seed` (a uniform pairing of degree·N half-edges, redrawn until simple and
// connected; N·degree even, degree < N). kFull: everyone. Throws std::invalid_argument.
GossipTopology make_topology(TopologyKind kind, std::uint32_t peers, std::uint32_t degree = 4,
                             std::uint64_t seed = 1, const std::string& name_prefix = "peer-");
// From an edge list over `peers` (kExplicit). Throws std::invalid_argument for an index out
// of range, a self loop, or a name that is not a plain identity or appears twice.
GossipTopology topology_from_edges(
    std::vector<GossipPeerAddress> peers,
    const std::vector<std::pair<std::uint32_t, std::uint32_t>>& edges);

// The topology file (JSON, worker/README.md "Gossip"):
//   {"kind": "ring", "peers": [{"name": "peer-0", "address": "10.0.0.1:5684"}, ...],
//    "edges": [[0, 1], [1, 2], ...]}
// Edges are what counts; "kind" says how they were made. Parsing checks everything
// (std::invalid_argument naming the problem): a file of the fleet is trusted no more than it
// must be.
std::string topology_json(const GossipTopology& topology);
GossipTopology parse_topology_json(std::string_view text);
GossipTopology read_topology_file(const std::string& path);

// Metropolis-Hastings weights (Xiao & Boyd): w_ij = 1 / (1 + max(d_i, d_j)) for each
// neighbour j, and w_ii = 1 − Σ_j w_ij. Symmetric and doubly stochastic, which D-PSGD needs
// for the peers' models to agree on the average. Returns one weight per neighbour, in the
// order of topology.neighbours[peer], then the peer's own.
std::vector<double> metropolis_weights(const GossipTopology& topology, std::uint32_t peer);

// ---- Workload balancing (EdgeGossip's "low performance variation") -------------------------

// Each peer sizes its batch so that one iteration takes about `target_seconds` at the speed
// it measures now (ours; worker/README.md "Balancing"): the wanted batch is examples per
// second × target, clamped to [min_batch, max_batch]; when it differs from the batch held
// by more than a tenth, the batch becomes the nearest size on the ladder base_batch ·
// 2^(k/4) (each batch size has kernels of its own, so a peer keeps to few), clamped the
// same way; the learning rate follows the batch linearly
// (lr = base_lr × batch / base_batch, Goyal et al.'s linear scaling rule), capped at
// max_lr_factor × base_lr. The speed is an exponentially weighted mean of examples per
// second over the iterations (weight `smoothing` for the newest), so it follows a CPU quota
// that changes within a few iterations.
struct BalanceOptions {
  double target_seconds = 0;  // 0: no balancing, every iteration uses base_batch
  int base_batch = 10;
  double base_lr = 0.1;
  int min_batch = 1;
  int max_batch = 256;
  double max_lr_factor = 8;
  double smoothing = 0.3;
};

class WorkloadBalancer {
 public:
  // Throws std::invalid_argument for a bad option (batches out of order, smoothing outside
  // (0, 1], negative target, a learning rate that is negative, or 0 with a target).
  explicit WorkloadBalancer(BalanceOptions options);
  // One iteration trained `examples` in `seconds` of compute.
  void observe(int examples, double seconds);
  int batch() const { return batch_; }
  double learning_rate() const;
  // Examples per second measured so far (0 before the first observation).
  double examples_per_second() const { return rate_; }
  const BalanceOptions& options() const { return options_; }

 private:
  int quantized_batch(double wanted) const;

  BalanceOptions options_;
  double rate_ = 0;
  int batch_;
};

// ---- Accuracy-aware training (EdgeGossip's second feature; ours in detail) ----------------

// Every evaluation of a peer's model on its local validation split is reported here. When
// the accuracy has not improved by more than `min_delta` over the best so far for `patience`
// evaluations in a row (a plateau), the learning rate is halved; after `max_decays` halvings,
// the next plateau stops the peer's training (it keeps serving and averaging its model).
struct PlateauOptions {
  int patience = 5;  // 0: never (accuracy-aware training off)
  double min_delta = 0.002;
  int max_decays = 2;
};

class PlateauDetector {
 public:
  explicit PlateauDetector(PlateauOptions options);
  enum class Verdict { kContinue, kDecay, kStop };
  Verdict report(double accuracy);
  double lr_factor() const { return lr_factor_; }  // 0.5^decays
  bool stopped() const { return stopped_; }
  double best() const { return best_; }
  int decays() const { return decays_; }

 private:
  PlateauOptions options_;
  double best_ = -1;
  int since_best_ = 0, decays_ = 0;
  double lr_factor_ = 1;
  bool stopped_ = false;
};

// ---- The settings both sides have, their one check, and γ's default ------------------------

// γ, the consensus step, when none is given: 1 with dense gossip (D-PSGD's x_i ← Σ_j w_ij x_j)
// and kDefaultCompressedConsensusStep with a publish fraction below 1 (ours, measured in the
// simulator: at publish fraction 0.01 on 8 MLP peers, γ from 0.05 to 0.3 ended within a point
// of each other, 0.5 twenty points lower, 1 at 23%: the published copies lag, and a large step
// applies the same stale difference again every iteration; sim/README.md "Gossip").
inline constexpr double kDefaultCompressedConsensusStep = 0.1;
// The bound on a neighbour's values (check_neighbour_model says why this number).
inline constexpr double kDefaultMaxNeighbourMagnitude = 1e4;
double default_consensus_step(double publish_fraction);

// The settings of gossip training that the peer (GossipPeerConfig) and the simulator
// (sim::GossipConfig) both have, as each uses them. Each side builds this from its own
// configuration and checks it with check_gossip_settings(), then checks what only it has
// (the peer: its topology and checkpoints; the simulator: peers, speed classes, budgets).
struct GossipSettings {
  GossipAlgorithm algorithm = GossipAlgorithm::kDpsgd;
  double publish_fraction = 1;
  double consensus_step = 1;  // γ as used (default_consensus_step() when none was given)
  std::uint32_t wait_steps = 0;
  // Without balancing (target_seconds 0) every step uses base_batch at base_lr.
  BalanceOptions balance;
  PlateauOptions plateau;
  double validation_fraction = 0.05;
  std::uint32_t validate_every = 50;
  // What a peer takes from a neighbour (check_neighbour_model, neighbour_clip_scale).
  double max_neighbour_magnitude = kDefaultMaxNeighbourMagnitude;  // 0: no bound
  double neighbour_clip = 0;                                       // τ; 0: off
};

// Throws std::invalid_argument "gossip: ..." naming the flag (edgetrain-worker --mode gossip
// and edgetrain-sim --mode gossip name them alike) for a setting outside its range or one
// that does not go with the algorithm: a publish fraction below 1 or wait steps with
// AD-PSGD. A learning rate of 0 is allowed without balancing (a run of mixing alone).
void check_gossip_settings(const GossipSettings& settings);

// ---- The step rules: the peer's arithmetic, which the simulator calls as well --------------

// A local SGD step, x ← x − lr·g. A gradient with a value that is not finite (NaN or
// infinite: a diverged model) is not applied: x stays as it is and the step returns false.
bool gossip_local_step(std::span<float> x, std::span<const float> gradient, float lr);

// D-PSGD's mix, x_i ← x_i + γ Σ_j w_ij (x̂_j − x̂_i), over the neighbours whose published copy
// x̂_j of this iteration is at hand (a neighbour skipped leaves its weight with the peer);
// `own` is the peer's own published copy x̂_i (with dense gossip, x_i itself; it must not
// alias x).
//
// Precision: float, one neighbour at a time in the order given (x_i += float(w_ij)·float(γ)
// · (x̂_j − x̂_i)), as the peer has always mixed. The simulator used to sum the neighbours'
// terms in a double accumulator and round once; we keep the peer's float: it is the peer's
// documented behaviour and what runs on the boards, so every real run stays bit for bit what
// it was, and the double buys nothing measurable: the two differ by about one float rounding
// of x per neighbour and iteration (2^-24 relative), orders below what one SGD step moves x,
// and the mix keeps the peers' mean within 1e-6 over 30 iterations either way
// (sim_gossip_test). What changes is the simulator's last bits, once (sim/README.md).
//
// A term with clip_scale below 1 (neighbour_clip_scale) adds w_ij·γ·s·(x̂_j − x̂_i) instead;
// at 1 (the default, and always with --neighbour-clip 0) the floats are those above.
struct MixTerm {
  double weight;                     // w_ij (metropolis_weights)
  std::span<const float> published;  // x̂_j
  double clip_scale = 1;             // s, in (0, 1]
};
void dpsgd_mix(std::span<float> x, std::span<const float> own, std::span<const MixTerm> neighbours,
               double consensus_step);

// ---- What a peer takes from a neighbour (issue 37; worker/README.md "Neighbours") ---------

// A neighbour's model (its published copy as pulled, model delta applied; or the x_j of an
// AD-PSGD answer or average request) is refused, never mixed in, when a value is not finite
// or its magnitude is above `max_magnitude` (ours: honest models stay far below it; 0: no
// bound, non-finite values are still refused). The default, kDefaultMaxNeighbourMagnitude,
// (declared above) is ours, from the honest range measured in the simulator (worker/README.md
// "Neighbours"): on mnist-small at lr 0.1 no value of an honest peer's model ended above 0.51
// (mlp, 8 peers, 1000 iterations, ring, random-regular 4, D-PSGD and AD-PSGD) or 0.36
// (paper-cnn), and 6.2 with mlp at lr 0.8, an lr too large to train well (87 %). 1e4 leaves
// over three orders of magnitude above the largest, while a poisoned model of 1e30 is refused.
enum class NeighbourVerdict { kAccepted, kNonFinite, kTooLarge };
NeighbourVerdict check_neighbour_model(std::span<const float> values, double max_magnitude);
// "non-finite model from a neighbour", "model above the magnitude bound from a neighbour".
const char* neighbour_verdict_reason(NeighbourVerdict verdict);

// Clipped gossip: before a neighbour's term is mixed in, its difference x̂_j − x̂_i is scaled
// down to an L2 norm of at most `clip` (the whole model's norm, in double): the clipped
// gossip step of He, Karimireddy and Jaggi 2022, "Byzantine-robust decentralized learning
// via ClippedGossip". Ours: one fixed τ for every neighbour and iteration (the paper chooses
// τ_i adaptively from the neighbours' distances), applied to D-PSGD's mix (dpsgd_mix through
// MixTerm::clip_scale) and not to AD-PSGD's midpoint. Returns s = min(1, clip / ‖x̂_j − x̂_i‖);
// 1 when clip is 0 (off) or the norm is within it.
double neighbour_clip_scale(std::span<const float> theirs, std::span<const float> own, double clip);

// AD-PSGD's pairwise average (Lian et al. 2018), as the two sides of POST /gossip/average
// compute it. The neighbour that is asked (the responder) answers its x_j and takes
// x_j ← (x_j + x_i)/2 with the x_i it was sent; the peer that asked (the initiator) takes
// x_i ← x_i + (x_j − x_i^sent)/2, which keeps whatever reached x_i since it sent x_i^sent
// (another neighbour's average). Both are at the midpoint up to a rounding.
void adpsgd_answer_average(std::span<float> x, std::span<const float> theirs);
void adpsgd_take_average(std::span<float> x, std::span<const float> sent,
                         std::span<const float> theirs);
// Both sides at once, for an exchange with nothing in between (the simulator's): the
// responder's rule on `responder` with `initiator` as sent, and the initiator's rule on
// `initiator` with the responder's model as it was before.
void adpsgd_exchange(std::span<float> initiator, std::span<float> responder);

}  // namespace edgetrain::runtime
