#include "worker/round_worker.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "common/logging.h"
#include "worker/loop_support.h"
#include "model/model.h"
#include "model/shard_sampler.h"
#include "model/thread_pool.h"
#include "model/trainer.h"
#include "privacy/distributed_noise.h"
#include "privacy/quantize.h"
#include "privacy/secagg_messages.h"
#include "privacy/secagg_signed.h"
#include "privacy/skellam.h"
#include "privacy/subset.h"
#include "transport/untrusted_text.h"

namespace edgetrain::runtime {
namespace {

using loop::Clock;
using loop::layout_of;
using loop::payload_text;
using loop::sleep_unless_stopped;

Model checked_model(const WorkerConfig& config, const Dataset& train) {
  if (config.batch < 1) throw std::invalid_argument("worker: batch must be at least 1");
  if (config.worker_count < 1 || config.worker_id >= config.worker_count)
    throw std::invalid_argument("worker: id " + std::to_string(config.worker_id) +
                                " is not below the worker count " +
                                std::to_string(config.worker_count));
  // Layout only: a round trains on the round's model, pulled into the state's own vectors.
  Model model(model_spec_from_argument(config.model), Model::Arena::kNone);
  const ExampleShape in = model.input_shape();
  if (static_cast<std::uint32_t>(in.H) != train.height ||
      static_cast<std::uint32_t>(in.W) != train.width ||
      static_cast<std::uint32_t>(in.C) != train.channels)
    throw ModelError("worker: model input does not match the data's image shape");
  // A label at or past the model's outputs would index past its logits; user data names
  // its own class count (model/user_data.h).
  if (model.num_classes() < static_cast<int>(train.num_classes))
    throw ModelError("worker: model has " + std::to_string(model.num_classes()) +
                     " outputs for the data's " + std::to_string(train.num_classes) + " classes");
  return model;
}

}  // namespace

std::optional<RoundInfo> parse_round_info(std::span<const std::uint8_t> payload) {
  const nlohmann::json j = nlohmann::json::parse(payload.begin(), payload.end(), nullptr, false);
  if (!j.is_object()) return std::nullopt;
  for (const char* key : {"round", "model_version", "local_steps"})
    if (!j.contains(key) || !j[key].is_number_unsigned()) return std::nullopt;
  if (!j.contains("deadline_seconds") || !j["deadline_seconds"].is_number() ||
      !j.contains("selected") || !j["selected"].is_boolean())
    return std::nullopt;
  RoundInfo info;
  info.round = j["round"].get<std::uint64_t>();
  info.model_version = j["model_version"].get<std::uint64_t>();
  info.deadline_seconds = j["deadline_seconds"].get<double>();
  info.selected = j["selected"].get<bool>();
  const std::uint64_t steps = j["local_steps"].get<std::uint64_t>();
  if (steps == 0 || steps > 1000000 || !std::isfinite(info.deadline_seconds)) return std::nullopt;
  info.local_steps = static_cast<std::uint32_t>(steps);
  if (j.contains("local_epochs")) {
    if (!j["local_epochs"].is_number_unsigned() || j["local_epochs"].get<std::uint64_t>() > 1000)
      return std::nullopt;
    info.local_epochs = static_cast<std::uint32_t>(j["local_epochs"].get<std::uint64_t>());
  }
  if (j.contains("secure") && j["secure"].is_boolean() && j["secure"].get<bool>()) {
    if (!j.contains("secagg_session") || !j["secagg_session"].is_number_unsigned() ||
        !j.contains("secagg_identity") || !j["secagg_identity"].is_string() ||
        !j.contains("clip_norm") || !j["clip_norm"].is_number())
      return std::nullopt;
    info.secure = true;
    info.secagg_session = j["secagg_session"].get<std::uint64_t>();
    info.secagg_identity = j["secagg_identity"].get<std::string>();
    info.clip_norm = j["clip_norm"].get<double>();
    if (info.secagg_identity.empty() || info.secagg_identity.size() > privacy::kMaxIdentityBytes ||
        !(info.clip_norm > 0 && std::isfinite(info.clip_norm)))
      return std::nullopt;
    if (j.contains("secagg_subset_length") || j.contains("secagg_subset_seed")) {
      if (!j.contains("secagg_subset_length") || !j["secagg_subset_length"].is_number_unsigned() ||
          !j.contains("secagg_subset_seed") || !j["secagg_subset_seed"].is_number_unsigned())
        return std::nullopt;
      const std::uint64_t length = j["secagg_subset_length"].get<std::uint64_t>();
      if (length == 0 || length > privacy::kMaxVectorLength) return std::nullopt;
      info.secagg_subset_length = static_cast<std::uint32_t>(length);
      info.secagg_subset_seed = j["secagg_subset_seed"].get<std::uint64_t>();
    }
    if (j.contains("dp_device_noise_stddev") || j.contains("secagg_value_bound")) {
      if (!j.contains("dp_device_noise_stddev") || !j["dp_device_noise_stddev"].is_number() ||
          !j.contains("secagg_value_bound") || !j["secagg_value_bound"].is_number())
        return std::nullopt;
      info.dp_device_noise_stddev = j["dp_device_noise_stddev"].get<double>();
      info.secagg_value_bound = j["secagg_value_bound"].get<double>();
    }
    if (j.contains("secagg_signed_keys")) {
      if (!j["secagg_signed_keys"].is_boolean()) return std::nullopt;
      info.secagg_signed_keys = j["secagg_signed_keys"].get<bool>();
    }
    if (j.contains("secagg_neighbours")) {
      if (!j["secagg_neighbours"].is_number_unsigned() || j["secagg_neighbours"].get<std::uint64_t>() > 254)
        return std::nullopt;
      info.secagg_neighbours = static_cast<std::uint32_t>(j["secagg_neighbours"].get<std::uint64_t>());
    }
    if (j.contains("dp_clip_count_device_stddev") || j.contains("secagg_count_value_bound")) {
      if (!j.contains("dp_clip_count_device_stddev") || !j["dp_clip_count_device_stddev"].is_number() ||
          !j.contains("secagg_count_value_bound") || !j["secagg_count_value_bound"].is_number())
        return std::nullopt;
      info.dp_clip_count_device_stddev = j["dp_clip_count_device_stddev"].get<double>();
      info.secagg_count_value_bound = j["secagg_count_value_bound"].get<double>();
    }
    if (j.contains("dp_noise")) {
      // A noise this worker does not know must not be taken for none.
      if (j["dp_noise"] != "skellam") return std::nullopt;
      for (const char* key : {"secagg_skellam_scale", "secagg_skellam_variance", "secagg_skellam_l2_bound"})
        if (!j.contains(key) || !j[key].is_number()) return std::nullopt;
      info.secagg_skellam_scale = j["secagg_skellam_scale"].get<double>();
      info.secagg_skellam_variance = j["secagg_skellam_variance"].get<double>();
      info.secagg_skellam_l2_bound = j["secagg_skellam_l2_bound"].get<double>();
    }
  }
  return info;
}

std::uint64_t round_steps(const RoundInfo& round, std::size_t shard_size, int batch) {
  if (round.local_epochs == 0) return round.local_steps;
  const std::uint64_t per_epoch =
      (shard_size + static_cast<std::size_t>(batch) - 1) / static_cast<std::size_t>(batch);
  return std::clamp<std::uint64_t>(per_epoch * round.local_epochs, 1, 1000000);
}

LocalTraining train_round_locally(const LocalTrainer& with, std::uint64_t steps,
                                  std::span<const float> start, std::span<float> parameters,
                                  std::span<float> delta, const LocalTrainingHooks& hooks) {
  std::copy(start.begin(), start.end(), parameters.begin());
  LocalTraining trained;
  for (std::uint64_t step = 0; step < steps; ++step) {
    if (hooks.before_step && !hooks.before_step()) break;
    with.sampler.next_batch(with.batch, with.pixels, with.labels);
    const auto started = Clock::now();
    const BatchResult result = with.trainer.compute_gradient(
        parameters, with.pixels.data(), with.labels.data(), with.batch, with.gradient);
    if (hooks.after_gradient) hooks.after_gradient(result, started);
    trained.steps++;
    if (!std::isfinite(result.loss)) continue;  // skipped, as Worker skips a non-finite step
    trained.last_loss = result.loss;
    for (std::size_t i = 0; i < parameters.size(); ++i) parameters[i] -= with.lr * with.gradient[i];
    trained.examples += static_cast<std::uint64_t>(with.batch);
  }
  for (std::size_t i = 0; i < parameters.size(); ++i) delta[i] = parameters[i] - start[i];
  return trained;
}

struct RoundWorker::State {
  State(const RoundWorkerConfig& config, const Dataset& train, ServerChannel& channel,
        const std::atomic<bool>& stop, WorkerLog log)
      : config(config),
        channel(channel),
        stop(stop),
        log(std::move(log)),
        model(checked_model(config.worker, train)),
        sampler(train, worker_shard(config.worker, train),
                config.worker.seed ^ (0x9e3779b97f4a7c15ULL * (config.worker.worker_id + 1))),
        pool(config.worker.threads),
        trainer(model, config.worker.batch, KernelBackend::kXnnpack, pool.get()),
        dropout(config.worker.dropout, model, trainer,
                config.worker.seed ^ (0x2545f4914f6cdd1dULL * (config.worker.worker_id + 1)),
                WorkerDropout::Pacing::kPerRound),
        compressor(layout_of(model), config.worker.compressor),
        sizes(model.tensor_sizes()),
        gradient(model.parameter_count()),
        pixels(static_cast<std::size_t>(config.worker.batch) * train.image_bytes()),
        labels(config.worker.batch),
        problems(
            this->config.worker, stop,
            [this](const std::string& line, logging::Level level) { say(line, level); },
            [this] { stats.retries++; }),
        sequence(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count())) {
    if (!(config.lr > 0))
      throw std::invalid_argument("worker: the local learning rate must be > 0");
    if (!(config.deadline_share > 0 && config.deadline_share <= 1))
      throw std::invalid_argument("worker: the deadline share must be in (0, 1]");
    trainer.set_input_format(train.format);  // uint8 or float32 examples, and their scaling
    trainer.set_step_seed(loop::dropout_step_seed(config.worker.seed, config.worker.worker_id));
    stats.dropout = dropout.status();
  }

  // As Worker::say: lines below the process's --log-level are dropped.
  void say(const std::string& line, logging::Level level = logging::Level::kInfo) const {
    if (log && logging::enabled(level)) log(line);
  }
  std::optional<RoundInfo> poll();
  bool pull(const RoundInfo& round);
  void train(const RoundInfo& round);
  bool send(const RoundInfo& round);
  // A secure round's steps after training (server/secure_round.h). True when the unmasking
  // shares were accepted.
  bool secure_send(const RoundInfo& round);
  bool post_step(const RoundInfo& round, const std::string& path,
                 const std::vector<std::uint8_t>& body);
  std::optional<std::vector<std::uint8_t>> wait_for(const RoundInfo& round,
                                                    const std::string& path);
  void dump_for_test(const RoundInfo& round, std::size_t devices,
                     std::span<const std::uint32_t> quantized) const;

  const RoundWorkerConfig config;
  ServerChannel& channel;
  const std::atomic<bool>& stop;
  const WorkerLog log;
  Model model;
  ShardSampler sampler;
  ThreadPool pool;
  Trainer trainer;
  WorkerDropout dropout;
  Compressor compressor;
  std::vector<std::uint32_t> sizes;
  std::vector<float> start, parameters, gradient;
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;
  loop::Trouble problems;
  std::uint64_t sequence;
  std::vector<std::uint8_t> body;
  std::uint64_t examples = 0;
  Clock::time_point
      polled_at;  // when the last GET /round was answered (its deadline counts from there)
  // How long the last pull took and how big it was: a DISTREAL worker expects its send to
  // take that time scaled by the delta's size (a dense delta is as big as the model).
  double last_pull_seconds = 0;
  std::size_t last_pull_bytes = 0;
  std::optional<std::uint64_t>
      done_round;  // the last round this worker sent a delta for (or was refused in)
  std::optional<std::uint64_t> done_session;  // likewise for secure sessions (a round may have several)
  std::unique_ptr<privacy::SecureRandom> random;  // made at the first secure round
  // A worker with a certificate: its key and the fleet's CA (the DTLS files), read at the
  // first secure round, for signed keys (privacy/secagg_signed.h).
  std::shared_ptr<privacy::DeviceCredentials> signing_credentials;
  std::shared_ptr<const privacy::CertificateAuthority> signing_ca;
  bool warned_unsigned = false;  // a PSK worker in a semi-honest secure round: said once
  // Whether this device takes part in `round` as to signing, and reads its credentials when
  // it signs; false (said why, the session left) when it cannot or must not.
  bool secure_signing_ready(const RoundInfo& round);
  bool dropped = false;                           // test_secagg_drop_after_input happened
  // Secure rounds that send a subset: what earlier sessions' subsets left unsent, added to the
  // next delta (error feedback like AdaComp's residual; ours). In memory only: a restart
  // loses it, as it loses a delta being trained.
  std::vector<float> unsent;
  RoundWorkerStats stats;
};

std::optional<RoundInfo> RoundWorker::State::poll() {
  transport::CoapResponse response;
  try {
    response = channel.get_round();
  } catch (const transport::TransportError& e) {
    problems.request_failed("GET /round failed", e);
    return std::nullopt;
  }
  problems.answered();
  polled_at = Clock::now();
  stats.polls++;
  if (response.code == transport::CoapCode::kNotFound) {
    problems.refused(WorkerExit::kNothingApplied,
                     "GET /round answered 4.04: is the server running with --mode rounds?");
    return std::nullopt;
  }
  std::optional<RoundInfo> info;
  if (response.code == transport::CoapCode::kContent) info = parse_round_info(response.payload);
  if (!info) {
    problems.trouble(WorkerExit::kNothingApplied, "GET /round answered " +
                                                      transport::coap_code_string(response.code) +
                                                      " " + payload_text(response.payload));
    return std::nullopt;
  }
  return info;  // refusals in a row end only with an exchange that succeeds (2.04, 4.09), as in
                // Worker
}

bool RoundWorker::State::pull(const RoundInfo& round) {
  transport::CoapResponse response;
  const auto pull_started = Clock::now();
  try {
    response = channel.get_model("model");
  } catch (const transport::TransportError& e) {
    problems.request_failed("pull failed", e);
    return false;
  }
  problems.answered();
  if (response.code != transport::CoapCode::kContent) {
    problems.trouble(WorkerExit::kNothingApplied, "GET /model answered " +
                                                      transport::coap_code_string(response.code) +
                                                      " " + payload_text(response.payload));
    return false;
  }
  auto decoded = transport::decode_dense_model(response.payload, {model.layout_id(), sizes});
  if (!decoded) {
    problems.refused(WorkerExit::kModelMismatch, "the server's model does not match model '" +
                                                     config.worker.model +
                                                     "': " + decoded.error().message);
    return false;
  }
  stats.pulls++;
  stats.bytes_received += response.payload.size();
  last_pull_seconds = std::chrono::duration<double>(Clock::now() - pull_started).count();
  last_pull_bytes = response.payload.size();
  if (decoded.value().version != round.model_version)
    return false;  // the round closed meanwhile: poll again
  start = std::move(decoded).value().values;
  return true;
}

void RoundWorker::State::train(const RoundInfo& round) {
  parameters.resize(start.size());
  const int batch = config.worker.batch;
  const std::uint64_t steps = round_steps(round, sampler.shard_size(), batch);
  if (dropout.adaptive()) {
    // DISTREAL in rounds: the steps and the send must fit the time left before the deadline
    // (what the pull took is gone already). The send is expected to take the pull's time
    // scaled by the last delta's size against the model's (the first round: as long as the
    // pull); a share of the rest is the steps' budget.
    const double left =
        round.deadline_seconds - std::chrono::duration<double>(Clock::now() - polled_at).count();
    const double send_ratio =
        body.empty() || last_pull_bytes == 0
            ? 1.0
            : static_cast<double>(body.size()) / static_cast<double>(last_pull_bytes);
    const double for_steps = left - last_pull_seconds * send_ratio;
    const double budget =
        std::max(for_steps * config.deadline_share, 1e-6) / static_cast<double>(steps);
    if (dropout.set_budget(budget))
      say("round " + std::to_string(round.round) + ": " + dropout.describe());
  }
  // The steps (the rule the simulator shares), and the delta in place of the gradient the
  // compressor usually takes.
  const LocalTraining trained = train_round_locally(
      {trainer, sampler, batch, config.lr, pixels, labels, gradient}, steps, start, parameters,
      gradient,
      {.before_step = [this] { return !stop; },
       .after_gradient =
           [&](const BatchResult&, Clock::time_point started) {
             if (config.worker.slowdown > 0)
               sleep_unless_stopped(std::chrono::duration_cast<Clock::duration>(
                                        (Clock::now() - started) * config.worker.slowdown),
                                    stop);
             if (dropout.after_step(std::chrono::duration<double>(Clock::now() - started).count()))
               say("round " + std::to_string(round.round) + ": " + dropout.describe());
             stats.dropout = dropout.status();
             stats.steps++;
           }});
  if (trained.last_loss) stats.last_loss = *trained.last_loss;
  examples = trained.examples;
  if (round.secure) return;  // `gradient` holds the delta: secure_send clips and quantizes it
  transport::SparseUpdate update;
  update.model_id = model.layout_id();
  update.sequence = ++sequence;
  update.fetched_version = round.round;  // the round number (= the version it started from)
  compressor.compress(gradient, update);
  auto encoded = transport::encode_sparse_update(update, {config.worker.compressor.value_encoding});
  if (!encoded)
    throw std::logic_error("worker: cannot encode a round delta: " + encoded.error().message);
  body = std::move(encoded).value();
}

bool RoundWorker::State::send(const RoundInfo& round) {
  for (int attempt = 0; attempt < 2 && !stop; ++attempt) {
    transport::CoapResponse response;
    try {
      response = channel.post_round_update(examples, body);
    } catch (const transport::TransportError& e) {
      problems.request_failed("sending the round delta failed", e);
      continue;  // once more with the same bytes: the server takes one delta per device and round
    }
    problems.answered();
    stats.bytes_sent += body.size();
    const std::string answer =
        transport::coap_code_string(response.code) + " " + payload_text(response.payload);
    if (response.code == transport::CoapCode::kChanged) {
      stats.rounds_trained++;
      stats.last_round = round.round;
      stats.acknowledged_rounds.push_back(round.round);
      done_round = round.round;
      problems.succeeded();
      return true;
    }
    if (response.code == transport::CoapCode::kConflict) {
      stats.deltas_refused++;  // the round closed (a straggler) or moved on: take part in the next
                               // one
      done_round = round.round;
      problems.expected_refusal();
      say("round " + std::to_string(round.round) + ": delta refused with " + answer,
          logging::Level::kWarn);
      return false;
    }
    if (response.code == transport::CoapCode::kUnauthorized ||
        response.code == transport::CoapCode::kForbidden) {
      stats.deltas_rejected++;
      problems.refused(WorkerExit::kUnknownIdentity, "round delta refused with " + answer);
      return false;
    }
    stats.deltas_rejected++;
    problems.trouble(WorkerExit::kNothingApplied, "round delta rejected with " + answer);
    return false;
  }
  return false;
}

bool RoundWorker::State::post_step(const RoundInfo& round, const std::string& path,
                                   const std::vector<std::uint8_t>& body) {
  for (int attempt = 0; attempt < 2 && !stop; ++attempt) {
    transport::CoapResponse response;
    try {
      response = channel.request(transport::Method::kPost, path, body);
      stats.secagg_requests++;  // answered ones
    } catch (const transport::TransportError& e) {
      problems.request_failed("POST /" + path + " failed", e);
      continue;  // the same bytes again: the server counts one message per device and step
    }
    problems.answered();
    stats.bytes_sent += body.size();
    if (response.code == transport::CoapCode::kChanged) return true;
    const std::string answer =
        transport::coap_code_string(response.code) + " " + payload_text(response.payload);
    done_session = round.secagg_session;
    if (response.code == transport::CoapCode::kConflict) {
      stats.deltas_refused++;  // the session moved on without this device: the next one
      problems.expected_refusal();
      say("round " + std::to_string(round.round) + ": POST /" + path + " refused with " + answer,
          logging::Level::kWarn);
      return false;
    }
    stats.deltas_rejected++;
    problems.trouble(WorkerExit::kNothingApplied, "POST /" + path + " rejected with " + answer);
    return false;
  }
  return false;
}

std::optional<std::vector<std::uint8_t>> RoundWorker::State::wait_for(const RoundInfo& round,
                                                                       const std::string& path) {
  const std::string with_session = path + "?session=" + std::to_string(round.secagg_session);
  // Each step closes by its deadline; a server that keeps answering "not yet" far past it is
  // left (ours: ten deadlines, at least 1 s), so that --duration and the stop flag still end
  // the run.
  const auto give_up_at =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(1.0, 10 * round.deadline_seconds)));
  while (!stop) {
    if (Clock::now() > give_up_at) {
      done_session = round.secagg_session;
      stats.deltas_refused++;
      say("round " + std::to_string(round.round) + ": GET /" + path +
              " still not answered ten step deadlines on: leaving this session",
          logging::Level::kWarn);
      return std::nullopt;
    }
    transport::CoapResponse response;
    try {
      response = channel.request(transport::Method::kGet, with_session);
      stats.secagg_requests++;
    } catch (const transport::TransportError& e) {
      problems.request_failed("GET /" + path + " failed", e);
      continue;
    }
    problems.answered();
    if (response.code == transport::CoapCode::kContent) {
      stats.bytes_received += response.payload.size();
      return std::move(response.payload);
    }
    if (response.code == 503) {  // the step is still open (server::kCoapNotYet)
      stats.secagg_not_yet++;
      sleep_unless_stopped(std::chrono::milliseconds(100), stop);
      continue;
    }
    done_session = round.secagg_session;
    const std::string answer =
        transport::coap_code_string(response.code) + " " + payload_text(response.payload);
    if (response.code == transport::CoapCode::kConflict) {
      stats.deltas_refused++;
      problems.expected_refusal();
      say("round " + std::to_string(round.round) + ": GET /" + path + " refused with " + answer,
          logging::Level::kWarn);
      return std::nullopt;
    }
    stats.deltas_rejected++;
    problems.trouble(WorkerExit::kNothingApplied, "GET /" + path + " answered " + answer);
    return std::nullopt;
  }
  return std::nullopt;
}

void RoundWorker::State::dump_for_test(const RoundInfo& round, std::size_t devices,
                                       std::span<const std::uint32_t> quantized) const {
  // With a subset, delta.f32 is the whole vector with the unsent remainder added (not
  // clipped) and quantized.u32 the subset's entries: the json names the subset.
  std::string name = round.secagg_identity;
  for (char& c : name)
    if (c == '/' || c == '\\') c = '_';
  const std::string stem = config.test_secagg_dump_dir + "/" + name + ".r" + std::to_string(round.round);
  auto write = [&](const std::string& path, const void* data, std::size_t bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out) throw std::runtime_error("worker: cannot write " + path);
  };
  write(stem + ".start.f32", start.data(), start.size() * sizeof(float));
  write(stem + ".delta.f32", gradient.data(), gradient.size() * sizeof(float));
  write(stem + ".quantized.u32", quantized.data(), quantized.size() * sizeof(std::uint32_t));
  const std::string meta = nlohmann::json{{"round", round.round},
                                          {"devices", devices},
                                          {"clip_norm", round.clip_norm},
                                          {"value_bound", round.secagg_value_bound > 0 ? round.secagg_value_bound
                                                                                       : round.clip_norm},
                                          {"device_noise_stddev", round.dp_device_noise_stddev},
                                          {"subset_seed", round.secagg_subset_seed},
                                          {"subset_length", round.secagg_subset_length}}
                               .dump() + "\n";
  write(stem + ".json", meta.data(), meta.size());
}

bool RoundWorker::State::secure_signing_ready(const RoundInfo& round) {
  const auto leave = [&](const std::string& why) {
    done_session = round.secagg_session;
    stats.deltas_refused++;
    say("round " + std::to_string(round.round) + ": not taking part in this secure round: " + why,
        logging::Level::kWarn);
    return false;
  };
  const auto& certificates = config.worker.certificates;
  if (!certificates) {
    if (round.secagg_signed_keys)
      return leave("the server asks for keys signed by the device's certificate, and this device has a PSK "
                   "identity (no key the server does not know)");
    if (!warned_unsigned) {
      warned_unsigned = true;
      say("secure aggregation with a PSK identity: the devices' keys are authenticated by the transport only, "
          "so this device trusts the server to relay them unchanged (the semi-honest model; docs/privacy.md)",
          logging::Level::kWarn);
    }
    return true;
  }
  // Ours: a device that can sign never takes part unsigned, or a server that substitutes keys
  // could unmask its delta.
  if (!round.secagg_signed_keys)
    return leave("this device has a certificate and takes part only in rounds with signed keys; the server "
                 "runs secure aggregation without --secagg-signed-keys, so it could substitute keys unseen");
  if (!signing_credentials) {
    try {
      signing_credentials = privacy::DeviceCredentials::from_files(certificates->certificate_file,
                                                                   certificates->private_key_file);
      signing_ca = privacy::CertificateAuthority::from_file(certificates->ca_file);
    } catch (const std::invalid_argument& e) {
      signing_credentials.reset();
      return leave(std::string("cannot sign keys: ") + e.what());
    }
  }
  return true;
}

bool RoundWorker::State::secure_send(const RoundInfo& round) {
  if (!random) random = std::make_unique<privacy::SecureRandom>();
  if (!secure_signing_ready(round)) return false;
  // A session that sends a subset: the delta plus what earlier subsets left unsent, of which
  // the session's entries (the same on every device) are sent.
  std::vector<std::uint32_t> subset;
  std::vector<float> picked;
  if (round.secagg_subset_length > 0) {
    if (round.secagg_subset_length > gradient.size()) {
      done_session = round.secagg_session;
      stats.deltas_refused++;
      say("round " + std::to_string(round.round) + ": the server's secure session sends a subset of " +
              std::to_string(round.secagg_subset_length) + " entries of a model of " +
              std::to_string(gradient.size()) + ": not taking part",
          logging::Level::kWarn);
      return false;
    }
    if (unsent.size() != gradient.size()) unsent.assign(gradient.size(), 0.0f);
    for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] += unsent[i];
    subset = privacy::subset_indices(round.secagg_subset_seed, static_cast<std::uint32_t>(gradient.size()),
                                     round.secagg_subset_length);
    picked.resize(subset.size());
    for (std::size_t k = 0; k < subset.size(); ++k) picked[k] = gradient[subset[k]];
  }
  const std::span<float> sent = subset.empty() ? std::span<float>(gradient) : std::span<float>(picked);
  // What is sent, clipped to the round's norm (quantize() refuses one above it; the float
  // scaling lands within its 1e-6 tolerance).
  double squares = 0;
  for (const float v : sent) squares += static_cast<double>(v) * v;
  const double norm = std::sqrt(squares);
  const bool unclipped = norm <= round.clip_norm;  // adaptive clipping's bit
  if (norm > round.clip_norm) {
    const auto scale = static_cast<float>(round.clip_norm / norm);
    for (float& v : sent) v *= scale;
  }
  // dp-fedavg's distributed noise: refused before any step when the announced range would let
  // the noised values wrap the ring (or the noise is not a number).
  const bool noised = round.dp_device_noise_stddev > 0 || round.secagg_value_bound > 0;
  if (noised) {
    if (const std::string problem = privacy::device_noise_problem(
            round.clip_norm, round.dp_device_noise_stddev, round.secagg_value_bound);
        !problem.empty()) {
      done_session = round.secagg_session;
      stats.deltas_refused++;
      say("round " + std::to_string(round.round) + ": not taking part in a secure round whose noise " +
              "this device cannot honour: " + problem,
          logging::Level::kWarn);
      return false;
    }
  }
  const bool counted = round.secagg_count_value_bound != 0 || round.dp_clip_count_device_stddev != 0;
  if (counted) {
    if (const std::string problem = privacy::device_noise_problem(1, round.dp_clip_count_device_stddev,
                                                                  round.secagg_count_value_bound);
        !problem.empty()) {
      done_session = round.secagg_session;
      stats.deltas_refused++;
      say("round " + std::to_string(round.round) + ": not taking part in a secure round whose clip count " +
              "this device cannot honour: " + problem,
          logging::Level::kWarn);
      return false;
    }
  }
  const bool skellam = round.secagg_skellam_scale != 0 || round.secagg_skellam_variance != 0;
  if (skellam) {
    if (const std::string problem = privacy::skellam_announcement_problem(
            round.secagg_skellam_scale, round.secagg_skellam_variance, round.secagg_skellam_l2_bound, round.clip_norm);
        !problem.empty()) {
      done_session = round.secagg_session;
      stats.deltas_refused++;
      say("round " + std::to_string(round.round) + ": not taking part in a secure round whose discrete noise " +
              "this device cannot honour: " + problem,
          logging::Level::kWarn);
      return false;
    }
  }
  try {
    // Signed sessions go through SignedSecAggDevice (checks every key's signature; reveals
    // only after the consistency step), the others through SecAggDevice.
    std::optional<privacy::SecAggDevice> plain_device;
    std::optional<privacy::SignedSecAggDevice> signed_device;
    if (round.secagg_signed_keys) {
      signed_device.emplace(round.secagg_identity, round.secagg_session, *random, signing_credentials, signing_ca);
    } else {
      plain_device.emplace(round.secagg_identity, round.secagg_session, *random);
    }
    if (!post_step(round, "round/secagg/keys",
                   signed_device ? privacy::serialize(signed_device->advertise_keys())
                                 : privacy::serialize(plain_device->advertise_keys())))
      return false;
    const auto directory_bytes = wait_for(round, "round/secagg/keys");
    if (!directory_bytes) return false;
    std::size_t key_holders = 0;
    std::vector<std::uint8_t> shares_message;
    if (signed_device) {
      const privacy::SignedKeyDirectory directory = privacy::parse_signed_key_directory(*directory_bytes);
      if (directory.directory.config.neighbours != 0)  // the server refuses signed keys with SecAgg+
        throw privacy::SecAggError("a signed key directory with neighbours (SecAgg+) is not built");
      key_holders = directory.directory.key_holder_count();
      shares_message = privacy::serialize(signed_device->share_keys(directory));
    } else {
      const privacy::KeyDirectory directory = privacy::parse_key_directory(*directory_bytes);
      if (directory.config.neighbours != round.secagg_neighbours)  // SecAgg+'s k, as GET /round said
        throw privacy::SecAggError("the key directory has " + std::to_string(directory.config.neighbours) +
                                   " neighbours per device, GET /round announced " +
                                   std::to_string(round.secagg_neighbours));
      key_holders = directory.key_holder_count();
      shares_message = privacy::serialize(plain_device->share_keys(directory));
    }
    if (!post_step(round, "round/secagg/shares", shares_message)) return false;
    if (config.test_secagg_drop_after == "shares") {
      say("round " + std::to_string(round.round) + ": leaving after the shares (--test-secagg-drop-after)");
      dropped = true;
      return false;
    }
    const auto shares_bytes = wait_for(round, "round/secagg/shares");
    if (!shares_bytes) return false;
    // N, the most summands, is U1's size: the server reads the sum back with the same.
    const auto devices = static_cast<std::uint32_t>(key_holders);
    std::vector<std::uint32_t> quantized;
    if (skellam) {
      // Integers of scale γ, rounded within Δ2, plus Sk(v_d) each (privacy/skellam.h). The
      // ring must hold U1's sum: a plan that could wrap it is refused, a draw past K leaves.
      if (const std::string problem = privacy::skellam_ring_problem(
              round.secagg_skellam_scale, round.clip_norm, round.secagg_skellam_variance, devices);
          !problem.empty())
        throw privacy::SecAggError("the discrete noise does not fit the ring: " + problem);
      try {
        quantized = privacy::skellam_encode(sent, round.secagg_skellam_scale, round.secagg_skellam_variance,
                                            round.secagg_skellam_l2_bound, devices, privacy::SecureBits(*random));
      } catch (const std::invalid_argument& e) {
        throw privacy::SecAggError(std::string("the discretely noised delta does not fit the ring: ") + e.what());
      }
    } else if (noised) {
      // The noise after clipping (what was sent stays clean for the subset's remainder).
      std::vector<float> with_noise(sent.begin(), sent.end());
      privacy::add_device_noise(with_noise, round.dp_device_noise_stddev, *random);
      try {
        quantized = privacy::quantize_bounded(with_noise, round.secagg_value_bound, devices,
                                              privacy::Rounding::kNearest);
      } catch (const std::invalid_argument& e) {
        // A draw past 10 standard deviations (1.5e-23 a value): sending it could wrap the sum.
        throw privacy::SecAggError(std::string("the noised delta does not fit the ring: ") + e.what());
      }
    } else {
      quantized = privacy::quantize(sent, round.clip_norm, devices, privacy::Rounding::kNearest);
    }
    if (counted) {
      try {
        quantized.push_back(privacy::quantized_count_value(unclipped, round.dp_clip_count_device_stddev,
                                                           round.secagg_count_value_bound, devices, *random));
      } catch (const std::invalid_argument& e) {
        throw privacy::SecAggError(std::string("the noised clip count does not fit the ring: ") + e.what());
      }
    }
    if (!config.test_secagg_dump_dir.empty()) dump_for_test(round, devices, quantized);
    const privacy::EncryptedShares received = privacy::parse_encrypted_shares(*shares_bytes);
    const privacy::MaskedInput masked = signed_device ? signed_device->masked_input(received, quantized)
                                                      : plain_device->masked_input(received, quantized);
    if (!post_step(round, "round/secagg/input", privacy::serialize(masked))) return false;
    if (!subset.empty()) {
      // Taken: what was sent leaves the remainder, the rest (and what clipping cut) stays.
      unsent.assign(gradient.begin(), gradient.end());
      for (std::size_t k = 0; k < subset.size(); ++k) unsent[subset[k]] -= picked[k];
      double held = 0;
      for (const float v : unsent) held += static_cast<double>(v) * v;
      stats.secagg_unsent_norm = std::sqrt(held);
    }
    if (config.test_secagg_drop_after == "input") {
      say("round " + std::to_string(round.round) + ": leaving after the masked input (--test-secagg-drop-after)");
      dropped = true;
      return false;
    }
    const auto survivors_bytes = wait_for(round, "round/secagg/survivors");
    if (!survivors_bytes) return false;
    privacy::UnmaskingShares unmasking;
    if (signed_device) {
      // The consistency step: sign the list, then reveal only with t signatures over it.
      const privacy::SurvivorList survivors = privacy::parse_survivor_list(*survivors_bytes);
      if (!post_step(round, "round/secagg/consistency", privacy::serialize(signed_device->sign_survivors(survivors))))
        return false;
      if (config.test_secagg_drop_after == "consistency") {
        say("round " + std::to_string(round.round) + ": leaving after the consistency signature (--test-secagg-drop-after)");
        dropped = true;
        return false;
      }
      const auto signatures_bytes = wait_for(round, "round/secagg/consistency");
      if (!signatures_bytes) return false;
      unmasking = signed_device->unmasking_shares(privacy::parse_consistency_signatures(*signatures_bytes));
    } else {
      unmasking = plain_device->unmasking_shares(privacy::parse_survivor_list(*survivors_bytes));
    }
    if (!post_step(round, "round/secagg/unmask", privacy::serialize(unmasking))) return false;
  } catch (const privacy::SecAggError& e) {
    // The server relayed something the protocol refuses: this session goes on without us.
    done_session = round.secagg_session;
    stats.deltas_refused++;
    say("round " + std::to_string(round.round) + ": secure aggregation refused: " + e.what(),
        logging::Level::kWarn);
    return false;
  }
  // Accepted: the round closes with the sum it is part of (unless too few devices answer the
  // unmasking, when the server begins another session of the round).
  // Not in acknowledged_rounds: the round's close may still be lost in a server crash (the
  // server then begins another session of it: server/secure_round.h).
  done_session = round.secagg_session;
  stats.rounds_trained++;
  stats.last_round = round.round;
  problems.succeeded();
  return true;
}

RoundWorker::RoundWorker(const RoundWorkerConfig& config, const Dataset& train,
                         ServerChannel& channel, const std::atomic<bool>& stop, WorkerLog log)
    : state_(std::make_unique<State>(config, train, channel, stop, std::move(log))) {}

RoundWorker::~RoundWorker() = default;

const RoundWorkerStats& RoundWorker::stats() const { return state_->stats; }
WorkerExit RoundWorker::last_trouble() const { return state_->problems.last(); }
const std::string& RoundWorker::last_trouble_message() const {
  return state_->problems.last_message();
}

bool RoundWorker::run_once() {
  State& s = *state_;
  const std::optional<RoundInfo> round = s.poll();
  if (!round) return false;
  const bool done = round->secure ? s.done_session == round->secagg_session
                                  : s.done_round == round->round;
  if (!round->selected || done) {
    sleep_unless_stopped(std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(s.config.poll_seconds)),
                         s.stop);
    return false;
  }
  if (!s.pull(*round)) return false;
  s.train(*round);
  if (s.stop) return false;
  return round->secure ? s.secure_send(*round) : s.send(*round);
}

RoundWorkerStats RoundWorker::run(const std::function<void(const RoundWorkerStats&)>& progress) {
  State& s = *state_;
  const auto started = Clock::now();
  auto out_of_time = [&] {
    return s.config.worker.max_seconds > 0 &&
           std::chrono::duration<double>(Clock::now() - started).count() >=
               s.config.worker.max_seconds;
  };
  while (!s.stop && !s.dropped && (s.config.max_rounds == 0 || s.stats.rounds_trained < s.config.max_rounds) &&
         !out_of_time()) {
    const std::uint64_t sent =
        s.stats.rounds_trained + s.stats.deltas_refused + s.stats.deltas_rejected;
    const bool accepted = run_once();
    if (progress &&
        s.stats.rounds_trained + s.stats.deltas_refused + s.stats.deltas_rejected != sent)
      progress(s.stats);
    if (accepted)
      s.say("round " + std::to_string(s.stats.last_round) +
            (s.done_session ? std::string(": secure aggregation's steps done")
                            : ": delta of " + std::to_string(s.body.size()) + " bytes accepted") +
            " (loss " +
            std::to_string(s.stats.last_loss) + ")" +
            (s.stats.dropout.drop_rates.empty() ? "" : ", drop " + s.stats.dropout.drop_rates));
  }
  return s.stats;
}

RoundWorkerRun run_round_worker(const RoundWorkerConfig& config, const Dataset& train,
                                const std::atomic<bool>& stop, const WorkerLog& log,
                                const std::function<void(const RoundWorkerStats&)>& progress) {
  CoapServerChannel channel(coap_client_options(config.worker, stop));
  RoundWorker worker(config, train, channel, stop, log);
  RoundWorkerRun result;
  try {
    result.stats = worker.run(progress);
  } catch (const WorkerFailure& e) {
    result.stats = worker.stats();
    result.exit = e.exit();
    result.reason = e.what();
    return result;
  }
  if (result.stats.rounds_trained == 0)
    end_without_anything_applied(worker.last_trouble(), worker.last_trouble_message(),
                                 "round delta", result.exit, result.reason);
  return result;
}

}  // namespace edgetrain::runtime
