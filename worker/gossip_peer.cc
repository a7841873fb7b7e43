#include "worker/gossip_peer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <variant>

#include "common/atomic_file.h"
#include "worker/backoff.h"
#include "worker/loop_support.h"
#include "worker/model_replica.h"
#include "model/shard_sampler.h"
#include "common/splitmix64.h"
#include "model/thread_pool.h"
#include "model/trainer.h"
#include "transport/codec.h"
#include "transport/model_changes.h"
#include "transport/untrusted_text.h"

namespace edgetrain::runtime {

namespace {

using loop::Clock;
using loop::payload_text;
using loop::sleep_unless_stopped;
using transport::CoapCode;
using transport::CoapRequest;
using transport::CoapResponse;
using transport::text_response;

constexpr const char* kModelPath = "gossip/model";
constexpr const char* kAveragePath = "gossip/average";
// Metadata keys of a peer's checkpoint (safetensors __metadata__).
constexpr const char* kIterationKey = "edgetrain.gossip.iteration";
constexpr const char* kPeerKey = "edgetrain.gossip.peer";

bool all_finite(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

// "since=V" (the only query GET /gossip/model takes, beside the id=NAME a plain CoAP peer
// declares itself with, which the transport reads); nullopt for none, a string for a bad one.
std::variant<std::optional<std::uint64_t>, std::string> parse_since(const std::string& query) {
  std::optional<std::uint64_t> since;
  for (std::size_t start = 0; start < query.size();) {
    std::size_t end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    const std::string part = query.substr(start, end - start);
    start = end + 1;
    if (part.rfind("id=", 0) == 0) continue;
    if (part.rfind("since=", 0) != 0 || since) return std::string("unknown query (only since=V)");
    const std::string digits = part.substr(6);
    if (digits.empty() || digits.size() > 19 ||
        !std::all_of(digits.begin(), digits.end(), ::isdigit))
      return std::string("since must be a version number");
    since = std::stoull(digits);
  }
  return since;
}

}  // namespace

void check_gossip_peer_config(const GossipPeerConfig& c) {
  if (c.topology.size() == 0) throw std::invalid_argument("gossip: empty topology");
  if (c.self >= c.topology.size())
    throw std::invalid_argument("gossip: peer index " + std::to_string(c.self) +
                                " is not in the topology of " + std::to_string(c.topology.size()));
  if (c.topology.neighbours[c.self].empty())
    throw std::invalid_argument("gossip: peer " + c.topology.peers[c.self].name +
                                " has no neighbours in the topology");
  // What the simulator has too, checked by the one check both use (worker/gossip.h).
  check_gossip_settings({.algorithm = c.algorithm,
                         .publish_fraction = c.publish_fraction,
                         .consensus_step = c.consensus_step,
                         .wait_steps = c.wait_steps,
                         .balance = c.balance,
                         .plateau = c.plateau,
                         .validation_fraction = c.validation_fraction,
                         .validate_every = c.validate_every,
                         .max_neighbour_magnitude = c.max_neighbour_magnitude,
                         .neighbour_clip = c.neighbour_clip});
  if (c.checkpoint_every == 0)
    throw std::invalid_argument("gossip: --checkpoint-every must be at least 1");
  if (!(c.neighbour_wait_seconds >= 0))
    throw std::invalid_argument("gossip: --neighbour-wait must be >= 0");
}

// ---- CoapPeerChannel -------------------------------------------------------------------------

CoapPeerChannel::CoapPeerChannel(const GossipTopology& topology, Options options)
    : topology_(topology), options_(std::move(options)) {}
CoapPeerChannel::~CoapPeerChannel() = default;

CoapResponse CoapPeerChannel::request(std::uint32_t neighbour, transport::Method method,
                                      const std::string& path, std::span<const std::uint8_t> body) {
  return client_for(neighbour).request(method, path, body);
}

transport::CoapDtlsClient& CoapPeerChannel::client_for(std::uint32_t neighbour) {
  std::lock_guard lock(clients_mutex_);
  auto& client = clients_[neighbour];
  if (!client) {
    const std::string& address = topology_.peers.at(neighbour).address;
    const auto colon = address.rfind(':');
    if (address.empty() || colon == std::string::npos || colon == 0)
      throw transport::TransportError("peer " + topology_.peers[neighbour].name +
                                      " has no host:port address in the topology");
    const std::string host = address.substr(0, colon), port_text = address.substr(colon + 1);
    if (port_text.empty() || port_text.size() > 5 ||
        !std::all_of(port_text.begin(), port_text.end(), ::isdigit) || std::stoul(port_text) == 0 ||
        std::stoul(port_text) > 65535)
      throw transport::TransportError("peer " + topology_.peers[neighbour].name +
                                      " has a bad port in " + address);
    transport::CoapDtlsClient::Options o(host, static_cast<std::uint16_t>(std::stoul(port_text)),
                                         {}, options_.timeout_ms);
    o.certificates = options_.certificates;
    if (o.certificates)
      o.expected_peer_name =
          topology_.peers[neighbour].name;  // the neighbour dialled, not any fleet member
    o.plaintext = options_.plaintext;
    if (options_.plaintext) o.psk.identity = options_.declared_identity;
    o.timing = options_.timing;
    o.stop = options_.stop;
    client = std::make_unique<transport::CoapDtlsClient>(std::move(o));
  }
  return *client;
}

// ---- GossipPeer ------------------------------------------------------------------------------

std::vector<std::uint32_t> gossip_shard(const GossipPeerConfig& config, const Dataset& train) {
  return shard_of(train,
                  {config.self, static_cast<std::uint32_t>(config.topology.size()), config.seed},
                  config.label_skewed);
}

struct GossipPeer::State {
  State(GossipPeerConfig c, const Dataset& train, PeerChannel& channel,
        const std::atomic<bool>& stop, std::function<void(const std::string&)> log)
      : config((check_gossip_peer_config(c), std::move(c))),
        channel(channel),
        stop(stop),
        log(std::move(log)),
        model(model_spec_from_argument(config.model)),
        sizes(model.tensor_sizes()),
        layout_id(model.layout_id()),
        pool(config.threads),
        balancer(config.balance),
        plateau(config.plateau),
        random{config.seed ^ (0xd1b54a32d192ed03ULL * (config.self + 1))} {
    const ExampleShape in = model.input_shape();
    if (static_cast<std::uint32_t>(in.H) != train.height ||
        static_cast<std::uint32_t>(in.W) != train.width ||
        static_cast<std::uint32_t>(in.C) != train.channels)
      throw ModelError("gossip: the model's input does not match the data's image shape");
    // A label at or past the model's outputs would index past its logits; user data names
    // its own class count (model/user_data.h).
    if (model.num_classes() < static_cast<int>(train.num_classes))
      throw ModelError("gossip: the model has " + std::to_string(model.num_classes()) +
                       " outputs for the data's " + std::to_string(train.num_classes) + " classes");
    // The shard, with a validation split held out of it (ours: its first indices; the shard
    // is already a seeded shuffle).
    std::vector<std::uint32_t> shard = gossip_shard(config, train);
    const auto held_out =
        static_cast<std::size_t>(config.validation_fraction * static_cast<double>(shard.size()));
    if (config.plateau.patience > 0 && held_out > 0) {
      validation = subset(train, std::span<const std::uint32_t>(shard.data(), held_out));
      shard.erase(shard.begin(), shard.begin() + static_cast<std::ptrdiff_t>(held_out));
    }
    sampler = std::make_unique<ShardSampler>(
        train, std::move(shard), config.seed ^ (0x9e3779b97f4a7c15ULL * (config.self + 1)));
    image_bytes = train.image_bytes();
    input_format = train.format;

    model.initialize(config.seed);
    // Every peer of a fleet initialises from the same seed: a neighbour that has not moved
    // yet holds this model at version 0, and the first pull is a delta from it, not a dense
    // model (1,650 round trips for the paper CNN). A neighbour resumed from a checkpoint
    // answers with a dense model, one with another seed with a delta whose digest fails.
    const std::vector<float> initial(model.parameters().begin(), model.parameters().end());
    if (!config.checkpoint_path.empty() && std::filesystem::exists(config.checkpoint_path)) {
      const auto metadata = model.load_safetensors(config.checkpoint_path);
      const auto it = metadata.find(kIterationKey);
      if (it == metadata.end())
        throw ModelError(config.checkpoint_path +
                         " is not a gossip peer's checkpoint (no iteration)");
      const std::string& text = it->second;
      if (text.empty() || text.size() > 19 || !std::all_of(text.begin(), text.end(), ::isdigit))
        throw ModelError(config.checkpoint_path + ": the iteration '" +
                         transport::escape_untrusted(text, 40) + "' is not a number");
      stats.iteration = stats.resumed_iteration = std::stoull(text);
      if (!all_finite(model.parameters()))
        throw ModelError(config.checkpoint_path + " holds non-finite parameters");
      resumed = true;
    }
    published = std::make_unique<PublishedModel>(
        sizes, model.parameters(), stats.iteration,
        PublishOptions{1, config.publish_fraction, config.publish_min_entries});
    const auto& mine = config.topology.neighbours[config.self];
    weights = metropolis_weights(config.topology, config.self);
    for (std::size_t k = 0; k < mine.size(); ++k) {
      neighbours.push_back(
          Neighbour{mine[k], weights[k], ModelReplica(layout_id, sizes),
                    Backoff(std::chrono::milliseconds(500), std::chrono::milliseconds(30000),
                            config.seed + config.self * 1000 + k)});
      neighbours.back().replica.assume(0, initial);
      stats.neighbours[config.topology.peers[mine[k]].name];  // listed from the start, at 0
    }
    gradient.resize(model.parameter_count());
    snapshot.resize(model.parameter_count());
    stats.batch = balancer.batch();
    stats.learning_rate = balancer.learning_rate();
  }

  void say(const std::string& line) const {
    if (log) log(line);
  }
  void count_refusal(const std::string& reason) { ++stats.refused[reason]; }
  // Counts a model or request of neighbour `name` refused for `reason` (under `mutex`);
  // returns whether it is the neighbour's first refusal (the one that is logged).
  bool count_neighbour_refusal(const std::string& name, const std::string& reason) {
    count_refusal(reason);
    NeighbourStats& n = stats.neighbours[name];
    n.last_refusal = reason;
    return ++n.refused == 1;
  }
  const std::string& name_of(std::uint32_t index) const {
    return config.topology.peers[index].name;
  }
  // What a neighbour sees of `x` (under `mutex`): x itself, or config.outgoing's copy of it.
  std::span<const float> outgoing_view(std::span<const float> x) {
    if (!config.outgoing) return x;
    outgoing_copy.assign(x.begin(), x.end());
    config.outgoing(outgoing_copy);
    return outgoing_copy;
  }

  // The trainer for a batch: XNNPACK's ops are built for one batch size, and a balanced
  // peer's batch moves; kept per size (a peer settles on a few sizes).
  Trainer& trainer_for(int batch) {
    auto found = trainers.find(batch);
    if (found != trainers.end()) return *found->second;
    // A board's memory holds a few: the one used longest ago goes first.
    if (trainers.size() >= 3)
      trainers.erase(trainer_order.front()), trainer_order.erase(trainer_order.begin());
    trainer_order.push_back(batch);
    auto& trainer = trainers[batch] =
        std::make_unique<Trainer>(model, batch, KernelBackend::kXnnpack, pool.get());
    trainer->set_input_format(input_format);
    trainer->set_step_seed(loop::dropout_step_seed(config.seed ^ std::uint64_t(batch), config.self));
    return *trainer;
  }

  GossipPeerConfig config;
  PeerChannel& channel;
  const std::atomic<bool>& stop;
  std::function<void(const std::string&)> log;

  // Everything below `mutex` is shared with the CoAP handlers, which run on the server's thread.
  mutable std::mutex mutex;
  Model model;  // x_i
  std::vector<std::uint32_t> sizes;
  std::uint64_t layout_id;
  std::unique_ptr<PublishedModel> published;  // x̂_i, named by the iteration of its last publish
  std::uint64_t published_digest = 0, published_digest_version = ~0ULL;
  GossipPeerStats stats;

  // The training thread's own.
  ThreadPool pool;
  std::map<int, std::unique_ptr<Trainer>> trainers;
  std::vector<int> trainer_order;  // batch sizes of `trainers`, oldest first
  std::unique_ptr<ShardSampler> sampler;
  std::size_t image_bytes = 0;
  InputFormat input_format;  // the training data's: every trainer_for() takes it
  Dataset validation;
  WorkloadBalancer balancer;
  PlateauDetector plateau;
  SplitMix64 random;
  bool resumed = false;
  std::vector<double> weights;  // Metropolis: per neighbour, then self
  struct Neighbour {
    std::uint32_t index;
    double weight;
    ModelReplica replica;  // its published model, as far as pulled
    Backoff backoff;
    Clock::time_point retry_after{};
  };
  std::vector<Neighbour> neighbours;
  std::vector<float> gradient, snapshot;
  std::vector<float> outgoing_copy;  // config.outgoing's copy of the model (under `mutex`)
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;

  bool is_neighbour(const std::string& identity) const {
    for (const Neighbour& n : neighbours)
      if (config.topology.peers[n.index].name == identity) return true;
    return false;
  }
  // Refuses a request from anyone but a neighbour (403); nullopt when it may go on.
  std::optional<CoapResponse> refuse_stranger(const CoapRequest& request) {
    if (is_neighbour(request.identity)) return std::nullopt;
    std::lock_guard lock(mutex);
    ++stats.requests_refused;
    count_refusal("not a neighbour");
    return text_response(CoapCode::kForbidden,
                         "'" + transport::escape_untrusted(request.identity, 64) +
                             "' is not a neighbour of " + config.topology.peers[config.self].name);
  }

  void local_step();
  void mix_dpsgd();
  void average_adpsgd();
  void validate();
  // What the training thread and the pulls of one D-PSGD iteration tell each other when the
  // peer trains while it waits (config.wait_steps).
  struct PullWait {
    std::mutex mutex;
    std::condition_variable changed;
    std::size_t pending = 0;  // pulls not finished
    std::size_t behind = 0;   // pulls waiting for a neighbour to reach the iteration
    Clock::time_point all_done{};
  };
  // The training thread's: the last step's time, and how long the last iteration's pulls
  // took from the publish (the wait for the neighbours, whatever the peer did meanwhile).
  double last_step_seconds = 0, last_wait_seconds = 0;
  bool pull(Neighbour& n, std::uint64_t wanted_version, PullWait* wait = nullptr);
  std::vector<char> pull_all(const std::vector<Neighbour*>& due, std::uint64_t iteration);
  std::vector<char> pull_all_training_meanwhile(const std::vector<Neighbour*>& due,
                                                std::uint64_t iteration);
  // Backs the neighbour off; says why unless `quiet` (a refusal after its first).
  void neighbour_failed(Neighbour& n, const std::string& why, bool quiet = false);
  // A model of `n` refused: counted, the copy dropped, the neighbour backed off; logged the
  // first time only (the stats file's "neighbours" counts the rest).
  void neighbour_refused(Neighbour& n, const std::string& reason, const std::string& detail);
};

void GossipPeer::State::local_step() {
  if (stats.training_stopped) return;
  const int batch = balancer.batch();
  pixels.resize(static_cast<std::size_t>(batch) * image_bytes);
  labels.resize(static_cast<std::size_t>(batch));
  sampler->next_batch(batch, pixels, labels);
  {
    std::lock_guard lock(mutex);
    std::copy(model.parameters().begin(), model.parameters().end(), snapshot.begin());
  }
  Trainer& trainer =
      trainer_for(batch);  // made before the clock starts: its set-up is not the step's time
  const auto started = Clock::now();
  const BatchResult result =
      trainer.compute_gradient(snapshot, pixels.data(), labels.data(), batch, gradient);
  if (config.slowdown > 0)
    sleep_unless_stopped(
        std::chrono::duration_cast<Clock::duration>((Clock::now() - started) * config.slowdown),
        stop);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  last_step_seconds = seconds;
  const auto lr = static_cast<float>(balancer.learning_rate() * plateau.lr_factor());
  {
    // AD-PSGD applies the gradient to the model as it is now, which an average may have
    // moved since the snapshot (Lian et al. 2018: a gradient computed on a stale model). The
    // handlers read and write the model and the counts on the server's thread.
    std::lock_guard lock(mutex);
    if (!gossip_local_step(model.parameters(), gradient, lr)) {
      count_refusal("non-finite own gradient");
      return;
    }
    stats.steps++;
    stats.examples += static_cast<std::uint64_t>(batch);
    stats.last_loss = result.loss;
    stats.batch = batch;
    stats.learning_rate = lr;
    stats.last_iteration_seconds = seconds;
  }
  balancer.observe(batch, seconds);
  std::lock_guard lock(mutex);
  stats.examples_per_second = balancer.examples_per_second();
}

void GossipPeer::State::neighbour_failed(Neighbour& n, const std::string& why, bool quiet) {
  const auto delay = n.backoff.next_delay();
  n.retry_after = Clock::now() + delay;
  std::lock_guard lock(mutex);
  stats.neighbours_skipped++;
  if (quiet) return;
  say("neighbour " + config.topology.peers[n.index].name + ": " + why + "; skipped for " +
      std::to_string(delay.count()) + " ms");
}

void GossipPeer::State::neighbour_refused(Neighbour& n, const std::string& reason,
                                          const std::string& detail) {
  n.replica = ModelReplica(layout_id, sizes);
  bool first;
  {
    std::lock_guard lock(mutex);
    stats.models_refused++;
    first = count_neighbour_refusal(name_of(n.index), reason);
  }
  neighbour_failed(n,
                   detail + (first ? " (refused; later refusals of this neighbour are counted in "
                                     "the stats file's \"neighbours\", not logged)"
                                   : ""),
                   !first);
}

// Pulls `n`'s published model until it is at `wanted_version` or later, or the wait is over.
// Returns whether the copy held is usable (exact, finite). With `wait`, says there when the
// neighbour is found behind (and when the pull ends), so that the training thread may step.
bool GossipPeer::State::pull(Neighbour& n, std::uint64_t wanted_version, PullWait* wait) {
  const auto give_up =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(config.neighbour_wait_seconds));
  int mismatches = 0;
  bool said_behind = false;
  struct Unsay {
    PullWait* wait;
    bool& said;
    ~Unsay() {
      if (!wait || !said) return;
      {
        std::lock_guard lock(wait->mutex);
        --wait->behind;
      }
      wait->changed.notify_all();
    }
  } unsay{wait, said_behind};
  while (!stop) {
    CoapResponse answer;
    try {
      answer = channel.request(
          n.index, transport::Method::kGet,
          n.replica.exact()
              ? std::string(kModelPath) + "?since=" + std::to_string(n.replica.version())
              : std::string(kModelPath));
    } catch (const transport::TransportError& e) {
      neighbour_failed(n, e.what());
      return false;
    }
    {
      std::lock_guard lock(mutex);
      stats.bytes_received += answer.payload.size();
    }
    if (answer.code != CoapCode::kContent) {
      neighbour_failed(n, "answered " + transport::coap_code_string(answer.code) + " " +
                              payload_text(answer.payload));
      return false;
    }
    try {
      const ModelReplica::PullOutcome outcome = n.replica.take(answer.payload);
      // A delta that did not fit the copy: the copy is dropped and the next pull is dense. A
      // neighbour that answers even that with a delta that does not fit is broken or hostile.
      if (outcome == ModelReplica::PullOutcome::kMismatch) {
        if (++mismatches < 2) continue;
        throw std::runtime_error("two model deltas in a row did not fit (" + n.replica.mismatch() +
                                 ")");
      }
    } catch (const std::exception& e) {
      neighbour_refused(n, "bad model from a neighbour",
                        std::string("sent a model that was refused: ") + e.what());
      return false;
    }
    // Its published copy as it stands with this answer (a model delta applied): refused
    // whole, never mixed in, for a value that is not finite or above the bound.
    const NeighbourVerdict verdict =
        check_neighbour_model(n.replica.parameters(), config.max_neighbour_magnitude);
    if (verdict != NeighbourVerdict::kAccepted) {
      neighbour_refused(n, neighbour_verdict_reason(verdict),
                        verdict == NeighbourVerdict::kNonFinite
                            ? std::string("sent a model with non-finite values")
                            : "sent a model with a value above --max-neighbour-magnitude " +
                                  std::to_string(config.max_neighbour_magnitude));
      return false;
    }
    n.backoff.reset();
    if (n.replica.version() >= wanted_version || Clock::now() >= give_up) return true;
    if (wait && !said_behind) {
      said_behind = true;
      {
        std::lock_guard lock(wait->mutex);
        ++wait->behind;
      }
      wait->changed.notify_all();
    }
    sleep_unless_stopped(std::chrono::milliseconds(20), stop);
  }
  return false;
}

std::vector<char> GossipPeer::State::pull_all(const std::vector<Neighbour*>& due,
                                              std::uint64_t iteration) {
  // A pull is a block-wise transfer, one round trip per block: pulled one after the other,
  // an iteration would wait for the sum of its neighbours' transfers, not the longest.
  std::vector<char> usable(due.size(), 0);
  if (channel.concurrent_neighbours() && due.size() > 1) {
    std::vector<std::thread> pulls;
    std::vector<std::exception_ptr> failures(due.size());
    for (std::size_t k = 1; k < due.size(); ++k)
      pulls.emplace_back([this, &due, &usable, &failures, iteration, k] {
        try {
          usable[k] = pull(*due[k], iteration);
        } catch (...) {
          failures[k] = std::current_exception();  // rethrown on the training thread below
        }
      });
    try {
      usable[0] = pull(*due[0], iteration);
    } catch (...) {
      failures[0] = std::current_exception();
    }
    for (std::thread& t : pulls) t.join();
    for (const std::exception_ptr& failure : failures)
      if (failure) std::rethrow_exception(failure);
  } else {
    for (std::size_t k = 0; k < due.size(); ++k) usable[k] = pull(*due[k], iteration);
  }
  return usable;
}

// The pulls run on their own threads (one per neighbour, or one for all when the channel
// cannot overlap them); while one of them waits for a neighbour that has not reached the
// iteration, the training thread takes local steps, at most config.wait_steps. A step is
// started only if, at the last step's time, it ends within the wait the last iteration had
// (this one's is not known): a peer must not make its own neighbours wait, or the slowest
// peer would take steps too and the fleet's pace would drop (the simulator showed it, 9 %
// slower, before this rule). A peer whose neighbours are ready (the slowest) takes none.
std::vector<char> GossipPeer::State::pull_all_training_meanwhile(const std::vector<Neighbour*>& due,
                                                                 std::uint64_t iteration) {
  std::vector<char> usable(due.size(), 0);
  if (due.empty()) return usable;
  PullWait wait;
  wait.pending = due.size();
  std::vector<std::exception_ptr> failures(due.size());
  auto run = [this, &due, &usable, &failures, &wait, iteration](std::size_t first,
                                                                std::size_t last) {
    for (std::size_t k = first; k < last; ++k) {
      try {
        usable[k] = pull(*due[k], iteration, &wait);
      } catch (...) {
        failures[k] = std::current_exception();  // rethrown on the training thread below
      }
      {
        std::lock_guard lock(wait.mutex);
        if (--wait.pending == 0) wait.all_done = Clock::now();
      }
      wait.changed.notify_all();
    }
  };
  const auto published_at = Clock::now();
  std::vector<std::thread> pulls;
  if (channel.concurrent_neighbours())
    for (std::size_t k = 0; k < due.size(); ++k) pulls.emplace_back(run, k, k + 1);
  else
    pulls.emplace_back(run, 0, due.size());
  auto fits = [&] {
    return std::chrono::duration<double>(Clock::now() - published_at).count() + last_step_seconds <=
           last_wait_seconds;
  };
  std::uint32_t extra = 0;
  std::exception_ptr step_failure;  // rethrown once the pulls are joined
  {
    std::unique_lock lock(wait.mutex);
    while (wait.pending > 0) {
      if (!step_failure && wait.behind > 0 && extra < config.wait_steps && !stop &&
          !stats.training_stopped && fits()) {
        lock.unlock();
        try {
          local_step();
        } catch (...) {
          step_failure = std::current_exception();
        }
        ++extra;
        lock.lock();
        continue;
      }
      wait.changed.wait(lock);
    }
  }
  for (std::thread& t : pulls) t.join();
  if (step_failure) std::rethrow_exception(step_failure);
  last_wait_seconds = std::chrono::duration<double>(wait.all_done - published_at).count();
  if (extra > 0) {
    std::lock_guard lock(mutex);
    stats.wait_steps += extra;
  }
  for (const std::exception_ptr& failure : failures)
    if (failure) std::rethrow_exception(failure);
  return usable;
}

void GossipPeer::State::mix_dpsgd() {
  const std::uint64_t iteration = published->version();
  std::vector<Neighbour*> due;
  for (Neighbour& n : neighbours) {
    if (Clock::now() < n.retry_after) {
      std::lock_guard lock(mutex);
      stats.neighbours_skipped++;
      continue;
    }
    due.push_back(&n);
  }
  const std::vector<char> usable = config.wait_steps > 0
                                       ? pull_all_training_meanwhile(due, iteration)
                                       : pull_all(due, iteration);
  if (!config.mix_neighbours) return;  // pulled for the pace only (GossipPeerConfig::outgoing)
  std::vector<Neighbour*> fresh;
  for (std::size_t k = 0; k < due.size(); ++k)
    if (usable[k]) fresh.push_back(due[k]);
  // x_i += γ Σ_j w_ij (x̂_j − x̂_i); a skipped neighbour's weight stays with the peer itself.
  // With --neighbour-clip, each difference is clipped to τ first (neighbour_clip_scale).
  std::vector<MixTerm> terms;
  std::lock_guard lock(mutex);
  for (const Neighbour* n : fresh) {
    const auto theirs = n->replica.parameters();
    const double scale =
        neighbour_clip_scale(theirs, published->parameters(), config.neighbour_clip);
    terms.push_back({n->weight, theirs, scale});
    NeighbourStats& counts = stats.neighbours[name_of(n->index)];
    counts.mixed++;
    if (scale < 1) counts.clipped++;
  }
  dpsgd_mix(model.parameters(), published->parameters(), terms, config.consensus_step);
  stats.exchanges += terms.size();
}

void GossipPeer::State::average_adpsgd() {
  std::vector<Neighbour*> ready;
  for (Neighbour& n : neighbours)
    if (Clock::now() >= n.retry_after) ready.push_back(&n);
  if (ready.empty()) {
    std::lock_guard lock(mutex);
    stats.neighbours_skipped++;
    return;
  }
  Neighbour& n = *ready[random.next() % ready.size()];
  std::vector<float> sent;
  std::uint64_t iteration;
  {
    std::lock_guard lock(mutex);
    sent.assign(model.parameters().begin(), model.parameters().end());
    iteration = stats.iteration;
  }
  auto body = [&] {
    std::lock_guard lock(mutex);
    return transport::encode_dense_model(layout_id, iteration, sizes, outgoing_view(sent));
  }();
  if (!body) throw std::logic_error("cannot encode the peer's model: " + body.error().message);
  CoapResponse answer;
  try {
    answer = channel.request(n.index, transport::Method::kPost, kAveragePath, body.value());
  } catch (const transport::TransportError& e) {
    neighbour_failed(n, e.what());
    return;
  }
  {
    std::lock_guard lock(mutex);
    stats.bytes_sent += body.value().size();
    stats.bytes_received += answer.payload.size();
  }
  if (answer.code != CoapCode::kChanged) {
    neighbour_failed(n, "answered " + transport::coap_code_string(answer.code));
    return;
  }
  const auto theirs = transport::decode_dense_model(answer.payload, {layout_id, sizes});
  const NeighbourVerdict verdict =
      theirs ? check_neighbour_model(theirs.value().values, config.max_neighbour_magnitude)
             : NeighbourVerdict::kAccepted;
  if (!theirs || verdict != NeighbourVerdict::kAccepted) {
    neighbour_refused(
        n, theirs ? neighbour_verdict_reason(verdict) : "bad model from a neighbour",
        std::string("answered a model that was refused: ") +
            (theirs ? neighbour_verdict_reason(verdict) : theirs.error().message.c_str()));
    return;
  }
  n.backoff.reset();
  if (!config.mix_neighbours) return;
  std::lock_guard lock(mutex);
  stats.neighbours[name_of(n.index)].mixed++;
  // x_i moves by half the difference to what the neighbour had; the neighbour moved by half
  // the difference to what we sent: both at the midpoint, the sum kept, and anything that
  // reached x_i meanwhile (another neighbour's average) kept as well.
  adpsgd_take_average(model.parameters(), sent, theirs.value().values);
  stats.exchanges++;
}

void GossipPeer::State::validate() {
  if (validation.size() == 0 || config.plateau.patience == 0 || stats.training_stopped) return;
  {
    std::lock_guard lock(mutex);
    std::copy(model.parameters().begin(), model.parameters().end(), snapshot.begin());
  }
  const int batch = balancer.options().base_batch;
  Trainer& trainer = trainer_for(batch);
  // batchnorm: the running statistics this peer's steps kept were taken under parameters
  // since mixed with its neighbours'; recomputed for the snapshot, as the simulator's
  // evaluate_parameters does (model/README.md, "Normalization state").
  if (trainer.has_batch_norm()) {
    trainer.begin_normalization_calibration();
    for (std::size_t start = 0; start < validation.size();
         start += static_cast<std::size_t>(batch)) {
      const int count = static_cast<int>(
          std::min<std::size_t>(static_cast<std::size_t>(batch), validation.size() - start));
      trainer.calibrate_normalization(snapshot,
                                      validation.pixels.data() + start * validation.image_bytes(),
                                      validation.labels.data() + start, count);
    }
    trainer.finish_normalization_calibration();
  }
  std::size_t correct = 0;
  for (std::size_t start = 0; start < validation.size(); start += static_cast<std::size_t>(batch)) {
    const int count = static_cast<int>(
        std::min<std::size_t>(static_cast<std::size_t>(batch), validation.size() - start));
    correct += static_cast<std::size_t>(
        trainer
            .evaluate(snapshot, validation.pixels.data() + start * validation.image_bytes(),
                      validation.labels.data() + start, count)
            .correct);
  }
  const double accuracy = static_cast<double>(correct) / static_cast<double>(validation.size());
  const PlateauDetector::Verdict verdict = plateau.report(accuracy);
  std::lock_guard lock(mutex);
  stats.validation_accuracy = accuracy;
  if (verdict == PlateauDetector::Verdict::kDecay)
    say("validation accuracy " + std::to_string(accuracy) + " on a plateau: learning rate x" +
        std::to_string(plateau.lr_factor()));
  if (verdict == PlateauDetector::Verdict::kStop) {
    stats.training_stopped = true;
    say("validation accuracy " + std::to_string(accuracy) +
        " on its last plateau: local training stops (the model is "
        "still served and averaged)");
  }
}

GossipPeer::GossipPeer(GossipPeerConfig config, const Dataset& train, PeerChannel& channel,
                       const std::atomic<bool>& stop, std::function<void(const std::string&)> log)
    : state_(std::make_unique<State>(std::move(config), train, channel, stop, std::move(log))) {
  if (state_->resumed)
    state_->say("resumed from " + state_->config.checkpoint_path + " at iteration " +
                std::to_string(state_->stats.iteration));
}
GossipPeer::~GossipPeer() = default;

CoapResponse GossipPeer::get_model(const CoapRequest& request) {
  State& s = *state_;
  if (auto refused = s.refuse_stranger(request)) return *refused;
  const auto since = parse_since(request.query);
  std::lock_guard lock(s.mutex);
  if (const auto* problem = std::get_if<std::string>(&since)) {
    ++s.stats.requests_refused;
    s.count_refusal("bad query");
    return text_response(CoapCode::kBadRequest, "bad query: " + *problem);
  }
  const PublishedModel& p = *s.published;
  if (s.published_digest_version != p.version()) {
    s.published_digest = transport::parameter_digest(p.parameters());
    s.published_digest_version = p.version();
  }
  std::vector<std::uint8_t> bytes;
  if (const auto v = std::get<std::optional<std::uint64_t>>(since)) {
    const transport::ChangeRecord record{s.layout_id,       s.sizes,     p.parameters(),
                                         p.last_changed(),  p.version(), p.changes_known_since(),
                                         s.published_digest};
    if (auto delta = transport::encode_changes_since(record, *v)) bytes = std::move(*delta);
  }
  if (bytes.empty()) {
    auto dense = transport::encode_dense_model(s.layout_id, p.version(), s.sizes, p.parameters());
    if (!dense)
      return text_response(CoapCode::kInternalServerError,
                           "cannot encode the model: " + dense.error().message);
    bytes = std::move(dense).value();
  }
  s.stats.bytes_sent += bytes.size();
  return {CoapCode::kContent, std::move(bytes), p.version()};
}

CoapResponse GossipPeer::post_average(const CoapRequest& request) {
  State& s = *state_;
  if (auto refused = s.refuse_stranger(request)) return *refused;
  auto refuse = [&](const std::string& reason, const std::string& detail) {
    std::lock_guard lock(s.mutex);
    ++s.stats.requests_refused;
    if (s.count_neighbour_refusal(request.identity, reason))
      s.say("neighbour " + request.identity + ": an average request refused (" + reason +
            "; later refusals of this neighbour are counted in the stats file's "
            "\"neighbours\", not logged)");
    return text_response(CoapCode::kBadRequest, reason + ": " + detail);
  };
  if (s.config.algorithm != GossipAlgorithm::kAdpsgd)
    return text_response(CoapCode::kMethodNotAllowed,
                         "this peer runs d-psgd: it averages by pulling, not by POST");
  const auto theirs = transport::decode_dense_model(request.payload, {s.layout_id, s.sizes});
  if (!theirs) return refuse("bad model", theirs.error().message);
  const NeighbourVerdict verdict =
      check_neighbour_model(theirs.value().values, s.config.max_neighbour_magnitude);
  if (verdict == NeighbourVerdict::kNonFinite)
    return refuse("non-finite model", "a value is NaN or infinite");
  if (verdict == NeighbourVerdict::kTooLarge)
    return refuse(
        "model above the magnitude bound",
        "a value's magnitude is above " + std::to_string(s.config.max_neighbour_magnitude));
  std::lock_guard lock(s.mutex);
  auto x = s.model.parameters();
  auto mine =
      transport::encode_dense_model(s.layout_id, s.stats.iteration, s.sizes, s.outgoing_view(x));
  if (!mine)
    return text_response(CoapCode::kInternalServerError,
                         "cannot encode the model: " + mine.error().message);
  if (s.config.mix_neighbours) {
    s.stats.neighbours[request.identity].mixed++;
    adpsgd_answer_average(x, theirs.value().values);
    s.stats.exchanges++;
  }
  s.stats.bytes_received += request.payload.size();
  s.stats.bytes_sent += mine.value().size();
  return {CoapCode::kChanged, std::move(mine).value()};
}

void GossipPeer::attach(transport::CoapDtlsServer& server) {
  server.add_resource(kModelPath, transport::Method::kGet,
                      [this](const CoapRequest& r) { return get_model(r); });
  server.add_resource(kAveragePath, transport::Method::kPost,
                      [this](const CoapRequest& r) { return post_average(r); });
}

void GossipPeer::iterate() {
  State& s = *state_;
  s.local_step();
  {
    std::lock_guard lock(s.mutex);
    s.stats.iteration++;
    // D-PSGD's neighbours read x̂ at this iteration; AD-PSGD serves it too (for evaluation
    // tools and a neighbour's first look), dense.
    s.published->advance(s.outgoing_view(s.model.parameters()), s.stats.iteration);
  }
  if (s.config.algorithm == GossipAlgorithm::kDpsgd)
    s.mix_dpsgd();
  else
    s.average_adpsgd();
  if (s.stats.iteration % s.config.validate_every == 0) s.validate();
  if (!s.config.checkpoint_path.empty() && s.stats.iteration % s.config.checkpoint_every == 0)
    checkpoint();
}

GossipPeerStats GossipPeer::run(const std::function<void(const GossipPeerStats&)>& progress) {
  State& s = *state_;
  const auto started = Clock::now();
  const std::uint64_t first = s.stats.iteration;
  while (!s.stop) {
    if (s.config.max_iterations > 0 && s.stats.iteration >= s.config.max_iterations) break;
    if (s.config.max_seconds > 0 &&
        std::chrono::duration<double>(Clock::now() - started).count() >= s.config.max_seconds)
      break;
    iterate();
    if (progress) progress(stats());
  }
  if (!s.config.checkpoint_path.empty() && s.stats.iteration > first) checkpoint();
  return stats();
}

void GossipPeer::checkpoint() {
  State& s = *state_;
  std::vector<std::uint8_t> bytes;
  {
    std::lock_guard lock(s.mutex);
    bytes = s.model.safetensors_bytes({{kIterationKey, std::to_string(s.stats.iteration)},
                                       {kPeerKey, s.config.topology.peers[s.config.self].name}});
  }
  common::write_file_atomically(
      s.config.checkpoint_path,
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

GossipPeerStats GossipPeer::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

std::vector<float> GossipPeer::parameters() const {
  std::lock_guard lock(state_->mutex);
  return {state_->model.parameters().begin(), state_->model.parameters().end()};
}

}  // namespace edgetrain::runtime
