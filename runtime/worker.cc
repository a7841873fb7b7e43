#include "runtime/worker.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "runtime/backoff.h"
#include "runtime/model.h"
#include "runtime/model_replica.h"
#include "runtime/server_channel.h"
#include "runtime/shard_sampler.h"
#include "runtime/thread_pool.h"
#include "runtime/trainer.h"
#include "transport/coap_dtls.h"
#include "transport/untrusted_text.h"

namespace edgetrain::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Sleeps up to `duration`, returning early once `stop` is set.
void sleep_unless_stopped(Clock::duration duration, const std::atomic<bool>& stop) {
  const auto until = Clock::now() + duration;
  while (!stop && Clock::now() < until) {
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), until - Clock::now()));
  }
}

// A server's diagnostic, as the worker's log shows it: network text, so escaped
// (transport::escape_untrusted) and cut at 200 bytes.
std::string payload_text(const std::vector<std::uint8_t>& payload) {
  return transport::escape_untrusted(
      std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()), 200);
}

}  // namespace

void parse_server_uri(const std::string& uri, std::string& host, std::uint16_t& port) {
  bool plaintext = false;
  if (uri.rfind("coap://", 0) == 0) throw std::invalid_argument("server URI must start with coaps:// (got '" + uri + "')");
  parse_server_uri(uri, host, port, plaintext);
}

void parse_server_uri(const std::string& uri, std::string& host, std::uint16_t& port, bool& plaintext) {
  plaintext = uri.rfind("coap://", 0) == 0;
  const std::string scheme = plaintext ? "coap://" : "coaps://";
  if (uri.rfind(scheme, 0) != 0)
    throw std::invalid_argument("server URI must start with coaps:// (or coap://) (got '" + uri + "')");
  std::string rest = uri.substr(scheme.size());
  if (auto slash = rest.find('/'); slash != std::string::npos) rest.resize(slash);
  port = plaintext ? 5683 : 5684;
  if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
    const auto close = rest.find(']');
    if (close == std::string::npos) throw std::invalid_argument("bad IPv6 address in '" + uri + "'");
    host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') throw std::invalid_argument("bad server URI '" + uri + "'");
    if (!rest.empty()) rest = rest.substr(1);
    else rest.clear();
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
    if (used != rest.size() || value < 1 || value > 65535) throw std::invalid_argument("bad port in '" + uri + "'");
    port = static_cast<std::uint16_t>(value);
  }
}

std::vector<std::uint8_t> parse_hex_key(const std::string& text) {
  std::string digits;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if (!std::isxdigit(static_cast<unsigned char>(c))) throw std::invalid_argument("key is not hexadecimal");
    digits += c;
  }
  if (digits.empty() || digits.size() % 2 != 0) throw std::invalid_argument("key must be an even number of hex digits");
  if (digits.size() > 128) throw std::invalid_argument("key longer than 64 bytes");
  std::vector<std::uint8_t> key;
  for (std::size_t i = 0; i < digits.size(); i += 2) key.push_back(static_cast<std::uint8_t>(std::stoi(digits.substr(i, 2), nullptr, 16)));
  return key;
}

struct Worker::State {
  State(const WorkerConfig& config, const Dataset& train, ServerChannel& channel, const std::atomic<bool>& stop,
        WorkerLog log)
      : config(checked(config)),
        channel(channel),
        stop(stop),
        log(std::move(log)),
        model(model_for(config, train)),
        sampler(train, shard_of(config, train), config.seed ^ (0x9e3779b97f4a7c15ULL * (config.worker_id + 1))),
        pool(config.threads),
        trainer(model, config.batch, KernelBackend::kXnnpack, pool.get()),
        compressor(layout_of(model), config.compressor),
        gradient(model.parameter_count()),
        pixels(static_cast<std::size_t>(config.batch) * train.image_bytes()),
        labels(config.batch),
        backoff(config.backoff_initial, config.backoff_max, config.seed + config.worker_id),
        // Sequence numbers must keep growing across restarts of this worker, or the server
        // would take a new update for a replay: start from the wall clock in microseconds.
        sequence(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count())),
        replica(model.layout_id(), tensor_sizes_of(model), config.dense_pull) {}

  static const WorkerConfig& checked(const WorkerConfig& config) {
    if (config.batch < 1) throw std::invalid_argument("worker: batch must be at least 1");
    if (config.pull_every < 1) throw std::invalid_argument("worker: pull interval must be at least 1");
    if (!(config.slowdown >= 0 && config.slowdown <= 1000)) throw std::invalid_argument("worker: slowdown must be 0..1000");
    if (config.worker_count < 1 || config.worker_id >= config.worker_count) {
      throw std::invalid_argument("worker: id " + std::to_string(config.worker_id) + " is not below the worker count " +
                                  std::to_string(config.worker_count));
    }
    return config;
  }
  static Model model_for(const WorkerConfig& config, const Dataset& train) {
    Model model(model_spec_from_argument(config.model));
    const ExampleShape in = model.input_shape();
    if (static_cast<std::uint32_t>(in.H) != train.height || static_cast<std::uint32_t>(in.W) != train.width ||
        static_cast<std::uint32_t>(in.C) != train.channels) {
      throw ModelError("worker: model input does not match the data's image shape");
    }
    return model;
  }
  static std::vector<std::uint32_t> shard_of(const WorkerConfig& config, const Dataset& train) {
    const ShardSpec spec{config.worker_id, config.worker_count, config.seed};
    return config.label_skewed ? shard_label_skewed(train.labels, train.num_classes, spec) : shard_iid(train.size(), spec);
  }
  static std::vector<TensorSlice> layout_of(const Model& model) {
    std::vector<TensorSlice> layout;
    for (const auto& t : model.tensors()) layout.push_back({t.offset, static_cast<std::uint32_t>(t.size)});
    return layout;
  }
  static std::vector<std::uint32_t> tensor_sizes_of(const Model& model) {
    std::vector<std::uint32_t> sizes;
    for (const auto& t : model.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
    return sizes;
  }

  void say(const std::string& line) const {
    if (log) log(line);
  }
  // A request that failed or was not answered as it should: count it and back off.
  void transport_trouble(const std::string& what) {
    stats.retries++;
    const auto delay = backoff.next_delay();
    say(what + "; retrying in " + std::to_string(delay.count()) + " ms");
    sleep_unless_stopped(delay, stop);
  }

  const WorkerConfig config;
  ServerChannel& channel;
  const std::atomic<bool>& stop;
  const WorkerLog log;
  Model model;
  ShardSampler sampler;
  ThreadPool pool;
  Trainer trainer;
  Compressor compressor;
  std::vector<float> gradient;
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;
  Backoff backoff;
  std::uint64_t sequence;
  ModelReplica replica;

  WorkerStats stats;
  std::uint64_t model_version = 0;
  bool have_model = false;  // false: pull before the next step
  std::uint64_t steps_since_pull = 0;
  int consecutive_mismatches = 0;
  int consecutive_non_finite = 0;
  std::vector<std::uint8_t> body;  // the encoded update of the last step
};

Worker::Worker(const WorkerConfig& config, const Dataset& train, ServerChannel& channel, const std::atomic<bool>& stop,
               WorkerLog log)
    : state_(std::make_unique<State>(config, train, channel, stop, std::move(log))) {}

Worker::~Worker() = default;

const WorkerStats& Worker::stats() const { return state_->stats; }

bool Worker::needs_pull() const {
  return !state_->have_model || state_->steps_since_pull >= static_cast<std::uint64_t>(state_->config.pull_every);
}

bool Worker::pull() {
  State& s = *state_;
  transport::CoapResponse response;
  try {
    response = s.channel.get_model(s.replica.pull_path());
  } catch (const transport::TransportError& e) {
    s.transport_trouble(std::string("pull failed: ") + e.what());
    return false;
  }
  if (response.code != transport::CoapCode::kContent) {
    // The server is up but will not serve us: say why and back off (it may be starting).
    s.transport_trouble("GET /model answered " + transport::coap_code_string(response.code) + " " +
                        payload_text(response.payload));
    return false;
  }
  ModelReplica::PullOutcome outcome;
  try {
    outcome = s.replica.take(response.payload);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("the server's model does not match model '" + s.config.model + "': " + e.what());
  }
  s.stats.bytes_received += response.payload.size();
  if (outcome == ModelReplica::PullOutcome::kMismatch) {
    s.stats.delta_mismatches++;
    // The next pull asks for the dense model, which cannot mismatch: a server that keeps
    // answering with deltas anyway is broken.
    if (++s.consecutive_mismatches >= 3)
      throw std::runtime_error("the server keeps sending unusable model deltas: " + s.replica.mismatch());
    s.say(s.replica.mismatch() + "; pulling the whole model");
    return false;
  }
  s.consecutive_mismatches = 0;
  if (outcome == ModelReplica::PullOutcome::kDelta) s.stats.delta_pulls++;
  s.model_version = s.replica.version();
  s.stats.pulls++;
  s.have_model = true;
  s.steps_since_pull = 0;
  s.backoff.reset();
  return true;
}

bool Worker::step() {
  State& s = *state_;
  const WorkerConfig& config = s.config;
  s.sampler.next_batch(config.batch, s.pixels, s.labels);
  const auto step_started = Clock::now();
  const BatchResult batch =
      s.trainer.compute_gradient(s.replica.parameters(), s.pixels.data(), s.labels.data(), config.batch, s.gradient);
  if (config.slowdown > 0) {
    const auto compute_time = Clock::now() - step_started;
    sleep_unless_stopped(std::chrono::duration_cast<Clock::duration>(compute_time * config.slowdown), s.stop);
  }
  s.stats.steps++;
  s.steps_since_pull++;
  s.stats.last_loss = batch.loss;
  transport::SparseUpdate update;
  update.model_id = s.model.layout_id();
  update.sequence = ++s.sequence;
  update.fetched_version = s.model_version;
  // A non-finite gradient (a diverged model, or a corrupt pull) must not reach the server:
  // skip the step and pull again; give up only if it keeps happening.
  bool finite = std::isfinite(batch.loss);
  if (finite) {
    try {
      s.compressor.compress(s.gradient, update);
    } catch (const std::invalid_argument&) {
      finite = false;
    }
  }
  if (!finite) {
    s.stats.non_finite_steps++;
    if (++s.consecutive_non_finite >= 10) {
      throw std::runtime_error("10 steps in a row gave a non-finite gradient: the server's model has diverged");
    }
    s.say("non-finite gradient at model version " + std::to_string(s.model_version) +
          "; skipping the step and pulling again");
    s.have_model = false;
    return false;
  }
  s.consecutive_non_finite = 0;
  auto encoded = transport::encode_sparse_update(update, {s.config.compressor.value_encoding});
  if (!encoded) throw std::logic_error("worker: cannot encode an update: " + encoded.error().message);
  s.body = std::move(encoded).value();
  return true;
}

void Worker::push() {
  State& s = *state_;
  // A retry sends the same bytes (same sequence): the server applies it once.
  for (int attempt = 0; attempt < 2 && !s.stop; attempt++) {
    transport::CoapResponse response;
    try {
      response = s.channel.post_update(s.body);
    } catch (const transport::TransportError& e) {
      s.transport_trouble(std::string("push failed: ") + e.what());
      s.have_model = attempt == 0 && s.have_model;  // after a second failure, pull again
      continue;
    }
    s.stats.bytes_sent += s.body.size();
    s.backoff.reset();
    if (response.code == transport::CoapCode::kChanged) {
      s.stats.updates_accepted++;
      if (const auto version = transport::decode_update_reply(response.payload)) s.stats.server_version = *version;
    } else if (response.code == transport::CoapCode::kConflict) {
      s.stats.updates_refused++;  // too stale or another model: pull before the next step
      s.have_model = false;
    } else {
      s.stats.updates_rejected++;
      s.say("update refused with " + transport::coap_code_string(response.code) + ": " + payload_text(response.payload));
    }
    break;
  }
}

WorkerStats Worker::run(const WorkerProgress& progress) {
  State& s = *state_;
  const auto started = Clock::now();
  auto out_of_time = [&] {
    return s.config.max_seconds > 0 &&
           std::chrono::duration<double>(Clock::now() - started).count() >= s.config.max_seconds;
  };
  while (!s.stop && (s.config.max_steps == 0 || s.stats.steps < s.config.max_steps) && !out_of_time()) {
    if (needs_pull() && !pull()) continue;
    if (!step()) continue;
    push();
    if (progress) progress(s.stats);
  }
  return s.stats;
}

WorkerStats run_worker(const WorkerConfig& config, const Dataset& train, const std::atomic<bool>& stop,
                       const WorkerLog& log, const WorkerProgress& progress) {
  transport::CoapDtlsClient::Options options{
      config.server_host, config.server_port, {config.identity, config.key}, config.request_timeout_ms};
  options.certificates = config.certificates;
  options.plaintext = config.insecure_plaintext;
  options.timing = config.timing;
  CoapServerChannel channel(std::move(options));
  Worker worker(config, train, channel, stop, log);
  return worker.run(progress);
}

}  // namespace edgetrain::runtime
