#include "worker/worker.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/logging.h"
#include "worker/backoff.h"
#include "worker/link_adaptation.h"
#include "worker/loop_support.h"
#include "model/model.h"
#include "worker/model_replica.h"
#include "worker/offline_training.h"
#include "worker/server_channel.h"
#include "worker/sharded_server_channel.h"
#include "model/shard_sampler.h"
#include "model/thread_pool.h"
#include "model/trainer.h"
#include "transport/coap_dtls.h"
#include "transport/untrusted_text.h"

namespace edgetrain::runtime {
namespace {

using loop::Clock;
using loop::layout_of;
using loop::payload_text;
using loop::sleep_unless_stopped;

}  // namespace

void parse_server_uri(const std::string& uri, std::string& host, std::uint16_t& port) {
  bool plaintext = false;
  if (uri.rfind("coap://", 0) == 0)
    throw std::invalid_argument("server URI must start with coaps:// (got '" + uri + "')");
  parse_server_uri(uri, host, port, plaintext);
}

void parse_server_uri(const std::string& uri, std::string& host, std::uint16_t& port,
                      bool& plaintext) {
  plaintext = uri.rfind("coap://", 0) == 0;
  const std::string scheme = plaintext ? "coap://" : "coaps://";
  if (uri.rfind(scheme, 0) != 0)
    throw std::invalid_argument("server URI must start with coaps:// (or coap://) (got '" + uri +
                                "')");
  std::string rest = uri.substr(scheme.size());
  if (auto slash = rest.find('/'); slash != std::string::npos) rest.resize(slash);
  port = plaintext ? 5683 : 5684;
  if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
    const auto close = rest.find(']');
    if (close == std::string::npos)
      throw std::invalid_argument("bad IPv6 address in '" + uri + "'");
    host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && rest[0] != ':')
      throw std::invalid_argument("bad server URI '" + uri + "'");
    if (!rest.empty())
      rest = rest.substr(1);
    else
      rest.clear();
  } else {
    const auto colon = rest.rfind(':');
    host = rest.substr(0, colon);
    rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
  }
  if (host.empty()) throw std::invalid_argument("server URI '" + uri + "' has no host");
  if (!rest.empty()) {
    std::size_t used = 0;
    int value = -1;
    try {
      value = std::stoi(rest, &used);
    } catch (...) {
    }
    if (used != rest.size() || value < 1 || value > 65535)
      throw std::invalid_argument("bad port in '" + uri + "'");
    port = static_cast<std::uint16_t>(value);
  }
}

std::vector<std::uint8_t> parse_hex_key(const std::string& text) {
  std::string digits;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if (!std::isxdigit(static_cast<unsigned char>(c)))
      throw std::invalid_argument("key is not hexadecimal");
    digits += c;
  }
  if (digits.empty() || digits.size() % 2 != 0)
    throw std::invalid_argument("key must be an even number of hex digits");
  if (digits.size() > 2 * transport::kMaxPskBytes) {
    throw std::invalid_argument(
        "the key is " + std::to_string(digits.size() / 2) +
        " bytes; the longest pre-shared key "
        "Mbed TLS 2.28 can use is " +
        std::to_string(transport::kMaxPskBytes) +
        " bytes (MBEDTLS_PSK_MAX_LEN): with a longer one every handshake fails");
  }
  std::vector<std::uint8_t> key;
  for (std::size_t i = 0; i < digits.size(); i += 2)
    key.push_back(static_cast<std::uint8_t>(std::stoi(digits.substr(i, 2), nullptr, 16)));
  return key;
}

std::vector<std::uint32_t> worker_shard(const WorkerConfig& config, const Dataset& train) {
  return shard_of(train, {config.worker_id, config.worker_count, config.seed}, config.label_skewed);
}

struct Worker::State {
  State(const WorkerConfig& config, const Dataset& train, ServerChannel& channel,
        const std::atomic<bool>& stop, WorkerLog log)
      : config(checked(config)),
        channel(channel),
        stop(stop),
        log(std::move(log)),
        model(model_for(config, train)),
        sampler(train, worker_shard(config, train),
                config.seed ^ (0x9e3779b97f4a7c15ULL * (config.worker_id + 1))),
        pool(config.threads),
        trainer(model, config.batch, KernelBackend::kXnnpack, pool.get()),
        dropout(config.dropout, model, trainer,
                config.seed ^ (0x2545f4914f6cdd1dULL * (config.worker_id + 1)),
                WorkerDropout::Pacing::kPerStep),
        compressor(layout_of(model), config.compressor),
        // Sized by the first step, after the first pull: a dense pull's buffers are gone by
        // then, and the two do not add up in the peak memory (1.7 MB for the paper CNN).
        gradient(),
        pixels(static_cast<std::size_t>(config.batch) * train.image_bytes()),
        labels(config.batch),
        // Failure bookkeeping and backoff, as every loop keeps them (worker/loop_support.h).
        trouble(
            this->config, stop,
            [this](const std::string& line, logging::Level level) { say(line, level); },
            [this] { stats.retries++; }),
        // Sequence numbers must keep growing across restarts of this worker, or the server
        // would take a new update for a replay: start from the wall clock in microseconds.
        sequence(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count())),
        replica(model.layout_id(), model.tensor_sizes(), config.dense_pull),
        offline(static_cast<float>(config.offline_lr)),
        budget_window(config.link.budget.enabled() ? config.link.budget.period_seconds : 3600),
        created(Clock::now()) {
    trainer.set_input_format(train.format);  // uint8 or float32 examples, and their scaling
    if (this->config.seeded_first_pull && !this->config.dense_pull && this->config.shards.empty()) {
      // A model with its own arena, gone at the end of this block: two copies for a moment,
      // as a dense first pull's body and its decoded values would be.
      Model seeded(model_spec_from_argument(this->config.model));
      seeded.initialize(this->config.seed);
      replica.assume(0, seeded.parameters());
    }
    trainer.set_step_seed(loop::dropout_step_seed(config.seed, config.worker_id));
    replica.accept_fp16_increments(config.fp16_increment_pulls);
    if (config.link.enabled()) {
      std::vector<std::uint32_t> sizes;
      for (const TensorSlice& slice : layout_of(model)) sizes.push_back(slice.size);
      chooser.emplace(config.link, std::move(sizes));
      // The first updates, before the uplink is measured, go at --rate within the bounds.
      first_rate = std::clamp(config.compressor.compression_rate, config.link.min_rate,
                              config.link.max_rate);
      compressor.set_compression_rate(first_rate);
      chosen_rate = first_rate;
    }
    stats.compression_rate = compressor.options().compression_rate;
  }

  static const WorkerConfig& checked(const WorkerConfig& config) {
    if (config.batch < 1) throw std::invalid_argument("worker: batch must be at least 1");
    if (config.pull_every < 1)
      throw std::invalid_argument("worker: pull interval must be at least 1");
    if (!(config.slowdown >= 0 && config.slowdown <= 1000))
      throw std::invalid_argument("worker: slowdown must be 0..1000");
    if (config.max_refusals < 1)
      throw std::invalid_argument("worker: max_refusals must be at least 1");
    if (!(config.give_up_after_seconds >= 0))
      throw std::invalid_argument("worker: give_up_after_seconds must be >= 0");
    if (!(config.offline_seconds >= 0 && std::isfinite(config.offline_seconds)))
      throw std::invalid_argument("worker: offline_seconds must be finite and >= 0");
    if (!(config.offline_lr > 0 && std::isfinite(config.offline_lr)))
      throw std::invalid_argument("worker: offline_lr must be finite and > 0");
    if (!(config.offline_max_rate >= 0 && config.offline_max_rate <= 1))
      throw std::invalid_argument("worker: offline_max_rate must lie in [0, 1]");
    if (!(config.offline_try_timeout_seconds >= 0 && config.offline_try_timeout_seconds <= 3600))
      throw std::invalid_argument("worker: offline_try_timeout_seconds must lie in [0, 3600]");
    if (!(config.offline_try_share > 0 && config.offline_try_share <= 1))
      throw std::invalid_argument("worker: offline_try_share must lie in (0, 1]");
    if (config.longest_request_ms < 0)
      throw std::invalid_argument("worker: longest_request_ms must be >= 0");
    if (config.link.enabled() && !config.shards.empty())
      throw std::invalid_argument(
          "worker: --send-share / --byte-budget do not work with --shards yet");
    if (config.fp16_increment_pulls && (config.dense_pull || !config.shards.empty()))
      throw std::invalid_argument(
          "worker: fp16 increment pulls are deltas of the cheap pull: not with dense pulls, nor "
          "with --shards yet");
    if (config.link.enabled() && config.compressor.method != CompressionMethod::kTopK)
      throw std::invalid_argument(
          "worker: --send-share / --byte-budget choose AdaComp's c: --compressor adacomp only");
    if (config.worker_count < 1 || config.worker_id >= config.worker_count) {
      throw std::invalid_argument("worker: id " + std::to_string(config.worker_id) +
                                  " is not below the worker count " +
                                  std::to_string(config.worker_count));
    }
    return config;
  }
  static Model model_for(const WorkerConfig& config, const Dataset& train) {
    // Layout only: the worker trains on its copy of the server's model (ModelReplica).
    Model model(model_spec_from_argument(config.model), Model::Arena::kNone);
    const ExampleShape in = model.input_shape();
    if (static_cast<std::uint32_t>(in.H) != train.height ||
        static_cast<std::uint32_t>(in.W) != train.width ||
        static_cast<std::uint32_t>(in.C) != train.channels) {
      throw ModelError("worker: model input does not match the data's image shape");
    }
    // A label at or past the model's outputs would index past its logits; user data names
    // its own class count (model/user_data.h).
    if (model.num_classes() < static_cast<int>(train.num_classes))
      throw ModelError("worker: model has " + std::to_string(model.num_classes()) +
                       " outputs for the data's " + std::to_string(train.num_classes) + " classes");
    return model;
  }

  // Lines below the process's --log-level are dropped here, so every program that runs a
  // worker loop gets the same filtering.
  void say(const std::string& line, logging::Level level = logging::Level::kInfo) const {
    if (log && logging::enabled(level)) log(line);
  }
  const WorkerConfig config;
  ServerChannel& channel;
  const std::atomic<bool>& stop;
  const WorkerLog log;
  Model model;
  ShardSampler sampler;
  ThreadPool pool;
  Trainer trainer;
  WorkerDropout dropout;
  Compressor compressor;
  std::vector<float> gradient;
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;
  loop::Trouble trouble;
  std::uint64_t sequence;
  ModelReplica replica;

  WorkerStats stats;
  std::uint64_t model_version = 0;
  bool have_model = false;  // false: pull before the next step
  std::uint64_t steps_since_pull = 0;
  int consecutive_mismatches = 0;
  int consecutive_non_finite = 0;
  std::vector<std::uint8_t> body;  // the encoded update of the last step
  bool ever_pulled = false;

  // Offline training (WorkerConfig::offline_steps, worker/offline_training.h).
  OfflineAccumulator offline;  // the local steps taken since the server went away
  bool is_offline = false;
  Clock::time_point offline_since, next_attempt;
  double earlier_offline_seconds = 0;
  // An update the server has not answered, sent again with the same bytes (and sequence)
  // before anything else once it answers: the step whose push found the server away (it may
  // have arrived; then the server takes the copy for a duplicate, and nothing is applied
  // twice), or an accumulated update whose push failed. At most one: the accumulated
  // steps are compressed only once nothing is pending, so updates go in sequence order.
  std::vector<std::uint8_t> pending;
  std::uint64_t pending_steps = 0;
  bool pending_offline = false;  // an accumulated offline update (else one online step)
  std::uint64_t pending_from_version = 0;
  // Why the worker is offline: the server away, or the byte budget spent.
  bool offline_for_budget = false;

  // Compression that follows the link (WorkerConfig::link, worker/link_adaptation.h).
  std::optional<RateChooser> chooser;
  double first_rate = 0;
  double chosen_rate = 0;  // the last choice before rate_dither()
  UplinkEstimate uplink;
  RateInputs rate_inputs;
  std::uint64_t updates_compressed = 0;
  ByteWindow budget_window;
  const Clock::time_point created;
  std::uint64_t sessions_counted = 0;
  double largest_recent_delta_wire = 0;  // decays, so an old large delta stops counting
  bool have_delta_size = false, have_pull_size = false;
  Clock::time_point budget_wait_since;
  double logged_rate = 0;
  Clock::time_point rate_logged_at;

  double seconds_since_start() const {
    return std::chrono::duration<double>(Clock::now() - created).count();
  }
  bool budget_on() const { return config.link.budget.enabled(); }
  // A transfer's estimated wire bytes into the budget (the pulls only when they are
  // counted), with a handshake for each new session the channel started.
  void count_transfer(std::size_t payload_bytes, bool upload) {
    const std::uint64_t sessions = channel.sessions_started();
    std::uint64_t bytes =
        (sessions - std::min(sessions, sessions_counted)) * kWireBytesPerHandshake;
    sessions_counted = std::max(sessions, sessions_counted);
    if (upload || config.link.budget_counts_pulls) bytes += estimated_wire_bytes(payload_bytes);
    if (!budget_on()) return;
    budget_window.add(seconds_since_start(), bytes);
    stats.budget_counted_bytes += bytes;
  }
  // What the next pull may cost: the dense model when the next pull is dense or no delta
  // was seen yet, else twice the largest recent delta (ours: a delta after a long wait can
  // be larger; see worker/README.md).
  double pull_reserve() const {
    if (!config.link.budget_counts_pulls) return 0;
    const double dense =
        static_cast<double>(estimated_wire_bytes(model.parameter_count() * sizeof(float) + 64));
    const bool next_is_dense = config.dense_pull || !ever_pulled || !replica.exact();
    return next_is_dense || !have_delta_size ? dense
                                             : std::min(dense, 2 * largest_recent_delta_wire);
  }
  void note_pull(std::size_t payload_bytes, bool delta) {
    const double wire = static_cast<double>(estimated_wire_bytes(payload_bytes));
    if (delta) {
      largest_recent_delta_wire = std::max(wire, 0.9 * largest_recent_delta_wire);
      have_delta_size = true;
    }
    rate_inputs.pull_wire_bytes =
        have_pull_size ? 0.8 * rate_inputs.pull_wire_bytes + 0.2 * wire : wire;
    have_pull_size = true;
  }
  void note_rest_of_step(Clock::duration rest) {
    const double seconds = std::chrono::duration<double>(rest).count();
    rate_inputs.rest_of_step_seconds = rate_inputs.rest_of_step_seconds > 0
                                           ? 0.8 * rate_inputs.rest_of_step_seconds + 0.2 * seconds
                                           : seconds;
  }
  // Seconds until the budget has room for `bytes` more (and a handshake, should the
  // session have to be renewed); 0 without a budget.
  double budget_wait(double bytes) {
    if (!budget_on()) return 0;
    return budget_window.seconds_until_room(
        seconds_since_start(), static_cast<std::uint64_t>(bytes) + kWireBytesPerHandshake,
        config.link.budget.bytes);
  }
  double next_update_wire_bytes() const {
    const double rate = compressor.options().compression_rate;
    const double payload =
        chooser ? chooser->predicted_payload_bytes(rate, rate_inputs.payload_bytes_per_entry)
                : static_cast<double>(body.size());
    return static_cast<double>(estimated_wire_bytes(static_cast<std::size_t>(payload)));
  }
  void begin_budget_wait(double seconds, bool offline_now) {
    if (stats.budget_waiting) return;
    stats.budget_waiting = true;
    stats.budget_waits++;
    budget_wait_since = Clock::now();
    say("byte budget: " + std::to_string(budget_window.spent(seconds_since_start())) + " of " +
        std::to_string(config.link.budget.bytes) + " bytes spent in the last " +
        std::to_string(static_cast<long long>(config.link.budget.period_seconds)) + " s; waiting " +
        std::to_string(static_cast<long long>(std::ceil(seconds))) + " s for room" +
        (offline_now ? ", training offline" : ""));
  }
  void end_budget_wait() {
    if (!stats.budget_waiting) return;
    stats.budget_waiting = false;
    stats.budget_wait_seconds +=
        std::chrono::duration<double>(Clock::now() - budget_wait_since).count();
  }
  void update_link_stats() {
    stats.uplink_bytes_per_second = uplink.bytes_per_second();
    stats.uplink_fixed_seconds = uplink.fixed_seconds();
    stats.step_seconds = rate_inputs.step_seconds;
    stats.turn_seconds_without_send = rate_inputs.rest_of_step_seconds;
    if (budget_on()) stats.budget_spent_bytes = budget_window.spent(seconds_since_start());
  }
  // c for the next update: from the measured uplink, with the budget's room left, varied a
  // little (rate_dither) so the uplink estimate sees different sizes; logged when it moved
  // by a quarter, at most every 10 s.
  void choose_rate() {
    if (!chooser) return;
    double rate = first_rate;
    if (uplink.ready()) {
      rate = std::min(chooser->choose(uplink, rate_inputs), kMaxRateGrowth * chosen_rate);
      if (budget_on()) {
        // Never plan past the room left in the period.
        const double room = static_cast<double>(config.link.budget.bytes) -
                            static_cast<double>(budget_window.spent(seconds_since_start())) -
                            static_cast<double>(kWireBytesPerHandshake) - pull_reserve();
        while (rate > config.link.min_rate &&
               static_cast<double>(estimated_wire_bytes(static_cast<std::size_t>(
                   chooser->predicted_payload_bytes(rate, rate_inputs.payload_bytes_per_entry)))) >
                   room)
          rate = std::max(config.link.min_rate, rate * 0.8);
      }
    }
    chosen_rate = rate;
    rate = std::clamp(rate * rate_dither(updates_compressed++), config.link.min_rate,
                      config.link.max_rate);
    compressor.set_compression_rate(rate);
    stats.compression_rate = rate;
    update_link_stats();
    const auto now = Clock::now();
    if ((logged_rate == 0 || std::fabs(rate / logged_rate - 1) > 0.25) &&
        now - rate_logged_at >= std::chrono::seconds(10)) {
      logged_rate = rate;
      rate_logged_at = now;
      char line[240];
      std::snprintf(line, sizeof line,
                    "compression rate c = %.4g (uplink %.1f kB/s + %.3f s per exchange; step "
                    "%.3f s, with the pull %.3f s%s)",
                    rate, uplink.bytes_per_second() / 1e3, uplink.fixed_seconds(),
                    rate_inputs.step_seconds, rate_inputs.rest_of_step_seconds,
                    budget_on() ? ("; budget " + std::to_string(stats.budget_spent_bytes) + " of " +
                                   std::to_string(config.link.budget.bytes) + " bytes spent")
                                      .c_str()
                                : "");
      say(line);
    }
  }
  // After an update of `payload` bytes was compressed at the rate in force.
  void note_update_size(std::size_t payload) {
    if (!chooser) return;
    const double entries =
        static_cast<double>(chooser->entries(compressor.options().compression_rate));
    if (entries > 0) rate_inputs.payload_bytes_per_entry = static_cast<double>(payload) / entries;
  }

  // The step's common part: one minibatch's gradient on `parameters`, the slowdown, the
  // dropout's choice, the counters.
  BatchResult train_batch(std::span<const float> parameters) {
    if (gradient.empty()) gradient.resize(model.parameter_count());
    sampler.next_batch(config.batch, pixels, labels);
    const auto step_started = Clock::now();
    const BatchResult batch =
        trainer.compute_gradient(parameters, pixels.data(), labels.data(), config.batch, gradient);
    if (config.slowdown > 0) {
      const auto compute_time = Clock::now() - step_started;
      sleep_unless_stopped(
          std::chrono::duration_cast<Clock::duration>(compute_time * config.slowdown), stop);
    }
    const double step_seconds = std::chrono::duration<double>(Clock::now() - step_started).count();
    rate_inputs.step_seconds = rate_inputs.step_seconds > 0
                                   ? 0.8 * rate_inputs.step_seconds + 0.2 * step_seconds
                                   : step_seconds;
    if (dropout.after_step(std::chrono::duration<double>(Clock::now() - step_started).count()))
      say(dropout.describe());
    stats.dropout = dropout.status();
    stats.steps++;
    stats.last_loss = batch.loss;
    return batch;
  }

  void count_non_finite_step() {
    stats.non_finite_steps++;
    if (++consecutive_non_finite >= 10) {
      throw std::runtime_error(
          "10 steps in a row gave a non-finite gradient: the server's model has diverged");
    }
  }

  // Offline training applies: on, and a model held that is the server's at model_version.
  bool can_train_offline() const {
    return config.offline_training() && ever_pulled && replica.exact();
  }
  // The server is away: (go on) training offline until next try in `delay`.
  void go_offline(Clock::duration delay, bool for_budget = false) {
    const auto now = Clock::now();
    next_attempt = now + delay;
    if (!is_offline) {
      is_offline = true;
      offline_for_budget = for_budget;
      offline_since = now;
      std::string bounds;
      if (config.offline_steps > 0)
        bounds = "at most " + std::to_string(config.offline_steps) + " steps";
      if (config.offline_seconds > 0)
        bounds += (bounds.empty() ? "for at most " : ", for at most ") +
                  std::to_string(config.offline_seconds) + " s";
      say(std::string(for_budget ? "the byte budget is spent" : "the server is away") +
          ": training offline from model version " + std::to_string(model_version) + " (" + bounds +
          ")");
    }
    if (!offline.started()) offline.begin(replica.parameters(), model_version);
    update_offline_stats();
  }
  void leave_offline() {
    const double seconds = std::chrono::duration<double>(Clock::now() - offline_since).count();
    earlier_offline_seconds += seconds;
    is_offline = false;
    update_offline_stats();
    say(std::string(offline_for_budget ? "room in the byte budget again"
                                       : "the server answers again") +
        ": back online after " + std::to_string(seconds) + " s offline");
    offline_for_budget = false;
    end_budget_wait();
  }
  bool within_offline_bounds() const {
    if (config.offline_steps > 0 && offline.steps() >= config.offline_steps) return false;
    return !(config.offline_seconds > 0 &&
             std::chrono::duration<double>(Clock::now() - offline_since).count() >=
                 config.offline_seconds);
  }
  void update_offline_stats() {
    stats.offline = is_offline;
    stats.buffered_steps = offline.steps() + pending_steps;
    stats.offline_seconds =
        earlier_offline_seconds +
        (is_offline ? std::chrono::duration<double>(Clock::now() - offline_since).count() : 0.0);
  }
  // One local step on the local copy, added to the accumulation; a non-finite one is skipped.
  void offline_step() {
    const BatchResult batch = train_batch(offline.local_parameters());
    stats.offline_steps++;
    if (!std::isfinite(batch.loss) || !offline.add_step(gradient)) {
      count_non_finite_step();
      say("non-finite gradient in an offline step from model version " +
              std::to_string(offline.from_version()) + "; skipped",
          logging::Level::kWarn);
      return;
    }
    consecutive_non_finite = 0;
  }
  // The accumulated steps through the compressor (its residual moves on, as for any update)
  // into the pending update, fetched version = the version they started from.
  void compress_offline_steps() {
    transport::SparseUpdate update;
    update.model_id = model.layout_id();
    update.sequence = ++sequence;
    update.fetched_version = offline.from_version();
    const std::uint64_t steps = offline.steps();
    // The claim the server's --offline-step-credit may honour (server/parameter_store.h).
    update.local_steps = static_cast<std::uint16_t>(std::min<std::uint64_t>(steps, 65535));
    choose_rate();
    // --offline-max-rate: up to c·s for the s steps, so that the sum keeps what the steps
    // would have sent one by one; the online c is back for the next update.
    const double online_rate = compressor.options().compression_rate;
    const double offline_rate = offline_compression_rate(online_rate, steps, config.offline_max_rate);
    compressor.set_compression_rate(offline_rate);
    try {
      compressor.compress(offline.sum(), update);
    } catch (const std::invalid_argument& e) {
      compressor.set_compression_rate(online_rate);
      // add_step() keeps the sum finite, so this is not expected; still never sent.
      stats.offline_steps_refused += steps;
      offline.clear();
      say(std::string("the offline steps could not be compressed (") + e.what() + "); " +
              std::to_string(steps) + " steps dropped",
          logging::Level::kWarn);
      return;
    }
    auto encoded = transport::encode_sparse_update(update, {config.compressor.value_encoding});
    if (!encoded)
      throw std::logic_error("worker: cannot encode an update: " + encoded.error().message);
    pending = std::move(encoded).value();
    note_update_size(pending.size());  // at the rate it was compressed at
    compressor.set_compression_rate(online_rate);
    pending_steps = steps;
    pending_offline = true;
    pending_from_version = offline.from_version();
    offline.clear();
  }

  // What the server answered to an update of `bytes` bytes (ours in `pending` when
  // `offline_steps_in_it` > 0: an accumulated update from `from_version`).
  void take_answer(const transport::CoapResponse& response, std::size_t bytes,
                   std::uint64_t offline_steps_in_it, std::uint64_t from_version);
};

namespace {
// 4.03 "quarantined: ..." (server/README.md, "Bad updates"): the server refuses this device's
// updates for a while after too many bad ones. Unlike a key the server no longer knows, it
// may pass, so it is waited out with the backoff like 5.00, not given up on.
bool is_quarantine(const transport::CoapResponse& response) {
  static constexpr std::string_view kPrefix = "quarantined";
  return response.code == transport::CoapCode::kForbidden &&
         response.payload.size() >= kPrefix.size() &&
         std::equal(kPrefix.begin(), kPrefix.end(), response.payload.begin());
}
}  // namespace

void Worker::State::take_answer(const transport::CoapResponse& response, std::size_t bytes,
                                std::uint64_t offline_steps_in_it, std::uint64_t from_version) {
  trouble.answered();
  stats.bytes_sent += bytes;
  const std::string refusal = "update refused with " +
                              transport::coap_code_string(response.code) + ": " +
                              payload_text(response.payload);
  if (offline_steps_in_it > 0) {
    if (response.code == transport::CoapCode::kChanged) {
      stats.offline_updates_accepted++;
      stats.last_offline_from_version = from_version;
      stats.last_offline_steps = offline_steps_in_it;
      if (const auto version = transport::decode_update_reply(response.payload)) {
        stats.last_offline_acknowledged_version = *version;
        say("offline update of " + std::to_string(offline_steps_in_it) +
            " steps from model version " + std::to_string(from_version) +
            " accepted: server version " + std::to_string(*version));
      }
    } else {
      // Never silently lost: counted, and said with the server's reason (4.09: too stale,
      // the worker pulls again before its next step).
      stats.offline_updates_refused++;
      stats.offline_steps_refused += offline_steps_in_it;
      say("offline update of " + std::to_string(offline_steps_in_it) +
              " steps from model version " + std::to_string(from_version) +
              " not applied, its steps are lost: " + refusal,
          logging::Level::kWarn);
    }
  }
  if (response.code == transport::CoapCode::kChanged) {
    stats.updates_accepted++;
    if (const auto version = transport::decode_update_reply(response.payload))
      stats.server_version = *version;
    trouble.succeeded();
  } else if (response.code == transport::CoapCode::kConflict) {
    stats.updates_refused++;  // too stale or another model: pull before the next step
    have_model = false;
    trouble.succeeded();
  } else if ((response.code == transport::CoapCode::kUnauthorized ||
              response.code == transport::CoapCode::kForbidden) &&
             !is_quarantine(response)) {
    stats.updates_rejected++;  // not (or no longer) in the server's keystore
    trouble.refused(WorkerExit::kUnknownIdentity, refusal);
  } else {
    // 5.00 (the server could not make the update durable: a full disk), 4.00, 4.13, 4.22,
    // a quarantine's 4.03: the update is dropped, and the next one waits the backoff, which keeps
    // growing until one is accepted, so a fleet does not hammer a server in trouble.
    stats.updates_rejected++;
    trouble.trouble(WorkerExit::kNothingApplied, refusal);
  }
}

Worker::Worker(const WorkerConfig& config, const Dataset& train, ServerChannel& channel,
               const std::atomic<bool>& stop, WorkerLog log)
    : state_(std::make_unique<State>(config, train, channel, stop, std::move(log))) {
  state_->stats.dropout = state_->dropout.status();
}

Worker::~Worker() = default;

const WorkerStats& Worker::stats() const { return state_->stats; }

WorkerExit Worker::last_trouble() const { return state_->trouble.last(); }

const std::string& Worker::last_trouble_message() const {
  return state_->trouble.last_message();
}

bool Worker::needs_pull() const {
  return !state_->have_model ||
         state_->steps_since_pull >= static_cast<std::uint64_t>(state_->config.pull_every);
}

bool Worker::pull() {
  State& s = *state_;
  transport::CoapResponse response;
  try {
    response = s.channel.get_model(s.replica.pull_path());
  } catch (const transport::TransportError& e) {
    s.count_transfer(0, false);  // the request left; no answer came
    if (s.is_offline || s.can_train_offline()) {
      if (const auto delay = s.trouble.server_away("pull failed", e)) s.go_offline(*delay);
      return false;
    }
    s.trouble.request_failed("pull failed", e);
    return false;
  }
  s.trouble.answered();
  s.count_transfer(response.payload.size(), false);
  if (response.code != transport::CoapCode::kContent) {
    // The server is up but will not serve us: say why and back off (it may be starting).
    const std::string what = "GET /model answered " + transport::coap_code_string(response.code) +
                             " " + payload_text(response.payload);
    s.trouble.trouble(WorkerExit::kNothingApplied, what);
    return false;
  }
  ModelReplica::PullOutcome outcome;
  try {
    outcome = s.replica.take(response.payload);
  } catch (const std::runtime_error& e) {
    // Another model (layout id or tensor sizes), as a whole model or a delta: the server was
    // started with another --model, or restarted with one under this worker.
    s.trouble.refused(WorkerExit::kModelMismatch, "the server's model does not match model '" +
                                              s.config.model +
                                              "' (give "
                                              "--model as the server's --model): " +
                                              e.what());
    return false;
  }
  s.stats.bytes_received += response.payload.size();
  if (outcome == ModelReplica::PullOutcome::kMismatch) {
    s.stats.delta_mismatches++;
    if (!s.ever_pulled && s.stats.seeded_first_pull_fallbacks == 0 && s.config.seeded_first_pull &&
        !s.config.dense_pull && s.config.shards.empty()) {
      s.stats.seeded_first_pull_fallbacks++;
      s.say("the seeded first pull: the server's model at version 0 is not the one built from "
            "--seed " + std::to_string(s.config.seed) +
            " here (another --seed, --init-from, or an initialisation that differs)");
    }
    // The next pull asks for the dense model, which cannot mismatch: a server that keeps
    // answering with deltas anyway is broken.
    if (++s.consecutive_mismatches >= 3)
      throw std::runtime_error("the server keeps sending unusable model deltas: " +
                               s.replica.mismatch());
    s.say(s.replica.mismatch() + "; pulling the whole model");
    return false;
  }
  s.consecutive_mismatches = 0;
  if (outcome == ModelReplica::PullOutcome::kDelta) s.stats.delta_pulls++;
  s.note_pull(response.payload.size(), outcome == ModelReplica::PullOutcome::kDelta);
  s.model_version = s.replica.version();
  if (!s.ever_pulled) {
    s.stats.first_pull = outcome == ModelReplica::PullOutcome::kDelta ? "delta" : "dense";
    s.stats.first_pull_bytes = response.payload.size();
  }
  s.stats.pulls++;
  s.have_model = true;
  s.ever_pulled = true;
  s.steps_since_pull = 0;
  return true;
}

bool compress_step(const BatchResult& result, std::span<const float> gradient,
                   Compressor& compressor, transport::SparseUpdate& update) {
  if (!std::isfinite(result.loss)) return false;
  try {
    compressor.compress(gradient, update);
  } catch (const std::invalid_argument&) {
    return false;  // a non-finite gradient
  }
  return true;
}

bool Worker::step() {
  State& s = *state_;
  const BatchResult batch = s.train_batch(s.replica.parameters());
  s.steps_since_pull++;
  transport::SparseUpdate update;
  update.model_id = s.model.layout_id();
  update.sequence = ++s.sequence;
  update.fetched_version = s.model_version;
  s.choose_rate();
  // A non-finite gradient (a diverged model, or a corrupt pull) must not reach the server:
  // skip the step and pull again; give up only if it keeps happening.
  if (!compress_step(batch, s.gradient, s.compressor, update)) {
    s.count_non_finite_step();
    s.say("non-finite gradient at model version " + std::to_string(s.model_version) +
              "; skipping the step and pulling again",
          logging::Level::kWarn);
    s.have_model = false;
    return false;
  }
  s.consecutive_non_finite = 0;
  auto encoded = transport::encode_sparse_update(update, {s.config.compressor.value_encoding});
  if (!encoded)
    throw std::logic_error("worker: cannot encode an update: " + encoded.error().message);
  s.body = std::move(encoded).value();
  s.note_update_size(s.body.size());
  return true;
}


void Worker::push() {
  State& s = *state_;
  // The turn's check planned for an update of the predicted size; one larger than that
  // waits here for room rather than pass the budget.
  for (double wait = s.budget_wait(static_cast<double>(estimated_wire_bytes(s.body.size())));
       wait > 0 && !s.stop;
       wait = s.budget_wait(static_cast<double>(estimated_wire_bytes(s.body.size())))) {
    s.begin_budget_wait(wait, false);
    sleep_unless_stopped(std::min<Clock::duration>(std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(wait)),
                                                   std::chrono::milliseconds(200)),
                         s.stop);
  }
  s.end_budget_wait();
  // A retry sends the same bytes (same sequence): the server applies it once.
  for (int attempt = 0; attempt < 2 && !s.stop; attempt++) {
    transport::CoapResponse response;
    const auto sent_at = Clock::now();
    try {
      response = s.channel.post_update(s.body);
    } catch (const transport::TransportError& e) {
      s.count_transfer(s.body.size(), true);
      if (s.can_train_offline()) {
        if (const auto delay = s.trouble.server_away("push failed", e)) {
          s.pending = std::move(s.body);
          s.pending_steps = 1;
          s.pending_offline = false;
          s.go_offline(*delay);
          return;
        }
        s.have_model = attempt == 0 && s.have_model;
        continue;
      }
      s.have_model = attempt == 0 && s.have_model;  // after a second failure, pull again
      s.trouble.request_failed("push failed", e);
      continue;
    }
    s.uplink.add(s.body.size(), std::chrono::duration<double>(Clock::now() - sent_at).count());
    s.count_transfer(s.body.size(), true);
    s.take_answer(response, s.body.size(), 0, 0);
    s.update_link_stats();
    break;
  }
}

bool Worker::post_pending(const WorkerProgress& progress) {
  State& s = *state_;
  transport::CoapResponse response;
  const auto sent_at = Clock::now();
  try {
    response = s.channel.post_update(s.pending);
  } catch (const transport::TransportError& e) {
    s.count_transfer(s.pending.size(), true);
    if (const auto delay = s.trouble.server_away("push failed", e)) s.go_offline(*delay);
    return false;
  }
  s.uplink.add(s.pending.size(), std::chrono::duration<double>(Clock::now() - sent_at).count());
  s.count_transfer(s.pending.size(), true);
  const std::uint64_t steps = s.pending_offline ? s.pending_steps : 0;
  const std::vector<std::uint8_t> sent = std::move(s.pending);
  s.pending.clear();
  s.pending_steps = 0;
  s.pending_offline = false;
  s.update_offline_stats();
  s.take_answer(response, sent.size(), steps, s.pending_from_version);
  if (progress) progress(s.stats);
  return true;
}

void Worker::run_offline(const WorkerProgress& progress) {
  State& s = *state_;
  const auto now = Clock::now();
  if (now >= s.next_attempt && s.budget_on()) {
    // The try, the kept update and the accumulated one must fit the budget; else the next
    // try comes when they do.
    const double needed = s.pull_reserve() +
                          static_cast<double>(estimated_wire_bytes(s.pending.size())) +
                          (s.offline.steps() > 0 ? s.next_update_wire_bytes() : 0.0);
    if (const double wait = s.budget_wait(needed); wait > 0) {
      s.next_attempt =
          now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait));
      s.begin_budget_wait(wait, true);
    }
  }
  if (now >= s.next_attempt && s.config.offline_try_timeout_seconds > 0 && !s.offline_for_budget) {
    try_with_probe(progress);
    return;
  }
  if (now >= s.next_attempt) {
    // The try is the pull the worker needs anyway: GET /model?since=V, small while the
    // server is away, the model to go on from once it answers.
    const auto tried_at = Clock::now();
    const bool pulled = pull();
    s.stats.offline_tries++;
    s.stats.offline_try_seconds += std::chrono::duration<double>(Clock::now() - tried_at).count();
    if (pulled) {
      if (!s.pending.empty() && !post_pending(progress)) return;
      if (s.offline.steps() > 0) {
        s.compress_offline_steps();
        if (!s.pending.empty() && !post_pending(progress)) return;
      }
      s.offline.clear();
      s.leave_offline();
    }
    s.update_offline_stats();
    if (progress) progress(s.stats);
    return;
  }
  if (s.within_offline_bounds()) {
    s.offline_step();
  } else {
    // At the bound: idle until the next try, as a worker without offline training does.
    sleep_unless_stopped(std::min<Clock::duration>(s.next_attempt - now, std::chrono::milliseconds(200)),
                         s.stop);
  }
  s.update_offline_stats();
  if (progress) progress(s.stats);
}

std::chrono::steady_clock::duration next_try_delay(std::chrono::steady_clock::duration tried,
                                                   double share,
                                                   std::chrono::steady_clock::duration floor) {
  if (!(share > 0 && share <= 1)) throw std::invalid_argument("next_try_delay: share not in (0, 1]");
  const auto rest = std::chrono::round<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::chrono::duration<double>(tried).count() *
                                    (1 - share) / share));
  return std::max(rest, floor);
}

void Worker::try_with_probe(const WorkerProgress& progress) {
  State& s = *state_;
  const auto tried_at = Clock::now();
  auto end_try = [&] {
    const auto tried = Clock::now() - tried_at;
    s.stats.offline_tries++;
    s.stats.offline_try_seconds += std::chrono::duration<double>(tried).count();
    const auto delay = next_try_delay(tried, s.config.offline_try_share, s.config.backoff_initial);
    s.next_attempt = Clock::now() + delay;
    // A failed post after an answered probe has logged its backoff delay; this one rules.
    s.say("next offline try in " +
              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(delay).count()) +
              " ms (--offline-try-share)",
          logging::Level::kDebug);
    s.update_offline_stats();
    if (progress) progress(s.stats);
  };
  try {
    s.channel.probe(static_cast<int>(s.config.offline_try_timeout_seconds * 1000));
  } catch (const transport::TransportError& e) {
    s.count_transfer(0, false);
    if (e.failure() == transport::TransportFailure::kInterrupted) return;
    // Counted and given up on as any failed try (--give-up-after); the next try follows
    // the share rule, not the backoff. Logged at debug level: one line per try would be
    // most of an intermittent worker's log.
    s.trouble.give_up_if_silent(std::string("probe failed: ") + e.what());
    s.stats.retries++;
    s.say(std::string("probe failed: ") + e.what(), logging::Level::kDebug);
    end_try();
    return;
  }
  s.trouble.answered();
  s.say("probe answered in " +
        std::to_string(std::chrono::duration<double>(Clock::now() - tried_at).count()) + " s");
  // Reachable: the work the server has not got first (a wide update should meet the fewest
  // versions since), then the model, pulled by the online loop after leave_offline().
  // A failure of either sends the worker back to training offline, its update kept.
  if (!s.pending.empty() && !post_pending(progress)) return end_try();
  if (s.offline.steps() > 0) {
    s.compress_offline_steps();
    if (!s.pending.empty() && !post_pending(progress)) return end_try();
  }
  s.offline.clear();
  s.have_model = false;
  s.leave_offline();
  s.stats.offline_tries++;
  s.stats.offline_try_seconds += std::chrono::duration<double>(Clock::now() - tried_at).count();
  if (progress) progress(s.stats);
}

WorkerStats Worker::run(const WorkerProgress& progress) {
  State& s = *state_;
  const auto started = Clock::now();
  auto out_of_time = [&] {
    return s.config.max_seconds > 0 &&
           std::chrono::duration<double>(Clock::now() - started).count() >= s.config.max_seconds;
  };
  while (!s.stop && (s.config.max_steps == 0 || s.stats.steps < s.config.max_steps) &&
         !out_of_time()) {
    if (s.is_offline) {
      run_offline(progress);
      continue;
    }
    const auto turn_started = Clock::now();
    if (s.budget_on()) {
      const double needed = (needs_pull() ? s.pull_reserve() : 0.0) + s.next_update_wire_bytes();
      if (const double wait = s.budget_wait(needed); wait > 0) {
        // Spent: wait for room, training offline meanwhile when that is on.
        const bool offline_now = s.can_train_offline();
        s.begin_budget_wait(wait, offline_now);
        if (offline_now) {
          s.go_offline(
              std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait)),
              true);
        } else {
          sleep_unless_stopped(
              std::min<Clock::duration>(
                  std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait)),
                  std::chrono::milliseconds(200)),
              s.stop);
        }
        s.update_link_stats();
        if (progress) progress(s.stats);
        continue;
      }
      s.end_budget_wait();
    }
    if (needs_pull() && !pull()) continue;
    if (!step()) continue;
    s.note_rest_of_step(Clock::now() - turn_started);
    push();
    if (progress) progress(s.stats);
  }
  s.end_budget_wait();
  s.update_link_stats();
  s.update_offline_stats();
  if (s.stats.buffered_steps > 0)
    s.say("the run ended offline: " + std::to_string(s.stats.buffered_steps) +
              " buffered steps were not sent",
          logging::Level::kWarn);
  return s.stats;
}

transport::CoapDtlsClient::Options coap_client_options(const WorkerConfig& config,
                                                       const std::atomic<bool>& stop) {
  transport::CoapDtlsClient::Options options{config.server_host,
                                             config.server_port,
                                             {config.identity, config.key},
                                             config.request_timeout_ms};
  options.longest_request_ms = config.longest_request_ms;
  options.certificates = config.certificates;
  options.plaintext = config.insecure_plaintext;
  options.timing = config.timing;
  options.stop = &stop;
  return options;
}

void end_without_anything_applied(WorkerExit last_trouble, const std::string& last_trouble_message,
                                  const std::string& nothing, WorkerExit& exit,
                                  std::string& reason) {
  // Nothing applied is no success, whatever ended the run (issue 12: a board whose server
  // never answered used to end with status 0).
  exit = last_trouble == WorkerExit::kStopped ? WorkerExit::kNothingApplied : last_trouble;
  reason = "the run ended before the server accepted any " + nothing;
  if (!last_trouble_message.empty()) reason += "; the last trouble: " + last_trouble_message;
}

WorkerRun run_worker(const WorkerConfig& config, const Dataset& train,
                     const std::atomic<bool>& stop, const WorkerLog& log,
                     const WorkerProgress& progress) {
  std::unique_ptr<ServerChannel> channel;
  ShardedServerChannel* sharded = nullptr;
  if (config.shards.empty()) {
    channel = std::make_unique<CoapServerChannel>(coap_client_options(config, stop));
  } else {
    // Every shard is an edgetrain-server with the same keystore: the same identity and key.
    std::vector<std::unique_ptr<ServerChannel>> shards;
    for (const auto& [host, port] : config.shards) {
      WorkerConfig one = config;
      one.server_host = host;
      one.server_port = port;
      shards.push_back(std::make_unique<CoapServerChannel>(coap_client_options(one, stop)));
    }
    auto owned = std::make_unique<ShardedServerChannel>(
        Model(model_spec_from_argument(config.model)), std::move(shards));
    sharded = owned.get();
    channel = std::move(owned);
  }
  auto with_shard_versions = [sharded](WorkerStats stats) {
    if (sharded) stats.shard_versions = sharded->acknowledged_versions();
    return stats;
  };
  Worker worker(config, train, *channel, stop, log);
  WorkerRun result;
  try {
    result.stats = with_shard_versions(worker.run([&](const WorkerStats& stats) {
      if (progress) progress(sharded ? with_shard_versions(stats) : stats);
    }));
  } catch (const WorkerFailure& e) {
    result.stats = with_shard_versions(worker.stats());
    result.exit = e.exit();
    result.reason = e.what();
    return result;
  }
  if (result.stats.updates_accepted == 0)
    end_without_anything_applied(worker.last_trouble(), worker.last_trouble_message(), "update",
                                 result.exit, result.reason);
  return result;
}

}  // namespace edgetrain::runtime
