#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <queue>
#include <stdexcept>

#include "worker/offline_training.h"
#include "worker/round_worker.h"
#include "model/shard_sampler.h"
#include "server/dp_accountant.h"
#include "privacy/distributed_noise.h"
#include "privacy/quantize.h"
#include "privacy/skellam.h"
#include "common/splitmix64.h"
#include "model/thread_pool.h"
#include "model/trainer.h"
#include "server/model_changes.h"
#include "sim/sim_internal.h"

namespace edgetrain::sim {
namespace {

struct Worker {
  runtime::ShardSampler sampler;
  double speed = 1;  // mean step time of this worker
  runtime::Compressor compressor;
  std::uint64_t sequence = 0;
  std::vector<std::uint8_t> pending;  // the encoded update in flight
};

enum class EventKind { kStartStep, kUpdateArrives };
struct Event {
  double time;
  int worker;
  EventKind kind;
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : worker > other.worker;
  }
};

void check_rounds_config(const SimConfig& c) {
  const RoundsConfig& r = c.rounds;
  if (r.local_steps < 1 || r.local_steps > 1000000)
    throw std::invalid_argument("sim: local steps must be in 1..10^6");
  if (r.local_epochs > 1000) throw std::invalid_argument("sim: local epochs must be in 0..1000");
  if (!(r.local_lr > 0) || !std::isfinite(r.local_lr))
    throw std::invalid_argument("sim: local learning rate must be positive");
  if (!(r.server_lr > 0) || !std::isfinite(r.server_lr))
    throw std::invalid_argument("sim: server learning rate must be positive");
  if (!(r.client_fraction > 0 && r.client_fraction <= 1))
    throw std::invalid_argument("sim: client fraction must be in (0, 1]");
  if (!(r.deadline_steps >= 0) || !std::isfinite(r.deadline_steps))
    throw std::invalid_argument("sim: round deadline must be >= 0");
  if (r.max_rounds < 1) throw std::invalid_argument("sim: max rounds must be at least 1");
  if (c.delta_pulls || c.publish.enabled() || c.replica_pull.enabled())
    throw std::invalid_argument(
        "sim: delta pulls, a published model and the cheap pull are for async mode (a round "
        "pulls the dense model)");
}

void check_config_values(const SimConfig& c) {
  if (c.workers < 1) throw std::invalid_argument("sim: need at least one worker");
  if (c.batch < 1) throw std::invalid_argument("sim: batch size must be at least 1");
  if (!(c.learning_rate > 0)) throw std::invalid_argument("sim: learning rate must be positive");
  if (c.max_updates < 1) throw std::invalid_argument("sim: max updates must be at least 1");
  if (c.eval_every < 1) throw std::invalid_argument("sim: eval interval must be at least 1");
  if (c.rounds.malicious_workers < 0 || c.rounds.malicious_workers >= c.workers)
    throw std::invalid_argument("--malicious-peers must leave at least one honest worker");
  if (!(c.rounds.aggregation.trim_fraction >= 0 && c.rounds.aggregation.trim_fraction < 0.5))
    throw std::invalid_argument("--trim-fraction must be in [0, 0.5)");
  if (!(c.rounds.clip_norm >= 0) || !std::isfinite(c.rounds.clip_norm))
    throw std::invalid_argument("--round-clip-norm must be a finite value >= 0");
  if (c.rounds.aggregation.kind == server::Aggregation::kDpFedAvg &&
      !(c.rounds.clip_norm > 0 && c.rounds.dp_noise_multiplier > 0))
    throw std::invalid_argument(
        "--aggregation dp-fedavg needs --round-clip-norm S and --dp-noise-multiplier z above 0");
  if (c.rounds.dp_noise_survivors > 0 && c.rounds.aggregation.kind != server::Aggregation::kDpFedAvg)
    throw std::invalid_argument(
        "--dp-noise-survivors (distributed noise) goes with --aggregation dp-fedavg, as the server's "
        "--secure-aggregation");
  if (c.rounds.dp_skellam && c.rounds.adaptive_clipping.enabled())
    throw std::invalid_argument("--dp-noise skellam with --dp-adaptive-clip-quantile: not yet (as the server)");
  if (c.rounds.dp_skellam && c.rounds.dp_noise_survivors == 0)
    throw std::invalid_argument(
        "--dp-noise skellam is the workers' discrete noise: it needs --dp-noise-survivors C (the "
        "server's own noise is Gaussian)");
  if (!(c.rounds.dp_delta > 0 && c.rounds.dp_delta < 1))
    throw std::invalid_argument("--dp-delta must be in (0, 1)");
  server::check_adaptive_clipping(c.rounds.adaptive_clipping);
  server::check_replica_pull_options(c.replica_pull);
  if (c.replica_pull.enabled() && c.publish.enabled())
    throw std::invalid_argument(
        "--pull-fraction and --publish-every are two ways to cut pulls: choose one");
  if (c.seeded_first_pull && !(c.delta_pulls || c.publish.enabled() || c.replica_pull.enabled()))
    throw std::invalid_argument(
        "--first-pull seeded makes the first pull a delta from the seeded model: it needs "
        "--delta-pulls, --publish-every or --pull-fraction (every other pull is dense)");
  if (c.rounds.aggregation.kind != server::Aggregation::kDpFedAvg &&
      (c.rounds.adaptive_clipping.enabled() || c.rounds.dp_target_epsilon > 0))
    throw std::invalid_argument(
        "--dp-adaptive-clip-quantile and --dp-target-epsilon go with --aggregation dp-fedavg");
  if (c.rounds.adaptive_clipping.enabled())  // throws when the count takes the whole budget
    server::delta_noise_multiplier(
        c.rounds.dp_noise_multiplier,
        server::count_noise_stddev(
            c.rounds.adaptive_clipping,
            static_cast<double>(std::max<long>(
                1, std::lround(c.rounds.client_fraction * static_cast<double>(c.workers))))));
  if (c.speed_spread < 0 || c.step_jitter < 0)
    throw std::invalid_argument("sim: speed spreads must be >= 0");
  if (c.failure_probability < 0 || c.failure_probability >= 1) {
    throw std::invalid_argument("sim: failure probability must be in [0, 1)");
  }
  if (!(c.failing_fraction >= 0 && c.failing_fraction <= 1))
    throw std::invalid_argument("sim: failing fraction must be in [0, 1]");
  if (!(c.downtime_steps >= 0)) throw std::invalid_argument("sim: downtime must be >= 0");
  if (c.mode == SimMode::kRounds) check_rounds_config(c);
  if (!(c.local_dp_clip >= 0 && std::isfinite(c.local_dp_clip)) ||
      !(c.local_dp_noise_multiplier >= 0) || (c.local_dp_noise_multiplier > 0 && !(c.local_dp_clip > 0)))
    throw std::invalid_argument("--local-dp-noise-multiplier needs --local-dp-clip above 0");
  if (c.lr_schedule.enabled()) {
    if (c.mode != SimMode::kAsync)
      throw std::invalid_argument(
          "--lr-decay-at is the staleness-aware server's schedule, for --mode async (rounds use "
          "--server-lr and --local-lr)");
    server::check_learning_rate_schedule(c.lr_schedule);
  }
  if (c.mode != SimMode::kAsync && c.local_dp_clip > 0)
    throw std::invalid_argument("--local-dp-clip is for --mode async");
  if (!(c.reachable > 0 && c.reachable <= 1))
    throw std::invalid_argument("--reachable must be in (0, 1]");
  if (!(c.outage_period_steps > 0 && std::isfinite(c.outage_period_steps)))
    throw std::invalid_argument("--outage-period must be a finite time above 0");
  if (!(c.outage_start_steps >= 0 && std::isfinite(c.outage_start_steps)))
    throw std::invalid_argument("--outage-start must be a finite time >= 0");
  if (c.mode != SimMode::kAsync && c.reachable < 1)
    throw std::invalid_argument("--reachable (devices reachable part of the time) is for --mode async");
  if (c.offline_steps > 0 && !(c.reachable < 1))
    throw std::invalid_argument(
        "--offline-steps trains while the link is down: it needs --reachable below 1");
  if (!(c.offline_max_rate >= 0 && c.offline_max_rate <= 1))
    throw std::invalid_argument("--offline-max-rate must be in [0, 1]");
  if (c.offline_max_rate > 0 && c.offline_steps == 0)
    throw std::invalid_argument("--offline-max-rate is for --offline-steps above 0");
  if (c.mode != SimMode::kAsync && (c.offline_step_credit > 0 || c.offline_average))
    throw std::invalid_argument("--offline-step-credit and --offline-average are for --mode async");
}

// The workers that may fail: round(failing_fraction · workers) of them, drawn from their own
// seeded stream so that the run's other draws (and so runs without failures) are unchanged.
std::vector<bool> failing_workers(const SimConfig& c) {
  std::vector<int> order(c.workers);
  for (int w = 0; w < c.workers; ++w) order[w] = w;
  runtime::SplitMix64 draw{c.seed ^ 0x6661696c696e67ULL};  // "failing"
  for (int i = c.workers - 1; i > 0; --i)
    std::swap(order[i], order[draw.next() % static_cast<std::uint64_t>(i + 1)]);
  const auto count = static_cast<int>(std::lround(c.failing_fraction * c.workers));
  std::vector<bool> may_fail(c.workers, false);
  for (int i = 0; i < count; ++i) may_fail[order[i]] = true;
  return may_fail;
}

std::vector<runtime::TensorSlice> layout_of(const runtime::Model& model) {
  std::vector<runtime::TensorSlice> layout;
  for (const auto& t : model.tensors())
    layout.push_back({t.offset, static_cast<std::uint32_t>(t.size)});
  return layout;
}

server::ParameterStoreOptions store_options(const SimConfig& config) {
  server::ParameterStoreOptions options;
  options.learning_rate = config.learning_rate;
  options.max_staleness = config.max_staleness;
  options.rule = config.staleness_rule;
  options.offline_step_credit = config.offline_step_credit;
  options.offline_average = config.offline_average;
  options.lr_schedule = config.lr_schedule;
  return options;
}

// What both modes share: the model, the server's store, the trainers, the workers with
// their shards, speeds and compressors, and the evaluation. Its numbers are drawn in the
// order the asynchronous simulator always drew them, so its runs stay as they were. Not
// copyable: the trainers hold the model.
struct Simulation {
  Simulation(const SimConfig& config, const runtime::Dataset& train, const runtime::Dataset& test);
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  // Appends the test accuracy of the server's model to result.curve.
  void evaluate(SimResult& result, std::uint64_t updates, double time);

  static constexpr int kEvalBatch = 100;
  const SimConfig& config;
  const runtime::Dataset& test;
  runtime::Model model;
  const std::vector<std::uint32_t> tensor_sizes;
  const std::vector<runtime::TensorSlice> layout;
  server::ParameterStore store;
  const transport::ModelLayout expected;
  std::uint64_t model_bytes = 0;  // every dense pull ships this many bytes
  runtime::ThreadPool pool;
  runtime::Trainer trainer;
  runtime::Trainer evaluator;
  std::vector<float> gradient;
  std::vector<std::uint8_t> batch_pixels;
  std::vector<std::int32_t> batch_labels;
  Random random;
  std::vector<Worker> workers;
  std::size_t eval_count = 0;
};

Simulation::Simulation(const SimConfig& config, const runtime::Dataset& train,
                       const runtime::Dataset& test)
    : config(config),
      test(test),
      model(checked_model(config.model, config.workers, config.seed, train, test, config.init_from)),
      tensor_sizes(model.tensor_sizes()),
      layout(layout_of(model)),
      store(model.layout_id(), tensor_sizes,
            std::vector<float>(model.parameters().begin(), model.parameters().end()),
            store_options(config)),
      expected{model.layout_id(), tensor_sizes},
      pool(config.threads),
      trainer(model, config.batch, config.kernels, pool.get()),
      evaluator(model, kEvalBatch, config.kernels, pool.get()),
      gradient(model.parameter_count()),
      batch_pixels(static_cast<std::size_t>(config.batch) * train.image_bytes()),
      batch_labels(config.batch),
      random(config.seed * 0x2545F4914F6CDD1DULL + 17) {
  // Every dense pull ships the same number of bytes: encode the model once to know it.
  auto model_message =
      transport::encode_dense_model(model.layout_id(), 0, tensor_sizes, store.parameters());
  if (!model_message)
    throw std::logic_error("sim: cannot encode the model: " + model_message.error().message);
  model_bytes = model_message.value().size();
  trainer.set_input_format(train.format);  // uint8 or float32 examples, and their scaling
  if (!config.conv_drop_rates.empty()) {
    runtime::DropoutConfig dropout;
    dropout.conv_drop_rates = config.conv_drop_rates;
    dropout.rescale = config.dropout_rescale;
    dropout.seed = config.seed * 0x9E3779B97F4A7C15ULL +
                   3;              // its own stream: the batches stay as without dropout
    trainer.set_dropout(dropout);  // validates against the model (std::invalid_argument)
  }
  workers.reserve(config.workers);
  for (int w = 0; w < config.workers; w++) {
    auto shard =
        worker_shard(train, w, config.workers, config.seed, config.label_skewed, config.skew);
    workers.push_back(
        Worker{runtime::ShardSampler(train, std::move(shard), config.seed + 1000003ULL * (w + 1)),
               random.log_normal(config.speed_spread),
               runtime::Compressor(layout, config.compressor),
               0,
               {}});
  }
  eval_count = config.eval_examples ? std::min(config.eval_examples, test.size()) : test.size();
}

void Simulation::evaluate(SimResult& result, std::uint64_t updates, double time) {
  const TestScore score = evaluate_parameters(evaluator, store.parameters(), test, eval_count);
  result.curve.push_back(
      {updates, time, result.ingress_bytes, result.pull_bytes, score.accuracy, score.loss});
}

// Local DP's step (SimConfig::local_dp_clip): the whole gradient clipped to L2 norm `clip`,
// then N(0, stddev²) added to every value.
// dp-fedavg's close under secure aggregation's noise rule (RoundsConfig::dp_noise_survivors):
// each device's dense delta plus its share of the noise, quantized as a worker quantizes it
// (runtime::RoundWorker's secure_send), summed in the ring and read back over m.
std::vector<float> distributed_noise_close(std::span<const server::RoundDelta> deltas,
                                           std::span<const std::uint32_t> tensor_sizes,
                                           double noise_multiplier, double clip_norm,
                                           std::uint32_t survivors, double denominator,
                                           Random& noise) {
  const double stddev = privacy::device_noise_stddev(noise_multiplier, clip_norm, survivors);
  const double bound = privacy::noised_value_bound(clip_norm, stddev);
  const auto devices = static_cast<std::uint32_t>(deltas.size());
  server::AggregationRule one_device(server::Aggregation::kDpFedAvg);
  one_device.expected_devices = 1;  // Σ of one delta: the delta, dense
  std::vector<std::uint32_t> ring;
  for (const server::RoundDelta& delta : deltas) {
    std::vector<float> values = server::aggregate_deltas(std::span(&delta, 1), tensor_sizes, one_device);
    for (float& v : values) v = static_cast<float>(v + stddev * noise.normal());
    const std::vector<std::uint32_t> quantized =
        privacy::quantize_bounded(values, bound, devices, privacy::Rounding::kNearest);
    if (ring.empty()) ring.assign(quantized.size(), 0);
    for (std::size_t i = 0; i < ring.size(); ++i) ring[i] += quantized[i];
  }
  const std::vector<double> sum = privacy::dequantize(ring, bound, devices);
  std::vector<float> mean(sum.size());
  for (std::size_t i = 0; i < sum.size(); ++i) mean[i] = static_cast<float>(sum[i] / denominator);
  return mean;
}

// The same under the discrete noise (RoundsConfig::dp_skellam): each worker's dense delta
// encoded as privacy::skellam_encode does on a device, with the noise generator's bits.
std::vector<float> skellam_noise_close(std::span<const server::RoundDelta> deltas,
                                       std::span<const std::uint32_t> tensor_sizes,
                                       const privacy::SkellamPlan& plan, double denominator, Random& noise) {
  const auto devices = static_cast<std::uint32_t>(deltas.size());
  server::AggregationRule one_device(server::Aggregation::kDpFedAvg);
  one_device.expected_devices = 1;
  const privacy::RandomBits bits = [&noise] { return static_cast<std::uint64_t>(noise.uniform() * 0x1p53) << 11; };
  std::vector<std::uint32_t> ring;
  for (const server::RoundDelta& delta : deltas) {
    const std::vector<float> values = server::aggregate_deltas(std::span(&delta, 1), tensor_sizes, one_device);
    const std::vector<std::uint32_t> encoded =
        privacy::skellam_encode(values, plan.scale, plan.device_variance, plan.l2_bound, devices, bits);
    if (ring.empty()) ring.assign(encoded.size(), 0);
    for (std::size_t i = 0; i < ring.size(); ++i) ring[i] += encoded[i];
  }
  const std::vector<double> sum = privacy::skellam_decode(ring, plan.scale);
  std::vector<float> mean(sum.size());
  for (std::size_t i = 0; i < sum.size(); ++i) mean[i] = static_cast<float>(sum[i] / denominator);
  return mean;
}

void clip_and_noise(std::span<float> gradient, double clip, double stddev, Random& random) {
  double squares = 0;
  for (const float g : gradient) squares += static_cast<double>(g) * g;
  const double norm = std::sqrt(squares);
  const double scale = norm > clip ? clip / norm : 1.0;
  for (float& g : gradient) g = static_cast<float>(g * scale + stddev * random.normal());
}

// The end of the down part of worker `worker`'s period that holds `time`. Both functions
// below compare with this one expression, so the time it returns is up for them (no
// rounding can leave a worker waiting for ever at a boundary).
double outage_end(const SimConfig& config, int worker, double time) {
  const double period = config.outage_period_steps;
  const double shift = config.outage_start_steps + period * worker / config.workers;
  return shift + std::floor((time - shift) / period) * period + (1 - config.reachable) * period;
}

}  // namespace

bool link_down_at(const SimConfig& config, int worker, double time) {
  if (!(config.reachable < 1) || time < config.outage_start_steps) return false;
  return time < outage_end(config, worker, time);
}

double link_up_again(const SimConfig& config, int worker, double time) {
  return link_down_at(config, worker, time) ? outage_end(config, worker, time) : time;
}

namespace {

// Asynchronous SGD: an event loop over workers' step starts and update arrivals.
void run_async(Simulation& sim, SimResult& result, const ProgressCallback& progress) {
  const SimConfig& config = sim.config;
  server::ParameterStore& store = sim.store;
  const std::vector<std::uint32_t>& tensor_sizes = sim.tensor_sizes;
  std::optional<runtime::PublishedModel> published;
  if (config.publish.enabled())
    published.emplace(tensor_sizes, store.parameters(), store.version(), config.publish);
  const bool delta_pulls = config.delta_pulls || published.has_value();
  // The cheap pull: the server's record of each worker's copy (empty until its first pull,
  // which is dense) and the version that copy was given.
  const bool replica_pulls = config.replica_pull.enabled();
  std::vector<std::vector<float>> replicas(replica_pulls ? config.workers : 0);
  std::vector<std::uint64_t> replica_versions(replicas.size(), 0);
  // With entry staleness, per worker and entry the version its copy's value comes from (the
  // store counts σ from it).
  // The age-weighted selection reads the same versions (without counting σ from them).
  const bool entry_staleness = replica_pulls && config.replica_pull.entry_staleness;
  const bool keep_since =
      entry_staleness || (replica_pulls && config.replica_pull.selection ==
                                               server::ReplicaPullOptions::Selection::kAgeWeighted);
  std::vector<std::vector<std::uint64_t>> replica_since(keep_since ? config.workers : 0);
  // The bytes of one pull by a worker that holds `held` (nothing: dense), as the server
  // would send them. The digest field's value does not change the size: left 0.
  auto pull_size = [&](const server::ChangeRecord& served,
                       std::optional<std::uint64_t> held) -> std::uint64_t {
    if (!delta_pulls || !held) return sim.model_bytes;
    const auto delta = server::encode_changes_since(served, *held);
    return delta ? delta->size() : sim.model_bytes;
  };
  auto evaluate = [&](SimResult& r, double time) { sim.evaluate(r, store.version(), time); };

  evaluate(result, 0);
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  for (int w = 0; w < config.workers; w++)
    events.push({sim.random.uniform() * sim.workers[w].speed, w, EventKind::kStartStep});
  std::vector<std::uint64_t> fetched(config.workers, 0);
  std::vector<std::optional<std::uint64_t>> held(
      config.workers);  // the version of each worker's copy
  if (config.seeded_first_pull) {
    // Every worker holds the seeded initial model (version 0), which is the store's now.
    std::fill(held.begin(), held.end(), store.version());
    for (std::vector<float>& replica : replicas)
      replica.assign(store.parameters().begin(), store.parameters().end());
    for (std::vector<std::uint64_t>& since : replica_since) since.assign(store.parameters().size(), store.version());
    std::fill(replica_versions.begin(), replica_versions.end(), store.version());
  }
  std::uint64_t pulls = 0;
  const std::vector<bool> may_fail = failing_workers(config);
  double delay_sum = 0;
  std::uint64_t update_bytes_sum = 0, updates_received = 0;
  // Refusals in a row: a diverged model (every update beyond the parameter bound) would
  // otherwise loop for ever without reaching max_updates.
  std::uint64_t refused_in_a_row = 0;
  const std::uint64_t stall_after = std::max<std::uint64_t>(kStallArrivals, 10ULL * config.workers);
  bool stop = false;
  // Local DP (SimConfig::local_dp_clip): its own generator, so that the run's other draws
  // stay those of a run without it; steps per worker for the accountant.
  Random local_noise(config.seed ^ 0x8bb84b93962eacc9ull);
  std::vector<std::uint64_t> local_dp_steps(config.workers, 0);
  // Outages (SimConfig::reachable): per worker the update its link was down for, and with
  // offline training the copy it last pulled and its accumulated offline steps.
  const bool outages = config.reachable < 1;
  const bool offline_training = outages && config.offline_steps > 0;
  std::vector<std::vector<std::uint8_t>> kept(outages ? config.workers : 0);
  std::vector<std::vector<float>> last_pulled(offline_training ? config.workers : 0);
  std::vector<runtime::OfflineAccumulator> offline;
  if (offline_training) offline.assign(config.workers, runtime::OfflineAccumulator(config.learning_rate));

  int current_worker = 0;  // whose update deliver() applies (its record's entry versions)
  // An update reaches the server: count its bytes, decode it as untrusted input, apply.
  // Returns whether it was applied; sets `stop` at the end of the run and result.stalled
  // when the server has refused everything for long (the caller then ends the loop).
  auto deliver = [&](const std::vector<std::uint8_t>& bytes, double time) -> bool {
    result.ingress_bytes += bytes.size();
    update_bytes_sum += bytes.size();
    updates_received++;
    auto decoded = transport::decode_sparse_update(bytes, sim.expected);
    if (!decoded)
      throw std::logic_error("sim: server refused a well-formed update: " +
                             decoded.error().message);
    const std::uint64_t delay = store.version() - decoded.value().fetched_version;
    std::span<const std::uint64_t> entry_versions;
    if (entry_staleness) entry_versions = replica_since[current_worker];
    server::ApplyResult applied =
        store.apply(decoded.value(), server::ValueCheck::kBound, entry_versions);
    if (applied.applied()) {
      refused_in_a_row = 0;
      if (published) published->advance(store.parameters(), store.version());
      result.updates_applied++;
      delay_sum += static_cast<double>(delay);
      result.max_delay = std::max(result.max_delay, delay);
      if (store.version() % config.eval_every == 0 || store.version() >= config.max_updates) {
        evaluate(result, time);
        if (config.stop_at_accuracy && result.curve.back().accuracy >= *config.stop_at_accuracy)
          stop = true;
      }
      if (store.version() >= config.max_updates) stop = true;
      if (progress && (store.version() % 25 == 0 || stop)) {
        progress({store.version(), config.max_updates,
                  result.curve.size() > 1 ? result.curve.back().accuracy : -1, result.ingress_bytes,
                  delay_sum / result.updates_applied});
      }
      return true;
    }
    if (applied.status == server::ApplyStatus::kTooStale ||
        applied.status == server::ApplyStatus::kOutOfBounds) {
      result.updates_refused++;  // too stale, or (a diverging run) it would push a parameter out of
                                 // bounds
      if (++refused_in_a_row >= stall_after) {
        result.stalled = true;
        stop = true;
        if (result.curve.back().updates != store.version()) evaluate(result, time);
      }
      return false;
    }
    throw std::logic_error(std::string("sim: update refused: ") + applied.reason);
  };

  while (!stop && !events.empty()) {
    const Event event = events.top();
    events.pop();
    Worker& worker = sim.workers[event.worker];
    result.virtual_time = event.time;
    current_worker = event.worker;
    if (event.kind == EventKind::kStartStep && outages) {
      const int w = event.worker;
      if (link_down_at(config, w, event.time)) {
        // Offline: a local step from the copy last pulled, or idle until the link is back.
        if (offline_training && !last_pulled[w].empty() && offline[w].steps() < config.offline_steps) {
          if (!offline[w].started()) offline[w].begin(last_pulled[w], fetched[w]);
          worker.sampler.next_batch(config.batch, sim.batch_pixels, sim.batch_labels);
          const runtime::BatchResult batch = sim.trainer.compute_gradient(
              offline[w].local_parameters(), sim.batch_pixels.data(), sim.batch_labels.data(),
              config.batch, sim.gradient);
          result.offline_steps++;
          if (!std::isfinite(batch.loss) || !offline[w].add_step(sim.gradient))
            result.non_finite_steps++;  // skipped, as the real worker's offline_step does
          events.push({event.time + worker.speed * sim.random.log_normal(config.step_jitter), w,
                       EventKind::kStartStep});
        } else {
          events.push({link_up_again(config, w, event.time), w, EventKind::kStartStep});
        }
        continue;
      }
      // The link is back: first the update it was down for, then the offline steps as one
      // update claiming them (the real worker's order), then the usual pull and step.
      if (!kept[w].empty()) {
        deliver(kept[w], event.time);
        kept[w].clear();
        if (stop) break;
      }
      if (offline_training && offline[w].steps() > 0) {
        transport::SparseUpdate update;
        update.model_id = sim.model.layout_id();
        update.sequence = ++worker.sequence;
        update.fetched_version = offline[w].from_version();
        update.local_steps =
            static_cast<std::uint16_t>(std::min<std::uint64_t>(offline[w].steps(), 65535));
        const double online_rate = worker.compressor.options().compression_rate;
        worker.compressor.set_compression_rate(runtime::offline_compression_rate(
            online_rate, offline[w].steps(), config.offline_max_rate));
        worker.compressor.compress(offline[w].sum(), update);
        worker.compressor.set_compression_rate(online_rate);
        offline[w].clear();
        auto encoded = transport::encode_sparse_update(update, {config.compressor.value_encoding});
        if (!encoded)
          throw std::logic_error("sim: encoder refused an offline update: " + encoded.error().message);
        if (deliver(encoded.value(), event.time))
          result.offline_updates_applied++;
        else
          result.offline_updates_refused++;
        if (stop) break;
      } else if (offline_training && offline[w].started()) {
        offline[w].clear();
      }
    }
    if (event.kind == EventKind::kStartStep) {
      // Pull, then compute on the model as pulled (the published one, if the server has one).
      const server::ChangeRecord served = server::served_changes(
          sim.model.layout_id(), tensor_sizes, store, published ? &*published : nullptr);
      std::span<const float> pulled = served.parameters;
      if (replica_pulls) {
        std::vector<float>& replica = replicas[event.worker];
        std::span<std::uint64_t> since;
        if (keep_since) since = replica_since[event.worker];
        if (replica.empty()) {
          replica.assign(store.parameters().begin(), store.parameters().end());
          if (keep_since) replica_since[event.worker].assign(replica.size(), store.version());
          result.pull_bytes += sim.model_bytes;
        } else {
          const transport::ModelDelta delta = server::replica_pull(
              sim.model.layout_id(), tensor_sizes, store.parameters(), store.version(), replica,
              replica_versions[event.worker], config.replica_pull, since);
          auto encoded = transport::encode_model_delta(delta);
          if (!encoded)
            throw std::logic_error("sim: cannot encode a pull: " + encoded.error().message);
          if (encoded.value().size() < sim.model_bytes) {
            result.pull_bytes += encoded.value().size();
          } else {  // the server sends the dense model instead, as for an exact pull
            replica.assign(store.parameters().begin(), store.parameters().end());
            std::fill(since.begin(), since.end(), store.version());
            result.pull_bytes += sim.model_bytes;
          }
        }
        replica_versions[event.worker] = store.version();
        pulled = replica;
      } else {
        result.pull_bytes += pull_size(served, held[event.worker]);
      }
      pulls++;
      held[event.worker] = served.version;
      fetched[event.worker] = served.version;
      if (offline_training) last_pulled[event.worker].assign(pulled.begin(), pulled.end());
      worker.sampler.next_batch(config.batch, sim.batch_pixels, sim.batch_labels);
      const runtime::BatchResult batch =
          sim.trainer.compute_gradient(pulled, sim.batch_pixels.data(),
                                       sim.batch_labels.data(), config.batch, sim.gradient);
      if (config.local_dp_clip > 0) {
        clip_and_noise(sim.gradient, config.local_dp_clip,
                       config.local_dp_noise_multiplier * config.local_dp_clip, local_noise);
        local_dp_steps[event.worker]++;
      }
      transport::SparseUpdate update;
      update.model_id = sim.model.layout_id();
      update.sequence = ++worker.sequence;
      update.fetched_version = fetched[event.worker];
      if (!runtime::compress_step(batch, sim.gradient, worker.compressor, update)) {
        // runtime::Worker's skip: a gradient that is not finite is not sent; the worker pulls
        // again and steps once this step's time is over. A run where that keeps happening
        // (a diverged model) stalls as one whose updates are all refused.
        result.non_finite_steps++;
        if (++refused_in_a_row >= stall_after) {
          result.stalled = true;
          if (result.curve.back().updates != store.version()) evaluate(result, event.time);
          break;
        }
        events.push({event.time + worker.speed * sim.random.log_normal(config.step_jitter),
                     event.worker, EventKind::kStartStep});
        continue;
      }
      auto encoded = transport::encode_sparse_update(update, {config.compressor.value_encoding});
      if (!encoded)
        throw std::logic_error("sim: encoder refused an update: " + encoded.error().message);
      worker.pending = std::move(encoded).value();
      const double step = worker.speed * sim.random.log_normal(config.step_jitter);
      if (config.failure_probability > 0 && may_fail[event.worker] &&
          sim.random.uniform() < config.failure_probability) {
        result.updates_lost++;
        const double downtime = sim.random.exponential(config.downtime_steps);
        const double back_at = event.time + step * sim.random.uniform() + downtime;
        if (config.failures_permanent) {
          result.workers_left++;
        } else {
          events.push({back_at, event.worker, EventKind::kStartStep});
        }
      } else {
        events.push({event.time + step, event.worker, EventKind::kUpdateArrives});
      }
      continue;
    }
    if (outages && link_down_at(config, event.worker, event.time)) {
      // The post fails: the update is kept for when the link is back.
      kept[event.worker] = std::move(worker.pending);
      worker.pending.clear();
      result.kept_updates++;
      events.push({event.time, event.worker, EventKind::kStartStep});
      continue;
    }
    deliver(worker.pending, event.time);
    if (result.stalled) break;
    events.push({event.time, event.worker, EventKind::kStartStep});
  }
  if (config.local_dp_clip > 0) {
    // The device with the most steps, at its own sampling rate.
    for (int w = 0; w < config.workers; ++w) {
      if (local_dp_steps[w] == 0) continue;
      const double q = std::min(1.0, static_cast<double>(config.batch) /
                                         static_cast<double>(sim.workers[w].sampler.shard_size()));
      server::DpAccountant accountant(q, config.local_dp_noise_multiplier / 2);
      accountant.add_rounds(local_dp_steps[w]);
      result.local_dp_epsilon = std::max(result.local_dp_epsilon,
                                         accountant.epsilon(config.local_dp_delta).epsilon);
    }
  }
  result.mean_delay = result.updates_applied ? delay_sum / result.updates_applied : 0;
  result.mean_update_bytes =
      updates_received ? static_cast<double>(update_bytes_sum) / updates_received : 0;
  result.mean_pull_bytes = pulls ? static_cast<double>(result.pull_bytes) / pulls : 0;
  if (published) result.published_lag = published->relative_lag();
}

// One selected worker's answer in a round: its encoded delta and when it reaches the server.
struct RoundArrival {
  double time;
  int worker;
  std::uint64_t examples;
  std::vector<std::uint8_t> encoded;
};

// The selected workers of one round: max(1, round(fraction · workers)) of those that have not
// left, a partial Fisher-Yates shuffle on the run's Random; in worker order.
std::vector<int> select_clients(const std::vector<bool>& gone, double client_fraction,
                                Random& random) {
  std::vector<int> candidates;
  for (int w = 0; w < static_cast<int>(gone.size()); ++w)
    if (!gone[w]) candidates.push_back(w);
  const auto wanted =
      std::max<long>(1, std::lround(client_fraction * static_cast<double>(gone.size())));
  const std::size_t count =
      std::min<std::size_t>(static_cast<std::size_t>(wanted), candidates.size());
  for (std::size_t i = 0; i < count; ++i) {
    const auto j =
        i + static_cast<std::size_t>(random.uniform() * static_cast<double>(candidates.size() - i));
    std::swap(candidates[i], candidates[std::min(j, candidates.size() - 1)]);
  }
  candidates.resize(count);
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

// Federated rounds (FedAvg): see simulator.h.
void run_rounds(Simulation& sim, SimResult& result, const ProgressCallback& progress) {
  const SimConfig& config = sim.config;
  const RoundsConfig& rounds = config.rounds;
  server::ParameterStore& store = sim.store;
  const std::size_t parameter_count = sim.model.parameter_count();

  runtime::RoundInfo
      round_info;  // only the step rule: runtime::round_steps, as the real worker counts
  round_info.local_steps = rounds.local_steps;
  round_info.local_epochs = rounds.local_epochs;
  std::vector<std::uint64_t> steps_of(config.workers);
  double mean_steps = 0;
  for (int w = 0; w < config.workers; ++w) {
    steps_of[w] =
        runtime::round_steps(round_info, sim.workers[w].sampler.shard_size(), config.batch);
    mean_steps += static_cast<double>(steps_of[w]) / config.workers;
  }
  const double deadline =
      rounds.deadline_steps > 0 ? rounds.deadline_steps : kDefaultDeadlineFactor * mean_steps;
  // How long the server waits for a selected worker: the deadline, or with wait-all the
  // server's safety limit for a worker that vanished.
  const double close_limit =
      rounds.policy == RoundPolicy::kDropStragglers ? deadline : kWaitAllSafetyFactor * deadline;

  const std::vector<bool> may_fail = failing_workers(config);
  std::vector<bool> gone(config.workers, false);
  // When each worker can start on a round: a straggler is still training the round it
  // missed, a crashed worker is down. The server still counts it as selected (it cannot
  // know), so it starts late, and may miss this round's close too.
  std::vector<double> ready_at(config.workers, 0.0);
  // Stragglers' deltas reach the server after their round closed: their bytes count when
  // they arrive (before the run ends), not in the aggregate.
  std::vector<std::pair<double, std::uint64_t>> late_bytes;
  auto count_late_bytes_until = [&](double time) {
    std::erase_if(late_bytes, [&](const std::pair<double, std::uint64_t>& late) {
      if (late.first > time) return false;
      result.ingress_bytes += late.second;
      return true;
    });
  };
  std::vector<float> start(parameter_count), parameters(parameter_count);
  const auto output_bias = output_bias_range(sim.model);
  // dp-fedavg: the accountant, the fixed denominator (the workers a round selects) and the
  // noise's own generator, so that the run's other draws stay those of a run without it.
  std::optional<server::DpAccountant> accountant;
  if (rounds.aggregation.kind == server::Aggregation::kDpFedAvg)
    accountant.emplace(rounds.client_fraction, rounds.dp_noise_multiplier);
  std::optional<privacy::SkellamPlan> skellam;
  if (accountant && rounds.dp_skellam) {
    skellam = privacy::skellam_plan(rounds.dp_noise_multiplier, rounds.clip_norm, rounds.dp_noise_survivors,
                                    parameter_count);
    accountant = server::DpAccountant::skellam(rounds.client_fraction, skellam->l1_bound, skellam->l2_bound,
                                               skellam->central_variance());
  }
  const double dp_denominator = static_cast<double>(
      std::max<long>(1, std::lround(rounds.client_fraction * static_cast<double>(config.workers))));
  Random noise(config.seed ^ 0xd1b54a32d192ed03ull);
  // Adaptive clipping: the current clip norm, and the deltas' share of the noise budget.
  double clip_norm = rounds.clip_norm;
  double delta_noise_multiplier = rounds.dp_noise_multiplier;
  const server::AdaptiveClipping& adaptive = rounds.adaptive_clipping;
  if (accountant && adaptive.enabled())
    delta_noise_multiplier = server::delta_noise_multiplier(
        rounds.dp_noise_multiplier, server::count_noise_stddev(adaptive, dp_denominator));
  const float delta_bound = store_options(config).max_parameter_magnitude;
  std::uint64_t pulls = 0, deltas_received = 0, delta_bytes_sum = 0, deltas_aggregated = 0;
  std::uint64_t unchanged_in_a_row = 0;  // rounds that left the model as it was
  double now = 0;
  sim.evaluate(result, store.version(), now);

  while (store.version() < rounds.max_rounds) {
    const std::vector<int> selected = select_clients(gone, rounds.client_fraction, sim.random);
    if (selected.empty()) break;  // every worker left for good
    std::copy(store.parameters().begin(), store.parameters().end(), start.begin());
    std::vector<RoundArrival> arrivals;
    for (const int w : selected) {
      Worker& worker = sim.workers[w];
      result.pull_bytes += sim.model_bytes;
      pulls++;
      // Local training: the real worker's (runtime::train_round_locally: plain SGD from the
      // round's model, the delta new − start into sim.gradient), one step time per minibatch;
      // a crash draw per step, as in async mode.
      const double started = std::max(now, ready_at[w]);
      double elapsed = 0;
      bool crashed = false;
      runtime::LocalTrainingHooks hooks;
      hooks.before_step = [&] {
        const double step_time = worker.speed * sim.random.log_normal(config.step_jitter);
        if (config.failure_probability > 0 && may_fail[w] &&
            sim.random.uniform() < config.failure_probability) {
          crashed = true;
          const double crashed_at = started + elapsed + step_time * sim.random.uniform();
          if (config.failures_permanent) {
            gone[w] = true;
            result.workers_left++;
          } else {
            ready_at[w] = crashed_at + sim.random.exponential(config.downtime_steps);
          }
          return false;
        }
        elapsed += step_time;
        return true;
      };
      const runtime::LocalTraining trained =
          runtime::train_round_locally({sim.trainer, worker.sampler, config.batch, rounds.local_lr,
                                        sim.batch_pixels, sim.batch_labels, sim.gradient},
                                       steps_of[w], start, parameters, sim.gradient, hooks);
      if (crashed) {
        result.updates_lost++;
        continue;
      }
      // A malicious worker (ours, issue 37) sends its delta with the attack applied.
      if (w < rounds.malicious_workers)
        apply_model_attack(rounds.attack,
                           std::span<float>(sim.gradient.data(), parameter_count), output_bias);
      // The delta goes through the compressor in place of a gradient (runtime::RoundWorker).
      const std::uint64_t examples = trained.examples;
      bool finite = examples > 0;
      for (std::size_t i = 0; i < parameter_count && finite; ++i)
        finite = std::isfinite(sim.gradient[i]);
      if (!finite) {
        result.updates_lost++;  // a diverged worker has nothing the server would take
        continue;
      }
      transport::SparseUpdate update;
      update.model_id = sim.model.layout_id();
      update.sequence = ++worker.sequence;
      update.fetched_version = store.version();  // the round number
      worker.compressor.compress(sim.gradient, update);
      auto encoded = transport::encode_sparse_update(update, {config.compressor.value_encoding});
      if (!encoded)
        throw std::logic_error("sim: encoder refused a round delta: " + encoded.error().message);
      ready_at[w] = started + elapsed;
      arrivals.push_back({started + elapsed, w, examples, std::move(encoded).value()});
    }
    // The server's round log holds the deltas in arrival order (ties: worker order).
    std::stable_sort(arrivals.begin(), arrivals.end(),
                     [](const RoundArrival& a, const RoundArrival& b) { return a.time < b.time; });

    // The close, as server::RoundCoordinator decides it: when every selected worker has
    // answered, or at the deadline with at least one delta; a round with none by then gets a
    // new deadline. A round no selected worker can answer ends empty at its deadline (ours).
    double close = now + close_limit;
    if (!arrivals.empty()) {
      close =
          now + close_limit * std::max(1.0, std::ceil((arrivals.front().time - now) / close_limit));
      if (arrivals.size() == selected.size() && arrivals.back().time <= close)
        close = arrivals.back().time;
    }
    count_late_bytes_until(close);
    std::vector<server::RoundDelta> deltas;
    std::size_t unclipped = 0;
    for (RoundArrival& arrival : arrivals) {
      deltas_received++;
      delta_bytes_sum += arrival.encoded.size();
      if (arrival.time > close) {
        result.round_stragglers++;
        late_bytes.push_back({arrival.time, arrival.encoded.size()});
        continue;
      }
      result.ingress_bytes += arrival.encoded.size();
      auto decoded = transport::decode_sparse_update(arrival.encoded, sim.expected);
      if (!decoded)
        throw std::logic_error("sim: server refused a well-formed round delta: " +
                               decoded.error().message);
      // What server::RoundCoordinator takes of it: refused past the bound, clipped.
      if (!server::round_delta_problem(decoded.value(), rounds.server_lr, delta_bound).empty()) {
        result.round_deltas_refused++;
        continue;
      }
      const double norm = server::clip_round_delta(decoded.value(), clip_norm);
      if (norm > clip_norm && clip_norm > 0) result.round_deltas_clipped++;
      if (server::counts_as_unclipped(norm, clip_norm, /*reloaded=*/false)) unclipped++;
      deltas.push_back({arrival.examples, std::move(decoded).value()});
    }
    now = close;
    result.virtual_time = now;
    // A run in which no round changes the model any more (every delta lost, or a diverged
    // model whose every close the store refuses) would otherwise never reach max_rounds.
    auto stalls = [&] {
      if (++unchanged_in_a_row < kStallRounds) return false;
      result.stalled = true;
      if (result.curve.back().updates != store.version())
        sim.evaluate(result, store.version(), now);
      return true;
    };
    if (deltas.empty()) {
      result.empty_rounds++;
      if (stalls()) break;
      continue;
    }
    // The server's close (server::round_close_update, as server::RoundCoordinator closes a
    // round): one update through the store, delay 0 (divisor 1), values −server_lr·Δ/lr, so
    // the model moves by server_lr·Δ as on the server.
    transport::SparseUpdate close_update;
    double next_clip = clip_norm;
    if (accountant) {
      if (rounds.dp_target_epsilon > 0) {
        server::DpAccountant next = *accountant;
        next.add_rounds(1);
        if (next.epsilon(rounds.dp_delta).epsilon > rounds.dp_target_epsilon) {
          result.privacy_exhausted = true;  // as the server: this round is not closed
          if (result.curve.back().updates != store.version())
            sim.evaluate(result, store.version(), now);
          break;
        }
      }
      server::AggregationRule rule = rounds.aggregation;
      rule.expected_devices = dp_denominator;
      std::vector<float> mean;
      if (skellam) {
        mean = skellam_noise_close(deltas, sim.tensor_sizes, *skellam, dp_denominator, noise);
      } else if (rounds.dp_noise_survivors > 0) {
        mean = distributed_noise_close(deltas, sim.tensor_sizes, delta_noise_multiplier,
                                       clip_norm, rounds.dp_noise_survivors, dp_denominator, noise);
      } else {
        mean = server::aggregate_deltas(deltas, sim.tensor_sizes, rule);
        const double stddev = delta_noise_multiplier * clip_norm / dp_denominator;
        for (float& v : mean) v = static_cast<float>(v + stddev * noise.normal());
      }
      if (adaptive.enabled()) {
        // Central: the server's draw; distributed: each device's share σ_b/√c (its value of
        // the masked vector: privacy::quantized_count_value, whose ring rounding is below 1e-8).
        double count_noise = 0;
        const double count_stddev = server::count_noise_stddev(adaptive, dp_denominator);
        if (rounds.dp_noise_survivors > 0) {
          for (std::size_t d = 0; d < deltas.size(); ++d)
            count_noise += count_stddev / std::sqrt(static_cast<double>(rounds.dp_noise_survivors)) * noise.normal();
        } else {
          count_noise = count_stddev * noise.normal();
        }
        next_clip =
            server::next_clip_norm(clip_norm, unclipped, count_noise, dp_denominator, adaptive);
      }
      close_update = server::close_update_of(mean, sim.tensor_sizes, rounds.server_lr,
                                             config.learning_rate, sim.model.layout_id(),
                                             store.version());
    } else {
      close_update = server::round_close_update(deltas, sim.tensor_sizes, rounds.aggregation,
                                                rounds.server_lr, config.learning_rate,
                                                sim.model.layout_id(), store.version());
    }
    const server::ApplyResult applied = store.apply(close_update);
    if (applied.status == server::ApplyStatus::kOutOfBounds) {
      result.updates_refused++;  // a diverged round: the model stays; the next round tries again
      if (stalls()) break;
      continue;
    }
    if (!applied.applied())
      throw std::logic_error(std::string("sim: round close refused: ") + applied.reason);
    unchanged_in_a_row = 0;
    result.updates_applied++;
    deltas_aggregated += deltas.size();
    if (accountant) {
      accountant->add_rounds(1);
      result.dp_epsilon_by_round.push_back(accountant->epsilon(rounds.dp_delta).epsilon);
      if (adaptive.enabled()) result.clip_norm_by_round.push_back(clip_norm);
      clip_norm = next_clip;
    }
    bool stop = store.version() >= rounds.max_rounds;
    if (store.version() % config.eval_every == 0 || stop) {
      sim.evaluate(result, store.version(), now);
      if (config.stop_at_accuracy && result.curve.back().accuracy >= *config.stop_at_accuracy)
        stop = true;
    }
    if (progress) {
      Progress p{store.version(), rounds.max_rounds,
                 result.curve.size() > 1 ? result.curve.back().accuracy : -1, result.ingress_bytes,
                 0};
      p.round_stragglers = result.round_stragglers;
      progress(p);
    }
    if (stop) break;
  }
  result.mean_update_bytes =
      deltas_received ? static_cast<double>(delta_bytes_sum) / deltas_received : 0;
  result.mean_pull_bytes = pulls ? static_cast<double>(result.pull_bytes) / pulls : 0;
  result.mean_round_deltas =
      result.updates_applied ? static_cast<double>(deltas_aggregated) / result.updates_applied : 0;
}

}  // namespace

void check_sim_config(const SimConfig& config) { check_config_values(config); }

const char* sim_mode_name(SimMode mode) { return mode == SimMode::kAsync ? "async" : "rounds"; }

SimMode parse_sim_mode(const std::string& name) {
  if (name == "async") return SimMode::kAsync;
  if (name == "rounds") return SimMode::kRounds;
  throw std::invalid_argument("unknown mode '" + name + "' (async or rounds)");
}

double SimResult::best_accuracy() const {
  double best = 0;
  for (const auto& p : curve) best = std::max(best, p.accuracy);
  return best;
}

std::optional<std::uint64_t> SimResult::ingress_bytes_to(double target) const {
  for (const auto& p : curve) {
    if (p.accuracy >= target) return p.ingress_bytes;
  }
  return std::nullopt;
}

std::optional<std::uint64_t> SimResult::traffic_bytes_to(double target) const {
  for (const auto& p : curve) {
    if (p.accuracy >= target) return p.ingress_bytes + p.pull_bytes;
  }
  return std::nullopt;
}

std::optional<std::uint64_t> SimResult::updates_to(double target) const {
  for (const auto& p : curve) {
    if (p.accuracy >= target) return p.updates;
  }
  return std::nullopt;
}

std::optional<double> SimResult::time_to(double target) const {
  for (const auto& p : curve) {
    if (p.accuracy >= target) return p.time;
  }
  return std::nullopt;
}

SimResult run_simulation(const SimConfig& config, const runtime::Dataset& train,
                         const runtime::Dataset& test, const std::string& label,
                         const ProgressCallback& progress) {
  check_sim_config(config);
  const auto wall_start = std::chrono::steady_clock::now();
  Simulation sim(config, train, test);
  SimResult result;
  result.label = label;
  if (config.mode == SimMode::kRounds) {
    run_rounds(sim, result, progress);
  } else {
    run_async(sim, result, progress);
  }
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  result.final_parameters.assign(sim.store.parameters().begin(), sim.store.parameters().end());
  return result;
}

}  // namespace edgetrain::sim
