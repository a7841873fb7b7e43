// The server's CoAP resources on top of ServerState (DESIGN.md, "Protocol"):
//
//   GET  /model   2.05, the dense model (codec), ETag = version
//   GET  /model?since=V
//                 2.05, a model delta (codec: the parameters whose value may have changed
//                 after version V, with their current values, and the current version),
//                 ETag = version; the dense model instead when V is ahead of the server,
//                 older than its change record (the history before its last restart), or
//                 the delta would not be smaller. V is decimal (0 ≤ V < 2^64); any other
//                 query, a second since= or an unknown parameter gets 4.00 with a reason.
//   POST /update  2.04 + the version the update produced (8 bytes, little-endian) once the
//                 update is durable; 4.00 malformed, 4.13 too large, 4.09 wrong model / too
//                 stale / old sequence (re-pull), 4.22 out of bounds (would leave a parameter
//                 non-finite or beyond the bound), 4.01 no DTLS identity (plain CoAP: no
//                 declared ?id=NAME), 4.03 identity no longer authorized or quarantined,
//                 5.00 the WAL write failed, 4.05 under --mode rounds (deltas go to
//                 /round/update, server/round_coordinator.h). Errors carry one line of text
//                 saying why.
//   GET  /status  2.05, JSON a person can read, with a section per device; observable (RFC
//                 7641): notifications at most every observe_interval_seconds while
//                 something changed (ServerResources::serve_once)
//   GET  /status?device=NAME
//                 2.05, one device's health (JSON); 4.04 for a name not tracked, 4.00 for a
//                 malformed query. Reading /status never changes the training state; it
//                 only makes the reader a monitor in the per-device table.
//
// Handlers are plain functions of a CoapRequest, so tests can call them without a network
// (then POST /update syncs the WAL for each update). Over the network (a request that can be
// deferred) POST /update is group-committed: the update is staged, and its 2.04 (or 5.00)
// leaves from answer_durable_updates() once the fdatasync covering it has finished; a
// duplicate of a staged update waits for the same sync.
// Several event loops (edgetrain-server --loop-threads): attach() one CoapDtlsServer per
// loop, each driven by its own thread calling serve_once() (libcoap is not thread-safe: a
// server, its sessions and its deferred answers belong to that thread). The handlers of all
// loops share this object and its ServerState under one mutex, so versions, σ and the WAL
// keep one total order; a deferred answer is queued for the loop that owns its session and
// sent by that loop's thread. report_accuracy() may be called from any thread; the getters
// that read counters, status_json(), metrics_text(), devices_json() and monitors_json()
// need hold() while loops run on other threads (the atomic ones say "any thread").
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "server/device_health.h"
#include "server/server_state.h"
#include "transport/coap_dtls.h"
#include "transport/codec.h"

namespace edgetrain::server {

// Identities of plain CoAP requests (edgetrain-server --insecure) are the name the peer
// declared (?id=NAME) behind this prefix: unproven, and apart from every DTLS identity.
inline constexpr const char* kUnauthenticatedPrefix = "unauthenticated:";

// The identity every mode keys a device's messages on (sequence numbers, the WAL, rounds,
// GAN feedback, /status): the DTLS identity, or a plain CoAP peer's declared name behind
// kUnauthenticatedPrefix; empty when the request has none that transport/identity.h allows.
std::string identity_key(const transport::CoapRequest& request);

struct ResourceOptions {
  // Whether a PSK identity that passed the handshake may still post (e.g. it is still in
  // the keystore); unset: every proven identity may. Not asked for certificate identities
  // (the CA vouches for them) nor for plain CoAP ones.
  std::function<bool(std::string_view identity)> is_authorized;
  // One line per notable event (refusals, duplicates, every `log_every_applied`th update).
  std::function<void(const std::string& line)> log;
  std::uint64_t log_every_applied = 100;
  // Non-empty: POST /update is refused with 4.05 and this reason (--mode rounds).
  std::string updates_refused_because;
  // Extra keys merged into /status (--mode rounds: the round counters as a JSON object).
  std::function<std::string()> extra_status;
  // Fixed facts shown by /status (model name, data set, ...).
  std::map<std::string, std::string> facts;
  // Watching a fleet (server/README.md): per-device health, Observe on /status, log levels
  // and repeated lines collapsed. log_at, when set, takes every line with its level (else
  // `log` gets them all); refusals and duplicates of one kind per device go through the
  // repeat limiter.
  DeviceHealthOptions health;
  double observe_interval_seconds = 5;
  std::function<void(logging::Level, const std::string& line)> log_at;
  logging::RepeatLimiter::Options repeats;
};

// The query of GET /model: no since (empty query), since = V, and whether the device takes
// the cheap pull's values as fp16 increments (values=fp16-increment), or why the query is
// refused.
struct ModelQuery {
  std::optional<std::uint64_t> since;
  bool fp16_increments = false;
};
std::variant<ModelQuery, std::string> parse_model_query(std::string_view query);

// Per identity that had an update refused: {"refused": {reason: count}, "consecutive_bad",
// "reported", "quarantined", "quarantines"}, identities escaped (/status and the stats file),
// as one JSON object.
std::string device_refusals_json(const ServerState& state);

// The POST /update success payload (the version, 8 bytes little-endian) is a wire
// contract of transport/codec.h; named here too for the server's callers.
using transport::decode_update_reply;

class ServerResources {
 public:
  ServerResources(ServerState& state, ResourceOptions options = {});

  transport::CoapResponse get_model(const transport::CoapRequest& request);
  transport::CoapResponse post_update(const transport::CoapRequest& request);
  transport::CoapResponse get_status(const transport::CoapRequest& request);
  // Registers the three resources on `server`, as event loop number N (0, 1, ... in the
  // order of the calls); returns N. Attach every loop's server before any loop runs.
  std::size_t attach(transport::CoapDtlsServer& server);
  // Sends the answers of staged updates whose WAL sync has finished (wait = true: waits for
  // the running sync, and for the next ones until nothing is staged), those of every loop,
  // from the calling thread: call it when no loop thread runs (or, with one loop, on its
  // thread), with wait = true before stopping. serve_once() does the same for its own loop.
  // Returns how many updates it answered.
  std::size_t answer_durable_updates(bool wait);
  // Updates staged and not yet answered.
  std::size_t updates_awaiting_sync() const {
    std::lock_guard lock(mutex_);
    return state_.staged_updates();
  }
  // One pass of the event loop every user of attach() runs, on the thread that drives
  // `server` (an attached one): network events for at most `idle_timeout_ms`, then the
  // finished answers of this loop's sessions. A finished WAL sync, or answers another loop
  // queued for this one, end the wait early (the loop's eventfd; a server without the
  // batched loop cannot watch it and waits 1 ms at a time while there are such). Before
  // stopping, call answer_durable_updates(true).
  void serve_once(transport::CoapDtlsServer& server, int idle_timeout_ms);
  // Ends every loop's current wait (serve_once returns after its pass): for a stop.
  void wake_loops() { wakers_->wake_all(); }
  // Holds the handlers' mutex: for reading the counters (status_json(), metrics_text(),
  // devices_json(), ...) from a thread other than the loops while loops run.
  std::unique_lock<std::mutex> hold() const { return std::unique_lock(mutex_); }
  // Per event loop, [{"requests": N, "updates_deferred": M, "lock_wait_seconds": W,
  // "lock_held_seconds": H}, ...]: how the sessions spread over the loops, and how long
  // each loop's thread waited for and held the handlers' mutex (/status and the stats file
  // key "loops").
  std::string loops_json() const;
  // Writes the counted summaries of collapsed log lines now, whether or not their interval
  // has ended (before the server stops).
  void flush_collapsed_lines();

  // From the evaluator thread: test accuracy of the parameters at `version`.
  void report_accuracy(std::uint64_t version, double accuracy);
  // Request payload bytes received by all resources (CoAP payloads after block-wise
  // reassembly; DTLS, CoAP headers and retransmissions are not visible here). Any thread.
  std::uint64_t ingress_payload_bytes() const {
    return ingress_payload_bytes_.load(std::memory_order_relaxed);
  }
  // "ingress 1830 payload bytes, 5120 socket bytes in 14 datagrams": the payload count next
  // to what reached the attached server's UDP socket (DESIGN.md's figure of merit). Any
  // thread.
  std::string ingress_summary() const;
  // Updates applied since this process started (not counting duplicates); any thread.
  std::uint64_t updates_applied() const { return applied_.load(std::memory_order_relaxed); }
  // Bytes that reached the attached servers' UDP sockets, summed over the loops (0 before
  // attach()); any thread.
  std::uint64_t ingress_socket_bytes() const {
    return sum_over_servers(&transport::CoapDtlsServer::bytes_received);
  }
  std::uint64_t ingress_socket_datagrams() const {
    return sum_over_servers(&transport::CoapDtlsServer::datagrams_received);
  }
  std::uint64_t egress_socket_bytes() const {
    return sum_over_servers(&transport::CoapDtlsServer::bytes_sent);
  }
  std::uint64_t egress_socket_datagrams() const {
    return sum_over_servers(&transport::CoapDtlsServer::datagrams_sent);
  }
  // GET /model requests answered, those answered with a model delta, and the handlers'
  // thread CPU time spent answering them (need hold() while loops run).
  std::uint64_t model_pulls() const { return model_pulls_; }
  std::uint64_t model_delta_pulls() const { return model_delta_pulls_; }
  double model_pull_cpu_seconds() const { return model_pull_cpu_seconds_; }
  std::string status_json() const;
  // The Prometheus / OpenMetrics text exposition of the counters and per-device health
  // (server/README.md, "Watching a fleet"). The CoAP thread renders it; the metrics
  // endpoint serves a copy.
  std::string metrics_text() const;
  const DeviceHealth& device_health() const { return health_; }
  // Per-device keys of /status and the stats file: {NAME: {...}} for workers, and the
  // names of monitors (identities that only read /status), as JSON text.
  std::string devices_json() const;
  std::string monitors_json() const;
  // What /status observers are notified of: a number that changes when updates are
  // applied, refused or answered as duplicates, the model is pulled, or an evaluation
  // arrives (not when /status is read).
  std::uint64_t activity() const;
  // Counts a request's payload into the ingress and the device's health. `worker`: a
  // training request (model pull, update, a round's poll or delta), not a monitoring one.
  // The resources here call it; so does the round coordinator's (--mode rounds).
  void note_request(const transport::CoapRequest& request, bool worker);

 private:
  // A deferred answer of a settled update, queued for the loop that owns its session.
  struct ReadyAnswer {
    transport::DeferredResponse answer;
    transport::CoapResponse response;
  };
  // What one event loop owns; loops_[n] is written under mutex_, apart from `server`
  // (fixed by attach()).
  struct Loop {
    const transport::CoapDtlsServer* server = nullptr;
    bool wakeable =
        false;  // its server watches its wake descriptor (else it polls while updates wait)
    std::vector<ReadyAnswer> ready;  // sent by this loop's thread only
    std::uint64_t requests = 0, updates_deferred = 0;
    // Time this loop's thread waited for mutex_ and held it: what of its work is serial.
    std::chrono::steady_clock::duration lock_wait{}, lock_held{};
    std::chrono::steady_clock::time_point next_tick{}, next_notify{};
    std::uint64_t notified_activity = 0;
  };
  std::uint64_t sum_over_servers(std::uint64_t (transport::CoapDtlsServer::*counter)()
                                     const) const {
    std::uint64_t sum = 0;
    for (const Loop& loop : loops_) sum += (loop.server->*counter)();
    return sum;
  }
  // mutex_ held by loop `loop`'s thread, timed into its lock_wait and lock_held.
  class LoopLock {
   public:
    LoopLock(std::mutex& mutex, Loop& loop);
    ~LoopLock();
    LoopLock(const LoopLock&) = delete;
    LoopLock& operator=(const LoopLock&) = delete;

   private:
    Loop& loop_;
    std::unique_lock<std::mutex> lock_;
    std::chrono::steady_clock::time_point acquired_;
  };
  // The handlers behind the public ones, with mutex_ held; `loop`: the one the request came
  // in on.
  transport::CoapResponse get_model_locked(const transport::CoapRequest& request);
  // `decoded`: the body already decoded (ServerState::decode_body, outside the mutex).
  transport::CoapResponse post_update_locked(
      const transport::CoapRequest& request, std::size_t loop,
      std::optional<ServerState::DecodedBody> decoded = std::nullopt);
  transport::CoapResponse get_status_locked(const transport::CoapRequest& request);
  // With mutex_ held: the results of finished syncs, each answer queued on its loop's
  // `ready` (wait: as answer_durable_updates). Returns how many.
  std::size_t settle(bool wait);
  // Sends `loop`'s queued answers; on the thread that owns the loop.
  static std::size_t send_ready(std::vector<ReadyAnswer> ready);
  std::size_t loop_of(const transport::CoapDtlsServer& server) const;
  void log_at(logging::Level level, const std::string& line) const;
  // A line that may repeat many times (refusals, duplicates): through the repeat limiter.
  void log_repeating(logging::Level level, std::string_view kind, const std::string& line);
  // /status?device=NAME.
  transport::CoapResponse get_device_status(std::string_view query);
  std::string device_json(const std::string& identity, const DeviceRecord& record) const;
  // serve_once's periodic work, with mutex_ held: summaries of collapsed lines (loop 0),
  // Observe notifications of the loop's own /status observers.
  void tick(transport::CoapDtlsServer& server, Loop& loop);
  // The answer to a settled update, with its counters and log lines; `original`: not a
  // duplicate answered along with it.
  transport::CoapResponse update_response(const SubmitResult& result, const std::string& identity,
                                          bool original);
  void log(const std::string& line) const;

  ServerState& state_;
  ResourceOptions options_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  // The handlers of all loops, settle(), tick() and every counter below that is not atomic;
  // also every call into state_ (its own sync thread and snapshot() apart).
  mutable std::mutex mutex_;
  std::vector<Loop> loops_;  // one per attach(); the size is fixed once loops run
  // One eventfd per loop, watched by its server (CoapDtlsServer::watch_wake_fd): written when
  // a WAL sync finishes (on the sync thread) and when another loop queues answers for it, so
  // a loop waits for those instead of polling every millisecond. Shared with the sync hook,
  // which ServerState keeps: the descriptors stay open as long as either may write them.
  struct LoopWakers {
    std::mutex mutex;
    std::vector<int> fds;
    ~LoopWakers();
    void wake(std::size_t loop);
    void wake_all();
  };
  std::shared_ptr<LoopWakers> wakers_ = std::make_shared<LoopWakers>();
  // Wakes every loop but `except` that has answers queued (settle() hands them out).
  void wake_loops_with_answers(std::size_t except);
  // Atomic: the evaluator thread reads them for its progress line.
  std::atomic<std::uint64_t> ingress_payload_bytes_ = 0, applied_ = 0;
  std::uint64_t requests_ = 0, model_pulls_ = 0, duplicates_ = 0;
  std::uint64_t model_delta_pulls_ = 0, bad_model_queries_ = 0;
  double model_pull_cpu_seconds_ = 0;  // the handlers' thread CPU time answering GET /model
  std::map<std::string, std::uint64_t> refused_;  // by reason
  DeviceHealth health_;
  logging::RepeatLimiter repeats_;
  std::atomic<std::uint64_t> evaluations_ = 0;
  // Staged updates by ticket: who asked (the original first, then duplicates), where the
  // answer goes and the loop that owns that session.
  struct Waiting {
    std::string identity;
    transport::DeferredResponse answer;
    std::size_t loop = 0;
  };
  std::map<std::uint64_t, std::vector<Waiting>> awaiting_sync_;
  mutable std::mutex accuracy_mutex_;
  std::optional<std::pair<std::uint64_t, double>> last_accuracy_;  // version, accuracy
};

}  // namespace edgetrain::server
