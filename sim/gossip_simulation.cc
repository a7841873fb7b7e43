#include "sim/gossip_simulation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <queue>
#include <sstream>
#include <stdexcept>

#include "model/published_model.h"
#include "model/shard_sampler.h"
#include "model/thread_pool.h"
#include "sim/sim_internal.h"
#include "transport/codec.h"
#include "transport/model_changes.h"

namespace edgetrain::sim {
namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) parts.push_back(part);
  return parts;
}

// A whole-string number, or nullopt.
std::optional<double> parse_number(const std::string& text) {
  try {
    std::size_t used = 0;
    const double value = std::stod(text, &used);
    if (used != text.size() || !std::isfinite(value)) return std::nullopt;
    return value;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// XNNPACK's operators are built for a trainer's max batch and pad smaller batches to it, so
// one trainer per batch size in use keeps a balanced peer's small batches cheap. The
// balancer keeps to a ladder of sizes (base · 2^(k/4), with hysteresis: worker/gossip.h),
// so a fleet uses a handful of sizes, and the trainers are shared by all peers (ours; each
// holds its activations; the real peer keeps at most three of its own).
class TrainerCache {
 public:
  TrainerCache(const runtime::Model& model, runtime::KernelBackend kernels, pthreadpool_t pool,
               const runtime::InputFormat& format)
      : model_(model), kernels_(kernels), pool_(pool), format_(format) {}

  runtime::Trainer& for_batch(int batch) {
    auto& trainer = trainers_[batch];
    if (!trainer) {
      trainer = std::make_unique<runtime::Trainer>(model_, batch, kernels_, pool_);
      trainer->set_input_format(format_);
    }
    return *trainer;
  }

 private:
  const runtime::Model& model_;
  runtime::KernelBackend kernels_;
  pthreadpool_t pool_;
  runtime::InputFormat format_;  // the training data's
  std::map<int, std::unique_ptr<runtime::Trainer>> trainers_;
};

struct Peer {
  Peer(std::vector<float> start, runtime::ShardSampler shard, std::vector<std::uint32_t> held_out,
       Random draws, runtime::PlateauDetector plateau_rule)
      : model(std::move(start)),
        sampler(std::move(shard)),
        validation(std::move(held_out)),
        random(draws),
        plateau(plateau_rule),
        gradient(model.size()) {}

  std::vector<float> model;
  runtime::ShardSampler sampler;
  std::vector<std::uint32_t> validation;  // held out of the shard (accuracy-aware training)
  Random random;                          // its jitter and its choice of neighbour
  std::optional<runtime::WorkloadBalancer> balancer;
  runtime::PlateauDetector plateau;
  std::optional<runtime::PublishedModel> published;  // compressed gossip
  std::uint32_t speed_class = 0;
  double clock = 0;  // when its last iteration ended
  std::uint64_t iterations = 0, steps = 0, examples = 0;
  double compute_time = 0, wait_time = 0;
  double last_wait = 0;  // D-PSGD: how long its last iteration waited for its neighbours
  bool stopped = false;
  bool malicious = false;       // GossipConfig::malicious_peers
  std::vector<float> poisoned;  // a malicious peer's published model (attack applied)
  std::uint64_t bytes_sent = 0;
  // The step in progress: its gradient, computed on the model at the step's start, and what
  // apply_step() needs (AD-PSGD applies it at the step's end, to the model as it is then).
  std::vector<float> gradient;
  float pending_lr = 0;
  int pending_batch = 0;
  double pending_seconds = 0;
};

class GossipSimulation {
 public:
  GossipSimulation(const GossipConfig& config, const runtime::Dataset& train,
                   const runtime::Dataset& test);
  void run_dpsgd(GossipResult& result, const GossipProgressCallback& progress);
  void run_adpsgd(GossipResult& result, const GossipProgressCallback& progress);
  void finish(GossipResult& result);

 private:
  int batch_of(const Peer& peer) const {
    return peer.balancer ? peer.balancer->batch() : config_.batch;
  }
  float lr_of(const Peer& peer) const {
    const double base = peer.balancer ? peer.balancer->learning_rate() : config_.learning_rate;
    return static_cast<float>(base * peer.plateau.lr_factor());
  }
  // The class's relative speed at `time`: its budget times the last scheduled factor.
  double class_speed(std::uint32_t speed_class, double time) const;
  // Mean compute time of `examples` training examples (fewer for forward-only work) for
  // this peer's class at `time`, before jitter.
  double compute_time(const Peer& peer, double examples, double time) const;
  // Computes peer's gradient for one minibatch on its model into peer.gradient and returns
  // the step's compute time; the learning rate, batch and time wait in the peer for
  // apply_step().
  double compute_step(Peer& peer, double start);
  void apply_step(Peer& peer);
  // Validation and the plateau rule after an iteration; returns its compute time.
  double maybe_validate(Peer& peer, double start, GossipResult& result);
  void evaluate(GossipResult& result, double time, double mean_iterations);
  std::uint64_t total_bytes() const;

  const GossipConfig& config_;
  const runtime::Dataset& train_;
  const runtime::Dataset& test_;
  runtime::Model model_;
  std::vector<std::uint32_t> tensor_sizes_;
  runtime::GossipTopology topology_;
  std::vector<std::vector<double>> weights_;  // Metropolis, per neighbour then self
  double gamma_;
  bool compressed_;
  std::uint64_t dense_bytes_;
  double fastest_budget_ = 1;
  runtime::ThreadPool pool_;
  TrainerCache trainers_;
  runtime::Trainer evaluator_;
  std::vector<std::uint8_t> pixels_;
  std::vector<std::int32_t> labels_;
  std::vector<Peer> peers_;
  std::size_t eval_count_;
  std::vector<float> average_;                   // scratch: the consensus model
  std::size_t honest_ = 0;                       // peers not malicious
  std::size_t bias_offset_ = 0, bias_size_ = 0;  // the output layer's bias (the bias attack)
  // A malicious peer's poisoned copy of `from` (the model it publishes or sends).
  std::span<const float> poison(Peer& peer, std::span<const float> from);
  // Whether an honest peer takes `theirs` (runtime::check_neighbour_model), counted if not.
  bool takes(std::span<const float> theirs, GossipResult& result) const;
};

std::span<const float> GossipSimulation::poison(Peer& peer, std::span<const float> from) {
  peer.poisoned.assign(from.begin(), from.end());
  apply_model_attack(config_.attack, peer.poisoned, {bias_offset_, bias_size_});
  return peer.poisoned;
}

bool GossipSimulation::takes(std::span<const float> theirs, GossipResult& result) const {
  if (runtime::check_neighbour_model(theirs, config_.max_neighbour_magnitude) ==
      runtime::NeighbourVerdict::kAccepted)
    return true;
  result.neighbour_models_refused++;
  return false;
}

runtime::GossipTopology topology_for(const GossipConfig& c) {
  if (c.topology) return *c.topology;
  return runtime::make_topology(c.topology_kind, static_cast<std::uint32_t>(c.peers), c.degree,
                                c.seed);
}

GossipSimulation::GossipSimulation(const GossipConfig& config, const runtime::Dataset& train,
                                   const runtime::Dataset& test)
    : config_(config),
      train_(train),
      test_(test),
      model_(checked_model(config.model, config.peers, config.seed, train, test)),
      tensor_sizes_(model_.tensor_sizes()),
      topology_(topology_for(config)),
      gamma_(config.effective_consensus_step()),
      compressed_(config.publish_fraction < 1),
      dense_bytes_(transport::dense_model_bytes(tensor_sizes_)),
      pool_(config.threads),
      trainers_(model_, config.kernels, pool_.get(), train.format),
      evaluator_(model_, 100, config.kernels, pool_.get()) {
  for (std::uint32_t i = 0; i < topology_.size(); ++i)
    weights_.push_back(runtime::metropolis_weights(topology_, i));
  if (!config.speed_classes.empty())
    fastest_budget_ = *std::max_element(config.speed_classes.begin(), config.speed_classes.end());
  const int max_batch =
      config.balance_target > 0 ? std::max(config.balance_max_batch, config.batch) : config.batch;
  pixels_.resize(static_cast<std::size_t>(max_batch) * train.image_bytes());
  labels_.resize(static_cast<std::size_t>(max_batch));
  // The settings the real peer has too: the balancer's and the plateau rule's options.
  const runtime::GossipSettings shared = config.settings();
  runtime::PublishOptions publish;
  publish.every = 1;
  publish.fraction = config.publish_fraction;
  publish.min_entries = config.publish_min_entries;
  peers_.reserve(static_cast<std::size_t>(config.peers));
  for (int i = 0; i < config.peers; ++i) {
    std::vector<std::uint32_t> shard =
        worker_shard(train, i, config.peers, config.seed, config.label_skewed, config.skew);
    std::vector<std::uint32_t> validation;
    if (config.plateau_patience > 0) {
      if (shard.size() < 2)
        throw std::invalid_argument(
            "gossip: a peer's shard is too small to hold out a validation split");
      // The shard is in seeded random order: its tail is as good a sample as any.
      const auto held = std::clamp<std::size_t>(
          static_cast<std::size_t>(
              std::ceil(config.validation_fraction * static_cast<double>(shard.size()))),
          1, shard.size() - 1);
      validation.assign(shard.end() - static_cast<std::ptrdiff_t>(held), shard.end());
      shard.resize(shard.size() - held);
    }
    std::vector<float> start(model_.parameters().begin(), model_.parameters().end());
    if (config.distinct_initialisation && i > 0) {
      runtime::Model other(model_.spec());
      other.initialize(config.seed + static_cast<std::uint64_t>(i));
      start.assign(other.parameters().begin(), other.parameters().end());
    }
    Peer peer(
        std::move(start),
        runtime::ShardSampler(train, std::move(shard),
                              config.seed + 1000003ULL * static_cast<std::uint64_t>(i + 1)),
        std::move(validation),
        Random(config.seed * 0x9E3779B97F4A7C15ULL + 7919ULL * static_cast<std::uint64_t>(i + 1)),
        runtime::PlateauDetector(shared.plateau));
    if (config.balance_target > 0) peer.balancer.emplace(shared.balance);
    if (compressed_) peer.published.emplace(tensor_sizes_, peer.model, 0, publish);
    peer.malicious = i < config.malicious_peers;
    peer.speed_class = config.speed_classes.empty()
                           ? 0
                           : static_cast<std::uint32_t>(i) % config.speed_classes.size();
    peers_.push_back(std::move(peer));
  }
  eval_count_ = config.eval_examples ? std::min(config.eval_examples, test.size()) : test.size();
  average_.resize(model_.parameter_count());
  honest_ = peers_.size() - static_cast<std::size_t>(config.malicious_peers);
  std::tie(bias_offset_, bias_size_) = output_bias_range(model_);
}

double GossipSimulation::class_speed(std::uint32_t speed_class, double time) const {
  double speed = config_.speed_classes.empty() ? 1.0 : config_.speed_classes[speed_class];
  double factor = 1, since = -1;
  for (const SpeedChange& change : config_.speed_schedule)
    if (change.speed_class == speed_class && change.at <= time && change.at >= since) {
      factor = change.factor;
      since = change.at;
    }
  return speed * factor;
}

double GossipSimulation::compute_time(const Peer& peer, double examples, double time) const {
  return examples / config_.batch * fastest_budget_ / class_speed(peer.speed_class, time);
}

double GossipSimulation::compute_step(Peer& peer, double start) {
  const int batch = batch_of(peer);
  peer.pending_batch = batch;
  peer.pending_lr = lr_of(peer);
  peer.sampler.next_batch(batch, pixels_, labels_);
  trainers_.for_batch(batch).compute_gradient(peer.model, pixels_.data(), labels_.data(), batch,
                                              peer.gradient);
  const double seconds =
      compute_time(peer, batch, start) * peer.random.log_normal(config_.step_jitter);
  peer.pending_seconds = seconds;
  return seconds;
}

void GossipSimulation::apply_step(Peer& peer) {
  // Counted when the step is done: an AD-PSGD step still computing at the end is not. Its
  // compute time is spent whether or not its gradient is applied.
  peer.compute_time += peer.pending_seconds;
  peer.steps++;
  peer.examples += static_cast<std::uint64_t>(peer.pending_batch);
  // The real peer's step: a gradient that is not finite is skipped, and the balancer then
  // observes nothing (it would otherwise learn from a step that did not happen).
  if (runtime::gossip_local_step(peer.model, peer.gradient, peer.pending_lr) && peer.balancer)
    peer.balancer->observe(peer.pending_batch, peer.pending_seconds);
}

double GossipSimulation::maybe_validate(Peer& peer, double start, GossipResult& result) {
  if (config_.plateau_patience == 0 || peer.stopped ||
      peer.iterations % config_.validate_every != 0)
    return 0;
  const TestScore score = evaluate_parameters(evaluator_, peer.model, train_, peer.validation);
  result.validations++;
  switch (peer.plateau.report(score.accuracy)) {
    case runtime::PlateauDetector::Verdict::kDecay:
      result.lr_decays++;
      break;
    case runtime::PlateauDetector::Verdict::kStop:
      peer.stopped = true;
      result.peers_stopped++;
      break;
    case runtime::PlateauDetector::Verdict::kContinue:
      break;
  }
  const double seconds =
      compute_time(peer, kForwardShareOfStep * static_cast<double>(peer.validation.size()), start);
  peer.compute_time += seconds;
  return seconds;
}

std::uint64_t GossipSimulation::total_bytes() const {
  std::uint64_t sum = 0;
  for (const Peer& p : peers_) sum += p.bytes_sent;
  return sum;
}

void GossipSimulation::evaluate(GossipResult& result, double time, double mean_iterations) {
  GossipEvalPoint point;
  point.time = time;
  point.mean_iterations = mean_iterations;
  point.bytes_per_peer = static_cast<double>(total_bytes()) / static_cast<double>(peers_.size());
  point.min_accuracy = 1;
  std::vector<double> sum(average_.size(), 0.0);
  const auto honest = static_cast<double>(honest_);
  for (const Peer& p : peers_) {
    if (p.malicious) continue;  // the honest peers' accuracy and consensus
    const TestScore score = evaluate_parameters(evaluator_, p.model, test_, eval_count_);
    point.mean_accuracy += score.accuracy / honest;
    point.mean_loss += score.loss / honest;
    point.min_accuracy = std::min(point.min_accuracy, score.accuracy);
    point.max_accuracy = std::max(point.max_accuracy, score.accuracy);
    point.local_steps += p.steps;
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += p.model[k];
  }
  for (std::size_t k = 0; k < sum.size(); ++k) average_[k] = static_cast<float>(sum[k] / honest);
  const TestScore consensus = evaluate_parameters(evaluator_, average_, test_, eval_count_);
  point.consensus_accuracy = consensus.accuracy;
  point.consensus_loss = consensus.loss;
  result.curve.push_back(point);
}

// D-PSGD in lockstep over iterations (gossip_simulation.h says why that is exact).
void GossipSimulation::run_dpsgd(GossipResult& result, const GossipProgressCallback& progress) {
  const std::size_t n = peers_.size(), size = model_.parameter_count();
  // Dense mixing reads every peer's model of this iteration: the new models go here first.
  std::vector<std::vector<float>> mixed(compressed_ ? 0 : n, std::vector<float>(size));
  std::vector<double> finished(n, 0.0);
  evaluate(result, 0, 0);
  for (std::uint64_t t = 1;; ++t) {
    // Local barrier: start when this peer and all its neighbours finished iteration t − 1.
    for (std::size_t i = 0; i < n; ++i) finished[i] = peers_[i].clock;
    for (std::size_t i = 0; i < n; ++i) {
      Peer& peer = peers_[i];
      double start = finished[i];
      for (std::uint32_t j : topology_.neighbours[i]) start = std::max(start, finished[j]);
      // Steps while waiting (wait_steps), the real peer's rule: a step is started only if,
      // at its mean time, it ends within the wait the last iteration had (the peer does not
      // know this one's); on the model as it is after the last mix, as the real peer's extra
      // steps are, which it takes between its publish and its mix.
      double ready = finished[i];
      for (std::uint32_t extra = 0; extra < config_.wait_steps && !peer.stopped; ++extra) {
        if (ready - finished[i] + compute_time(peer, batch_of(peer), ready) > peer.last_wait) break;
        ready += compute_step(peer, ready);
        apply_step(peer);
      }
      peer.last_wait = start - finished[i];
      peer.wait_time += std::max(0.0, start - ready);
      start = std::max(start, ready);
      double busy = 0;
      if (peer.stopped) {
        result.skipped_steps++;
      } else {
        busy = compute_step(peer, start);
        apply_step(peer);
      }
      peer.iterations++;
      busy += maybe_validate(peer, start + busy, result);
      peer.clock = start + busy;
    }
    // Publish, and count what each neighbour reads of it.
    for (std::size_t i = 0; i < n; ++i) {
      Peer& peer = peers_[i];
      const auto readers = topology_.neighbours[i].size();
      result.exchanges += readers;
      if (!compressed_) {
        peer.bytes_sent += readers * dense_bytes_;
        continue;
      }
      const std::uint64_t held = peer.published->version();  // every neighbour read the last one
      peer.published->advance(peer.model, t);
      const transport::ChangeRecord record{model_.layout_id(),
                                           tensor_sizes_,
                                           peer.published->parameters(),
                                           peer.published->last_changed(),
                                           peer.published->version(),
                                           peer.published->changes_known_since(),
                                           0};  // the digest's value does not change the size
      const auto delta = transport::encode_changes_since(record, held);
      peer.bytes_sent += readers * (delta ? delta->size() : dense_bytes_);
    }
    // A malicious peer publishes its model (or published copy) poisoned.
    for (Peer& peer : peers_)
      if (peer.malicious)
        poison(peer,
               compressed_ ? peer.published->parameters() : std::span<const float>(peer.model));
    // Mix: x_i ← x_i + γ Σ_j w_ij (x̂_j − x̂_i), the real peer's rule and floats
    // (runtime::dpsgd_mix). Dense, x̂ = x: every peer reads the others' models of this
    // iteration, so the mixed models go to `mixed` first.
    std::vector<runtime::MixTerm> terms;
    for (std::size_t i = 0; i < n; ++i) {
      Peer& peer = peers_[i];
      auto published = [&](std::size_t p) -> std::span<const float> {
        if (peers_[p].malicious) return peers_[p].poisoned;
        return compressed_ ? peers_[p].published->parameters()
                           : std::span<const float>(peers_[p].model);
      };
      const auto& neighbours = topology_.neighbours[i];
      if (!compressed_) std::copy(peer.model.begin(), peer.model.end(), mixed[i].begin());
      if (peer.malicious) continue;  // it keeps its own model
      // The real peer's rule for each neighbour's copy: refused (its weight stays with the
      // peer, as for a neighbour skipped), else its difference clipped to τ (when set).
      terms.clear();
      for (std::size_t k = 0; k < neighbours.size(); ++k) {
        const auto theirs = published(neighbours[k]);
        if (!takes(theirs, result)) continue;
        const double scale =
            runtime::neighbour_clip_scale(theirs, published(i), config_.neighbour_clip);
        if (scale < 1) result.neighbour_terms_clipped++;
        terms.push_back({weights_[i][k], theirs, scale});
      }
      runtime::dpsgd_mix(compressed_ ? std::span<float>(peer.model) : std::span<float>(mixed[i]),
                         published(i), terms, gamma_);
    }
    if (!compressed_)
      for (std::size_t i = 0; i < n; ++i) peers_[i].model.swap(mixed[i]);

    double now = 0;
    bool all_stopped = true;
    for (const Peer& p : peers_) {
      now = std::max(now, p.clock);
      all_stopped = all_stopped && p.stopped;
    }
    result.virtual_time = now;
    result.mean_iterations = static_cast<double>(t);
    bool stop = t >= config_.max_iterations ||
                (config_.time_budget > 0 && now >= config_.time_budget) || all_stopped;
    if (t % config_.eval_every == 0 || stop) {
      evaluate(result, now, static_cast<double>(t));
      const GossipEvalPoint& last = result.curve.back();
      if (config_.stop_at_accuracy && last.mean_accuracy >= *config_.stop_at_accuracy) stop = true;
      if (progress)
        progress({static_cast<double>(t), config_.max_iterations, now, last.mean_accuracy,
                  last.consensus_accuracy, last.bytes_per_peer});
    }
    if (stop) break;
  }
}

// AD-PSGD: events in virtual-time order, ties by peer id (then a step's start before its end).
void GossipSimulation::run_adpsgd(GossipResult& result, const GossipProgressCallback& progress) {
  enum class Kind { kStart, kFinish };
  struct Event {
    double time;
    std::uint32_t peer;
    Kind kind;
    bool operator>(const Event& o) const {
      if (time != o.time) return time > o.time;
      if (peer != o.peer) return peer > o.peer;
      return kind > o.kind;
    }
  };
  const std::size_t n = peers_.size();
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  for (std::uint32_t i = 0; i < n; ++i) events.push({0.0, i, Kind::kStart});
  const std::uint64_t step_budget = config_.max_iterations * n;
  const std::uint64_t eval_steps = config_.eval_every * n;
  std::uint64_t total_steps = 0;
  evaluate(result, 0, 0);
  auto report = [&](double time) {
    evaluate(result, time, static_cast<double>(total_steps) / static_cast<double>(n));
    const GossipEvalPoint& last = result.curve.back();
    if (progress)
      progress({last.mean_iterations, config_.max_iterations, time, last.mean_accuracy,
                last.consensus_accuracy, last.bytes_per_peer});
    return config_.stop_at_accuracy && last.mean_accuracy >= *config_.stop_at_accuracy;
  };
  bool evaluated_at_end = false;
  while (!events.empty()) {
    const Event event = events.top();
    if (config_.time_budget > 0 && event.time > config_.time_budget) {
      result.virtual_time = config_.time_budget;
      report(config_.time_budget);
      evaluated_at_end = true;
      break;
    }
    events.pop();
    result.virtual_time = event.time;
    Peer& peer = peers_[event.peer];
    if (event.kind == Kind::kStart) {
      if (peer.stopped) continue;
      events.push({event.time + compute_step(peer, event.time), event.peer, Kind::kFinish});
      continue;
    }
    apply_step(peer);
    peer.iterations++;
    total_steps++;
    // Average with a uniformly drawn neighbour: both hold the midpoint from now on, each by
    // its side's rule of the real peers' average, and each sent the other its dense model.
    const auto& neighbours = topology_.neighbours[event.peer];
    Peer& other = peers_[neighbours[static_cast<std::size_t>(
        peer.random.uniform() * static_cast<double>(neighbours.size()))]];
    if (!peer.malicious && !other.malicious) {
      runtime::adpsgd_exchange(peer.model, other.model);
    } else if (!peer.malicious) {
      // An honest peer asked a malicious one: it refuses the answer (or takes it).
      const auto answer = poison(other, other.model);
      if (takes(answer, result)) runtime::adpsgd_take_average(peer.model, peer.model, answer);
    } else if (!other.malicious) {
      // A malicious peer asked an honest one: it refuses the request (or answers it).
      const auto request = poison(peer, peer.model);
      if (takes(request, result)) runtime::adpsgd_answer_average(other.model, request);
    }
    peer.bytes_sent += dense_bytes_;
    other.bytes_sent += dense_bytes_;
    result.exchanges++;
    const double validation = maybe_validate(peer, event.time, result);
    peer.clock = event.time + validation;
    if (!peer.stopped) events.push({peer.clock, event.peer, Kind::kStart});
    const bool done = total_steps >= step_budget;
    if (total_steps % eval_steps == 0 || done) {
      const bool reached = report(event.time);
      if (reached || done) {
        evaluated_at_end = true;
        break;
      }
    }
  }
  result.mean_iterations = static_cast<double>(total_steps) / static_cast<double>(n);
  // Every peer stopped (accuracy-aware) before the budget: the run ends at its last event.
  if (!evaluated_at_end) report(result.virtual_time);
}

void GossipSimulation::finish(GossipResult& result) {
  const std::size_t n = honest_;  // the consensus of the honest peers
  std::vector<double> sum(average_.size(), 0.0);
  result.malicious_peers = config_.malicious_peers;
  for (const Peer& p : peers_) {
    if (p.malicious) continue;
    for (std::size_t k = 0; k < sum.size(); ++k) {
      sum[k] += p.model[k];
      result.honest_max_abs_parameter =
          std::max(result.honest_max_abs_parameter, std::fabs(static_cast<double>(p.model[k])));
    }
  }
  double norm = 0;
  for (std::size_t k = 0; k < sum.size(); ++k) {
    average_[k] = static_cast<float>(sum[k] / static_cast<double>(n));
    norm += static_cast<double>(average_[k]) * average_[k];
  }
  double distance = 0;
  for (const Peer& p : peers_) {
    if (p.malicious) continue;
    double d = 0;
    for (std::size_t k = 0; k < sum.size(); ++k)
      d += std::pow(static_cast<double>(p.model[k]) - average_[k], 2);
    distance += std::sqrt(d);
  }
  result.consensus_distance = norm > 0 ? distance / static_cast<double>(n) / std::sqrt(norm) : 0;
  result.consensus_parameters = average_;
  result.bytes_per_peer = static_cast<double>(total_bytes()) / static_cast<double>(peers_.size());
  const std::size_t classes = std::max<std::size_t>(1, config_.speed_classes.size());
  result.classes.assign(classes, {});
  std::vector<std::uint64_t> steps(classes, 0), iterations(classes, 0), examples(classes, 0);
  std::vector<double> compute(classes, 0), wait(classes, 0);
  for (const Peer& p : peers_) {
    result.local_steps += p.steps;
    SpeedClassStats& c = result.classes[p.speed_class];
    c.peers++;
    steps[p.speed_class] += p.steps;
    iterations[p.speed_class] += p.iterations;
    examples[p.speed_class] += p.examples;
    compute[p.speed_class] += p.compute_time;
    wait[p.speed_class] += p.wait_time;
    if (config_.keep_final_models) result.final_models.push_back(p.model);
  }
  for (std::size_t c = 0; c < classes; ++c) {
    SpeedClassStats& s = result.classes[c];
    s.budget = config_.speed_classes.empty() ? 1.0 : config_.speed_classes[c];
    s.compute_per_step = steps[c] ? compute[c] / static_cast<double>(steps[c]) : 0;
    s.wait_per_iteration = iterations[c] ? wait[c] / static_cast<double>(iterations[c]) : 0;
    s.steps_per_iteration =
        iterations[c] ? static_cast<double>(steps[c]) / static_cast<double>(iterations[c]) : 0;
    s.mean_batch = steps[c] ? static_cast<double>(examples[c]) / static_cast<double>(steps[c]) : 0;
  }
  std::ostringstream t;
  t << runtime::topology_kind_name(topology_.kind) << ", " << topology_.size() << " peers, "
    << topology_.edges().size() << " edges";
  result.topology = t.str();
}

}  // namespace

std::vector<double> parse_speed_classes(const std::string& text) {
  std::vector<double> classes;
  if (text.empty()) return classes;
  for (const std::string& part : split_commas(text)) {
    const auto value = parse_number(part);
    if (!value || *value <= 0)
      throw std::invalid_argument("--speed-classes: '" + part +
                                  "' is not a positive number (e.g. 0.12,0.08,0.05,0.03)");
    classes.push_back(*value);
  }
  return classes;
}

std::vector<SpeedChange> parse_speed_schedule(const std::string& text) {
  std::vector<SpeedChange> schedule;
  if (text.empty()) return schedule;
  for (const std::string& entry : split_commas(text)) {
    const auto first = entry.find(':'),
               second = entry.find(':', first == std::string::npos ? first : first + 1);
    const auto bad = [&] {
      return std::invalid_argument(
          "--speed-schedule: '" + entry +
          "' is not TIME:CLASS:FACTOR (time >= 0 in step times, class index, factor > 0)");
    };
    if (first == std::string::npos || second == std::string::npos) throw bad();
    const auto at = parse_number(entry.substr(0, first));
    const auto speed_class = parse_number(entry.substr(first + 1, second - first - 1));
    const auto factor = parse_number(entry.substr(second + 1));
    if (!at || *at < 0 || !speed_class || *speed_class < 0 ||
        *speed_class != std::floor(*speed_class) || *speed_class > 1000 || !factor || *factor <= 0)
      throw bad();
    schedule.push_back({*at, static_cast<std::uint32_t>(*speed_class), *factor});
  }
  return schedule;
}

double GossipConfig::effective_consensus_step() const {
  return consensus_step ? *consensus_step : runtime::default_consensus_step(publish_fraction);
}

runtime::GossipSettings GossipConfig::settings() const {
  runtime::GossipSettings s;
  s.algorithm = algorithm;
  s.publish_fraction = publish_fraction;
  s.consensus_step = effective_consensus_step();
  s.wait_steps = wait_steps;
  s.validation_fraction = validation_fraction;
  s.validate_every = validate_every;
  s.balance.target_seconds = balance_target;
  s.balance.base_batch = batch;
  s.balance.base_lr = learning_rate;
  s.balance.min_batch = balance_min_batch;
  s.balance.max_batch = balance_max_batch;
  s.balance.max_lr_factor = balance_max_lr_factor;
  s.plateau.patience = plateau_patience;
  s.plateau.max_decays = plateau_max_decays;
  s.plateau.min_delta = plateau_min_delta;
  s.max_neighbour_magnitude = max_neighbour_magnitude;
  s.neighbour_clip = neighbour_clip;
  return s;
}

void check_gossip_config(const GossipConfig& c) {
  auto refuse = [](const std::string& what) { throw std::invalid_argument("gossip: " + what); };
  if (c.peers < 2) refuse("--workers (the peer count) must be at least 2");
  if (c.batch < 1) refuse("--batch must be at least 1");
  runtime::check_gossip_settings(c.settings());
  // The peer resolves an unset γ to its default before anyone can tell; here a γ given with
  // AD-PSGD is refused rather than ignored (the peer ignores it).
  if (c.algorithm == GossipAlgorithm::kAdpsgd && c.consensus_step && *c.consensus_step != 1)
    refuse("--consensus-step is for --gossip d-psgd (AD-PSGD takes the midpoint)");
  if (c.topology && c.topology->size() != static_cast<std::size_t>(c.peers))
    refuse("--topology-file lists " + std::to_string(c.topology->size()) +
           " peers, --workers says " + std::to_string(c.peers));
  if (c.topology && !c.topology->connected()) refuse("--topology-file: the graph is not connected");
  if (!c.topology && c.peers >= 2) {
    try {  // cheap, and the drawn graph is the one the run draws again from the same seed
      runtime::make_topology(c.topology_kind, static_cast<std::uint32_t>(c.peers), c.degree,
                             c.seed);
    } catch (const std::invalid_argument& e) {
      refuse(std::string("--topology ") + runtime::topology_kind_name(c.topology_kind) +
             " / --degree: " + e.what());
    }
  }
  for (double budget : c.speed_classes)
    if (!(budget > 0) || !std::isfinite(budget)) refuse("--speed-classes must all be positive");
  for (const SpeedChange& change : c.speed_schedule) {
    if (change.speed_class >= std::max<std::size_t>(1, c.speed_classes.size()))
      refuse("--speed-schedule names class " + std::to_string(change.speed_class) + " of " +
             std::to_string(std::max<std::size_t>(1, c.speed_classes.size())) + " speed classes");
    if (!(change.factor > 0) || !(change.at >= 0))
      refuse("--speed-schedule needs times >= 0 and factors > 0");
  }
  if (!(c.step_jitter >= 0)) refuse("--step-jitter must be >= 0");
  if (c.malicious_peers < 0 || c.malicious_peers >= c.peers)
    refuse("--malicious-peers must be in [0, --workers) (an honest peer must remain)");
  if (!std::isfinite(c.attack.value)) refuse("--attack: the value must be finite");
  if (c.max_iterations < 1) refuse("--iterations must be at least 1");
  if (c.eval_every < 1) refuse("--eval-every must be at least 1");
  if (!(c.time_budget >= 0) || !std::isfinite(c.time_budget)) refuse("--time-budget must be >= 0");
}

const GossipEvalPoint* GossipResult::first_reaching(double target) const {
  for (const auto& p : curve)
    if (p.mean_accuracy >= target) return &p;
  return nullptr;
}

const GossipEvalPoint* GossipResult::consensus_first_reaching(double target) const {
  for (const auto& p : curve)
    if (p.consensus_accuracy >= target) return &p;
  return nullptr;
}

double GossipResult::best_mean_accuracy() const {
  double best = 0;
  for (const auto& p : curve) best = std::max(best, p.mean_accuracy);
  return best;
}

GossipResult run_gossip_simulation(const GossipConfig& config, const runtime::Dataset& train,
                                   const runtime::Dataset& test, const std::string& label,
                                   const GossipProgressCallback& progress) {
  check_gossip_config(config);
  const auto wall_start = std::chrono::steady_clock::now();
  GossipSimulation simulation(config, train, test);
  GossipResult result;
  result.label = label;
  if (config.algorithm == GossipAlgorithm::kDpsgd) {
    simulation.run_dpsgd(result, progress);
  } else {
    simulation.run_adpsgd(result, progress);
  }
  simulation.finish(result);
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

}  // namespace edgetrain::sim
