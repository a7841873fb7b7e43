// The client half of coap_dtls.h: CoapDtlsClient on libcoap (Mbed TLS backend), one
// blocking request at a time on a kept session, with one reconnection when a session that
// had answered before fails.
#include "transport/coap_internal.h"
#include "transport/handshake_watch.h"
#include "transport/untrusted_text.h"

#include <mbedtls/error.h>
#include <mbedtls/ssl.h>
#include <netdb.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

namespace edgetrain::transport {
namespace {

coap_pdu_code_t to_request_code(Method method) {
  switch (method) {
    case Method::kGet:
      return COAP_REQUEST_CODE_GET;
    case Method::kPost:
      return COAP_REQUEST_CODE_POST;
    case Method::kPut:
      return COAP_REQUEST_CODE_PUT;
    case Method::kDelete:
      return COAP_REQUEST_CODE_DELETE;
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

const char* method_name(Method method) {
  switch (method) {
    case Method::kGet:
      return "GET";
    case Method::kPost:
      return "POST";
    case Method::kPut:
      return "PUT";
    case Method::kDelete:
      return "DELETE";
  }
  return "GET";
}

// The TLS alerts a DTLS 1.2 server sends when it refuses a handshake (RFC 5246 7.2, RFC 4279).
std::string alert_name(int alert) {
  switch (alert) {
    case MBEDTLS_SSL_ALERT_MSG_UNEXPECTED_MESSAGE:
      return "unexpected_message";
    case MBEDTLS_SSL_ALERT_MSG_BAD_RECORD_MAC:
      return "bad_record_mac";
    case MBEDTLS_SSL_ALERT_MSG_HANDSHAKE_FAILURE:
      return "handshake_failure";
    case MBEDTLS_SSL_ALERT_MSG_BAD_CERT:
      return "bad_certificate";
    case MBEDTLS_SSL_ALERT_MSG_UNSUPPORTED_CERT:
      return "unsupported_certificate";
    case MBEDTLS_SSL_ALERT_MSG_CERT_REVOKED:
      return "certificate_revoked";
    case MBEDTLS_SSL_ALERT_MSG_CERT_EXPIRED:
      return "certificate_expired";
    case MBEDTLS_SSL_ALERT_MSG_CERT_UNKNOWN:
      return "certificate_unknown";
    case MBEDTLS_SSL_ALERT_MSG_ILLEGAL_PARAMETER:
      return "illegal_parameter";
    case MBEDTLS_SSL_ALERT_MSG_UNKNOWN_CA:
      return "unknown_ca";
    case MBEDTLS_SSL_ALERT_MSG_ACCESS_DENIED:
      return "access_denied";
    case MBEDTLS_SSL_ALERT_MSG_DECODE_ERROR:
      return "decode_error";
    case MBEDTLS_SSL_ALERT_MSG_DECRYPT_ERROR:
      return "decrypt_error";
    case MBEDTLS_SSL_ALERT_MSG_PROTOCOL_VERSION:
      return "protocol_version";
    case MBEDTLS_SSL_ALERT_MSG_INSUFFICIENT_SECURITY:
      return "insufficient_security";
    case MBEDTLS_SSL_ALERT_MSG_INTERNAL_ERROR:
      return "internal_error";
    case MBEDTLS_SSL_ALERT_MSG_UNKNOWN_PSK_IDENTITY:
      return "unknown_psk_identity";
    default:
      return "alert " + std::to_string(alert);
  }
}

// "127.0.0.1:5684", or "server.lan (192.0.2.7):5684" when the name is not the address.
std::string address_text(const std::string& host, std::uint16_t port,
                         const coap_address_t& resolved) {
  char numeric[NI_MAXHOST] = "";
  std::string shown = host;
  if (getnameinfo(&resolved.addr.sa, resolved.size, numeric, sizeof numeric, nullptr, 0,
                  NI_NUMERICHOST) == 0 &&
      host != numeric) {
    shown += std::string(" (") + numeric + ")";
  }
  if (host.find(':') != std::string::npos) shown = "[" + shown + "]";  // IPv6
  return shown + ":" + std::to_string(port);
}

}  // namespace

const char* transport_failure_name(TransportFailure failure) {
  switch (failure) {
    case TransportFailure::kOther:
      return "other";
    case TransportFailure::kNoAnswer:
      return "no answer";
    case TransportFailure::kUnreachable:
      return "unreachable";
    case TransportFailure::kHandshakeRefused:
      return "handshake refused";
    case TransportFailure::kUnknownIdentity:
      return "unknown identity";
    case TransportFailure::kTimedOut:
      return "timed out";
    case TransportFailure::kSessionLost:
      return "session lost";
    case TransportFailure::kInterrupted:
      return "interrupted";
  }
  return "other";
}

struct CoapDtlsClient::Impl {
  Options options;
  coap_context_t* context = nullptr;
  coap_session_t* session = nullptr;
  coap_address_t server_address{};
  std::string server_text;  // "HOST:PORT" for messages (address_text)
  std::uint64_t sessions_started = 0;
  std::uint64_t reconnections =
      0;  // fresh sessions started inside a request, after a reused one failed
  bool session_answered = false;        // the current session carried a complete exchange
  detail::HandshakeProgress handshake;  // of the current session (handshake_watch.h)
  bool dtls_closed = false;             // libcoap freed the current session's DTLS state

  // State of the one request in flight.
  std::vector<std::uint8_t> token;
  bool done = false;
  std::string failure;  // empty while none
  TransportFailure failure_kind = TransportFailure::kOther;
  CoapResponse response;

  void fail(TransportFailure kind, std::string why) {
    if (!failure.empty()) return;  // the first reason is the real one
    failure_kind = kind;
    failure = std::move(why);
  }

  // Whether this session ever got anything back from the server.
  bool heard_from_server() const {
    return session_answered || handshake.heard_from_server || handshake.completed;
  }

  // After ICMP came back for a datagram (`error`: errno of the read that reported it).
  void fail_unreachable(int error) {
    if (error == ECONNREFUSED) {
      fail(TransportFailure::kUnreachable, "nothing listens on " + server_text +
                                               " (its host answered 'port unreachable'): is "
                                               "edgetrain-server running there, on that port?");
    } else if (error == EHOSTUNREACH) {
      fail(TransportFailure::kUnreachable,
           "no route to " + server_text +
               " (ICMP 'host unreachable'): a wrong address, or the host is down?");
    } else {
      // libcoap reports only those two; errno was lost on the way.
      fail(TransportFailure::kUnreachable, "nothing listens on " + server_text +
                                               ", or there is no route to it (an ICMP error came "
                                               "back): is edgetrain-server running there?");
    }
  }

  // When nothing at all came back, or the server went quiet after answering.
  void fail_silent(const std::string& when) {
    if (!heard_from_server()) {
      fail(TransportFailure::kNoAnswer, "no answer from " + server_text + " " + when +
                                            ": nothing came back (is edgetrain-server running "
                                            "there, and does every firewall on the way let UDP "
                                            "through to that port?)");
    } else if (!options.plaintext && !handshake.completed) {
      fail(TransportFailure::kTimedOut,
           "the DTLS handshake with " + server_text + " began but the server went silent " + when +
               " (a lossy link, or a server that is overloaded or went away?)");
    } else {
      fail(TransportFailure::kTimedOut, "no answer from " + server_text + " " + when +
                                            " (the server answered before: "
                                            "gone away, overloaded, or a lossy link?)");
    }
  }

  // libcoap gave up the session's DTLS (COAP_NACK_TLS_FAILED): why, from what the handshake
  // watch saw of it.
  void fail_dtls() {
    if (handshake.completed) {
      fail(TransportFailure::kSessionLost,
           "the DTLS session with " + server_text + " was closed by the server");
      return;
    }
    const std::string who = options.certificates
                                ? "this certificate"
                                : "identity '" + escape_untrusted(options.psk.identity) + "'";
    if (handshake.alert == MBEDTLS_SSL_ALERT_MSG_UNKNOWN_PSK_IDENTITY) {
      fail(TransportFailure::kUnknownIdentity,
           "the server at " + server_text + " does not know the PSK " + who +
               " (it refused the DTLS handshake with alert unknown_psk_identity): add the device "
               "on the server "
               "(edgetrain-server add-device NAME), or give the identity it was added with");
    } else if (handshake.alert == MBEDTLS_SSL_ALERT_MSG_INTERNAL_ERROR) {
      // The server's trouble, not our credentials: worth another try later.
      fail(
          TransportFailure::kOther,
          "the server at " + server_text +
              " ended the DTLS handshake with alert internal_error (trouble on the server's side)");
    } else if (handshake.alert >= 0) {
      const std::string hint =
          options.certificates
              ? "the server does not accept this certificate (not signed by the CA it trusts?)"
              : "wrong key for " + who + " (not the key the server holds for it?)";
      fail(TransportFailure::kHandshakeRefused, "the server at " + server_text +
                                                    " refused the DTLS handshake (alert " +
                                                    alert_name(handshake.alert) + "): " + hint);
    } else if (handshake.wrong_peer_name) {
      fail(TransportFailure::kHandshakeRefused,
           "the server at " + server_text + " showed a certificate for '" +
               escape_untrusted(*handshake.wrong_peer_name) + "', not for '" +
               escape_untrusted(options.expected_peer_name) + "' (another peer at that address?)");
    } else if (handshake.local_error != 0) {
      char text[160];
      mbedtls_strerror(handshake.local_error, text, sizeof text);
      fail(TransportFailure::kHandshakeRefused,
           "this side refused the DTLS handshake with " + server_text + " (" + text + ")" +
               (options.certificates ? ": is the server's certificate signed by the --ca file?"
                                     : ""));
    } else {
      fail_silent("during the DTLS handshake");
    }
  }

  static Impl* of(coap_session_t* session) {
    return static_cast<Impl*>(coap_session_get_app_data(session));
  }

  static coap_response_t on_response(coap_session_t* session, const coap_pdu_t*,
                                     const coap_pdu_t* received, const coap_mid_t) {
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

  static void on_nack(coap_session_t* session, const coap_pdu_t*, const coap_nack_reason_t reason,
                      const coap_mid_t) {
    const int error =
        errno;  // after an ICMP error: the failed read's (libcoap frees, logs nothing between)
    Impl* self = of(session);
    if (!self || self->done) return;
    switch (reason) {
      case COAP_NACK_TOO_MANY_RETRIES:
        self->fail_silent("after every retransmission");
        break;
      case COAP_NACK_NOT_DELIVERABLE:
        self->fail(TransportFailure::kOther, "request not deliverable");
        break;
      case COAP_NACK_RST:
        self->fail(TransportFailure::kOther, "the server reset the exchange (CoAP RST)");
        break;
      case COAP_NACK_TLS_FAILED:
        self->fail_dtls();
        break;
      case COAP_NACK_ICMP_ISSUE:
        self->fail_unreachable(error);
        break;
      default:
        self->fail(TransportFailure::kOther, "network error");
        break;
    }
  }

  // libcoap 4.3.1 (Mbed TLS) signals DTLS_CLOSED whenever it frees a session's DTLS state,
  // whatever the reason, and before it reports the queued request's nack (which says why).
  // So the event only marks the session; wait() explains a closed session that got no nack
  // (a request the server had acknowledged with an empty ACK and not yet answered).
  static int on_event(coap_session_t* session, const coap_event_t event) {
    Impl* self = of(session);
    if (!self || self->done) return 0;
    if (event == COAP_EVENT_DTLS_ERROR) self->fail_dtls();
    if (event == COAP_EVENT_DTLS_CLOSED) self->dtls_closed = true;
    return 0;
  }

  void drop_session() {
    if (session) {
      detail::stop_watching_handshake(session);
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
      session =
          coap_new_client_session_pki(context, nullptr, &server_address, COAP_PROTO_DTLS, &pki);
    } else {
      coap_dtls_cpsk_t psk{};
      psk.version = COAP_DTLS_CPSK_SETUP_VERSION;
      psk.psk_info.identity.s = reinterpret_cast<const uint8_t*>(options.psk.identity.data());
      psk.psk_info.identity.length = options.psk.identity.size();
      psk.psk_info.key.s = options.psk.key.data();
      psk.psk_info.key.length = options.psk.key.size();
      session =
          coap_new_client_session_psk2(context, nullptr, &server_address, COAP_PROTO_DTLS, &psk);
    }
    if (!session) {
      throw TransportError(std::string("cannot create a ") + (options.plaintext ? "CoAP" : "DTLS") +
                           " session to " + options.host);
    }
    ++sessions_started;
    coap_session_set_app_data(session, this);
    handshake = {};
    // libcoap's CN callback is only called for certificates that failed a check, so the
    // handshake watch checks the name once the handshake has finished (handshake_watch.h).
    if (options.certificates) handshake.expected_peer_name = options.expected_peer_name;
    dtls_closed = false;
    detail::watch_handshake(session, &handshake);
    apply_timing(session, options.timing);
  }

  bool stop_requested() const { return options.stop && options.stop->load(); }
};

CoapDtlsClient::CoapDtlsClient(Options options) : impl_(std::make_unique<Impl>()) {
  coap_library_startup();
  check_timing(options.timing);
  if (options.certificates) {
    check_certificate_files(*options.certificates);
  } else if (!options.plaintext && (options.psk.identity.empty() || options.psk.key.empty())) {
    throw TransportError("a DTLS-PSK client needs an identity and a key");
  } else if (!options.plaintext && options.psk.key.size() > kMaxPskBytes) {
    throw TransportError("the PSK is " + std::to_string(options.psk.key.size()) +
                         " bytes; Mbed TLS takes at most " + std::to_string(kMaxPskBytes) +
                         " (MBEDTLS_PSK_MAX_LEN): every handshake would fail");
  }
  impl_->options = std::move(options);
  impl_->server_address = resolve_udp_address(impl_->options.host, impl_->options.port);
  impl_->server_text =
      address_text(impl_->options.host, impl_->options.port, impl_->server_address);
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

CoapResponse CoapDtlsClient::request(Method method, const std::string& path,
                                     std::span<const std::uint8_t> payload) {
  Impl& s = *impl_;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(s.options.timeout_ms);
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
      coap_add_option(pdu, COAP_OPTION_URI_PATH, segment.size(),
                      reinterpret_cast<const uint8_t*>(segment.data()));
    }
    if (question_mark != std::string::npos) {
      const std::string query = path.substr(question_mark + 1);
      for (std::size_t start = 0; start <= query.size();) {
        std::size_t end = query.find('&', start);
        if (end == std::string::npos) end = query.size();
        if (end > start)
          coap_add_option(pdu, COAP_OPTION_URI_QUERY, end - start,
                          reinterpret_cast<const uint8_t*>(query.data() + start));
        start = end + 1;
      }
    }
    if (s.options.plaintext && !s.options.psk.identity.empty()) {
      const std::string declared = "id=" + s.options.psk.identity;
      coap_add_option(pdu, COAP_OPTION_URI_QUERY, declared.size(),
                      reinterpret_cast<const uint8_t*>(declared.data()));
    }
    if (!payload.empty()) {
      auto* body = new std::vector<std::uint8_t>(payload.begin(), payload.end());
      if (!coap_add_data_large_request(s.session, pdu, body->size(), body->data(), release_payload,
                                       body)) {
        coap_delete_pdu(pdu);
        throw TransportError("cannot attach a " + std::to_string(payload.size()) + "-byte body");
      }
    }
    s.done = false;
    s.failure.clear();
    s.failure_kind = TransportFailure::kOther;
    s.response = {};
    if (coap_send(s.session, pdu) == COAP_INVALID_MID) {
      s.drop_session();
      throw TransportError("coap_send failed");
    }
  };
  // Every wait below looks at the stop flag at least every 100 ms.
  auto wait = [&] {
    while (!s.done && s.failure.empty()) {
      if (s.stop_requested()) {
        s.fail(TransportFailure::kInterrupted, "interrupted: the worker is stopping");
        return false;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        s.fail_silent("within " + std::to_string(s.options.timeout_ms) + " ms");
        return false;  // no time left for anything else
      }
      coap_io_process(s.context, static_cast<uint32_t>(std::min<long long>(left.count(), 100)));
      if (s.dtls_closed && !s.done) s.fail_dtls();  // no-op when a nack has explained it
    }
    return true;
  };
  auto pause_unless_stopped = [&](std::chrono::milliseconds pause) {
    const auto until = std::chrono::steady_clock::now() + pause;
    while (!s.stop_requested() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          std::chrono::milliseconds(50), until - std::chrono::steady_clock::now()));
    }
    return !s.stop_requested();
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
    std::minstd_rand jitter(
        static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
    const auto pause = std::chrono::milliseconds(100 + jitter() % 200);
    if (std::chrono::steady_clock::now() + pause < deadline) {
      if (pause_unless_stopped(pause)) {
        ++s.reconnections;
        send();
        wait();
        if (!s.done) s.failure = first_failure + "; then, on a new session: " + s.failure;
      } else {
        s.failure.clear();
        s.fail(TransportFailure::kInterrupted, "interrupted: the worker is stopping");
      }
    }
  }
  coap_context_set_keepalive(s.context, 0);
  if (!s.done) {
    const std::string why = s.failure;
    const TransportFailure kind = s.failure_kind;
    s.drop_session();  // the next request starts over with a fresh handshake
    throw TransportError(std::string(method_name(method)) + " /" + path + ": " + why, kind);
  }
  s.session_answered = true;
  return std::move(s.response);
}

std::uint64_t CoapDtlsClient::sessions_started() const { return impl_->sessions_started; }

std::uint64_t CoapDtlsClient::reconnections() const { return impl_->reconnections; }

}  // namespace edgetrain::transport
