#include "worker/gan_worker.h"

#include <chrono>
#include <condition_variable>
#include <stdexcept>

#include "common/logging.h"
#include "worker/loop_support.h"
#include "model/shard_sampler.h"
#include "worker/worker_exit_codes.h"
#include "transport/gan_codec.h"
#include "transport/untrusted_text.h"

namespace edgetrain::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using loop::payload_text;
using loop::sleep_unless_stopped;
using transport::CoapCode;
using transport::CoapRequest;
using transport::CoapResponse;
using transport::text_response;

constexpr int kServiceUnavailable = 503;

}  // namespace

struct GanWorker::State {
  State(const GanWorkerConfig& c, const Dataset& train, ServerChannel& server, PeerChannel* peers,
        const GossipTopology* topology, const std::atomic<bool>& stop, WorkerLog log)
      : config(c),
        server(server),
        peers(peers),
        topology(topology),
        stop(stop),
        log(std::move(log)),
        d(make_discriminator(c.gan, c.gan.seed + 3000 * (c.worker.worker_id + 1))),
        sampler(train, worker_shard(c.worker, train),
                c.worker.seed ^ (0x9e3779b97f4a7c15ULL * (c.worker.worker_id + 1))),
        sizes(d->model().tensor_sizes()),
        problems(
            this->config.worker, stop,
            [this](const std::string& line, logging::Level level) { say(line, level); },
            [this] {
              std::lock_guard lock(mutex);
              stats.retries++;
            }) {
    if (train.image_bytes() != static_cast<std::size_t>(kGanImageSize) ||
        train.num_classes != kGanClasses)
      throw std::invalid_argument(
          "gan: the data must be 28x28 grey images of 10 classes (MNIST, Fashion-MNIST)");
    if (c.gan.discriminator_steps < 1)
      throw std::invalid_argument("gan: --gan-discriminator-steps must be at least 1");
    const std::size_t b = static_cast<std::size_t>(c.gan.batch);
    real_pixels.resize(b * kGanImageSize);
    real_labels.resize(b);
    real.resize(b * kGanImageSize);
    feedback.resize(b * kGanImageSize);
  }

  void say(const std::string& line, logging::Level level = logging::Level::kInfo) const {
    if (log && logging::enabled(level)) log(line);
  }
  void swap(const transport::GanBatches& batches);
  void train(const transport::GanBatches& batches);
  bool send_feedback(const transport::GanBatches& batches);

  const GanWorkerConfig config;
  ServerChannel& server;
  PeerChannel* peers;
  const GossipTopology* topology;
  const std::atomic<bool>& stop;
  const WorkerLog log;
  std::unique_ptr<GanPart> d;
  ShardSampler sampler;
  std::vector<std::uint32_t> sizes;
  loop::Trouble problems;
  std::vector<std::uint8_t> real_pixels;
  std::vector<std::int32_t> real_labels;
  std::vector<float> real, feedback;
  std::uint64_t done_iteration = UINT64_MAX;  // the last iteration this worker answered
  // Discriminators peers sent, by swap round; guarded by the mutex (the peer endpoint's thread).
  mutable std::mutex mutex;
  std::condition_variable arrived;
  std::map<std::uint32_t, std::vector<float>> mailbox;
  GanWorkerStats stats;  // the counters of the peer endpoint are guarded by `mutex` too
};

GanWorker::GanWorker(const GanWorkerConfig& config, const Dataset& train, ServerChannel& server,
                     PeerChannel* peers, const GossipTopology* topology,
                     const std::atomic<bool>& stop, WorkerLog log)
    : state_(
          std::make_unique<State>(config, train, server, peers, topology, stop, std::move(log))) {}

GanWorker::~GanWorker() = default;

CoapResponse GanWorker::post_discriminator(const CoapRequest& request) {
  State& s = *state_;
  auto refuse = [&](int code, const std::string& why) {
    std::lock_guard lock(s.mutex);
    s.stats.peer_requests_refused++;
    s.say("refused a discriminator: " + why, logging::Level::kWarn);
    return text_response(code, why);
  };
  if (!s.topology || !s.topology->find(request.identity))
    return refuse(CoapCode::kForbidden, "'" + transport::escape_untrusted(request.identity, 60) +
                                            "' is not a peer of this fleet");
  const transport::ModelLayout layout{s.d->model().layout_id(), s.sizes};
  auto decoded = transport::decode_dense_model(request.payload, layout);
  if (!decoded)
    return refuse(CoapCode::kBadRequest,
                  "not this fleet's discriminator: " + decoded.error().message);
  auto& model = decoded.value();
  if (model.version == 0 || model.version > UINT32_MAX)
    return refuse(CoapCode::kBadRequest, "swap round 0 or too large");
  {
    std::lock_guard lock(s.mutex);
    s.mailbox[static_cast<std::uint32_t>(model.version)] = std::move(model.values);
    s.stats.peer_bytes_received += request.payload.size();
  }
  s.arrived.notify_all();
  return {CoapCode::kChanged, {}, {}};
}

void GanWorker::attach(transport::CoapDtlsServer& server) {
  server.add_resource("gan/discriminator", transport::Method::kPost,
                      [this](const CoapRequest& r) { return post_discriminator(r); });
}

// Send this D to the peer the server named, then take the one some peer sent for this round.
void GanWorker::State::swap(const transport::GanBatches& batches) {
  const std::uint32_t round = batches.swap_round;
  bool sent = false;
  const auto target = topology ? topology->find(batches.swap_to) : std::nullopt;
  if (!peers || !target) {
    say("swap round " + std::to_string(round) + ": no endpoint for peer '" +
            transport::escape_untrusted(batches.swap_to, 60) + "' (not in the topology)",
        logging::Level::kWarn);
  } else if (auto body =
                 transport::encode_dense_model(d->model().layout_id(), round, sizes, d->params);
             !body) {  // a non-finite discriminator is not sent (issue 37)
    say("swap round " + std::to_string(round) +
            ": this discriminator is not sent: " + body.error().message,
        logging::Level::kWarn);
    std::lock_guard lock(mutex);
    stats.swaps_not_sent++;
  } else {
    try {
      const auto response =
          peers->request(*target, transport::Method::kPost, "gan/discriminator", body.value());
      sent = response.code == CoapCode::kChanged;
      if (!sent)
        say("swap round " + std::to_string(round) + ": " + batches.swap_to + " answered " +
                transport::coap_code_string(response.code) + " " + payload_text(response.payload),
            logging::Level::kWarn);
    } catch (const transport::TransportError& e) {
      say("swap round " + std::to_string(round) + ": " + batches.swap_to +
              " not reached: " + e.what(),
          logging::Level::kWarn);
    }
    if (sent) {
      std::lock_guard lock(mutex);
      stats.swaps_sent++;
      stats.peer_bytes_sent += body.value().size();
    }
  }
  std::unique_lock lock(mutex);
  const bool got = arrived.wait_for(lock, std::chrono::duration<double>(config.swap_wait_seconds),
                                    [&] { return mailbox.count(round) > 0 || stop.load(); }) &&
                   mailbox.count(round) > 0;
  if (got) {
    d->params = std::move(mailbox[round]);
    stats.swaps_received++;
  } else {
    stats.swaps_missed++;
    say("swap round " + std::to_string(round) + ": no discriminator came in " +
            std::to_string(config.swap_wait_seconds) + " s; training on this one",
        logging::Level::kWarn);
  }
  mailbox.erase(mailbox.begin(),
                mailbox.upper_bound(round));  // this round's and any older, late ones
}

void GanWorker::State::train(const transport::GanBatches& batches) {
  const auto started = Clock::now();
  const int b = static_cast<int>(batches.batch);
  std::vector<std::int32_t> g_labels(batches.g_labels.begin(), batches.g_labels.end());
  std::vector<std::int32_t> d_labels(batches.d_labels.begin(), batches.d_labels.end());
  DiscriminatorStepStats step;
  for (int l = 0; l < config.gan.discriminator_steps; l++) {
    sampler.next_batch(b, real_pixels, real_labels);
    pixels_to_gan(real.data(), real_pixels.data(), real_pixels.size());
    step = discriminator_step(*d, real.data(), real_labels.data(), batches.d_samples.data(),
                              d_labels.data(), b);
  }
  const float g_loss =
      generator_feedback(*d, batches.g_samples.data(), g_labels.data(), b, feedback.data());
  std::lock_guard lock(mutex);
  stats.d_loss_real = step.real.adversarial;
  stats.d_loss_fake = step.fake.adversarial;
  stats.g_loss = g_loss;
  stats.compute_seconds += std::chrono::duration<double>(Clock::now() - started).count();
}

bool GanWorker::State::send_feedback(const transport::GanBatches& batches) {
  transport::GanFeedback f{.run_id = batches.run_id,
                           .iteration = batches.iteration,
                           .batch = batches.batch,
                           .width = batches.width,
                           .values = feedback};
  auto body = transport::encode_gan_feedback(f, config.feedback_encoding);
  if (!body) {  // a non-finite feedback is not sent (issue 37): the next iteration may do better
    done_iteration = batches.iteration;
    std::lock_guard lock(mutex);
    stats.feedbacks_not_sent++;
    say("feedback for iteration " + std::to_string(batches.iteration) +
            " not sent: " + body.error().message,
        logging::Level::kWarn);
    return false;
  }
  CoapResponse response;
  try {
    response = server.request(transport::Method::kPost, "gan/feedback", body.value());
  } catch (const transport::TransportError& e) {
    problems.request_failed("POST /gan/feedback failed", e);
    return false;
  }
  problems.answered();
  {
    std::lock_guard lock(mutex);
    stats.bytes_sent += body.value().size();
  }
  if (response.code ==
      CoapCode::kForbidden) {  // a restarted server that has not seen this worker yet
    say("feedback for iteration " + std::to_string(batches.iteration) + " refused (" +
            payload_text(response.payload) + "): asking for batches again",
        logging::Level::kWarn);
    return false;
  }
  if (response.code == CoapCode::kChanged || response.code == CoapCode::kConflict)
    done_iteration = batches.iteration;
  if (response.code == CoapCode::kChanged) {
    problems.succeeded();
    std::lock_guard lock(mutex);
    stats.iterations++;
    stats.last_iteration = batches.iteration;
    return true;
  }
  if (response.code ==
      CoapCode::kConflict) {  // the iteration closed without this worker: the next one
    problems.expected_refusal();
    std::lock_guard lock(mutex);
    stats.feedbacks_refused++;
    say("feedback for iteration " + std::to_string(batches.iteration) +
            " refused: " + payload_text(response.payload),
        logging::Level::kWarn);
    return false;
  }
  if (response.code == CoapCode::kUnprocessableEntity) {  // out of bounds: not for this iteration
    done_iteration = batches.iteration;
    problems.expected_refusal();
    std::lock_guard lock(mutex);
    stats.feedbacks_out_of_bounds++;
    say("feedback for iteration " + std::to_string(batches.iteration) +
            " refused: " + payload_text(response.payload),
        logging::Level::kWarn);
    return false;
  }
  problems.trouble(WorkerExit::kError, "POST /gan/feedback answered " +
                                           transport::coap_code_string(response.code) + " " +
                                           payload_text(response.payload));
  return false;
}

bool GanWorker::run_once() {
  State& s = *state_;
  CoapResponse response;
  try {
    response = s.server.request(transport::Method::kGet, "gan/batches");
  } catch (const transport::TransportError& e) {
    s.problems.request_failed("GET /gan/batches failed", e);
    return false;
  }
  s.problems.answered();
  if (response.code == kServiceUnavailable) {
    {
      std::lock_guard lock(s.mutex);
      s.stats.waits++;
    }
    sleep_unless_stopped(std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(s.config.poll_seconds)),
                         s.stop);
    return false;
  }
  if (response.code == CoapCode::kNotFound) {
    s.problems.refused(WorkerExit::kNothingApplied,
                       "GET /gan/batches answered 4.04: is the server running with --mode gan?");
    return false;
  }
  if (response.code == CoapCode::kForbidden) {
    s.problems.refused(WorkerExit::kNothingApplied,
                       "GET /gan/batches answered 4.03: " + payload_text(response.payload));
    return false;
  }
  if (response.code != CoapCode::kContent) {
    s.problems.trouble(WorkerExit::kError, "GET /gan/batches answered " +
                                               transport::coap_code_string(response.code) + " " +
                                               payload_text(response.payload));
    return false;
  }
  {
    std::lock_guard lock(s.mutex);
    s.stats.bytes_received += response.payload.size();
  }
  auto decoded = transport::decode_gan_batches(
      response.payload,
      {.batch = static_cast<std::uint32_t>(s.config.gan.batch), .width = kGanImageSize});
  if (!decoded) {
    if (decoded.error().code == transport::CodecErrorCode::kLayoutMismatch)
      throw WorkerFailure(
          WorkerExit::kModelMismatch,
          "the server's GAN batches do not fit this worker: " + decoded.error().message +
              " (--batch must be the server's --gan-batch)");
    s.problems.trouble(WorkerExit::kError, "GAN batches refused: " + decoded.error().message);
    return false;
  }
  const auto& batches = decoded.value();
  if (batches.iteration == s.done_iteration) {  // answered already (a lost 2.04): wait for the next
    sleep_unless_stopped(std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(s.config.poll_seconds)),
                         s.stop);
    return false;
  }
  if (batches.swap_round > 0) s.swap(batches);
  s.train(batches);
  return s.send_feedback(batches);
}

GanWorkerStats GanWorker::run(const std::function<void(const GanWorkerStats&)>& progress) {
  State& s = *state_;
  const auto started = Clock::now();
  auto out_of_time = [&] {
    return s.config.worker.max_seconds > 0 &&
           std::chrono::duration<double>(Clock::now() - started).count() >=
               s.config.worker.max_seconds;
  };
  while (!s.stop &&
         (s.config.max_iterations == 0 || stats().iterations < s.config.max_iterations) &&
         !out_of_time()) {
    const bool accepted = run_once();
    if (accepted && progress) progress(stats());
  }
  return stats();
}

GanWorkerStats GanWorker::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

const GanPart& GanWorker::discriminator() const { return *state_->d; }

}  // namespace edgetrain::runtime
