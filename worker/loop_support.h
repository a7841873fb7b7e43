// What the worker loops (worker.cc, round_worker.cc, gossip_peer.cc, gan_worker.cc) share
// privately: the sleep a stop flag cuts short, the model's layout as the compressor and the
// codec want it, a peer's diagnostic as a log line shows it, and how the rounds and MD-GAN
// loops back off and give up. Not part of the library's interface.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <functional>
#include <optional>

#include "common/logging.h"
#include "worker/backoff.h"
#include "worker/compressor.h"
#include "model/model.h"
#include "worker/worker.h"
#include "worker/worker_exit_codes.h"
#include "transport/coap_dtls.h"
#include "transport/untrusted_text.h"

namespace edgetrain::runtime::loop {

using Clock = std::chrono::steady_clock;

// Sleeps up to `duration`, returning within 20 ms once `stop` is set.
inline void sleep_unless_stopped(Clock::duration duration, const std::atomic<bool>& stop) {
  const auto until = Clock::now() + duration;
  while (!stop && Clock::now() < until)
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(20), until - Clock::now()));
}

// A peer's diagnostic, as a log line shows it: network text, so escaped
// (transport::escape_untrusted) and cut at 200 bytes.
inline std::string payload_text(const std::vector<std::uint8_t>& payload) {
  return transport::escape_untrusted(
      std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()), 200);
}

// The first step seed of a worker's dropout layers (Trainer::set_step_seed): each worker its
// own mask sequence, reproducible from the run's seed; with the trainer's default every worker
// of a fleet would drop the same units at the same step.
inline std::uint64_t dropout_step_seed(std::uint64_t seed, std::uint32_t worker) {
  return seed ^ (0xd1b54a32d192ed03ULL * (std::uint64_t{worker} + 1));
}

inline std::vector<TensorSlice> layout_of(const Model& model) {
  std::vector<TensorSlice> layout;
  for (const auto& t : model.tensors())
    layout.push_back({t.offset, static_cast<std::uint32_t>(t.size)});
  return layout;
}

// How the rounds and MD-GAN loops meet trouble with the server, as Worker does: a failed or
// unexpected answer is counted, logged and backed off (exponential, with jitter); refusals no
// retry fixes (a refused handshake, an unknown identity, ...) are given up after
// config.max_refusals in a row, and a server silent for config.give_up_after_seconds is
// given up (WorkerFailure with the exit status that says why).
class Trouble {
 public:
  using Say = std::function<void(const std::string&, logging::Level)>;
  // `on_retry` counts each retry in the loop's stats. `config` and `stop` must outlive this
  // (pass the loop's own copy of its configuration, not a constructor argument).
  Trouble(const WorkerConfig& config, const std::atomic<bool>& stop, Say say,
          std::function<void()> on_retry)
      : config_(config),
        stop_(stop),
        say_(std::move(say)),
        on_retry_(std::move(on_retry)),
        backoff_(config.backoff_initial, config.backoff_max, config.seed + config.worker_id) {}

  void trouble(WorkerExit exit, const std::string& what) {
    last_ = exit;
    last_message_ = what;
    on_retry_();
    const auto delay = backoff_.next_delay();
    say_(what + "; retrying in " + std::to_string(delay.count()) + " ms", logging::Level::kWarn);
    sleep_unless_stopped(delay, stop_);
  }
  // Tried max_refusals times in a row (with backoff between: a server being set up may
  // change its mind), then given up.
  void refused(WorkerExit exit, const std::string& what) {
    last_ = exit;
    last_message_ = what;
    if (++refusals_in_a_row_ >= config_.max_refusals)
      throw WorkerFailure(exit, what + " (" + std::to_string(refusals_in_a_row_) + " time" +
                                    (refusals_in_a_row_ > 1 ? "s" : "") +
                                    " in a row; giving up)");
    trouble(exit, what);
  }
  void request_failed(const std::string& what, const transport::TransportError& e) {
    const std::string text = what + ": " + e.what();
    switch (e.failure()) {
      case transport::TransportFailure::kInterrupted:
        return;
      case transport::TransportFailure::kHandshakeRefused:
        refused(WorkerExit::kHandshakeRefused, text);
        return;
      case transport::TransportFailure::kUnknownIdentity:
        refused(WorkerExit::kUnknownIdentity, text);
        return;
      default:
        break;
    }
    // The server is away (no answer, nothing listening, a session lost): retried with
    // backoff until it has not answered for give_up_after_seconds.
    give_up_if_silent(text);
    trouble(last_, text);
  }
  // A failed request while the worker can train offline (WorkerConfig::offline_steps):
  // when the server is away (no answer, nothing listening, a session lost), counted and
  // logged as request_failed() does, and given up after give_up_after_seconds alike, but
  // the backoff delay is returned instead of slept, so that the worker trains through it.
  // Any other failure (refused, interrupted) is request_failed()'s, and nullopt.
  std::optional<Clock::duration> server_away(const std::string& what,
                                             const transport::TransportError& e) {
    switch (e.failure()) {
      case transport::TransportFailure::kInterrupted:
      case transport::TransportFailure::kHandshakeRefused:
      case transport::TransportFailure::kUnknownIdentity:
        request_failed(what, e);
        return std::nullopt;
      default:
        break;
    }
    const std::string text = what + ": " + e.what();
    give_up_if_silent(text);
    on_retry_();
    const auto delay = backoff_.next_delay();
    // With probes (--offline-try-timeout) the share rule may set the next try instead:
    // the worker then logs that delay at debug level.
    say_(text + "; training offline, backoff " + std::to_string(delay.count()) + " ms",
         logging::Level::kWarn);
    return delay;
  }
  // The server answered (whatever it said).
  void answered() {
    last_answer_ = Clock::now();
    ever_answered_ = true;
  }
  // What was asked for was done: the backoff and the refusals in a row start again.
  void succeeded() {
    backoff_.reset();
    refusals_in_a_row_ = 0;
  }
  // A refusal that is part of the protocol (a round or iteration closed): not one in a row.
  void expected_refusal() { refusals_in_a_row_ = 0; }
  // Notes `text` as the last trouble (the server away), and throws WorkerFailure once the
  // server has not answered for give_up_after_seconds.
  void give_up_if_silent(const std::string& text) {
    const WorkerExit exit =
        ever_answered_ ? WorkerExit::kServerGone : WorkerExit::kServerUnreachable;
    last_ = exit;
    last_message_ = text;
    const double silent = std::chrono::duration<double>(Clock::now() - last_answer_).count();
    if (config_.give_up_after_seconds > 0 && silent >= config_.give_up_after_seconds)
      throw WorkerFailure(
          exit,
          text + " (" +
              (ever_answered_ ? "no answer from the server for " : "no answer since the start, ") +
              std::to_string(static_cast<long long>(silent)) + " s; giving up: --give-up-after " +
              std::to_string(static_cast<long long>(config_.give_up_after_seconds)) + ")");
  }
  WorkerExit last() const { return last_; }
  const std::string& last_message() const { return last_message_; }

 private:
  const WorkerConfig& config_;
  const std::atomic<bool>& stop_;
  Say say_;
  std::function<void()> on_retry_;
  Backoff backoff_;
  Clock::time_point last_answer_ = Clock::now();
  bool ever_answered_ = false;
  int refusals_in_a_row_ = 0;
  WorkerExit last_ = WorkerExit::kStopped;
  std::string last_message_;
};

}  // namespace edgetrain::runtime::loop
