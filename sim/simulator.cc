#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <queue>
#include <stdexcept>

#include "runtime/shard_sampler.h"
#include "runtime/splitmix64.h"
#include "runtime/thread_pool.h"
#include "runtime/trainer.h"
#include "server/model_changes.h"

namespace edgetrain::sim {
namespace {

// splitmix64 with Box-Muller: the same numbers on every platform for a seed.
class Random {
 public:
  explicit Random(std::uint64_t seed) : generator_{seed} {}
  double uniform() { return generator_.uniform_double(); }  // [0, 1)
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  double log_normal(double sigma) { return sigma > 0 ? std::exp(sigma * normal() - 0.5 * sigma * sigma) : 1.0; }
  double exponential(double mean) { return -mean * std::log(1.0 - uniform()); }

 private:
  runtime::SplitMix64 generator_;
};

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

void check_config(const SimConfig& c) {
  if (c.workers < 1) throw std::invalid_argument("sim: need at least one worker");
  if (c.batch < 1) throw std::invalid_argument("sim: batch size must be at least 1");
  if (!(c.learning_rate > 0)) throw std::invalid_argument("sim: learning rate must be positive");
  if (c.max_updates < 1) throw std::invalid_argument("sim: max updates must be at least 1");
  if (c.eval_every < 1) throw std::invalid_argument("sim: eval interval must be at least 1");
  if (c.speed_spread < 0 || c.step_jitter < 0) throw std::invalid_argument("sim: speed spreads must be >= 0");
  if (c.failure_probability < 0 || c.failure_probability >= 1) {
    throw std::invalid_argument("sim: failure probability must be in [0, 1)");
  }
  if (!(c.failing_fraction >= 0 && c.failing_fraction <= 1)) throw std::invalid_argument("sim: failing fraction must be in [0, 1]");
  if (!(c.downtime_steps >= 0)) throw std::invalid_argument("sim: downtime must be >= 0");
}

// The workers that may fail: round(failing_fraction · workers) of them, drawn from their own
// seeded stream so that the run's other draws (and so runs without failures) are unchanged.
std::vector<bool> failing_workers(const SimConfig& c) {
  std::vector<int> order(c.workers);
  for (int w = 0; w < c.workers; ++w) order[w] = w;
  runtime::SplitMix64 draw{c.seed ^ 0x6661696c696e67ULL};  // "failing"
  for (int i = c.workers - 1; i > 0; --i) std::swap(order[i], order[draw.next() % static_cast<std::uint64_t>(i + 1)]);
  const auto count = static_cast<int>(std::lround(c.failing_fraction * c.workers));
  std::vector<bool> may_fail(c.workers, false);
  for (int i = 0; i < count; ++i) may_fail[order[i]] = true;
  return may_fail;
}

}  // namespace

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

std::optional<std::uint64_t> SimResult::updates_to(double target) const {
  for (const auto& p : curve) {
    if (p.accuracy >= target) return p.updates;
  }
  return std::nullopt;
}

SimResult run_simulation(const SimConfig& config, const runtime::Dataset& train, const runtime::Dataset& test,
                         const std::string& label, const ProgressCallback& progress) {
  check_config(config);
  const auto wall_start = std::chrono::steady_clock::now();
  runtime::Model model(runtime::model_spec_from_argument(config.model));
  const runtime::ExampleShape in = model.input_shape();
  if (static_cast<std::uint32_t>(in.H) != train.height || static_cast<std::uint32_t>(in.W) != train.width ||
      static_cast<std::uint32_t>(in.C) != train.channels || train.image_bytes() != test.image_bytes()) {
    throw runtime::ModelError("sim: model input " + std::to_string(in.H) + "x" + std::to_string(in.W) + "x" +
                              std::to_string(in.C) + " does not match the data's " + std::to_string(train.height) +
                              "x" + std::to_string(train.width) + "x" + std::to_string(train.channels));
  }
  if (model.num_classes() < static_cast<int>(train.num_classes)) {
    throw runtime::ModelError("sim: model has " + std::to_string(model.num_classes()) + " outputs for " +
                              std::to_string(train.num_classes) + " classes");
  }
  if (train.size() < static_cast<std::size_t>(config.workers)) throw std::invalid_argument("sim: fewer examples than workers");
  model.initialize(config.seed);

  std::vector<std::uint32_t> tensor_sizes;
  std::vector<runtime::TensorSlice> layout;
  for (const auto& t : model.tensors()) {
    tensor_sizes.push_back(static_cast<std::uint32_t>(t.size));
    layout.push_back({t.offset, static_cast<std::uint32_t>(t.size)});
  }
  server::ParameterStoreOptions store_options;
  store_options.learning_rate = config.learning_rate;
  store_options.max_staleness = config.max_staleness;
  store_options.rule = config.staleness_rule;
  server::ParameterStore store(model.layout_id(), tensor_sizes,
                               std::vector<float>(model.parameters().begin(), model.parameters().end()), store_options);
  const transport::ModelLayout expected{model.layout_id(), tensor_sizes};
  // Every pull ships the same number of bytes: encode the model once to know it.
  auto model_message = transport::encode_dense_model(model.layout_id(), 0, tensor_sizes, store.parameters());
  if (!model_message) throw std::logic_error("sim: cannot encode the model: " + model_message.error().message);
  const std::uint64_t model_bytes = model_message.value().size();
  std::optional<server::PublishedModel> published;
  if (config.publish.enabled()) published.emplace(tensor_sizes, store.parameters(), store.version(), config.publish);
  const bool delta_pulls = config.delta_pulls || published.has_value();
  // The bytes of one pull by a worker that holds `held` (nothing: dense), as the server
  // would send them. The digest field's value does not change the size: left 0.
  auto pull_size = [&](const server::ChangeRecord& served, std::optional<std::uint64_t> held) -> std::uint64_t {
    if (!delta_pulls || !held) return model_bytes;
    const auto delta = server::encode_changes_since(served, *held);
    return delta ? delta->size() : model_bytes;
  };

  runtime::ThreadPool pool(config.threads);
  runtime::Trainer trainer(model, config.batch, config.kernels, pool.get());
  if (!config.conv_drop_rates.empty()) {
    runtime::DropoutConfig dropout;
    dropout.conv_drop_rates = config.conv_drop_rates;
    dropout.rescale = config.dropout_rescale;
    dropout.seed = config.seed * 0x9E3779B97F4A7C15ULL + 3;  // its own stream: the batches stay as without dropout
    trainer.set_dropout(dropout);  // validates against the model (std::invalid_argument)
  }
  const int eval_batch = 100;
  runtime::Trainer evaluator(model, eval_batch, config.kernels, pool.get());
  std::vector<float> gradient(model.parameter_count());
  std::vector<std::uint8_t> batch_pixels(static_cast<std::size_t>(config.batch) * train.image_bytes());
  std::vector<std::int32_t> batch_labels(config.batch);

  Random random(config.seed * 0x2545F4914F6CDD1DULL + 17);
  std::vector<Worker> workers;
  workers.reserve(config.workers);
  for (int w = 0; w < config.workers; w++) {
    runtime::ShardSpec shard_spec{static_cast<std::uint32_t>(w), static_cast<std::uint32_t>(config.workers), config.seed};
    auto shard = config.label_skewed ? runtime::shard_label_skewed(train.labels, train.num_classes, shard_spec, config.skew)
                                     : runtime::shard_iid(train.size(), shard_spec);
    if (shard.empty()) throw std::invalid_argument("sim: worker " + std::to_string(w) + " got an empty shard");
    workers.push_back(Worker{runtime::ShardSampler(train, std::move(shard), config.seed + 1000003ULL * (w + 1)),
                             random.log_normal(config.speed_spread), runtime::Compressor(layout, config.compressor), 0,
                             {}});
  }

  const std::size_t eval_count = config.eval_examples ? std::min(config.eval_examples, test.size()) : test.size();
  auto evaluate = [&](SimResult& result, double time) {
    std::size_t correct = 0;
    double loss_sum = 0;
    for (std::size_t start = 0; start < eval_count; start += eval_batch) {
      const int count = static_cast<int>(std::min<std::size_t>(eval_batch, eval_count - start));
      auto r = evaluator.evaluate(store.parameters(), test.pixels.data() + start * test.image_bytes(),
                                  test.labels.data() + start, count);
      correct += r.correct;
      loss_sum += static_cast<double>(r.loss) * count;
    }
    result.curve.push_back({store.version(), time, result.ingress_bytes, result.pull_bytes,
                            static_cast<double>(correct) / eval_count, loss_sum / eval_count});
  };

  SimResult result;
  result.label = label;
  evaluate(result, 0);
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  for (int w = 0; w < config.workers; w++) events.push({random.uniform() * workers[w].speed, w, EventKind::kStartStep});
  std::vector<std::uint64_t> fetched(config.workers, 0);
  std::vector<std::optional<std::uint64_t>> held(config.workers);  // the version of each worker's copy
  std::uint64_t pulls = 0;
  const std::vector<bool> may_fail = failing_workers(config);
  double delay_sum = 0;
  std::uint64_t update_bytes_sum = 0, updates_received = 0;
  // Refusals in a row: a diverged model (every update beyond the parameter bound) would
  // otherwise loop for ever without reaching max_updates.
  std::uint64_t refused_in_a_row = 0;
  const std::uint64_t stall_after = std::max<std::uint64_t>(kStallArrivals, 10ULL * config.workers);
  bool stop = false;

  while (!stop && !events.empty()) {
    const Event event = events.top();
    events.pop();
    Worker& worker = workers[event.worker];
    if (event.kind == EventKind::kStartStep) {
      // Pull, then compute on the model as pulled (the published one, if the server has one).
      const server::ChangeRecord served =
          server::served_changes(model.layout_id(), tensor_sizes, store, published ? &*published : nullptr);
      result.pull_bytes += pull_size(served, held[event.worker]);
      pulls++;
      held[event.worker] = served.version;
      fetched[event.worker] = served.version;
      worker.sampler.next_batch(config.batch, batch_pixels, batch_labels);
      trainer.compute_gradient(served.parameters, batch_pixels.data(), batch_labels.data(), config.batch, gradient);
      transport::SparseUpdate update;
      update.model_id = model.layout_id();
      update.sequence = ++worker.sequence;
      update.fetched_version = fetched[event.worker];
      worker.compressor.compress(gradient, update);
      auto encoded = transport::encode_sparse_update(update, {config.compressor.value_encoding});
      if (!encoded) throw std::logic_error("sim: encoder refused an update: " + encoded.error().message);
      worker.pending = std::move(encoded).value();
      const double step = worker.speed * random.log_normal(config.step_jitter);
      if (config.failure_probability > 0 && may_fail[event.worker] && random.uniform() < config.failure_probability) {
        result.updates_lost++;
        const double downtime = random.exponential(config.downtime_steps);
        const double back_at = event.time + step * random.uniform() + downtime;
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
    // The update reaches the server: count its bytes, decode it as untrusted input, apply.
    result.ingress_bytes += worker.pending.size();
    update_bytes_sum += worker.pending.size();
    updates_received++;
    auto decoded = transport::decode_sparse_update(worker.pending, expected);
    if (!decoded) throw std::logic_error("sim: server refused a well-formed update: " + decoded.error().message);
    const std::uint64_t delay = store.version() - decoded.value().fetched_version;
    server::ApplyResult applied = store.apply(decoded.value());
    if (applied.applied()) {
      refused_in_a_row = 0;
      if (published) published->advance(store.parameters(), store.version());
      result.updates_applied++;
      delay_sum += static_cast<double>(delay);
      result.max_delay = std::max(result.max_delay, delay);
      if (store.version() % config.eval_every == 0 || store.version() >= config.max_updates) {
        evaluate(result, event.time);
        if (config.stop_at_accuracy && result.curve.back().accuracy >= *config.stop_at_accuracy) stop = true;
      }
      if (store.version() >= config.max_updates) stop = true;
      if (progress && (store.version() % 25 == 0 || stop)) {
        progress({store.version(), config.max_updates, result.curve.size() > 1 ? result.curve.back().accuracy : -1,
                  result.ingress_bytes, delay_sum / result.updates_applied});
      }
    } else if (applied.status == server::ApplyStatus::kTooStale || applied.status == server::ApplyStatus::kOutOfBounds) {
      result.updates_refused++;  // too stale, or (a diverging run) it would push a parameter out of bounds
      if (++refused_in_a_row >= stall_after) {
        result.stalled = true;
        if (result.curve.back().updates != store.version()) evaluate(result, event.time);
        break;
      }
    } else {
      throw std::logic_error(std::string("sim: update refused: ") + applied.reason);
    }
    events.push({event.time, event.worker, EventKind::kStartStep});
  }
  result.mean_delay = result.updates_applied ? delay_sum / result.updates_applied : 0;
  result.mean_update_bytes = updates_received ? static_cast<double>(update_bytes_sum) / updates_received : 0;
  result.mean_pull_bytes = pulls ? static_cast<double>(result.pull_bytes) / pulls : 0;
  if (published) result.published_lag = published->relative_lag();
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  result.final_parameters.assign(store.parameters().begin(), store.parameters().end());
  return result;
}

}  // namespace edgetrain::sim
