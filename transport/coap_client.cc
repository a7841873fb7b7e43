// The client half of coap_dtls.h: CoapDtlsClient on libcoap (Mbed TLS backend), one
// blocking request at a time on a kept session, with one reconnection when a session that
// had answered before fails.
#include "transport/coap_internal.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

namespace edgetrain::transport {
namespace {

coap_pdu_code_t to_request_code(Method method) {
  switch (method) {
    case Method::kGet: return COAP_REQUEST_CODE_GET;
    case Method::kPost: return COAP_REQUEST_CODE_POST;
    case Method::kPut: return COAP_REQUEST_CODE_PUT;
    case Method::kDelete: return COAP_REQUEST_CODE_DELETE;
  }
  return COAP_REQUEST_CODE_GET;
}

int code_from_pdu(coap_pdu_code_t code) { return (code >> 5) * 100 + (code & 0x1f); }

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> segments;
  std::string current;
  for (char c : path) {
    if (c == '/') {
      if (!current.empty()) segments.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) segments.push_back(current);
  return segments;
}

}  // namespace

struct CoapDtlsClient::Impl {
  Options options;
  coap_context_t* context = nullptr;
  coap_session_t* session = nullptr;
  coap_address_t server_address{};
  std::uint64_t sessions_started = 0;
  std::uint64_t reconnections = 0;  // fresh sessions started inside a request, after a reused one failed
  bool session_answered = false;    // the current session carried a complete exchange

  // State of the one request in flight.
  std::vector<std::uint8_t> token;
  bool done = false;
  std::string failure;
  CoapResponse response;

  static Impl* of(coap_session_t* session) { return static_cast<Impl*>(coap_session_get_app_data(session)); }

  static coap_response_t on_response(coap_session_t* session, const coap_pdu_t*, const coap_pdu_t* received,
                                     const coap_mid_t) {
    Impl* self = of(session);
    if (!self) return COAP_RESPONSE_OK;
    coap_bin_const_t token = coap_pdu_get_token(received);
    if (self->done || token.length != self->token.size() ||
        (token.length && std::memcmp(token.s, self->token.data(), token.length) != 0)) {
      return COAP_RESPONSE_OK;  // a late answer to an earlier request: ignore it
    }
    self->response.code = code_from_pdu(coap_pdu_get_code(received));
    coap_opt_iterator_t options;
    if (coap_opt_t* etag = coap_check_option(received, COAP_OPTION_ETAG, &options)) {
      self->response.etag = coap_decode_var_bytes8(coap_opt_value(etag), coap_opt_length(etag));
    }
    size_t length = 0, offset = 0, total = 0;
    const uint8_t* data = nullptr;
    self->response.payload.clear();
    if (coap_get_data_large(received, &length, &data, &offset, &total) && data) {
      self->response.payload.assign(data, data + length);
    }
    self->done = true;
    return COAP_RESPONSE_OK;
  }

  static void on_nack(coap_session_t* session, const coap_pdu_t*, const coap_nack_reason_t reason, const coap_mid_t) {
    Impl* self = of(session);
    if (!self || self->done) return;
    switch (reason) {
      case COAP_NACK_TOO_MANY_RETRIES: self->failure = "no answer from the server (too many retransmissions)"; break;
      case COAP_NACK_NOT_DELIVERABLE: self->failure = "request not deliverable"; break;
      case COAP_NACK_RST: self->failure = "server reset the exchange"; break;
      case COAP_NACK_TLS_FAILED: self->failure = "DTLS handshake failed (wrong identity or key, or a certificate the peer does not accept?)"; break;
      case COAP_NACK_ICMP_ISSUE: self->failure = "server unreachable (nothing listening on that port?)"; break;
      default: self->failure = "network error"; break;
    }
  }

  static int on_event(coap_session_t* session, const coap_event_t event) {
    Impl* self = of(session);
    if (!self || self->done) return 0;
    if (event == COAP_EVENT_DTLS_ERROR) self->failure = "DTLS error (handshake refused: wrong identity or key, or a certificate the peer does not accept?)";
    if (event == COAP_EVENT_DTLS_CLOSED && self->failure.empty()) self->failure = "DTLS session closed by the server";
    return 0;
  }

  void drop_session() {
    if (session) {
      coap_session_set_app_data(session, nullptr);
      // Cancel what is still queued for this session first: after an ICMP error libcoap
      // keeps the request queued for retransmission, holding a reference to the session,
      // and those entries were never freed (LeakSanitizer in e2e_server_crash_recovery).
      coap_session_disconnected(session, COAP_NACK_NOT_DELIVERABLE);
      coap_session_release(session);
      session = nullptr;
      session_answered = false;
    }
  }

  void connect() {
    if (options.plaintext) {
      session = coap_new_client_session(context, nullptr, &server_address, COAP_PROTO_UDP);
    } else if (options.certificates) {
      coap_dtls_pki_t pki = pki_setup(*options.certificates);
      session = coap_new_client_session_pki(context, nullptr, &server_address, COAP_PROTO_DTLS, &pki);
    } else {
      coap_dtls_cpsk_t psk{};
      psk.version = COAP_DTLS_CPSK_SETUP_VERSION;
      psk.psk_info.identity.s = reinterpret_cast<const uint8_t*>(options.psk.identity.data());
      psk.psk_info.identity.length = options.psk.identity.size();
      psk.psk_info.key.s = options.psk.key.data();
      psk.psk_info.key.length = options.psk.key.size();
      session = coap_new_client_session_psk2(context, nullptr, &server_address, COAP_PROTO_DTLS, &psk);
    }
    if (!session) {
      throw TransportError(std::string("cannot create a ") + (options.plaintext ? "CoAP" : "DTLS") + " session to " +
                           options.host);
    }
    ++sessions_started;
    coap_session_set_app_data(session, this);
    apply_timing(session, options.timing);
  }
};

CoapDtlsClient::CoapDtlsClient(Options options) : impl_(std::make_unique<Impl>()) {
  coap_library_startup();
  check_timing(options.timing);
  if (options.certificates) {
    check_certificate_files(*options.certificates);
  } else if (!options.plaintext && (options.psk.identity.empty() || options.psk.key.empty())) {
    throw TransportError("a DTLS-PSK client needs an identity and a key");
  }
  impl_->options = std::move(options);
  impl_->server_address = resolve_udp_address(impl_->options.host, impl_->options.port);
  impl_->context = coap_new_context(nullptr);
  if (!impl_->context) throw TransportError("coap_new_context failed");
  coap_context_set_block_mode(impl_->context, COAP_BLOCK_USE_LIBCOAP | COAP_BLOCK_SINGLE_BODY);
  coap_register_response_handler(impl_->context, &Impl::on_response);
  coap_register_nack_handler(impl_->context, &Impl::on_nack);
  coap_register_event_handler(impl_->context, &Impl::on_event);
}

CoapDtlsClient::~CoapDtlsClient() {
  impl_->drop_session();
  if (impl_->context) coap_free_context(impl_->context);
}

CoapResponse CoapDtlsClient::request(Method method, const std::string& path, std::span<const std::uint8_t> payload) {
  Impl& s = *impl_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(s.options.timeout_ms);
  auto send = [&] {
    if (!s.session) s.connect();
    coap_pdu_t* pdu = coap_new_pdu(COAP_MESSAGE_CON, to_request_code(method), s.session);
    if (!pdu) throw TransportError("cannot allocate a CoAP request");
    uint8_t token[8];
    size_t token_length = 0;
    coap_session_new_token(s.session, &token_length, token);
    coap_add_token(pdu, token_length, token);
    s.token.assign(token, token + token_length);
    const std::size_t question_mark = path.find('?');
    for (const std::string& segment : split_path(path.substr(0, question_mark))) {
      coap_add_option(pdu, COAP_OPTION_URI_PATH, segment.size(), reinterpret_cast<const uint8_t*>(segment.data()));
    }
    if (question_mark != std::string::npos) {
      const std::string query = path.substr(question_mark + 1);
      for (std::size_t start = 0; start <= query.size();) {
        std::size_t end = query.find('&', start);
        if (end == std::string::npos) end = query.size();
        if (end > start)
          coap_add_option(pdu, COAP_OPTION_URI_QUERY, end - start, reinterpret_cast<const uint8_t*>(query.data() + start));
        start = end + 1;
      }
    }
    if (s.options.plaintext && !s.options.psk.identity.empty()) {
      const std::string declared = "id=" + s.options.psk.identity;
      coap_add_option(pdu, COAP_OPTION_URI_QUERY, declared.size(), reinterpret_cast<const uint8_t*>(declared.data()));
    }
    if (!payload.empty()) {
      auto* body = new std::vector<std::uint8_t>(payload.begin(), payload.end());
      if (!coap_add_data_large_request(s.session, pdu, body->size(), body->data(), release_payload, body)) {
        coap_delete_pdu(pdu);
        throw TransportError("cannot attach a " + std::to_string(payload.size()) + "-byte body");
      }
    }
    s.done = false;
    s.failure.clear();
    s.response = {};
    if (coap_send(s.session, pdu) == COAP_INVALID_MID) {
      s.drop_session();
      throw TransportError("coap_send failed");
    }
  };
  auto wait = [&] {
    while (!s.done && s.failure.empty()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        s.failure = "timed out after " + std::to_string(s.options.timeout_ms) + " ms";
        return false;  // no time left for anything else
      }
      coap_io_process(s.context, static_cast<uint32_t>(std::min<long long>(left.count(), 100)));
    }
    return true;
  };

  // A session that already carried an exchange and now fails before the deadline (the
  // server closed it, or lost it and libcoap gave up retransmitting) is most likely gone
  // on the server's side, e.g. after a restart: start one fresh session after a short,
  // jittered pause and send the request again (requests are idempotent here: updates carry
  // a sequence number the server deduplicates). A new session failing is the caller's
  // problem (it backs off longer).
  //
  // A server may acknowledge a request with an empty ACK and answer later (the update
  // server does once the update is durable); after that ACK nothing is retransmitted, so a
  // server that died meanwhile would go unnoticed until the deadline. Pinging a session
  // that has been silent (no datagram either way) for kKeepaliveSeconds during a request
  // finds that out (ICMP unreachable, or no pong before the next ping); between requests
  // nothing is pinged. libcoap drops a session whose ping got no pong by the next silent
  // interval, so the interval must exceed the usual retransmission gaps: at 1 s it cut
  // healthy block-wise transfers on a lossy link (a lost ping or pong during a 1-3 s
  // retransmission wait).
  constexpr unsigned kKeepaliveSeconds = 5;
  coap_context_set_keepalive(s.context, kKeepaliveSeconds);
  const bool reused_session = s.session && s.session_answered;
  send();
  const bool time_left = wait();
  if (!s.done && reused_session && time_left) {
    const std::string first_failure = s.failure;
    s.drop_session();
    std::minstd_rand jitter(static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
    const auto pause = std::chrono::milliseconds(100 + jitter() % 200);
    if (std::chrono::steady_clock::now() + pause < deadline) {
      std::this_thread::sleep_for(pause);
      ++s.reconnections;
      send();
      wait();
      if (!s.done) s.failure = first_failure + "; then, on a new session: " + s.failure;
    }
  }
  coap_context_set_keepalive(s.context, 0);
  if (!s.done) {
    std::string why = s.failure;
    s.drop_session();  // the next request starts over with a fresh handshake
    throw TransportError("request to " + s.options.host + ":" + std::to_string(s.options.port) + "/" + path +
                         " failed: " + why);
  }
  s.session_answered = true;
  return std::move(s.response);
}

std::uint64_t CoapDtlsClient::sessions_started() const { return impl_->sessions_started; }

std::uint64_t CoapDtlsClient::reconnections() const { return impl_->reconnections; }

}  // namespace edgetrain::transport
