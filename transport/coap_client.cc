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
  // The liveness probe of a reused session during a request (request(): a server that
  // restarted answers nothing on the old session). The last time the server was heard in
  // this request (its sending counts as heard), and the CoAP ping in flight, if any.
  std::chrono::steady_clock::time_point last_heard_in_request;
  coap_mid_t probe_mid = COAP_INVALID_MID;
  std::chrono::steady_clock::time_point probe_sent;
  std::uint64_t silent_sessions = 0;  // sessions given up because a probe went unanswered

  // Q-Block2 (RFC 9177) reception of the GET in flight (transport/README.md, "Q-Block"):
  // the blocks so far, which were asked for, and the tokens of the transfer's requests
  // (each burst is asked for by a request of its own).
  struct QBlock2Receive {
    bool asked = false;    // the request carries Q-Block2
    bool active = false;   // a block has come: ETag, size and block size are known
    bool restart = false;  // a block of another ETag came: the body changed, ask again
    std::uint64_t etag = 0;
    int code = 0;
    std::uint32_t szx = 6;
    std::size_t body_size = 0;
    std::uint32_t blocks = 0;
    std::uint32_t received = 0;
    std::vector<std::uint8_t> body;
    std::vector<bool> have;
    std::uint32_t asked_until = 0;  // every block below it was asked for
    std::uint32_t last_asked = 0;   // the last block the latest request asked for
    bool burst_ended = false;       // that block came: time to ask for the next burst
    std::chrono::steady_clock::time_point last_progress;
    std::vector<std::vector<std::uint8_t>> tokens;
  };
  QBlock2Receive q_block2;
  // Q-Block1 (RFC 9177) sending of the request body in flight (coap_internal.h).
  QBlock1Sender q_block1;
  bool q_block1_refused = false;       // the server answered a Q-Block1 block with 4.02
  bool server_lacks_q_block1 = false;  // ... so this client uses Block1 with it from now on
  bool q_block2_refused = false;      // the server answered the Q-Block2 GET with 4.02
  bool server_lacks_q_block2 = false;  // ... so this client uses Block2 with it from now on
  Method current_method = Method::kGet;
  std::string current_path;
  // The largest body a Q-Block2 answer may announce (ours): its Size2 is allocated at once.
  static constexpr std::size_t kMaxQBlock2BodyBytes = std::size_t{64} << 20;

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
    self->last_heard_in_request = std::chrono::steady_clock::now();  // even a late answer
    coap_bin_const_t token = coap_pdu_get_token(received);
    auto same = [&](const std::vector<std::uint8_t>& ours) {
      return token.length == ours.size() &&
             (token.length == 0 || std::memcmp(token.s, ours.data(), token.length) == 0);
    };
    if (self->q_block1.active()) {
      if (self->done || !same(self->q_block1.token())) return COAP_RESPONSE_OK;
      switch (self->q_block1.take_answer(received)) {
        case QBlock1Sender::Answer::kContinue:
        case QBlock1Sender::Answer::kMissing:
          return COAP_RESPONSE_OK;  // step_q_block1() sends what is due
        case QBlock1Sender::Answer::kRefused:
          self->q_block1_refused = true;  // request() sends it again with Block1
          self->done = true;
          return COAP_RESPONSE_OK;
        case QBlock1Sender::Answer::kFinal:
          break;  // the answer to the whole body (the handler's, or a refusal)
      }
    }
    const bool ours = self->q_block1.active() ? true
                      : self->q_block2.asked
                          ? std::any_of(self->q_block2.tokens.begin(),
                                        self->q_block2.tokens.end(), same)
                          : same(self->token);
    if (self->done || !ours) return COAP_RESPONSE_OK;  // a late answer to an earlier request
    coap_opt_iterator_t options;
    if (self->q_block2.asked) {
      // libcoap's 4.02 echoes the option it did not know, so the code comes first.
      if (coap_pdu_get_code(received) == COAP_RESPONSE_CODE(402) && !self->q_block2.active) {
        self->q_block2_refused = true;  // request() asks again without Q-Block2
        self->done = true;
        return COAP_RESPONSE_OK;
      }
      const coap_opt_t* block = coap_check_option(received, kOptionQBlock2, &options);
      if (block && COAP_RESPONSE_CLASS(coap_pdu_get_code(received)) == 2) {
        self->take_q_block2(received, block);
        return COAP_RESPONSE_OK;
      }
      // Anything else (an error, a body of one block) is the whole answer.
    }
    self->response.code = code_from_pdu(coap_pdu_get_code(received));
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

  void start_q_block1(std::span<const std::uint8_t> payload) {
    uint8_t token_bytes[8];
    size_t token_length = 0;
    coap_session_new_token(session, &token_length, token_bytes);
    token.assign(token_bytes, token_bytes + token_length);
    const std::vector<std::uint8_t> body_token = token;
    const bool sent = q_block1.start(
        session, payload, token, options.timing.max_payloads, options.timing.ack_timeout_seconds,
        [this, body_token](coap_pdu_type_t type) {
          return new_request_pdu(type, current_method, current_path, body_token);
        });
    if (!sent) fail_q_block1_send();
  }

  // Called by the wait loop (QBlock1Sender::step: resends, the next burst, the probe).
  void step_q_block1() {
    if (!q_block1.active() || done || !failure.empty()) return;
    if (!q_block1.step(std::chrono::steady_clock::now())) fail_q_block1_send();
  }

  void fail_q_block1_send() {
    fail(TransportFailure::kOther,
         "cannot send block " + std::to_string(q_block1.failed_block()) + " of a body");
  }

  // One block of a Q-Block2 answer. Every block carries the ETag and Size2 (RFC 9177 4.4);
  // a block of another ETag means the body changed, and the transfer starts over.
  void take_q_block2(const coap_pdu_t* received, const coap_opt_t* option) {
    QBlock2Receive& q = q_block2;
    if (q.restart) return;  // stragglers of the body given up
    coap_opt_iterator_t iterator;
    const coap_opt_t* etag_option = coap_check_option(received, COAP_OPTION_ETAG, &iterator);
    const coap_opt_t* size_option = coap_check_option(received, COAP_OPTION_SIZE2, &iterator);
    const auto block = decode_q_block(option);
    size_t length = 0;
    const uint8_t* data = nullptr;
    coap_get_data(received, &length, &data);
    if (!block || !etag_option || !size_option) {
      fail(TransportFailure::kOther, "the server at " + server_text +
                                         " sent a Q-Block2 block without a valid Q-Block2, ETag "
                                         "or Size2 option");
      return;
    }
    const std::uint64_t etag =
        coap_decode_var_bytes8(coap_opt_value(etag_option), coap_opt_length(etag_option));
    const std::size_t size =
        coap_decode_var_bytes8(coap_opt_value(size_option), coap_opt_length(size_option));
    if (q.active && (etag != q.etag || size != q.body_size || block->szx != q.szx)) {
      q.restart = true;  // the wait loop asks for the whole new body
      return;
    }
    const std::size_t block_size = std::size_t{1} << (block->szx + 4);
    if (!q.active) {
      if (size > kMaxQBlock2BodyBytes) {
        fail(TransportFailure::kOther,
             "the server at " + server_text + " announced a " + std::to_string(size) +
                 "-byte body (Size2); this client takes at most " +
                 std::to_string(kMaxQBlock2BodyBytes));
        return;
      }
      q.active = true;
      q.etag = etag;
      q.code = code_from_pdu(coap_pdu_get_code(received));
      q.szx = block->szx;
      q.body_size = size;
      q.blocks = static_cast<std::uint32_t>((size + block_size - 1) / block_size);
      q.body.assign(size, 0);
      q.have.assign(q.blocks, false);
      // A request for the whole body gets the first MAX_PAYLOADS blocks.
      q.asked_until = std::min<std::uint32_t>(
          q.blocks, static_cast<std::uint32_t>(options.timing.max_payloads));
      q.last_asked = q.asked_until == 0 ? 0 : q.asked_until - 1;
    }
    const std::size_t offset = std::size_t{block->num} * block_size;
    if (block->num >= q.blocks || length != std::min(block_size, size - offset)) {
      fail(TransportFailure::kOther, "the server at " + server_text + " sent Q-Block2 block " +
                                         std::to_string(block->num) + " of " +
                                         std::to_string(length) + " bytes, which does not fit a " +
                                         std::to_string(size) + "-byte body");
      return;
    }
    q.last_progress = std::chrono::steady_clock::now();
    if (block->num == q.last_asked) q.burst_ended = true;
    if (q.have[block->num]) return;  // a duplicate
    q.have[block->num] = true;
    if (length > 0) std::memcpy(q.body.data() + offset, data, length);
    if (++q.received < q.blocks) return;
    response.code = q.code;
    response.etag = q.etag;
    response.payload = std::move(q.body);
    done = true;
  }

  // Sends a request on the current session and returns its token; Q-Block2 options from
  // `q_block2` (ascending). Throws TransportError when it cannot be sent.
  std::vector<std::uint8_t> send_request(Method method, const std::string& path,
                                         std::span<const std::uint8_t> payload,
                                         const std::vector<QBlockValue>& q_block2) {
    uint8_t token_bytes[8];
    size_t token_length = 0;
    coap_session_new_token(session, &token_length, token_bytes);
    coap_pdu_t* pdu = new_request_pdu(COAP_MESSAGE_CON, method, path,
                                      {token_bytes, token_bytes + token_length});
    for (const QBlockValue& block : q_block2) {
      std::uint8_t buffer[4];
      coap_add_option(pdu, kOptionQBlock2, encode_q_block(buffer, block), buffer);
    }
    if (!payload.empty()) {
      auto* body = new std::vector<std::uint8_t>(payload.begin(), payload.end());
      if (!coap_add_data_large_request(session, pdu, body->size(), body->data(), release_payload,
                                       body)) {
        coap_delete_pdu(pdu);
        throw TransportError("cannot attach a " + std::to_string(payload.size()) + "-byte body");
      }
    }
    if (coap_send(session, pdu) == COAP_INVALID_MID) {
      drop_session();
      throw TransportError("coap_send failed");
    }
    return {token_bytes, token_bytes + token_length};
  }

  // A request PDU with the token, the Uri-Path and Uri-Query options of `path` and, for plain
  // CoAP, the declared identity. Throws TransportError when it cannot be allocated.
  coap_pdu_t* new_request_pdu(coap_pdu_type_t type, Method method, const std::string& path,
                              const std::vector<std::uint8_t>& token_bytes) {
    coap_pdu_t* pdu = coap_new_pdu(type, to_request_code(method), session);
    if (!pdu) throw TransportError("cannot allocate a CoAP request");
    coap_add_token(pdu, token_bytes.size(), token_bytes.data());
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
    if (options.plaintext && !options.psk.identity.empty()) {
      const std::string declared = "id=" + options.psk.identity;
      coap_add_option(pdu, COAP_OPTION_URI_QUERY, declared.size(),
                      reinterpret_cast<const uint8_t*>(declared.data()));
    }
    return pdu;
  }

  // A GET for the whole body with Q-Block2 (NUM 0, M set: RFC 9177 4.4).
  void ask_for_whole_body() {
    q_block2 = {};
    q_block2.asked = true;
    q_block2.last_progress = std::chrono::steady_clock::now();
    token = send_request(current_method, current_path, {}, {{0, true, 6}});
    q_block2.tokens.push_back(token);
  }

  // Called by the wait loop: after the last block of a burst came, or nothing came for
  // NON_RECEIVE_TIMEOUT (RFC 9177 7.2: 2 x NON_TIMEOUT, and NON_TIMEOUT = ACK_TIMEOUT), one
  // request for the missing blocks (M unset, each) and the next burst (M set), at most
  // MAX_PAYLOADS blocks in all: the server sends no burst it was not asked for.
  void step_q_block2() {
    QBlock2Receive& q = q_block2;
    if (!q.asked || done || !failure.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (q.restart) {
      ask_for_whole_body();
      return;
    }
    const auto receive_timeout = std::chrono::duration<double>(2 * options.timing.ack_timeout_seconds);
    const bool quiet = now - q.last_progress > receive_timeout;
    if (!q.active) {
      // The request itself is retransmitted by libcoap; its answer (block 0) and the burst
      // may all have been lost after libcoap saw one of them: ask once more.
      if (quiet) ask_for_whole_body();
      return;
    }
    if (!q.burst_ended && !quiet) return;
    const auto limit = static_cast<std::size_t>(options.timing.max_payloads);
    std::vector<QBlockValue> wanted;
    for (std::uint32_t n = 0; n < q.asked_until && wanted.size() < limit; ++n)
      if (!q.have[n]) wanted.push_back({n, false, q.szx});
    std::uint32_t last = wanted.empty() ? 0 : wanted.back().num;
    if (wanted.size() < limit && q.asked_until < q.blocks) {
      wanted.push_back({q.asked_until, true, q.szx});
      q.asked_until = std::min<std::uint32_t>(
          q.blocks, q.asked_until + static_cast<std::uint32_t>(limit - (wanted.size() - 1)));
      last = q.asked_until - 1;
    }
    q.burst_ended = false;
    q.last_progress = now;
    if (wanted.empty()) return;
    q.last_asked = last;
    try {
      q.tokens.push_back(send_request(current_method, current_path, {}, wanted));
    } catch (const TransportError& e) {
      fail(TransportFailure::kOther, e.what());
    }
  }

  static void on_nack(coap_session_t* session, const coap_pdu_t*, const coap_nack_reason_t reason,
                      const coap_mid_t mid) {
    const int error =
        errno;  // after an ICMP error: the failed read's (libcoap frees, logs nothing between)
    Impl* self = of(session);
    if (!self) return;
    if (mid != COAP_INVALID_MID && mid == self->probe_mid && reason != COAP_NACK_ICMP_ISSUE) {
      // libcoap reports the RST answering our own ping (a pong) as a nack; that the ping got
      // no answer at all is for step_liveness_probe() to decide.
      if (reason == COAP_NACK_RST) self->probe_answered();
      return;
    }
    if (self->done) return;
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

  // The request in flight on a session that answered before has heard nothing from the
  // server for `quiet`: send it a CoAP ping; a ping unanswered for `quiet` more means the
  // session is gone on the server's side (a server killed and restarted drops the old
  // session's records silently: no ICMP, no alert), and request() starts a fresh one.
  // Without this, libcoap retransmits into the void until MAX_RETRANSMIT (45 s at the
  // defaults) or its keepalive notices (~18 s): the workers of e2e_rounds_secure_aggregation
  // missed a secure round's step that way. `quiet` is the time by which the request's first
  // two retransmissions went unanswered, so a lossy link rarely pays more than a needless
  // ping; when it does, the cost is one handshake, since every request here is idempotent.
  void step_liveness_probe(std::chrono::steady_clock::time_point now) {
    const auto quiet = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(3 * options.timing.ack_timeout_seconds *
                                      options.timing.ack_random_factor));
    if (probe_mid == COAP_INVALID_MID) {
      if (now - last_heard_in_request < quiet) return;
      // NSTART 1 would hold a confirmable ping back behind the request (libcoap's delay
      // queue): let one more confirmable message through while the probe is out.
      coap_session_set_nstart(session, static_cast<uint16_t>(options.timing.nstart + 1));
      probe_mid = coap_session_send_ping(session);
      probe_sent = now;
      if (probe_mid == COAP_INVALID_MID) {
        coap_session_set_nstart(session, static_cast<uint16_t>(options.timing.nstart));
        last_heard_in_request = now;  // not established (yet): look again later
      } else {
        expect_probe_reset(probe_mid);
      }
      return;
    }
    if (now - probe_sent < quiet) return;
    ++silent_sessions;
    fail(TransportFailure::kSessionLost,
         "the session with " + server_text + " went silent: neither the request nor a CoAP ping " +
             "got an answer for " +
             std::to_string(static_cast<int>(
                 std::chrono::duration<double>(now - last_heard_in_request).count())) +
             " s (a server that restarted has forgotten its sessions)");
  }

  void probe_answered() {
    probe_mid = COAP_INVALID_MID;
    last_heard_in_request = std::chrono::steady_clock::now();
    if (session) coap_session_set_nstart(session, static_cast<uint16_t>(options.timing.nstart));
  }

  void drop_session() {
    probe_mid = COAP_INVALID_MID;
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
  // Known, so that libcoap hands answers carrying it to on_response (it drops a piggybacked
  // answer with an unknown critical option, and resets a non-confirmable one).
  coap_register_option(impl_->context, kOptionQBlock1);
  coap_register_option(impl_->context, kOptionQBlock2);
  coap_register_response_handler(impl_->context, &Impl::on_response);
  coap_register_nack_handler(impl_->context, &Impl::on_nack);
  coap_register_event_handler(impl_->context, &Impl::on_event);
}

CoapDtlsClient::~CoapDtlsClient() {
  impl_->drop_session();
  if (impl_->context) coap_free_context(impl_->context);
}

std::chrono::steady_clock::time_point request_deadline(
    std::chrono::steady_clock::time_point started, std::chrono::steady_clock::time_point last_heard,
    std::chrono::milliseconds timeout, std::chrono::milliseconds longest) {
  const auto first = started + timeout;
  if (longest <= timeout) return first;
  return std::min(started + longest, std::max(first, last_heard + timeout));
}

CoapResponse CoapDtlsClient::request(Method method, const std::string& path,
                                     std::span<const std::uint8_t> payload, int timeout_ms) {
  Impl& s = *impl_;
  const auto started = std::chrono::steady_clock::now();
  const auto timeout = std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : s.options.timeout_ms);
  const auto longest =
      std::chrono::milliseconds(timeout_ms > 0 ? 0 : s.options.longest_request_ms);
  // Moves with what the server answers when longest_request_ms allows (request_deadline()).
  auto deadline_now = [&] {
    return request_deadline(started, s.last_heard_in_request, timeout, longest);
  };
  auto send = [&] {
    if (!s.session) s.connect();
    s.done = false;
    s.failure.clear();
    s.failure_kind = TransportFailure::kOther;
    s.response = {};
    s.q_block2 = {};
    s.q_block2_refused = false;
    s.q_block1.reset();
    s.q_block1_refused = false;
    s.current_method = method;
    s.current_path = path;
    if (s.probe_mid != COAP_INVALID_MID) s.probe_answered();  // forget an earlier probe
    s.last_heard_in_request = std::chrono::steady_clock::now();
    if (method == Method::kGet && payload.empty() && s.options.timing.q_block &&
        !s.server_lacks_q_block2) {
      s.ask_for_whole_body();
    } else if ((method == Method::kPost || method == Method::kPut) && payload.size() > 1024 &&
               s.options.timing.q_block && !s.server_lacks_q_block1) {
      s.start_q_block1(payload);
    } else {
      s.token = s.send_request(method, path, payload, {});
    }
  };
  bool probe_if_silent = false;  // step_liveness_probe() while waiting
  // Every wait below looks at the stop flag at least every 100 ms.
  auto wait = [&] {
    while (!s.done && s.failure.empty()) {
      if (s.stop_requested()) {
        s.fail(TransportFailure::kInterrupted, "interrupted: the worker is stopping");
        return false;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline_now() - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - started);
        s.fail_silent(took <= timeout + std::chrono::milliseconds(100)
                          ? "within " + std::to_string(timeout.count()) + " ms"
                          : "within " + std::to_string(timeout.count()) +
                                " ms of the last answer (" + std::to_string(took.count()) +
                                " ms in all)");
        return false;  // no time left for anything else
      }
      coap_io_process(s.context, static_cast<uint32_t>(std::min<long long>(left.count(), 100)));
      if (s.dtls_closed && !s.done) s.fail_dtls();  // no-op when a nack has explained it
      if (probe_if_silent && s.session && !s.done && s.failure.empty())
        s.step_liveness_probe(std::chrono::steady_clock::now());
      s.step_q_block2();
      s.step_q_block1();
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
  probe_if_silent = reused_session;  // a new session's silence is the handshake's to explain
  send();
  bool time_left = wait();
  if (s.q_block2_refused || s.q_block1_refused) {
    // 4.02 Bad Option: a server without Q-Block (RFC 9177 4.4). RFC 7959 from now on.
    if (s.q_block2_refused) s.server_lacks_q_block2 = true;
    if (s.q_block1_refused) s.server_lacks_q_block1 = true;
    send();
    time_left = wait();
  }
  if (!s.done && reused_session && time_left) {
    const std::string first_failure = s.failure;
    s.drop_session();
    std::minstd_rand jitter(
        static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
    const auto pause = std::chrono::milliseconds(100 + jitter() % 200);
    if (std::chrono::steady_clock::now() + pause < deadline_now()) {
      if (pause_unless_stopped(pause)) {
        ++s.reconnections;
        probe_if_silent = false;
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
  if (s.probe_mid != COAP_INVALID_MID) s.probe_answered();  // the request is over
  s.q_block1.reset();  // the body is the caller's: nothing may send from it later
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

std::uint64_t CoapDtlsClient::silent_sessions() const { return impl_->silent_sessions; }

}  // namespace edgetrain::transport
