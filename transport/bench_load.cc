// libcoap-backed implementation of bench_load.h (benchmark-only; see the header).
#include "transport/bench_load.h"

#include "transport/coap_internal.h"
#include "transport/socket_ingress.h"

#include <coap3/coap.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>

// ---- datagram counting through the linker's --wrap (see CMakeLists.txt) -----------------
namespace {
std::atomic<std::uint64_t> g_sent_datagrams{0}, g_sent_bytes{0}, g_received_datagrams{0},
    g_received_bytes{0};

void count_sent(ssize_t bytes) {
  if (bytes < 0) return;
  g_sent_datagrams.fetch_add(1, std::memory_order_relaxed);
  g_sent_bytes.fetch_add(static_cast<std::uint64_t>(bytes), std::memory_order_relaxed);
}
void count_received(ssize_t bytes) {
  if (bytes < 0) return;
  g_received_datagrams.fetch_add(1, std::memory_order_relaxed);
  g_received_bytes.fetch_add(static_cast<std::uint64_t>(bytes), std::memory_order_relaxed);
}
}  // namespace

extern "C" {
ssize_t __real_send(int fd, const void* data, size_t length, int flags);
ssize_t __real_recv(int fd, void* data, size_t length, int flags);

ssize_t __wrap_send(int fd, const void* data, size_t length, int flags) {
  const ssize_t sent = __real_send(fd, data, length, flags);
  count_sent(sent);
  return sent;
}
ssize_t __wrap_recv(int fd, void* data, size_t length, int flags) {
  const ssize_t received = __real_recv(fd, data, length, flags);
  count_received(received);
  return received;
}
// No recvmsg or sendmsg wrapper here: edgetrain_transport already wraps both for the
// server's socket counters (socket_ingress.cc), which also keep the process's sendmsg()
// totals; the load client's connected sockets use send() and recv().
}

namespace edgetrain::transport::bench {

DatagramCounts DatagramCounts::operator-(const DatagramCounts& earlier) const {
  return {sent_datagrams - earlier.sent_datagrams, sent_bytes - earlier.sent_bytes,
          received_datagrams - earlier.received_datagrams, received_bytes - earlier.received_bytes};
}

DatagramCounts datagram_counts() {
  const transport::detail::SendTotals sent_by_sendmsg = transport::detail::sendmsg_totals();
  return {g_sent_datagrams.load() + sent_by_sendmsg.datagrams,
          g_sent_bytes.load() + sent_by_sendmsg.bytes, g_received_datagrams.load(),
          g_received_bytes.load()};
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// coap_io_process() with up to 256 ready sockets per coap_io_do_epoll() instead of
// libcoap 4.3.1's 10: every do_epoll ends by walking all sessions (coap_io_prepare_io),
// and the load generator has one socket per device, so with 1000 devices its own walks
// took as much CPU as the server it measures, on the same two cores.
void process_io(coap_context_t* context, int timeout_ms) {
  const int fd = coap_context_get_coap_fd(context);
  if (fd < 0) {
    coap_io_process(context, static_cast<std::uint32_t>(timeout_ms));
    return;
  }
  coap_tick_t now;
  coap_ticks(&now);
  const unsigned int libcoap_timeout = coap_io_prepare_epoll(context, now);
  const int wait = libcoap_timeout == 0
                       ? timeout_ms
                       : std::min<int>(static_cast<int>(libcoap_timeout), timeout_ms);
  epoll_event ready[256];
  const int count = epoll_wait(fd, ready, 256, wait);
  coap_io_do_epoll(context, ready, count > 0 ? static_cast<std::size_t>(count) : 0);
}

class LoadRunner;
struct Device;

// One DTLS session of a device with one server (a shard, or the only server).
struct ShardSession {
  enum class State { kNotStarted, kHandshake, kEstablished, kFailed };
  LoadRunner* runner = nullptr;
  Device* device = nullptr;
  std::size_t shard = 0;
  coap_session_t* session = nullptr;
  State state = State::kNotStarted;
  bool posting = false;             // its part of the device's update is in progress
  std::vector<std::uint8_t> token;  // of the part in progress
  std::size_t body_bytes = 0;
  std::vector<std::uint8_t> body;  // a Q-Block1 part's, alive until its answer
  QBlock1Sender q_block1;
};

// A load device: one session per shard, one update at a time (a part on each session).
struct Device {
  enum class State { kConnecting, kIdle, kPosting, kFailed };
  std::size_t index = 0;
  State state = State::kConnecting;
  std::vector<std::unique_ptr<ShardSession>> sessions;  // shard order
  std::uint64_t next_sequence = 1;
  std::size_t parts_pending = 0;  // of the update in progress
  // Per shard, how its part of the update in progress ended: 0 pending, 2xx/4xx/5xx the
  // answer's code, kUnanswered.
  std::vector<int> part_outcome;
};

constexpr int kUnanswered = -1;

class LoadRunner {
 public:
  explicit LoadRunner(const UpdateLoadOptions& options) : options_(options) {
    // Handshake failures are counted in the report; libcoap's own log stays at errors.
    coap_library_startup();
    std::vector<std::uint16_t> ports = options.shard_ports;
    if (ports.empty()) ports.push_back(options.port);
    for (const std::uint16_t port : ports)
      server_addresses_.push_back(resolve_udp_address(options.host, port));
    report_.shards.resize(ports.size());
    context_ = coap_new_context(nullptr);
    if (!context_) throw TransportError("coap_new_context failed");
    coap_context_set_block_mode(context_, COAP_BLOCK_USE_LIBCOAP | COAP_BLOCK_SINGLE_BODY);
    coap_register_response_handler(context_, &LoadRunner::on_response);
    coap_register_nack_handler(context_, &LoadRunner::on_nack);
    coap_register_event_handler(context_, &LoadRunner::on_event);
    // Without these libcoap drops the 2.31 and 4.08 answers, which carry Q-Block1.
    coap_register_option(context_, kOptionQBlock1);
    coap_register_option(context_, kOptionQBlock2);
    for (std::size_t i = 0; i < options.devices.size(); ++i) {
      auto device = std::make_unique<Device>();
      device->index = i;
      device->part_outcome.assign(ports.size(), 0);
      for (std::size_t shard = 0; shard < ports.size(); ++shard) {
        auto session = std::make_unique<ShardSession>();
        session->runner = this;
        session->device = device.get();
        session->shard = shard;
        sessions_.push_back(session.get());
        device->sessions.push_back(std::move(session));
      }
      devices_.push_back(std::move(device));
    }
  }
  ~LoadRunner() {
    for (ShardSession* s : sessions_) {
      if (s->session) {
        coap_session_set_app_data(s->session, nullptr);
        coap_session_release(s->session);
      }
    }
    if (context_) coap_free_context(context_);
  }

  UpdateLoadReport run() {
    establish_sessions();
    post_updates();
    return report_;
  }

 private:
  static ShardSession* of(coap_session_t* session) {
    return static_cast<ShardSession*>(coap_session_get_app_data(session));
  }

  void establish_sessions() {
    const DatagramCounts before = datagram_counts();
    const auto started = Clock::now();
    const auto deadline =
        started + std::chrono::duration<double>(options_.handshake_budget_seconds);
    std::size_t next = 0;
    while (report_.sessions_established + report_.sessions_failed < sessions_.size()) {
      while (next < sessions_.size() && handshakes_in_flight_ < options_.max_handshakes_in_flight) {
        start_handshake(*sessions_[next++]);
      }
      if (Clock::now() >= deadline) break;
      process_io(context_, 10);
      // libcoap 4.3.1 raises COAP_EVENT_DTLS_CONNECTED on a client only when a datagram
      // arrives after the handshake, so the end of a handshake is seen in the session state.
      for (std::size_t i = first_handshaking_; i < next; ++i) {
        ShardSession& s = *sessions_[i];
        if (s.state == ShardSession::State::kHandshake &&
            coap_session_get_state(s.session) == COAP_SESSION_STATE_ESTABLISHED)
          mark_established(s);
      }
      while (first_handshaking_ < next &&
             sessions_[first_handshaking_]->state != ShardSession::State::kHandshake)
        ++first_handshaking_;
    }
    // Whatever is still half-open after the budget counts as failed.
    for (ShardSession* s : sessions_) {
      if (s->state == ShardSession::State::kHandshake ||
          s->state == ShardSession::State::kNotStarted) {
        s->state = ShardSession::State::kFailed;
        ++report_.sessions_failed;
      }
    }
    handshakes_in_flight_ = 0;
    // A device posts only when it holds a session with every shard.
    for (auto& device : devices_) {
      device->state = all_established(*device) ? Device::State::kIdle : Device::State::kFailed;
      if (device->state == Device::State::kIdle) ++report_.devices_posting;
    }
    report_.handshake_seconds = seconds_between(started, Clock::now());
    report_.handshake_traffic = datagram_counts() - before;
  }

  static bool all_established(const Device& device) {
    for (const auto& s : device.sessions)
      if (s->state != ShardSession::State::kEstablished) return false;
    return true;
  }

  void start_handshake(ShardSession& s) {
    const PskCredentials& psk_credentials = options_.devices[s.device->index];
    coap_dtls_cpsk_t psk{};
    psk.version = COAP_DTLS_CPSK_SETUP_VERSION;
    psk.psk_info.identity.s = reinterpret_cast<const uint8_t*>(psk_credentials.identity.data());
    psk.psk_info.identity.length = psk_credentials.identity.size();
    psk.psk_info.key.s = psk_credentials.key.data();
    psk.psk_info.key.length = psk_credentials.key.size();
    // The ClientHello goes out here; COAP_EVENT_DTLS_CONNECTED reports the end.
    s.state = ShardSession::State::kHandshake;
    ++handshakes_in_flight_;
    s.session = coap_new_client_session_psk2(context_, nullptr, &server_addresses_[s.shard],
                                             COAP_PROTO_DTLS, &psk);
    if (!s.session) {
      fail(s);
      return;
    }
    coap_session_set_app_data(s.session, &s);
  }

  void post_updates() {
    for (auto& device : devices_)
      if (device->state == Device::State::kIdle) idle_.push_back(device.get());
    if (options_.on_posts_starting) options_.on_posts_starting();
    const DatagramCounts before = datagram_counts();
    const auto started = Clock::now();
    const auto stop_posting = started + std::chrono::duration<double>(options_.max_post_seconds);
    // Posts in progress at the stop get a bounded grace period for their answers (a CoAP
    // exchange gives up after ~45 s of retransmissions; we do not wait that long).
    const auto give_up = stop_posting + std::chrono::seconds(10);
    auto last_answer = started;
    std::uint64_t posts_started = 0;
    while (true) {
      const auto now = Clock::now();
      const bool may_post = now < stop_posting && posts_started < options_.max_posts;
      while (may_post && posts_in_flight_ < options_.max_posts_in_flight && !idle_.empty() &&
             posts_started < options_.max_posts) {
        Device* device = idle_.front();
        idle_.pop_front();
        if (device->state != Device::State::kIdle) continue;  // failed while idle
        start_update(*device);
        ++posts_started;
      }
      if (posts_in_flight_ == 0 && (!may_post || idle_.empty())) break;
      if (now >= give_up) break;
      const std::uint64_t answered_before = answers_;
      process_io(context_, 5);
      if (answers_ != answered_before) last_answer = Clock::now();
      if (options_.q_block) step_q_block1_posts();
    }
    // Updates still in progress at the give-up: unanswered, each part that was.
    for (ShardSession* s : sessions_)
      if (s->posting) finish_part(*s, kUnanswered);
    report_.post_seconds = seconds_between(started, last_answer);
    report_.post_traffic = datagram_counts() - before;
    if (options_.on_posts_finished) options_.on_posts_finished();
  }

  // The bursts after a 2.31, the blocks a 4.08 listed, and probes, for every Q-Block1 part
  // in progress (a walk of the sessions: ~1 µs per 1000, against a pass of libcoap's I/O).
  void step_q_block1_posts() {
    const auto now = Clock::now();
    for (ShardSession* s : sessions_) {
      if (!s->posting || !s->q_block1.active()) continue;
      if (!s->q_block1.step(now)) fail(*s);
    }
  }

  coap_pdu_t* new_post_pdu(const ShardSession& s, coap_pdu_type_t type) const {
    coap_pdu_t* pdu = coap_new_pdu(type, COAP_REQUEST_CODE_POST, s.session);
    if (!pdu) return nullptr;
    coap_add_token(pdu, s.token.size(), s.token.data());
    coap_add_option(pdu, COAP_OPTION_URI_PATH, options_.path.size(),
                    reinterpret_cast<const uint8_t*>(options_.path.data()));
    return pdu;
  }

  // Every shard's part, one after the other; a part that cannot be sent counts as unanswered.
  void start_update(Device& device) {
    device.state = Device::State::kPosting;
    device.parts_pending = device.sessions.size();
    std::fill(device.part_outcome.begin(), device.part_outcome.end(), 0);
    ++posts_in_flight_;
    const std::uint64_t sequence = device.next_sequence++;
    for (auto& s : device.sessions) {
      std::vector<std::uint8_t> body = options_.make_body(device.index, s->shard, sequence);
      report_.posted_body_bytes += body.size();
      s->posting = true;
      if (!start_part(*s, std::move(body))) fail(*s);
    }
  }

  bool start_part(ShardSession& s, std::vector<std::uint8_t> body) {
    s.q_block1.reset();
    s.body_bytes = body.size();
    std::uint8_t token[8];
    std::size_t token_length = 0;
    coap_session_new_token(s.session, &token_length, token);
    s.token.assign(token, token + token_length);
    if (options_.q_block && body.size() > 1024) {
      s.body = std::move(body);
      return s.q_block1.start(s.session, s.body, s.token, options_.max_payloads,
                              options_.ack_timeout_seconds,
                              [this, &s](coap_pdu_type_t type) { return new_post_pdu(s, type); });
    }
    coap_pdu_t* pdu = new_post_pdu(s, COAP_MESSAGE_CON);
    if (!pdu) return false;
    auto* owned = new std::vector<std::uint8_t>(std::move(body));
    // libcoap owns `owned` from here on (release_payload), whether or not the call succeeds.
    if (!coap_add_data_large_request(s.session, pdu, owned->size(), owned->data(),
                                     release_payload, owned)) {
      coap_delete_pdu(pdu);
      return false;
    }
    return coap_send(s.session, pdu) != COAP_INVALID_MID;
  }

  void mark_established(ShardSession& s) {
    s.state = ShardSession::State::kEstablished;
    --handshakes_in_flight_;
    ++report_.sessions_established;
  }

  // A part ended with `outcome` (a CoAP code number, or kUnanswered); the update ends with
  // its last part.
  void finish_part(ShardSession& s, int outcome) {
    if (!s.posting) return;
    s.posting = false;
    s.q_block1.reset();
    Device& device = *s.device;
    device.part_outcome[s.shard] = outcome;
    ShardPostCounts& counts = report_.shards[s.shard];
    if (outcome == kUnanswered)
      ++counts.unanswered;
    else if (outcome / 100 == 2)
      ++counts.acknowledged;
    else
      ++counts.refused_by_code[outcome];
    if (--device.parts_pending == 0) finish_update(device);
  }

  void finish_update(Device& device) {
    int refusal = 0;
    bool unanswered = false;
    for (const int outcome : device.part_outcome) {
      if (outcome == kUnanswered) unanswered = true;
      else if (outcome / 100 != 2 && refusal == 0) refusal = outcome;
    }
    if (refusal != 0)
      ++report_.posts_refused_by_code[refusal];
    else if (unanswered)
      ++report_.posts_unanswered;
    else
      ++report_.posts_acknowledged;
    --posts_in_flight_;
    ++answers_;
    if (all_established(device)) {
      device.state = Device::State::kIdle;
      idle_.push_back(&device);
    } else {
      device.state = Device::State::kFailed;
    }
  }

  void fail(ShardSession& s) {
    switch (s.state) {
      case ShardSession::State::kNotStarted:
      case ShardSession::State::kHandshake:
        --handshakes_in_flight_;
        ++report_.sessions_failed;
        break;
      case ShardSession::State::kEstablished:
      case ShardSession::State::kFailed:
        break;
    }
    s.state = ShardSession::State::kFailed;
    finish_part(s, kUnanswered);
    if (s.device->state == Device::State::kIdle) s.device->state = Device::State::kFailed;
  }

  static coap_response_t on_response(coap_session_t* session, const coap_pdu_t*,
                                     const coap_pdu_t* received, const coap_mid_t) {
    ShardSession* s = of(session);
    if (!s || !s->posting) return COAP_RESPONSE_OK;
    const coap_bin_const_t token = coap_pdu_get_token(received);
    if (token.length != s->token.size() ||
        (token.length && std::memcmp(token.s, s->token.data(), token.length) != 0))
      return COAP_RESPONSE_OK;  // not the part in progress
    LoadRunner& self = *s->runner;
    if (s->q_block1.active()) {
      switch (s->q_block1.take_answer(received)) {
        case QBlock1Sender::Answer::kContinue:
        case QBlock1Sender::Answer::kMissing:
          return COAP_RESPONSE_OK;  // step_q_block1_posts() sends what is due
        case QBlock1Sender::Answer::kRefused:
          ++self.report_.q_block1_refused;  // counted with the 4.02s below
          break;
        case QBlock1Sender::Answer::kFinal:
          break;
      }
    }
    const coap_pdu_code_t code = coap_pdu_get_code(received);
    const int code_number = (code >> 5) * 100 + (code & 0x1f);
    if (code_number / 100 == 2) {
      self.report_.acknowledged_body_bytes += s->body_bytes;
      if (self.options_.on_success) {
        size_t length = 0, offset = 0, total = 0;
        const uint8_t* data = nullptr;
        if (coap_get_data_large(received, &length, &data, &offset, &total) && data)
          self.options_.on_success(s->shard, std::span<const std::uint8_t>(data, length));
        else
          self.options_.on_success(s->shard, {});
      }
    }
    self.finish_part(*s, code_number);
    return COAP_RESPONSE_OK;
  }

  static void on_nack(coap_session_t* session, const coap_pdu_t*, const coap_nack_reason_t,
                      const coap_mid_t) {
    ShardSession* s = of(session);
    if (!s || !s->posting) return;
    // The session may still be usable (a lost exchange); a broken one reports an event too.
    if (coap_session_get_state(session) != COAP_SESSION_STATE_ESTABLISHED)
      s->state = ShardSession::State::kFailed;
    s->runner->finish_part(*s, kUnanswered);
  }

  static int on_event(coap_session_t* session, const coap_event_t event) {
    ShardSession* s = of(session);
    if (!s) return 0;
    LoadRunner& self = *s->runner;
    if (event == COAP_EVENT_DTLS_CONNECTED && s->state == ShardSession::State::kHandshake) {
      self.mark_established(*s);
    } else if (event == COAP_EVENT_DTLS_ERROR || event == COAP_EVENT_DTLS_CLOSED ||
               event == COAP_EVENT_SESSION_FAILED) {
      self.fail(*s);
    }
    return 0;
  }

  const UpdateLoadOptions& options_;
  std::vector<coap_address_t> server_addresses_;  // per shard
  coap_context_t* context_ = nullptr;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<ShardSession*> sessions_;  // every device's, device by device
  std::deque<Device*> idle_;
  std::size_t handshakes_in_flight_ = 0;
  std::size_t first_handshaking_ = 0;  // sessions before it are past their handshake
  std::size_t posts_in_flight_ = 0;    // updates
  std::uint64_t answers_ = 0;          // updates finished one way or another
  UpdateLoadReport report_;
};

}  // namespace

UpdateLoadReport run_update_load(const UpdateLoadOptions& options) {
  if (!options.make_body) throw TransportError("run_update_load needs make_body");
  if (options.devices.empty()) throw TransportError("run_update_load needs at least one device");
  for (const std::uint16_t port : options.shard_ports)
    if (port == 0) throw TransportError("run_update_load: a shard port of 0");
  LoadRunner runner(options);
  return runner.run();
}

}  // namespace edgetrain::transport::bench
