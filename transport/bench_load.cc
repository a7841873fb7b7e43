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

struct DeviceSession {
  enum class State { kNotStarted, kHandshake, kIdle, kPosting, kFailed };
  LoadRunner* runner = nullptr;
  std::size_t device = 0;
  coap_session_t* session = nullptr;
  State state = State::kNotStarted;
  std::uint64_t next_sequence = 1;
  std::vector<std::uint8_t> token;  // of the post in progress
  std::size_t body_bytes = 0;
  std::vector<std::uint8_t> body;  // a Q-Block1 post's, alive until its answer
  QBlock1Sender q_block1;
};

class LoadRunner {
 public:
  explicit LoadRunner(const UpdateLoadOptions& options) : options_(options) {
    // Handshake failures are counted in the report; libcoap's own log stays at errors.
    coap_library_startup();
    server_address_ = resolve_udp_address(options.host, options.port);
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
      auto device = std::make_unique<DeviceSession>();
      device->runner = this;
      device->device = i;
      devices_.push_back(std::move(device));
    }
  }
  ~LoadRunner() {
    for (auto& device : devices_) {
      if (device->session) {
        coap_session_set_app_data(device->session, nullptr);
        coap_session_release(device->session);
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
  static DeviceSession* of(coap_session_t* session) {
    return static_cast<DeviceSession*>(coap_session_get_app_data(session));
  }

  void establish_sessions() {
    const DatagramCounts before = datagram_counts();
    const auto started = Clock::now();
    const auto deadline =
        started + std::chrono::duration<double>(options_.handshake_budget_seconds);
    std::size_t next = 0;
    while (report_.sessions_established + report_.sessions_failed < devices_.size()) {
      while (next < devices_.size() && handshakes_in_flight_ < options_.max_handshakes_in_flight) {
        start_handshake(*devices_[next++]);
      }
      if (Clock::now() >= deadline) break;
      process_io(context_, 10);
      // libcoap 4.3.1 raises COAP_EVENT_DTLS_CONNECTED on a client only when a datagram
      // arrives after the handshake, so the end of a handshake is seen in the session state.
      for (std::size_t i = first_handshaking_; i < next; ++i) {
        DeviceSession& device = *devices_[i];
        if (device.state == DeviceSession::State::kHandshake &&
            coap_session_get_state(device.session) == COAP_SESSION_STATE_ESTABLISHED)
          mark_established(device);
      }
      while (first_handshaking_ < next &&
             devices_[first_handshaking_]->state != DeviceSession::State::kHandshake)
        ++first_handshaking_;
    }
    // Whatever is still half-open after the budget counts as failed.
    for (auto& device : devices_) {
      if (device->state == DeviceSession::State::kHandshake ||
          device->state == DeviceSession::State::kNotStarted) {
        device->state = DeviceSession::State::kFailed;
        ++report_.sessions_failed;
      }
    }
    handshakes_in_flight_ = 0;
    report_.handshake_seconds = seconds_between(started, Clock::now());
    report_.handshake_traffic = datagram_counts() - before;
  }

  void start_handshake(DeviceSession& device) {
    const PskCredentials& psk_credentials = options_.devices[device.device];
    coap_dtls_cpsk_t psk{};
    psk.version = COAP_DTLS_CPSK_SETUP_VERSION;
    psk.psk_info.identity.s = reinterpret_cast<const uint8_t*>(psk_credentials.identity.data());
    psk.psk_info.identity.length = psk_credentials.identity.size();
    psk.psk_info.key.s = psk_credentials.key.data();
    psk.psk_info.key.length = psk_credentials.key.size();
    // The ClientHello goes out here; COAP_EVENT_DTLS_CONNECTED reports the end.
    device.state = DeviceSession::State::kHandshake;
    ++handshakes_in_flight_;
    device.session =
        coap_new_client_session_psk2(context_, nullptr, &server_address_, COAP_PROTO_DTLS, &psk);
    if (!device.session) {
      fail(device);
      return;
    }
    coap_session_set_app_data(device.session, &device);
  }

  void post_updates() {
    for (auto& device : devices_)
      if (device->state == DeviceSession::State::kIdle) idle_.push_back(device.get());
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
        DeviceSession* device = idle_.front();
        idle_.pop_front();
        if (device->state != DeviceSession::State::kIdle) continue;  // failed while idle
        if (start_post(*device)) ++posts_started;
      }
      if (posts_in_flight_ == 0 && (!may_post || idle_.empty())) break;
      if (now >= give_up) break;
      const std::uint64_t answered_before = answers_;
      process_io(context_, 5);
      if (answers_ != answered_before) last_answer = Clock::now();
      if (options_.q_block) step_q_block1_posts();
    }
    report_.posts_unanswered += posts_in_flight_;
    report_.post_seconds = seconds_between(started, last_answer);
    report_.post_traffic = datagram_counts() - before;
    if (options_.on_posts_finished) options_.on_posts_finished();
  }

  // The bursts after a 2.31, the blocks a 4.08 listed, and probes, for every Q-Block1 post
  // in progress (a walk of the devices: ~1 µs at 1000, against a pass of libcoap's I/O).
  void step_q_block1_posts() {
    const auto now = Clock::now();
    for (auto& device : devices_) {
      if (device->state != DeviceSession::State::kPosting || !device->q_block1.active()) continue;
      if (!device->q_block1.step(now)) fail(*device);
    }
  }

  coap_pdu_t* new_post_pdu(const DeviceSession& device, coap_pdu_type_t type) const {
    coap_pdu_t* pdu = coap_new_pdu(type, COAP_REQUEST_CODE_POST, device.session);
    if (!pdu) return nullptr;
    coap_add_token(pdu, device.token.size(), device.token.data());
    coap_add_option(pdu, COAP_OPTION_URI_PATH, options_.path.size(),
                    reinterpret_cast<const uint8_t*>(options_.path.data()));
    return pdu;
  }

  bool start_q_block1_post(DeviceSession& device, std::vector<std::uint8_t> body) {
    std::uint8_t token[8];
    std::size_t token_length = 0;
    coap_session_new_token(device.session, &token_length, token);
    device.token.assign(token, token + token_length);
    device.body = std::move(body);
    device.body_bytes = device.body.size();
    if (!device.q_block1.start(device.session, device.body, device.token, options_.max_payloads,
                               options_.ack_timeout_seconds, [this, &device](coap_pdu_type_t type) {
                                 return new_post_pdu(device, type);
                               })) {
      fail(device);
      return false;
    }
    device.state = DeviceSession::State::kPosting;
    ++device.next_sequence;
    ++posts_in_flight_;
    report_.posted_body_bytes += device.body_bytes;
    return true;
  }

  bool start_post(DeviceSession& device) {
    std::vector<std::uint8_t> body = options_.make_body(device.device, device.next_sequence);
    device.q_block1.reset();
    if (options_.q_block && body.size() > 1024) return start_q_block1_post(device, std::move(body));
    coap_pdu_t* pdu = coap_new_pdu(COAP_MESSAGE_CON, COAP_REQUEST_CODE_POST, device.session);
    if (!pdu) {
      fail(device);
      return false;
    }
    std::uint8_t token[8];
    std::size_t token_length = 0;
    coap_session_new_token(device.session, &token_length, token);
    coap_add_token(pdu, token_length, token);
    device.token.assign(token, token + token_length);
    coap_add_option(pdu, COAP_OPTION_URI_PATH, options_.path.size(),
                    reinterpret_cast<const uint8_t*>(options_.path.data()));
    auto* owned = new std::vector<std::uint8_t>(std::move(body));
    device.body_bytes = owned->size();
    // libcoap owns `owned` from here on (release_payload), whether or not the call succeeds.
    if (!coap_add_data_large_request(device.session, pdu, owned->size(), owned->data(),
                                     release_payload, owned)) {
      coap_delete_pdu(pdu);
      fail(device);
      return false;
    }
    if (coap_send(device.session, pdu) == COAP_INVALID_MID) {
      fail(device);
      return false;
    }
    device.state = DeviceSession::State::kPosting;
    ++device.next_sequence;
    ++posts_in_flight_;
    report_.posted_body_bytes += device.body_bytes;
    return true;
  }

  void mark_established(DeviceSession& device) {
    device.state = DeviceSession::State::kIdle;
    --handshakes_in_flight_;
    ++report_.sessions_established;
  }

  void finish_post(DeviceSession& device) {
    device.state = DeviceSession::State::kIdle;
    device.q_block1.reset();
    --posts_in_flight_;
    ++answers_;
    idle_.push_back(&device);
  }

  void fail(DeviceSession& device) {
    switch (device.state) {
      case DeviceSession::State::kNotStarted:
      case DeviceSession::State::kHandshake:
        --handshakes_in_flight_;
        ++report_.sessions_failed;
        break;
      case DeviceSession::State::kPosting:
        --posts_in_flight_;
        ++answers_;
        ++report_.posts_unanswered;
        break;
      case DeviceSession::State::kIdle:
      case DeviceSession::State::kFailed:
        break;
    }
    device.state = DeviceSession::State::kFailed;
    device.q_block1.reset();
  }

  static coap_response_t on_response(coap_session_t* session, const coap_pdu_t*,
                                     const coap_pdu_t* received, const coap_mid_t) {
    DeviceSession* device = of(session);
    if (!device || device->state != DeviceSession::State::kPosting) return COAP_RESPONSE_OK;
    const coap_bin_const_t token = coap_pdu_get_token(received);
    if (token.length != device->token.size() ||
        (token.length && std::memcmp(token.s, device->token.data(), token.length) != 0))
      return COAP_RESPONSE_OK;  // not the post in progress
    LoadRunner& self = *device->runner;
    if (device->q_block1.active()) {
      switch (device->q_block1.take_answer(received)) {
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
      ++self.report_.posts_acknowledged;
      self.report_.acknowledged_body_bytes += device->body_bytes;
      if (self.options_.on_success) {
        size_t length = 0, offset = 0, total = 0;
        const uint8_t* data = nullptr;
        if (coap_get_data_large(received, &length, &data, &offset, &total) && data)
          self.options_.on_success(std::span<const std::uint8_t>(data, length));
        else
          self.options_.on_success({});
      }
    } else {
      ++self.report_.posts_refused_by_code[code_number];
    }
    self.finish_post(*device);
    return COAP_RESPONSE_OK;
  }

  static void on_nack(coap_session_t* session, const coap_pdu_t*, const coap_nack_reason_t,
                      const coap_mid_t) {
    DeviceSession* device = of(session);
    if (!device || device->state != DeviceSession::State::kPosting) return;
    LoadRunner& self = *device->runner;
    ++self.report_.posts_unanswered;
    --self.posts_in_flight_;
    device->q_block1.reset();
    ++self.answers_;
    // The session may still be usable (a lost exchange); a broken one reports an event too.
    if (coap_session_get_state(session) == COAP_SESSION_STATE_ESTABLISHED) {
      device->state = DeviceSession::State::kIdle;
      self.idle_.push_back(device);
    } else {
      device->state = DeviceSession::State::kFailed;
    }
  }

  static int on_event(coap_session_t* session, const coap_event_t event) {
    DeviceSession* device = of(session);
    if (!device) return 0;
    LoadRunner& self = *device->runner;
    if (event == COAP_EVENT_DTLS_CONNECTED && device->state == DeviceSession::State::kHandshake) {
      self.mark_established(*device);
    } else if (event == COAP_EVENT_DTLS_ERROR || event == COAP_EVENT_DTLS_CLOSED ||
               event == COAP_EVENT_SESSION_FAILED) {
      self.fail(*device);
    }
    return 0;
  }

  const UpdateLoadOptions& options_;
  coap_address_t server_address_{};
  coap_context_t* context_ = nullptr;
  std::vector<std::unique_ptr<DeviceSession>> devices_;
  std::deque<DeviceSession*> idle_;
  std::size_t handshakes_in_flight_ = 0;
  std::size_t first_handshaking_ = 0;  // devices before it are past their handshake
  std::size_t posts_in_flight_ = 0;
  std::uint64_t answers_ = 0;  // posts finished one way or another
  UpdateLoadReport report_;
};

}  // namespace

UpdateLoadReport run_update_load(const UpdateLoadOptions& options) {
  if (!options.make_body) throw TransportError("run_update_load needs make_body");
  if (options.devices.empty()) throw TransportError("run_update_load needs at least one device");
  LoadRunner runner(options);
  return runner.run();
}

}  // namespace edgetrain::transport::bench
