// The peer mode of edgetrain-worker (--mode gossip; worker/README.md "Gossip"): training
// without a server. Every peer is a CoAP/DTLS server and a client at once. It serves its
// published model (model/published_model.h) at GET /gossip/model[?since=V] — the model
// delta since the version a neighbour holds, with its digest, as the parameter server serves
// its own (transport/model_changes.h) — and takes pairwise averages at POST /gossip/average.
// Only the topology's neighbours of a peer may call it: their identity is their certificate's
// CN (or, with --insecure, a declared name), checked against the topology file.
//
// Two algorithms (Lian et al. 2017 and 2018):
//   D-PSGD  every iteration: one local SGD step; publish; pull every neighbour's published
//           model of this iteration (waiting up to neighbour_wait_seconds for a neighbour that
//           is behind: a local barrier), then x_i ← x_i + γ Σ_j w_ij (x̂_j − x̂_i) with
//           Metropolis weights. Dense (publish fraction 1, γ = 1) that is x_i ← Σ_j w_ij x_j;
//           compressed (fraction < 1), x̂ follows x by top-|x − x̂| steps whose left-out part
//           waits for later steps (CHOCO-SGD's public copies with error feedback).
//   AD-PSGD every iteration: one local SGD step, then an atomic pairwise average with one
//           random neighbour (POST /gossip/average carries x_i; the neighbour answers its x_j
//           and both move to the midpoint), no barrier. Dense only.
// A neighbour that does not answer is skipped and retried after a backoff that doubles per
// failure (worker/backoff.h); a model that does not decode, is not finite, or is of another
// layout is refused and counted, never averaged in.
//
// Balancing (worker/gossip.h WorkloadBalancer) sizes each iteration's batch to a target
// time from the speed measured now; with wait_steps a D-PSGD peer also trains while a
// neighbour it pulls is behind, instead of idling at the barrier; accuracy-aware training
// (PlateauDetector) evaluates the model on a validation split held out of the peer's shard, halves
// the learning rate on a plateau and stops local steps on the last one (the peer keeps serving and
// averaging). The model and its iteration are checkpointed (safetensors) and resumed after a kill.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/dataset.h"
#include "worker/gossip.h"
#include "model/model.h"
#include "model/published_model.h"
#include "transport/coap_dtls.h"

namespace edgetrain::runtime {

struct GossipPeerConfig {
  std::string model = "paper-cnn";
  GossipTopology topology;
  std::uint32_t self = 0;  // this peer's index in the topology; its shard number too
  GossipAlgorithm algorithm = GossipAlgorithm::kDpsgd;
  bool label_skewed = false;
  std::uint64_t seed = 1;  // the same on every peer: the same initial model and shards
  int threads = 1;
  // With balance.target_seconds 0 every step uses balance.base_batch at balance.base_lr.
  BalanceOptions balance;
  PlateauOptions plateau{.patience = 0};
  double validation_fraction = 0.05;  // of the shard, held out for accuracy-aware training
  std::uint32_t validate_every = 50;  // iterations between validations (with plateau.patience > 0)
  // Compressed gossip: the share of each tensor's entries a publish step copies (1: dense).
  double publish_fraction = 1;
  std::uint32_t publish_min_entries = 32;
  double consensus_step = 1;          // γ
  double neighbour_wait_seconds = 5;  // D-PSGD: how long to wait for a neighbour that is behind
  // D-PSGD: at most this many more local steps per iteration, taken while a neighbour this
  // peer pulls is behind, each only if it ends within the last iteration's wait (ours: a
  // fast peer trains instead of idling at the barrier; 0: off).
  std::uint32_t wait_steps = 0;
  // What this peer takes from a neighbour (worker/gossip.h check_neighbour_model and
  // neighbour_clip_scale): a model with a value above this magnitude is refused (0: no bound;
  // non-finite values are always refused), and with neighbour_clip > 0 (D-PSGD) each
  // neighbour's difference is clipped to that L2 norm before the mix.
  double max_neighbour_magnitude = kDefaultMaxNeighbourMagnitude;
  double neighbour_clip = 0;
  // For experiments only: edgetrain-gossip-attacker (a host program) sets these, edgetrain-worker
  // never does. `outgoing` rewrites a copy of every model this peer lets a neighbour see
  // (its published copy, D-PSGD; the models it posts and answers, AD-PSGD); with
  // mix_neighbours false the peer still pulls from (or averages with) its neighbours, so it keeps
  // the fleet's pace, but never moves its own model toward theirs.
  std::function<void(std::span<float>)> outgoing;
  bool mix_neighbours = true;
  std::uint64_t max_iterations = 0;     // 0: until stopped
  double max_seconds = 0;               // 0: until stopped
  double slowdown = 0;                  // sleep this many times each step's compute time
  std::string checkpoint_path;          // empty: no checkpoints
  std::uint32_t checkpoint_every = 20;  // iterations
};

// Throws std::invalid_argument naming what is wrong.
void check_gossip_peer_config(const GossipPeerConfig& config);

// The examples the peer `config.self` trains on, its validation split included: its shard
// (shard_of(), model/dataset.h) as the topology's peer `self` of all of them. edgetrain-worker
// loads only their images (load_dataset_part).
std::vector<std::uint32_t> gossip_shard(const GossipPeerConfig& config, const Dataset& train);

// What this peer took and refused of one neighbour (the stats file's "neighbours").
struct NeighbourStats {
  std::uint64_t mixed = 0;    // models mixed in (D-PSGD) or averages done with it (AD-PSGD)
  std::uint64_t refused = 0;  // its models or average requests refused (bound, non-finite, bad)
  std::uint64_t clipped = 0;  // D-PSGD: its difference clipped to --neighbour-clip
  std::string last_refusal;   // why it was last refused (empty: never)
};

struct GossipPeerStats {
  std::uint64_t iteration = 0;  // local iterations done (resumed from a checkpoint)
  std::uint64_t resumed_iteration =
      0;                         // the checkpoint's iteration this run started from (0: none)
  std::uint64_t steps = 0;       // local SGD steps trained in this run
  std::uint64_t wait_steps = 0;  // ... of which taken while waiting for a neighbour (wait_steps)
  std::uint64_t examples = 0;    // examples trained in this run
  std::uint64_t exchanges = 0;   // neighbour models mixed in (D-PSGD) or averages done (AD-PSGD)
  std::uint64_t neighbours_skipped = 0;  // unreachable, in backoff, or behind after the wait
  std::uint64_t models_refused = 0;      // from neighbours: undecodable, wrong layout, not finite
  std::uint64_t requests_refused = 0;    // to this peer: not a neighbour, bad query, bad body
  std::uint64_t bytes_sent = 0;  // payloads this peer sent (answers it served, bodies it posted)
  std::uint64_t bytes_received = 0;  // payloads it received
  int batch = 0;                     // the batch of the last iteration
  double learning_rate = 0;
  double examples_per_second = 0;
  double last_iteration_seconds = 0;  // compute of the last iteration (with slowdown)
  double validation_accuracy = -1;    // last validation, -1 before any
  bool training_stopped = false;      // accuracy-aware stop
  float last_loss = 0;
  std::map<std::string, std::uint64_t> refused;      // by reason, both directions
  std::map<std::string, NeighbourStats> neighbours;  // by neighbour name, every neighbour
};

// What a peer needs of its neighbours; the CoAP/DTLS one is CoapPeerChannel, tests use fakes.
class PeerChannel {
 public:
  virtual ~PeerChannel() = default;
  // Throws transport::TransportError when no answer came.
  virtual transport::CoapResponse request(std::uint32_t neighbour, transport::Method method,
                                          const std::string& path,
                                          std::span<const std::uint8_t> body = {}) = 0;
  // Whether requests to different neighbours may run at once, from different threads (then
  // a D-PSGD iteration pulls all its neighbours in parallel). Requests to one neighbour
  // never overlap.
  virtual bool concurrent_neighbours() const { return false; }
};

class CoapPeerChannel : public PeerChannel {
 public:
  struct Options {
    std::optional<transport::CertificateFiles> certificates;
    bool plaintext = false;
    std::string declared_identity;  // plaintext: declared with every request
    transport::CoapTiming timing = transport::CoapTiming::wan();
    int timeout_ms = 10000;
    const std::atomic<bool>* stop = nullptr;
  };
  // Clients are made on first use from each neighbour's topology address ("host:port").
  CoapPeerChannel(const GossipTopology& topology, Options options);
  ~CoapPeerChannel() override;
  transport::CoapResponse request(std::uint32_t neighbour, transport::Method method,
                                  const std::string& path,
                                  std::span<const std::uint8_t> body) override;
  // One client (its own libcoap context and DTLS session) per neighbour.
  bool concurrent_neighbours() const override { return true; }

 private:
  transport::CoapDtlsClient& client_for(std::uint32_t neighbour);

  const GossipTopology& topology_;
  Options options_;
  std::mutex clients_mutex_;  // guards the map; each client is used by one thread at a time
  std::map<std::uint32_t, std::unique_ptr<transport::CoapDtlsClient>> clients_;
};

class GossipPeer {
 public:
  // Loads the checkpoint if there is one (its iteration is resumed), else initialises the
  // model from the seed. Throws std::invalid_argument (config), ModelError (model vs data or
  // checkpoint). `train`, `channel` and `stop` must outlive the peer.
  GossipPeer(GossipPeerConfig config, const Dataset& train, PeerChannel& channel,
             const std::atomic<bool>& stop, std::function<void(const std::string&)> log = {});
  ~GossipPeer();
  GossipPeer(const GossipPeer&) = delete;
  GossipPeer& operator=(const GossipPeer&) = delete;

  // The handlers of this peer's resources, for a CoapDtlsServer (attach()) or direct calls.
  // Safe to call from another thread than the one running iterations.
  transport::CoapResponse get_model(const transport::CoapRequest& request);
  transport::CoapResponse post_average(const transport::CoapRequest& request);
  void attach(transport::CoapDtlsServer& server);

  // One iteration: local step (unless stopped by accuracy-aware training), publish, mix.
  void iterate();
  // iterate() until stop, max_iterations or max_seconds; `progress` after every iteration.
  GossipPeerStats run(const std::function<void(const GossipPeerStats&)>& progress = {});
  // Writes the checkpoint now (also done every checkpoint_every iterations and by run() at its
  // end).
  void checkpoint();
  GossipPeerStats stats() const;
  // A copy of the model now.
  std::vector<float> parameters() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace edgetrain::runtime
