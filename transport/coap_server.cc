// The server half of coap_dtls.h: CoapDtlsServer and DeferredResponse on libcoap (Mbed TLS
// backend). C callbacks translate into C++ handlers here, and no exception ever crosses
// back into libcoap. A request goes through three steps (CoapDtlsServer::Impl::handle):
// build the CoapRequest from the PDU and the session (identity, payload, query), dispatch
// it (retransmission cache, checks, the resource's handler) and respond (code, ETag,
// block-wise body; nothing for a deferred answer).
#include "transport/coap_internal.h"

#include <mbedtls/ssl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>

#include "transport/handshake_guard.h"
#include "transport/handshake_watch.h"
#include "transport/identity.h"
#include "transport/libcoap_block_bodies.h"
#include "transport/socket_ingress.h"

namespace edgetrain::transport {

// libcoap_block_bodies.c reads libcoap's private session layout, which is 4.3.1's.
static_assert(std::string_view(LIBCOAP_PACKAGE_VERSION) == "4.3.1",
              "transport/libcoap_block_bodies.c reads libcoap 4.3.1's private layout: check it "
              "against this version");
namespace {

coap_request_t to_libcoap_method(Method method) {
  switch (method) {
    case Method::kGet:
      return COAP_REQUEST_GET;
    case Method::kPost:
      return COAP_REQUEST_POST;
    case Method::kPut:
      return COAP_REQUEST_PUT;
    case Method::kDelete:
      return COAP_REQUEST_DELETE;
  }
  return COAP_REQUEST_GET;
}

Method from_request_code(coap_pdu_code_t code) {
  switch (code) {
    case COAP_REQUEST_CODE_POST:
      return Method::kPost;
    case COAP_REQUEST_CODE_PUT:
      return Method::kPut;
    case COAP_REQUEST_CODE_DELETE:
      return Method::kDelete;
    default:
      return Method::kGet;
  }
}

// The subject CN of the certificate the peer of an established DTLS session presented
// (verified against the CA in the handshake), or nullopt if it presented none. libcoap
// 4.3.1's CN callback (validate_cn_call_back) is no help: its Mbed TLS backend calls it
// only for certificates that failed a check (cert_verify_callback_mbedtls returns early
// when the verification flags are 0), so the CN is read from Mbed TLS's session.
std::optional<std::string> certificate_name(const coap_session_t* session) {
  coap_tls_library_t library = COAP_TLS_LIBRARY_NOTLS;
  void* tls = coap_session_get_tls(session, &library);
  if (!tls || library != COAP_TLS_LIBRARY_MBEDTLS) return std::nullopt;
  // A certificate without a CN gives an empty identity, refused upstream.
  return detail::peer_certificate_name(*static_cast<const mbedtls_ssl_context*>(tls));
}

std::string address_string(const coap_address_t* address) {
  if (!address) return {};
  unsigned char text[INET6_ADDRSTRLEN + 8] = {};
  const size_t length = coap_print_addr(address, text, sizeof(text) - 1);
  return std::string(reinterpret_cast<const char*>(text), length);
}

}  // namespace

// What a separate response needs from its request: the session (referenced, so libcoap
// keeps it while the answer is pending), the token, and the Block1 option to echo (RFC 7959
// 2.3: the answer to the last block of a body carries its Block1 option).
struct DeferredResponse::State {
  std::set<State*>* registry = nullptr;  // the server's; null once the server is gone
  coap_session_t* session = nullptr;
  std::vector<std::uint8_t> token;
  std::vector<std::uint8_t> block1;
  bool has_block1 = false;

  void detach() {
    if (session) coap_session_release(session);
    session = nullptr;
    if (registry) registry->erase(this);
    registry = nullptr;
  }
  ~State() { detach(); }
};

DeferredResponse::DeferredResponse() = default;
DeferredResponse::DeferredResponse(std::unique_ptr<State> state) : state_(std::move(state)) {}
DeferredResponse::DeferredResponse(DeferredResponse&&) noexcept = default;
DeferredResponse& DeferredResponse::operator=(DeferredResponse&&) noexcept = default;
DeferredResponse::~DeferredResponse() = default;

void DeferredResponse::send(const CoapResponse& response) {
  std::unique_ptr<State> state = std::move(state_);
  if (!state || !state->session) return;
  coap_session_t* session = state->session;
  if (coap_session_get_state(session) != COAP_SESSION_STATE_ESTABLISHED) return;
  coap_pdu_t* pdu = coap_pdu_init(COAP_MESSAGE_CON,
                                  static_cast<coap_pdu_code_t>(COAP_RESPONSE_CODE(response.code)),
                                  coap_new_message_id(session), coap_session_max_pdu_size(session));
  if (!pdu) return;
  coap_add_token(pdu, state->token.size(), state->token.data());
  // Options in ascending number: ETag (4), Content-Format (12), Block1 (27).
  if (response.etag) {
    std::uint8_t buffer[8];
    coap_add_option(pdu, COAP_OPTION_ETAG,
                    coap_encode_var_safe8(buffer, sizeof(buffer), *response.etag), buffer);
  }
  if (!response.payload.empty()) {
    std::uint8_t buffer[4];
    coap_add_option(
        pdu, COAP_OPTION_CONTENT_FORMAT,
        coap_encode_var_safe(buffer, sizeof(buffer), COAP_MEDIATYPE_APPLICATION_OCTET_STREAM),
        buffer);
  }
  if (state->has_block1 && response.code / 100 == 2)
    coap_add_option(pdu, COAP_OPTION_BLOCK1, state->block1.size(), state->block1.data());
  if (!response.payload.empty())
    coap_add_data(pdu, std::min<std::size_t>(response.payload.size(), 512),
                  response.payload.data());
  coap_send(session, pdu);  // libcoap owns the pdu now, and retransmits it until ACKed
}

struct CoapDtlsServer::Impl {
  struct Resource {
    Impl* server = nullptr;
    std::map<Method, RequestHandler> handlers;
    coap_resource_t* resource = nullptr;  // owned by the context
  };

  Options options;
  coap_context_t* context = nullptr;
  coap_endpoint_t* endpoint = nullptr;
  coap_endpoint_t* plaintext_endpoint = nullptr;
  std::uint16_t bound_port = 0;
  std::uint16_t bound_plaintext_port = 0;
  std::vector<int> endpoint_fds;  // found after the fact: libcoap 4.3.1 keeps them private
  // run_once's batched reads (Options::datagrams_per_pass): libcoap's epoll descriptor (-1
  // when libcoap was built without epoll), the events handed to coap_io_do_epoll(), and
  // how many reads per ready endpoint the next pass tries.
  int coap_fd = -1;
  std::vector<epoll_event> batch;
  std::uint32_t reads_per_ready_endpoint = 1;
  bool epoll_prepared = false;  // run_once(): libcoap's timers armed by a first walk
  // run_once(): the last walk of the sessions, and whether one was skipped since (see
  // kWalkDeferral).
  std::chrono::steady_clock::time_point last_walk;
  bool walk_owed = false;
  // watch_wake_fd(): the descriptor (-1: none) and the address its epoll events carry, which
  // is no coap_socket_t, so such events never reach coap_io_do_epoll().
  int wake_fd = -1;
  char wake_marker = 0;
  detail::IngressCounters ingress;
  // Per session, the answer to the last non-idempotent request a handler saw, by CoAP
  // message id. libcoap 4.3.1 keeps no such cache: when the ACK of a request is lost, the
  // client's retransmission (same message id) reaches the handler again; with this it
  // gets the first answer back instead (RFC 7252, 4.5). The client has one request in
  // flight (NSTART 1), so one answer per session is enough. Entries go with the session.
  struct LastAnswer {
    coap_mid_t mid;
    CoapResponse reply;
  };
  std::map<const coap_session_t*, LastAnswer> last_answers;
  static constexpr std::size_t kMaxRememberedAnswerBytes = 1024;
  static constexpr int kRequestEntityIncomplete = 408;
  std::map<std::string, std::unique_ptr<Resource>> resources;
  // The key handed to libcoap by the identity callback; Mbed TLS copies it before the
  // callback's caller returns, so one buffer suffices.
  std::vector<std::uint8_t> current_key;
  coap_bin_const_t current_key_view{};
  // Deferred responses not yet sent: cut loose from their sessions before the context goes.
  std::set<DeferredResponse::State*> deferred;
  // Sessions whose key was revoked (Options::current_psk), referenced until run_once closes
  // them: after the 4.01 that says so has gone out.
  std::vector<coap_session_t*> revoked_sessions;
  // The front guard of the DTLS endpoint (handshake_guard.h) and when run_once next looks
  // at the pending handshakes.
  std::unique_ptr<detail::HandshakeGuard> guard;
  detail::GuardClock::time_point next_handshake_sweep{};
  detail::GuardClock::time_point next_idle_source_sweep{};

  // Block-wise request bodies (Block1) being assembled, one per session. libcoap 4.3.1's
  // own assembly (COAP_BLOCK_SINGLE_BODY) has no size limit: it allocates what Size1
  // announces and grows the body with every block until the last one, so a 256 MiB POST
  // was held whole before any handler could answer 4.13. Without that flag libcoap hands
  // each block to handle() and answers 2.31 Continue for us; the body is built here,
  // within Options::max_body_bytes and max_bodies_in_progress.
  struct Assembly {
    std::vector<std::uint8_t> body;
    std::chrono::steady_clock::time_point last_block;
  };
  std::map<const coap_session_t*, Assembly> assemblies;
  std::uint64_t bodies_refused = 0;
  std::uint64_t request_bodies_forgotten =
      0;  // libcoap's records freed early (libcoap_block_bodies.h)
  static constexpr int kContinue = 231;
  static constexpr int kServiceUnavailable = 503;
  // A body whose sender went quiet this long gives its place up to a new one (libcoap
  // itself forgets an idle session only after 300 s).
  static constexpr std::chrono::seconds kIdleBodyTimeout{60};

  // Q-Block2 (RFC 9177; transport/README.md, "Q-Block"): per session, the body of the last
  // GET asked for with Q-Block2, kept so that the requests for its next bursts and for
  // missing blocks are served without running the handler again. At most
  // max_bodies_in_progress are kept (the one asked for longest ago goes first) and none
  // beyond kHeldBodyTimeout; a request for a body no longer kept runs the handler again,
  // and if the body changed meanwhile, its new ETag tells the client to start over.
  struct HeldBody {
    std::string resource_key;  // Uri-Path + "?" + Uri-Query: which GET it answers
    std::shared_ptr<const std::vector<std::uint8_t>> body;
    std::uint64_t etag = 0;
    int code = CoapCode::kContent;
    std::chrono::steady_clock::time_point last_request;
  };
  std::map<const coap_session_t*, HeldBody> held_bodies;
  // Blocks of a burst after its first (which rides in the answer to the request): sent as
  // non-confirmable responses with the request's token once libcoap has sent that answer,
  // at the end of the pass (send_queued_blocks()).
  struct QueuedBlocks {
    coap_session_t* session = nullptr;  // referenced until sent
    std::vector<std::uint8_t> token;
    HeldBody held;
    std::uint32_t szx = 6;
    std::vector<std::uint32_t> nums;
  };
  std::vector<QueuedBlocks> queued_blocks;
  // Read by other threads (q_block2_bodies_served(), q_block2_bodies_held()).
  std::atomic<std::uint64_t> q_block2_bodies_served{0};
  std::atomic<std::size_t> q_block2_bodies_held{0};
  static constexpr std::chrono::seconds kHeldBodyTimeout{10};

  // Q-Block1 (RFC 9177) request bodies being assembled, one per session, its blocks in any
  // order; counted with `assemblies` against max_bodies_in_progress and the idle timeout.
  // All blocks of one body carry one token (ours), which tells a new body from the
  // stragglers of the last one.
  struct QBlock1Assembly {
    std::vector<std::uint8_t> token;
    std::vector<std::uint8_t> body;
    std::vector<bool> have;
    std::uint32_t szx = 6;
    std::uint32_t blocks = 0;
    std::uint32_t received = 0;
    std::uint32_t seen_until = 0;  // past the last burst's end seen
    std::chrono::steady_clock::time_point last_block;
  };
  std::map<const coap_session_t*, QBlock1Assembly> q_block1_assemblies;
  // The answer given to the session's last whole Q-Block1 body, for late blocks and probes
  // of it (code 0: answered later, by a deferred response).
  struct QBlock1Done {
    std::vector<std::uint8_t> token;
    CoapResponse reply;
  };
  std::map<const coap_session_t*, QBlock1Done> q_block1_done;
  static constexpr int kMissingBlocksFormat = 272;  // application/missing-blocks+cbor-seq

  // What the request's payload amounts to: the whole body (the request's own payload, or
  // the assembled blocks), a block to acknowledge with 2.31 Continue, or a refusal.
  struct BodyStep {
    enum Kind { kWhole, kContinue, kRefused } kind = kWhole;
    std::span<const std::uint8_t> body;
    CoapResponse refusal;
    bool assembled = false;  // `body` lives in `assemblies` until the handler has run
  };

  BodyStep refuse_body(const coap_session_t* session, int code, const std::string& why) {
    assemblies.erase(session);
    ++bodies_refused;
    return {BodyStep::kRefused, {}, text_reply(code, why)};
  }

  // Makes room for a new body if an idle one can go; false when the bound holds.
  bool room_for_a_body() {
    if (assemblies.size() + q_block1_assemblies.size() < options.max_bodies_in_progress)
      return true;
    const auto now = std::chrono::steady_clock::now();
    auto idle = [&](const auto& entry) { return now - entry.second.last_block > kIdleBodyTimeout; };
    std::erase_if(assemblies, idle);
    std::erase_if(q_block1_assemblies, idle);
    return assemblies.size() + q_block1_assemblies.size() < options.max_bodies_in_progress;
  }

  BodyStep take_block(const coap_session_t* session, const coap_pdu_t* request) {
    size_t length = 0;
    const uint8_t* data = nullptr;
    coap_get_data(request, &length, &data);
    const std::string limit = ", the limit is " + std::to_string(options.max_body_bytes);
    coap_block_b_t block{};
    if (!coap_get_block_b(session, request, COAP_OPTION_BLOCK1, &block)) {
      if (length > options.max_body_bytes)
        return refuse_body(session, CoapCode::kRequestEntityTooLarge,
                           "body of " + std::to_string(length) + " bytes" + limit);
      return {BodyStep::kWhole, {data, length}, {}};
    }
    coap_opt_iterator_t iterator;
    if (const coap_opt_t* size1 = coap_check_option(request, COAP_OPTION_SIZE1, &iterator)) {
      const std::size_t announced =
          coap_decode_var_bytes8(coap_opt_value(size1), coap_opt_length(size1));
      if (announced > options.max_body_bytes)
        return refuse_body(
            session, CoapCode::kRequestEntityTooLarge,
            "body of " + std::to_string(announced) + " bytes announced (Size1)" + limit);
    }
    const std::size_t offset = std::size_t{block.num} << (block.szx + 4);
    if (offset + length > options.max_body_bytes)
      return refuse_body(session, CoapCode::kRequestEntityTooLarge,
                         "body passes " + std::to_string(offset + length) + " bytes at block " +
                             std::to_string(block.num) + limit);
    auto it = assemblies.find(session);
    if (block.num == 0) {
      if (!block.m) {
        if (it != assemblies.end()) assemblies.erase(it);
        return {BodyStep::kWhole, {data, length}, {}};
      }
      if (it == assemblies.end()) {
        if (!room_for_a_body())
          return refuse_body(session, kServiceUnavailable,
                             std::to_string(options.max_bodies_in_progress) +
                                 " block-wise bodies in progress: retry later");
        it = assemblies.emplace(session, Assembly{}).first;
      }
      it->second.body.clear();  // block 0 (again) starts the body afresh
    } else if (it == assemblies.end() || offset > it->second.body.size()) {
      // A block without its predecessors: e.g. libcoap 4.3.1 hands over a retransmitted
      // last block, whose ACK was lost, after the body was complete.
      return refuse_body(session, kRequestEntityIncomplete, "incomplete block-wise body");
    }
    std::vector<std::uint8_t>& body = it->second.body;
    if (offset + length > body.size()) {
      // Grow geometrically, but never past the limit, whatever the peer announced.
      if (body.capacity() < offset + length)
        body.reserve(
            std::min(options.max_body_bytes, std::max(offset + length, 2 * body.capacity())));
      body.resize(offset + length);
    }
    if (length > 0) std::memcpy(body.data() + offset, data, length);
    it->second.last_block = std::chrono::steady_clock::now();
    if (block.m) return {BodyStep::kContinue, {}, {}};
    body.resize(offset + length);
    return {BodyStep::kWhole, body, {}, true};
  }

  static const coap_bin_const_t* validate_identity(coap_bin_const_t* identity,
                                                   coap_session_t* session, void* arg) {
    auto* self = static_cast<Impl*>(arg);
    if (!identity || !self->options.psk_lookup) return nullptr;
    try {
      std::string_view id(reinterpret_cast<const char*>(identity->s), identity->length);
      auto key = self->options.psk_lookup(id);
      if (!key || key->empty()) return nullptr;  // unknown identity: refuse the handshake
      if (self->guard) self->guard->note_known_identity(session, std::string(id));
      self->current_key = std::move(*key);
      self->current_key_view.s = self->current_key.data();
      self->current_key_view.length = self->current_key.size();
      return &self->current_key_view;
    } catch (...) {
      return nullptr;
    }
  }

  static int on_event(coap_session_t* session, const coap_event_t event) {
    auto* self = static_cast<Impl*>(coap_get_app_data(coap_session_get_context(session)));
    if (!self) return 0;
    if (event == COAP_EVENT_SERVER_SESSION_NEW) apply_timing(session, self->options.timing);
    if (event == COAP_EVENT_SERVER_SESSION_DEL) {
      self->last_answers.erase(session);
      self->assemblies.erase(session);
      self->held_bodies.erase(session);
      self->q_block1_assemblies.erase(session);
      self->q_block1_done.erase(session);
      self->q_block2_bodies_held = self->held_bodies.size();
    }
    self->track_handshake(session, event);
    return 0;
  }

  // Handshake bookkeeping for the guard: a DTLS session libcoap makes is a pending handshake
  // until it is established (seen by sweep_handshakes), fails or is deleted.
  void track_handshake(coap_session_t* session, coap_event_t event) {
    if (!guard || coap_session_get_proto(session) != COAP_PROTO_DTLS) return;
    if (event == COAP_EVENT_SERVER_SESSION_NEW) {
      const coap_address_t* remote = coap_session_get_addr_remote(session);
      guard->handshake_started(session, detail::peer_address(&remote->addr.sa, remote->size),
                               detail::GuardClock::now());
    } else if (event == COAP_EVENT_DTLS_ERROR && guard->is_pending(session)) {
      report_handshake_failure(session, guard->handshake_ended(session),
                               "wrong key or corrupted handshake");
    } else if (event == COAP_EVENT_SERVER_SESSION_DEL) {
      guard->handshake_ended(session);
    }
  }

  // Only identities psk_lookup knew are reported: a known device with a wrong key (or a
  // stolen name) is worth an operator's attention; unknown names are psk_lookup's to report.
  void report_handshake_failure(coap_session_t* session, const std::optional<std::string>& identity,
                                const char* reason) {
    if (!identity || !options.on_handshake_failure) return;
    try {
      options.on_handshake_failure(
          {*identity, address_string(coap_session_get_addr_remote(session)), reason});
    } catch (...) {  // never into libcoap
    }
  }

  // Every 100 ms: established handshakes stop being pending; handshakes past their deadline
  // are ended (libcoap frees the session in its next pass). libcoap 4.3.1 frees a server
  // session only after COAP_EVENT_SERVER_SESSION_DEL, which removes it from the guard, so
  // every session the guard lists is alive.
  void sweep_handshakes() {
    const auto now = detail::GuardClock::now();
    if (!guard || now < next_handshake_sweep) return;
    next_handshake_sweep = now + std::chrono::milliseconds(100);
    for (const void* key : guard->pending_sessions()) {
      auto* session = static_cast<coap_session_t*>(const_cast<void*>(key));
      if (coap_session_get_state(session) == COAP_SESSION_STATE_ESTABLISHED)
        guard->handshake_ended(session);
    }
    for (const auto& [key, peer] : guard->overdue(now)) {
      auto* session = static_cast<coap_session_t*>(const_cast<void*>(key));
      report_handshake_failure(session, guard->handshake_ended(session), "timed out");
      guard->count_timed_out();
      coap_session_disconnected(session, COAP_NACK_TLS_FAILED);
    }
    if (now >= next_idle_source_sweep) {
      guard->forget_idle_sources(now);
      next_idle_source_sweep = now + std::chrono::seconds(10);
    }
  }

  // The declared identity of a plain CoAP request: the value of its `id` URI query.
  static std::string declared_identity(const coap_string_t* query) {
    if (!query || !query->s) return {};
    std::string_view text(reinterpret_cast<const char*>(query->s), query->length);
    while (!text.empty()) {
      const auto amp = text.find('&');
      const std::string_view item = text.substr(0, amp);
      if (item.substr(0, 3) == "id=")
        return std::string(item.substr(3));  // a CoAP option: at most 255 bytes
      if (amp == std::string_view::npos) break;
      text.remove_prefix(amp + 1);
    }
    return {};
  }

  // Step 1, build: the CoapRequest a handler sees, from the PDU and its session. The
  // identity comes from the session (PSK identity or certificate CN), or for plain CoAP from
  // the declared ?id=NAME; `payload` is `body` (the PDU's payload or an assembled body).
  static CoapRequest build_request(Resource& entry, coap_session_t* session,
                                   const coap_pdu_t* request, const coap_string_t* query,
                                   bool& deferred, std::span<const std::uint8_t> body) {
    CoapRequest req;
    req.method = from_request_code(coap_pdu_get_code(request));
    if (coap_pdu_get_type(request) == COAP_MESSAGE_CON) {
      req.defer = [&deferred, &entry, session, request] {
        auto state = std::make_unique<DeferredResponse::State>();
        state->session = coap_session_reference(session);
        const coap_bin_const_t token = coap_pdu_get_token(request);
        state->token.assign(token.s, token.s + token.length);
        coap_opt_iterator_t options;
        if (coap_opt_t* block1 = coap_check_option(request, COAP_OPTION_BLOCK1, &options)) {
          state->has_block1 = true;
          state->block1.assign(coap_opt_value(block1),
                               coap_opt_value(block1) + coap_opt_length(block1));
        }
        state->registry = &entry.server->deferred;
        state->registry->insert(state.get());
        deferred = true;
        return DeferredResponse(std::move(state));
      };
    }
    req.peer_address = address_string(coap_session_get_addr_remote(session));
    if (coap_session_get_proto(session) != COAP_PROTO_DTLS) {
      req.authentication = PeerAuthentication::kNone;
      req.identity = declared_identity(query);
    } else if (const coap_bin_const_t* id = coap_session_get_psk_identity(session);
               id && id->length > 0) {
      req.authentication = PeerAuthentication::kPsk;
      req.identity.assign(reinterpret_cast<const char*>(id->s), id->length);
    } else if (auto name = certificate_name(session)) {
      req.authentication = PeerAuthentication::kCertificate;
      req.identity = *name;
    }
    req.payload = body;
    if (query && query->s) req.query.assign(reinterpret_cast<const char*>(query->s), query->length);
    return req;
  }

  // Whether `session` is a PSK session whose identity now has another key or none
  // (Options::current_psk); such a session is queued for closing.
  static bool session_key_revoked(Impl& server, coap_session_t* session) {
    if (!server.options.current_psk || coap_session_get_proto(session) != COAP_PROTO_DTLS)
      return false;
    const coap_bin_const_t* id = coap_session_get_psk_identity(session);
    const coap_bin_const_t* key = coap_session_get_psk_key(session);
    if (!id || id->length == 0 || !key) return false;
    const auto now = server.options.current_psk(
        std::string_view(reinterpret_cast<const char*>(id->s), id->length));
    if (now && now->size() == key->length && std::equal(now->begin(), now->end(), key->s))
      return false;
    if (std::find(server.revoked_sessions.begin(), server.revoked_sessions.end(), session) ==
        server.revoked_sessions.end())
      server.revoked_sessions.push_back(coap_session_reference(session));
    return true;
  }

  void close_revoked_sessions() {
    for (coap_session_t* session : revoked_sessions) {
      coap_session_disconnected(session, COAP_NACK_TLS_FAILED);
      coap_session_release(session);
    }
    revoked_sessions.clear();
  }

  static CoapResponse text_reply(int code, const std::string& why) {
    return {code, std::vector<std::uint8_t>(why.begin(), why.end())};
  }

  // Step 2, dispatch: the answer to a request, from the retransmission cache, a refusal
  // that no handler sees, or the resource's handler. Never throws. `deferred`: the handler
  // (or the request it retransmits) answers later; the returned reply is then ignored.
  // `whole_body`: a body assembled elsewhere (Q-Block1), handed to the handler as it is.
  static CoapResponse dispatch(Resource& entry, coap_session_t* session, const coap_pdu_t* request,
                               const coap_string_t* query, bool& deferred,
                               const std::vector<std::uint8_t>* whole_body = nullptr) {
    Impl& server = *entry.server;
    const coap_mid_t mid = coap_pdu_get_mid(request);
    const bool idempotent = coap_pdu_get_code(request) == COAP_REQUEST_CODE_GET;
    const auto last = server.last_answers.find(session);
    if (!idempotent && last != server.last_answers.end() && last->second.mid == mid) {
      deferred = last->second.reply.code == 0;  // answered later: acknowledge it empty again
      return last->second.reply;  // a retransmission of a request the handler already answered
    }
    CoapResponse reply;
    bool assembled = false;
    try {
      const BodyStep step = whole_body ? BodyStep{BodyStep::kWhole, *whole_body, {}}
                                       : server.take_block(session, request);
      assembled = step.assembled;
      if (step.kind != BodyStep::kWhole) {
        reply = step.kind == BodyStep::kContinue ? CoapResponse(kContinue) : step.refusal;
        remember_answer(server, session, mid, idempotent, reply);
        return reply;
      }
      if (session_key_revoked(server, session)) {
        reply = text_reply(CoapCode::kUnauthorized,
                           "session key revoked: this device was re-keyed or removed "
                           "(edgetrain-server rotate-key / remove-device)");
        if (assembled) server.assemblies.erase(session);
        remember_answer(server, session, mid, idempotent, reply);
        return reply;
      }
      const CoapRequest req = build_request(entry, session, request, query, deferred, step.body);
      auto it = entry.handlers.find(req.method);
      if (req.authentication == PeerAuthentication::kCertificate &&
          !is_plain_identity(req.identity)) {
        // Identities end up in logs, the WAL and /status: only plain names (transport/identity.h).
        reply = text_reply(CoapCode::kForbidden,
                           "certificate subject CN is not a plain name (1..64 of [A-Za-z0-9._-])");
      } else if (it == entry.handlers.end()) {
        reply.code = 405;
      } else {
        reply = it->second(req);
      }
    } catch (const std::exception& e) {
      deferred = false;  // answered now; a handle the handler kept can only send a late duplicate
      reply = text_reply(CoapCode::kInternalServerError, e.what());
    } catch (...) {
      deferred = false;
      reply = CoapResponse(CoapCode::kInternalServerError);
    }
    if (assembled) server.assemblies.erase(session);  // the body went to its handler
    if (deferred) reply = {};                         // remembered as "answered later" (code 0)
    remember_answer(server, session, mid, idempotent, reply);
    return reply;
  }

  static void remember_answer(Impl& server, const coap_session_t* session, coap_mid_t mid,
                              bool idempotent, const CoapResponse& reply) {
    if (idempotent || reply.payload.size() > kMaxRememberedAnswerBytes) return;
    try {
      server.last_answers[session] = {mid, reply};
    } catch (...) {
    }
  }

  // Step 3, respond: `reply` into libcoap's response PDU (code, ETag, a body of any size
  // with block-wise transfer).
  static void respond(coap_resource_t* resource, coap_session_t* session, const coap_pdu_t* request,
                      const coap_string_t* query, coap_pdu_t* response, CoapResponse reply) {
    coap_pdu_set_code(response, static_cast<coap_pdu_code_t>(COAP_RESPONSE_CODE(reply.code)));
    if (reply.etag) {
      // Single-block bodies: libcoap adds no ETag itself. Block-wise bodies: libcoap
      // replaces this option with its `etag` argument below, in every block.
      std::uint8_t buffer[8];
      std::size_t length = coap_encode_var_safe8(buffer, sizeof(buffer), *reply.etag);
      if (length == 0) {  // 0 encodes as no bytes, but an ETag has 1 to 8 (RFC 7252 5.10.6): peers
                          // drop the PDU
        buffer[0] = 0;
        length = 1;
      }
      coap_add_option(response, COAP_OPTION_ETAG, length, buffer);
    }
    if (reply.code == CoapCode::kRequestEntityTooLarge) {
      // RFC 7959 2.9.3: Size1 in a 4.13 tells the client the largest body it may send.
      const auto* entry = static_cast<const Resource*>(coap_resource_get_userdata(resource));
      std::uint8_t buffer[8];
      coap_add_option(
          response, COAP_OPTION_SIZE1,
          coap_encode_var_safe8(buffer, sizeof(buffer), entry->server->options.max_body_bytes),
          buffer);
    }
    if (!reply.payload.empty()) {
      auto* body = new std::vector<std::uint8_t>(std::move(reply.payload));
      coap_add_data_large_response(
          resource, session, request, response, query, COAP_MEDIATYPE_APPLICATION_OCTET_STREAM, -1,
          reply.etag.value_or(0), body->size(), body->data(), release_payload, body);
    }
  }

  // libcoap's handler of every method of every resource.
  static void handle(coap_resource_t* resource, coap_session_t* session, const coap_pdu_t* request,
                     const coap_string_t* query, coap_pdu_t* response) {
    auto* entry = static_cast<Resource*>(coap_resource_get_userdata(resource));
    // One body per session is assembled here, so libcoap needs no record of older ones, and
    // none at all once the last block of this one is in (libcoap_block_bodies.h). A request
    // without Block1 (a GET between two blocks of a POST) leaves the records alone.
    coap_block_b_t block{};
    if (coap_get_block_b(session, request, COAP_OPTION_BLOCK1, &block))
      entry->server->request_bodies_forgotten +=
          edgetrain_forget_request_bodies(session, block.m ? 1 : 0);
    if (entry->server->options.timing.q_block &&
        coap_pdu_get_code(request) == COAP_REQUEST_CODE_GET &&
        serve_q_block2(*entry, resource, session, request, query, response))
      return;
    if (entry->server->options.timing.q_block &&
        take_q_block1(*entry, resource, session, request, query, response))
      return;
    bool deferred = false;
    CoapResponse reply = dispatch(*entry, session, request, query, deferred);
    // Answered later: leaving the response code 0 makes libcoap send an empty ACK.
    if (deferred) return;
    respond(resource, session, request, query, response, std::move(reply));
  }

  // The blocks a GET's Q-Block2 options ask for, in ascending order, each once (RFC 9177
  // 4.4: M unset asks for that block alone, M set for that block and all after it).
  // Returns false when the request has no Q-Block2 option or a malformed one.
  static bool wanted_blocks(const coap_pdu_t* request, std::uint32_t& szx,
                            std::vector<std::pair<std::uint32_t, bool>>& wanted) {
    coap_opt_filter_t filter;
    coap_option_filter_clear(&filter);
    coap_option_filter_set(&filter, kOptionQBlock2);
    coap_opt_iterator_t iterator;
    coap_option_iterator_init(request, &iterator, &filter);
    while (const coap_opt_t* option = coap_option_next(&iterator)) {
      const auto block = decode_q_block(option);
      if (!block || wanted.size() >= 1024) return false;
      szx = std::min(szx, block->szx);
      wanted.emplace_back(block->num, block->more);
    }
    return !wanted.empty();
  }

  // A request block carrying Q-Block1 (RFC 9177 4.3): kept; at the end of a burst (every
  // MAX_PAYLOADS-th block, and the body's last) answered 2.31 Continue when every block so
  // far has come, else 4.08 with the missing blocks' numbers; a block that fills the last
  // gap is answered as a burst end. The whole body goes to the handler once. Other blocks
  // get no answer (a non-confirmable one: nothing; a confirmable one: an empty ACK). The
  // body cap, max_bodies_in_progress and the idle timeout hold as for Block1. Returns false
  // for a request without Q-Block1.
  static bool take_q_block1(Resource& entry, coap_resource_t* resource, coap_session_t* session,
                            const coap_pdu_t* request, const coap_string_t* query,
                            coap_pdu_t* response) {
    coap_opt_iterator_t iterator;
    const coap_opt_t* option = coap_check_option(request, kOptionQBlock1, &iterator);
    if (!option) return false;
    Impl& server = *entry.server;
    auto answer = [&](CoapResponse reply) {
      respond(resource, session, request, query, response, std::move(reply));
      return true;
    };
    auto refuse = [&](int code, const std::string& why) {
      server.q_block1_assemblies.erase(session);
      ++server.bodies_refused;
      return answer(text_reply(code, why));
    };
    const auto block = decode_q_block(option);
    const coap_opt_t* size1 = coap_check_option(request, COAP_OPTION_SIZE1, &iterator);
    if (!block || !size1)
      return answer(text_reply(CoapCode::kBadRequest,
                               "a Q-Block1 block needs a valid Q-Block1 and a Size1 option"));
    const coap_bin_const_t token = coap_pdu_get_token(request);
    const std::vector<std::uint8_t> token_bytes(token.s, token.s + token.length);
    // A block of a body already handed to the handler: its answer again (or nothing, when
    // the handler answers later; libcoap then sends an empty ACK to a confirmable block).
    if (const auto done = server.q_block1_done.find(session);
        done != server.q_block1_done.end() && done->second.token == token_bytes) {
      if (done->second.reply.code == 0) return true;
      return answer(done->second.reply);
    }
    const std::size_t size =
        coap_decode_var_bytes8(coap_opt_value(size1), coap_opt_length(size1));
    const std::string limit = ", the limit is " + std::to_string(server.options.max_body_bytes);
    if (size > server.options.max_body_bytes)
      return refuse(CoapCode::kRequestEntityTooLarge,
                    "body of " + std::to_string(size) + " bytes announced (Size1)" + limit);
    const std::size_t block_size = std::size_t{1} << (block->szx + 4);
    const std::size_t offset = std::size_t{block->num} * block_size;
    size_t length = 0;
    const uint8_t* data = nullptr;
    coap_get_data(request, &length, &data);
    if (offset >= std::max<std::size_t>(size, 1) ||
        length != std::min(block_size, size - std::min(size, offset)) ||
        block->more != (offset + length < size))
      return refuse(CoapCode::kBadRequest, "Q-Block1 block " + std::to_string(block->num) +
                                               " of " + std::to_string(length) +
                                               " bytes does not fit a " + std::to_string(size) +
                                               "-byte body");
    auto it = server.q_block1_assemblies.find(session);
    if (it != server.q_block1_assemblies.end() &&
        (it->second.token != token_bytes || it->second.body.size() != size ||
         it->second.szx != block->szx)) {
      server.q_block1_assemblies.erase(it);  // a new body: the old one is given up
      it = server.q_block1_assemblies.end();
    }
    if (it == server.q_block1_assemblies.end()) {
      if (!server.room_for_a_body())
        return refuse(kServiceUnavailable, std::to_string(server.options.max_bodies_in_progress) +
                                               " block-wise bodies in progress: retry later");
      QBlock1Assembly fresh;
      fresh.token = token_bytes;
      fresh.szx = block->szx;
      fresh.blocks = static_cast<std::uint32_t>((size + block_size - 1) / block_size);
      fresh.body.assign(size, 0);  // at most max_body_bytes, checked above
      fresh.have.assign(fresh.blocks, false);
      it = server.q_block1_assemblies.emplace(session, std::move(fresh)).first;
    }
    QBlock1Assembly& body = it->second;
    body.last_block = std::chrono::steady_clock::now();
    const bool fills_a_gap = !body.have[block->num] && block->num < body.seen_until;
    if (!body.have[block->num]) {
      body.have[block->num] = true;
      ++body.received;
      if (length > 0) std::memcpy(body.body.data() + offset, data, length);
    }
    const auto max_payloads = static_cast<std::uint32_t>(server.options.timing.max_payloads);
    const bool burst_end = !block->more || block->num % max_payloads == max_payloads - 1;
    if (burst_end) body.seen_until = std::max(body.seen_until, block->num + 1);
    std::vector<std::uint32_t> missing;
    for (std::uint32_t n = 0; n < body.seen_until && missing.size() < 64; ++n)
      if (!body.have[n]) missing.push_back(n);
    if (!burst_end && !(fills_a_gap && missing.empty())) return true;  // no answer yet
    if (!missing.empty()) {
      if (!burst_end) return true;  // gaps left: the client asks again after its timeout
      CoapResponse incomplete(kRequestEntityIncomplete, cbor_unsigned_sequence(missing));
      coap_pdu_set_code(response, static_cast<coap_pdu_code_t>(COAP_RESPONSE_CODE(kRequestEntityIncomplete)));
      std::uint8_t buffer[4];
      coap_add_option(response, COAP_OPTION_CONTENT_FORMAT,
                      coap_encode_var_safe(buffer, sizeof buffer, kMissingBlocksFormat), buffer);
      coap_add_data(response, incomplete.payload.size(), incomplete.payload.data());
      return true;
    }
    if (body.received < body.blocks) {
      // Every block of the bursts so far: 2.31 Continue, echoing Q-Block1 (RFC 9177 4.3).
      coap_pdu_set_code(response, static_cast<coap_pdu_code_t>(COAP_RESPONSE_CODE(kContinue)));
      std::uint8_t buffer[4];
      coap_add_option(response, kOptionQBlock1,
                      encode_q_block(buffer, {body.seen_until - 1, true, body.szx}), buffer);
      return true;
    }
    // The whole body: to the handler, once.
    std::vector<std::uint8_t> whole = std::move(body.body);
    server.q_block1_assemblies.erase(it);
    bool deferred = false;
    CoapResponse reply = dispatch(entry, session, request, query, deferred, &whole);
    server.q_block1_done[session] = {token_bytes, deferred ? CoapResponse{} : reply};
    if (deferred) return true;
    return answer(std::move(reply));
  }

  // A CBOR sequence of unsigned integers (RFC 8742; RFC 9177 5's missing-blocks list).
  static std::vector<std::uint8_t> cbor_unsigned_sequence(const std::vector<std::uint32_t>& values) {
    std::vector<std::uint8_t> out;
    for (std::uint32_t v : values) {
      if (v < 24) {
        out.push_back(static_cast<std::uint8_t>(v));
      } else if (v < 256) {
        out.insert(out.end(), {24, static_cast<std::uint8_t>(v)});
      } else if (v < 65536) {
        out.insert(out.end(), {25, static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v)});
      } else {
        out.insert(out.end(), {26, static_cast<std::uint8_t>(v >> 24), static_cast<std::uint8_t>(v >> 16),
                               static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v)});
      }
    }
    return out;
  }

  // A GET carrying Q-Block2: answers with up to MAX_PAYLOADS of the wanted blocks, the first
  // in `response`, the others queued. Returns false to leave the request to the ordinary
  // path (no Q-Block2 option).
  static bool serve_q_block2(Resource& entry, coap_resource_t* resource, coap_session_t* session,
                             const coap_pdu_t* request, const coap_string_t* query,
                             coap_pdu_t* response) {
    Impl& server = *entry.server;
    std::uint32_t szx = 6;
    std::vector<std::pair<std::uint32_t, bool>> wanted;
    coap_opt_iterator_t probe;
    if (!coap_check_option(request, kOptionQBlock2, &probe)) return false;
    if (!wanted_blocks(request, szx, wanted)) {
      respond(resource, session, request, query, response,
              text_reply(CoapCode::kBadRequest, "malformed Q-Block2 option"));
      return true;
    }
    // Leave room in the datagram for the header and the options (token, ETag,
    // Content-Format, Size2, Q-Block2: at most 31 bytes).
    while (szx > 0 && (std::size_t{1} << (szx + 4)) + 64 > coap_session_max_pdu_size(session)) --szx;
    const std::size_t block_size = std::size_t{1} << (szx + 4);
    const coap_str_const_t* uri = coap_resource_get_uri_path(resource);
    std::string key(reinterpret_cast<const char*>(uri->s), uri->length);
    if (query && query->s) key.append("?").append(reinterpret_cast<const char*>(query->s), query->length);
    const bool whole_body = wanted.size() == 1 && wanted[0].first == 0 && wanted[0].second;
    const auto now = std::chrono::steady_clock::now();
    auto held = server.held_bodies.find(session);
    if (held != server.held_bodies.end() &&
        (whole_body || held->second.resource_key != key || now - held->second.last_request > kHeldBodyTimeout)) {
      server.held_bodies.erase(held);  // a new transfer, or one for another body
      held = server.held_bodies.end();
    }
    if (held == server.held_bodies.end()) {
      bool deferred = false;
      CoapResponse reply = dispatch(entry, session, request, query, deferred);
      if (deferred) return true;  // answered later, without Q-Block2
      if (reply.code / 100 != 2 || reply.payload.size() <= block_size) {
        // Errors and bodies of one block go as they are; an answer without Q-Block2 is a
        // whole body to the client.
        respond(resource, session, request, query, response, std::move(reply));
        return true;
      }
      server.make_room_for_held_body(now);
      HeldBody body;
      body.resource_key = key;
      body.etag = reply.etag ? *reply.etag : fnv1a64(reply.payload);
      body.code = reply.code;
      body.body = std::make_shared<const std::vector<std::uint8_t>>(std::move(reply.payload));
      held = server.held_bodies.emplace(session, std::move(body)).first;
      ++server.q_block2_bodies_served;
    }
    server.q_block2_bodies_held = server.held_bodies.size();
    held->second.last_request = now;
    const HeldBody& body = held->second;
    const std::uint32_t blocks =
        static_cast<std::uint32_t>((body.body->size() + block_size - 1) / block_size);
    // Missing blocks first (they come first in the client's list), then the continuation;
    // no block twice, at most MAX_PAYLOADS (RFC 9177 7.2).
    std::vector<std::uint32_t> nums;
    const auto limit = static_cast<std::size_t>(server.options.timing.max_payloads);
    std::sort(wanted.begin(), wanted.end());
    for (const auto& [num, more] : wanted) {
      for (std::uint32_t n = num; n < blocks && nums.size() < limit; ++n) {
        if (std::find(nums.begin(), nums.end(), n) == nums.end()) nums.push_back(n);
        if (!more) break;
      }
    }
    if (nums.empty()) {
      respond(resource, session, request, query, response,
              text_reply(CoapCode::kBadRequest, "Q-Block2 asks for blocks beyond the body's " +
                                                    std::to_string(blocks)));
      return true;
    }
    coap_pdu_set_code(response, static_cast<coap_pdu_code_t>(COAP_RESPONSE_CODE(body.code)));
    add_q_block2_options_and_data(response, body, szx, nums[0]);
    if (nums.size() > 1) {
      QueuedBlocks queued;
      queued.session = coap_session_reference(session);
      const coap_bin_const_t token = coap_pdu_get_token(request);
      queued.token.assign(token.s, token.s + token.length);
      queued.held = body;
      queued.szx = szx;
      queued.nums.assign(nums.begin() + 1, nums.end());
      server.queued_blocks.push_back(std::move(queued));
    }
    return true;
  }

  // ETag (4), Content-Format (12), Size2 (28), Q-Block2 (31) and block `num`'s bytes: every
  // Q-Block2 response carries the ETag and the body's size (RFC 9177 4.4).
  static void add_q_block2_options_and_data(coap_pdu_t* pdu, const HeldBody& body,
                                            std::uint32_t szx, std::uint32_t num) {
    const std::size_t block_size = std::size_t{1} << (szx + 4);
    const std::size_t offset = std::size_t{num} * block_size;
    const std::size_t length = std::min(block_size, body.body->size() - offset);
    std::uint8_t etag[8] = {};
    std::size_t etag_length = coap_encode_var_safe8(etag, sizeof etag, body.etag);
    if (etag_length == 0) etag_length = 1;  // ETag 0: one zero byte, never an empty option
    coap_add_option(pdu, COAP_OPTION_ETAG, etag_length, etag);
    std::uint8_t buffer[8];
    coap_add_option(
        pdu, COAP_OPTION_CONTENT_FORMAT,
        coap_encode_var_safe(buffer, sizeof buffer, COAP_MEDIATYPE_APPLICATION_OCTET_STREAM),
        buffer);
    coap_add_option(pdu, COAP_OPTION_SIZE2,
                    coap_encode_var_safe8(buffer, sizeof buffer, body.body->size()), buffer);
    std::uint8_t block[4];
    coap_add_option(pdu, kOptionQBlock2,
                    encode_q_block(block, {num, offset + length < body.body->size(), szx}), block);
    coap_add_data(pdu, length, body.body->data() + offset);
  }

  // FNV-1a over a body: its ETag when the handler gave none (ours; any value that changes
  // with the body will do, RFC 7252 5.10.6).
  static std::uint64_t fnv1a64(const std::vector<std::uint8_t>& bytes) {
    std::uint64_t hash = 14695981039346656037ull;
    for (std::uint8_t byte : bytes) hash = (hash ^ byte) * 1099511628211ull;
    return hash;
  }

  void make_room_for_held_body(std::chrono::steady_clock::time_point now) {
    std::erase_if(held_bodies, [&](const auto& entry) {
      return now - entry.second.last_request > kHeldBodyTimeout;
    });
    while (!held_bodies.empty() && held_bodies.size() >= options.max_bodies_in_progress) {
      auto oldest = std::min_element(held_bodies.begin(), held_bodies.end(),
                                     [](const auto& a, const auto& b) {
                                       return a.second.last_request < b.second.last_request;
                                     });
      held_bodies.erase(oldest);
    }
  }

  // The queued blocks of this pass's Q-Block2 bursts, as non-confirmable responses (RFC 9177
  // 4.4: the client asks again for what it misses; nothing is retransmitted by itself).
  void send_queued_blocks() {
    std::vector<QueuedBlocks> sending;
    sending.swap(queued_blocks);
    for (QueuedBlocks& queued : sending) {
      coap_session_t* session = queued.session;
      if (coap_session_get_state(session) == COAP_SESSION_STATE_ESTABLISHED) {
        for (std::uint32_t num : queued.nums) {
          coap_pdu_t* pdu = coap_pdu_init(
              COAP_MESSAGE_NON, static_cast<coap_pdu_code_t>(COAP_RESPONSE_CODE(queued.held.code)),
              coap_new_message_id(session), coap_session_max_pdu_size(session));
          if (!pdu) break;
          coap_add_token(pdu, queued.token.size(), queued.token.data());
          add_q_block2_options_and_data(pdu, queued.held, queued.szx, num);
          coap_send(session, pdu);  // libcoap owns the pdu now
        }
      }
      coap_session_release(session);
    }
  }
};

CoapDtlsServer::CoapDtlsServer(Options options) : impl_(std::make_unique<Impl>()) {
  coap_library_startup();
  check_timing(options.timing);
  check_handshake_limits(options.handshake);
  if (options.datagrams_per_pass < 1 || options.datagrams_per_pass > 1024)
    throw std::invalid_argument("datagrams per pass must be 1..1024");
  if (options.max_body_bytes == 0 || options.max_bodies_in_progress == 0)
    throw std::invalid_argument("max body bytes and max bodies in progress must be at least 1");
  if (options.certificates) check_certificate_files(*options.certificates);
  impl_->options = std::move(options);
  Impl& s = *impl_;
  s.context = coap_new_context(nullptr);
  if (!s.context) throw TransportError("coap_new_context failed");
  // From here on the destructor would not run: free the context on any failure.
  try {
    coap_set_app_data(s.context, impl_.get());
    coap_register_event_handler(s.context, &Impl::on_event);
    // Not COAP_BLOCK_SINGLE_BODY: request bodies are assembled in take_block(), bounded.
    coap_context_set_block_mode(s.context, COAP_BLOCK_USE_LIBCOAP);
    // Known, so that a GET carrying it reaches handle() rather than getting 4.02 Bad Option,
    // which is what a server with Q-Block off answers (the client then falls back).
    if (s.options.timing.q_block) {
      coap_register_option(s.context, kOptionQBlock1);
      coap_register_option(s.context, kOptionQBlock2);
    }
    s.guard = std::make_unique<detail::HandshakeGuard>(s.options.handshake);
    coap_context_set_max_handshake_sessions(s.context, s.options.handshake.max_pending);

    coap_dtls_spsk_t psk{};
    psk.version = COAP_DTLS_SPSK_SETUP_VERSION;
    psk.validate_id_call_back = &Impl::validate_identity;
    psk.id_call_back_arg = impl_.get();
    if (!coap_context_set_psk2(s.context, &psk))
      throw TransportError("DTLS-PSK set-up failed (is libcoap built with a DTLS library?)");
    if (s.options.certificates) {
      coap_dtls_pki_t pki = pki_setup(*s.options.certificates);
      if (!coap_context_set_pki(s.context, &pki)) throw TransportError("DTLS X.509 set-up failed");
    }
    std::optional<detail::ReusePortWhileBinding> reuse_port;
    if (s.options.reuse_port) reuse_port.emplace();
    coap_address_t address = resolve_udp_address(s.options.bind_address, s.options.port);
    s.endpoint = coap_new_endpoint(s.context, &address, COAP_PROTO_DTLS);
    if (!s.endpoint) {
      throw TransportError("cannot listen on " + s.options.bind_address + ":" +
                           std::to_string(s.options.port) + " (port in use?)");
    }
    if (s.options.plaintext_port) {
      coap_address_t plain = resolve_udp_address(s.options.bind_address, *s.options.plaintext_port);
      s.plaintext_endpoint = coap_new_endpoint(s.context, &plain, COAP_PROTO_UDP);
      if (!s.plaintext_endpoint) {
        throw TransportError("cannot listen for plain CoAP on " + s.options.bind_address + ":" +
                             std::to_string(*s.options.plaintext_port) + " (port in use?)");
      }
    }
    reuse_port.reset();
    // "127.0.0.1:5684 DTLS" or "[::1]:5684 DTLS": the port the kernel actually bound.
    auto bound_port_of = [](coap_endpoint_t* endpoint) {
      std::string description = coap_endpoint_str(endpoint);
      auto space = description.rfind(' ');
      auto colon = description.rfind(':', space);
      return static_cast<std::uint16_t>(
          std::stoi(description.substr(colon + 1, space - colon - 1)));
    };
    s.bound_port = bound_port_of(s.endpoint);
    if (s.plaintext_endpoint) s.bound_plaintext_port = bound_port_of(s.plaintext_endpoint);

    for (std::uint16_t port : {s.bound_port, s.bound_plaintext_port}) {
      if (port == 0) continue;
      const coap_address_t bound = resolve_udp_address(s.options.bind_address, port);
      const int fd = detail::find_bound_udp_socket(&bound.addr.sa, bound.size);
      if (fd < 0) {
        throw TransportError("cannot find the socket of " + s.options.bind_address + ":" +
                             std::to_string(port) + " to count its ingress (is /proc mounted?)");
      }
      // The DTLS endpoint's datagrams pass the handshake guard first; plain CoAP's do not.
      detail::count_ingress(fd, &s.ingress, port == s.bound_port ? s.guard.get() : nullptr);
      s.endpoint_fds.push_back(fd);
      // Q-Block1 clients send bursts of MAX_PAYLOADS blocks unanswered: 32 devices' bursts
      // (~2.3 kB of buffer each datagram, as the kernel counts) overflow Linux's default
      // 208 kB, and a lost block stalls its body for NON_RECEIVE_TIMEOUT. 4 MiB (ours; the
      // kernel caps it at net.core.rmem_max) holds ~1,800 datagrams.
      const int receive_buffer = 4 << 20;
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    }
    s.coap_fd = coap_context_get_coap_fd(s.context);
  } catch (...) {
    for (int fd : s.endpoint_fds) detail::stop_counting_ingress(fd);
    coap_free_context(s.context);
    throw;
  }
}

CoapDtlsServer::~CoapDtlsServer() {
  while (!impl_->deferred.empty()) (*impl_->deferred.begin())->detach();
  for (auto& queued : impl_->queued_blocks) coap_session_release(queued.session);
  for (int fd : impl_->endpoint_fds) detail::stop_counting_ingress(fd);
  for (coap_session_t* session : impl_->revoked_sessions) coap_session_release(session);
  if (impl_->context) coap_free_context(impl_->context);
}

void CoapDtlsServer::add_resource(const std::string& path, Method method, RequestHandler handler) {
  auto& entry = impl_->resources[path];
  if (!entry) {
    entry = std::make_unique<Impl::Resource>();
    entry->server = impl_.get();
    coap_str_const_t* uri =
        coap_new_str_const(reinterpret_cast<const uint8_t*>(path.data()), path.size());
    coap_resource_t* resource = coap_resource_init(uri, COAP_RESOURCE_FLAGS_RELEASE_URI);
    if (!resource) throw TransportError("cannot create resource " + path);
    coap_resource_set_userdata(resource, entry.get());
    entry->resource = resource;
    coap_add_resource(impl_->context, resource);
    for (Method m : {Method::kGet, Method::kPost, Method::kPut, Method::kDelete}) {
      coap_register_handler(resource, to_libcoap_method(m), &Impl::handle);
    }
  }
  entry->handlers[method] = std::move(handler);
}

void CoapDtlsServer::make_observable(const std::string& path) {
  auto it = impl_->resources.find(path);
  if (it == impl_->resources.end() || !it->second->handlers.count(Method::kGet))
    throw std::logic_error("make_observable(" + path + "): no GET handler registered on that path");
  coap_resource_set_get_observable(it->second->resource, 1);
}

bool CoapDtlsServer::notify_observers(const std::string& path) {
  auto it = impl_->resources.find(path);
  if (it == impl_->resources.end()) return false;
  // libcoap marks the resource dirty; the next run_once (coap_io_prepare_epoll) calls the GET
  // handler once per observer and sends each its notification.
  return coap_resource_notify_observers(it->second->resource, nullptr) != 0;
}

std::uint16_t CoapDtlsServer::port() const { return impl_->bound_port; }

std::uint16_t CoapDtlsServer::plaintext_port() const { return impl_->bound_plaintext_port; }

std::uint64_t CoapDtlsServer::bytes_received() const {
  return impl_->ingress.bytes.load(std::memory_order_relaxed);
}

std::size_t CoapDtlsServer::bodies_in_progress() const {
  return impl_->assemblies.size() + impl_->q_block1_assemblies.size();
}

std::uint64_t CoapDtlsServer::bodies_refused() const { return impl_->bodies_refused; }

std::uint64_t CoapDtlsServer::q_block2_bodies_served() const {
  return impl_->q_block2_bodies_served.load(std::memory_order_relaxed);
}

std::size_t CoapDtlsServer::q_block2_bodies_held() const {
  return impl_->q_block2_bodies_held.load(std::memory_order_relaxed);
}

std::uint64_t CoapDtlsServer::block_records_freed() const {
  return impl_->request_bodies_forgotten;
}

std::uint64_t CoapDtlsServer::datagrams_received() const {
  return impl_->ingress.datagrams.load(std::memory_order_relaxed);
}

std::uint64_t CoapDtlsServer::bytes_sent() const {
  return impl_->ingress.sent_bytes.load(std::memory_order_relaxed);
}

std::uint64_t CoapDtlsServer::datagrams_sent() const {
  return impl_->ingress.sent_datagrams.load(std::memory_order_relaxed);
}

HandshakeStats CoapDtlsServer::handshake_stats() const {
  return impl_->guard ? impl_->guard->stats() : HandshakeStats{};
}

// coap_io_process() as libcoap 4.3.1 does it with epoll (prepare: timeouts and
// retransmissions of every session; epoll_wait; coap_io_do_epoll, which reads ONE datagram
// per ready socket and then prepares again), except that a ready endpoint is handed to
// coap_io_do_epoll() several times in one call, so that several datagrams share its walk
// over all sessions (libcoap's loop walks twice per pass; this one once, see below). A
// server has one socket per endpoint for all its sessions, which is why this matters: at
// 1000 sessions the walks were 44 % of its CPU. How many
// reads adapts to the load: twice what the previous pass found while every read finds a
// datagram, else one more than it found, so an idle server pays at most one read that
// finds nothing (EAGAIN, which libcoap logs only at LOG_WARNING and above).
namespace {
// libcoap 4.3.1's coap_io_do_epoll() ends every pass with a walk of every session
// (coap_io_prepare_epoll → coap_io_prepare_io: idle sessions, DTLS and block-wise timeouts,
// Observe notifications; ~60 µs at 1000 sessions, 11 % of the server's CPU under load, as
// a pass mostly finds the few datagrams that came since the last). Nothing in it is due
// sooner than its timers, which are seconds (ACK_TIMEOUT, DTLS retransmission, block and
// session timeouts), and libcoap arms its timerfd itself for what is queued between walks
// (retransmissions). So run_once() lets a pass skip the walk when the last one was less
// than kWalkDeferral ago and libcoap's timer did not fire, and makes the walk it owes
// itself within kWalkDeferral (ours: 50 ms, a delay nothing in CoAP's timing notices; an
// Observe notification of /status, every few seconds, may leave up to 50 ms later. It was
// 10 ms: at a few hundred updates/s that still meant a walk per 2-5 updates, ~10 % of the
// server's CPU in perf; at 50 ms 4.4 %, the rest being walks the timer's firings force;
// server/README.md, "A sharded server under the load").
constexpr std::chrono::milliseconds kWalkDeferral{50};
// socket_ingress.cc's wrapper declares coap_io_prepare_epoll() without libcoap's headers.
static_assert(sizeof(coap_tick_t) == sizeof(std::uint64_t));
}  // namespace

void CoapDtlsServer::run_once(int timeout_ms) {
  Impl& s = *impl_;
  s.close_revoked_sessions();
  s.sweep_handshakes();
  const auto wait_ms = static_cast<std::uint32_t>(timeout_ms < 0 ? 0 : timeout_ms);
  if (s.options.datagrams_per_pass <= 1 || s.coap_fd < 0) {
    coap_io_process(s.context, wait_ms);
    s.send_queued_blocks();
    return;
  }
  // coap_io_prepare_epoll() walks every session (idle, DTLS and block-wise timeouts) and arms
  // libcoap's timerfd, which is in the epoll set: its firing wakes the wait below.
  // coap_io_do_epoll() calls it at its end, and libcoap re-arms the timer itself for what is
  // queued between passes (retransmissions, notifications), so only the first pass needs a
  // call here. (The second walk per pass was redundant: 16,217 → 7,848 walks in 10 s of load,
  // counted with uprobes; it was cheap, though, right after the first and so in the cache.)
  const auto walk_due = s.last_walk + kWalkDeferral;
  if (!s.epoll_prepared || (s.walk_owed && std::chrono::steady_clock::now() >= walk_due)) {
    coap_tick_t now;
    coap_ticks(&now);
    coap_io_prepare_epoll(s.context, now);
    s.epoll_prepared = true;
    s.walk_owed = false;
    s.last_walk = std::chrono::steady_clock::now();
  }
  int wait = static_cast<int>(wait_ms);
  if (s.walk_owed) {  // wake up for it (rounded up to whole milliseconds)
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        s.last_walk + kWalkDeferral - std::chrono::steady_clock::now());
    wait = std::min<int>(wait, static_cast<int>(std::max<std::int64_t>(0, left.count())));
  }
  epoll_event ready[16];
  const int count = epoll_wait(s.coap_fd, ready, 16, wait);
  s.batch.clear();
  std::size_t ready_endpoints = 0;
  bool woken = false;
  bool timer_fired = false;  // libcoap's timerfd: its event data is NULL (net.c)
  for (int i = 0; i < count; ++i) {
    if (ready[i].data.ptr == nullptr) timer_fired = true;
    if (ready[i].data.ptr == &s.wake_marker) {
      std::uint64_t wakes = 0;
      [[maybe_unused]] const ssize_t drained =
          ::read(s.wake_fd, &wakes, sizeof wakes);  // EAGAIN: already drained
      woken = true;
      continue;
    }
    s.batch.push_back(ready[i]);
    // libcoap's event data is its coap_socket_t, whose first member is the descriptor
    // (coap_io_internal.h of 4.3.1). Were that to change, no event would match and every
    // pass would read one datagram, as libcoap's own loop does.
    const int* socket = static_cast<const int*>(ready[i].data.ptr);
    if (socket == nullptr || !(ready[i].events & EPOLLIN) ||
        std::find(s.endpoint_fds.begin(), s.endpoint_fds.end(), *socket) == s.endpoint_fds.end())
      continue;
    ++ready_endpoints;
    for (std::uint32_t extra = 1; extra < s.reads_per_ready_endpoint; ++extra)
      s.batch.push_back(ready[i]);
  }
  // Woken and nothing else: no walk of the sessions (coap_io_do_epoll() ends with one, ~100 µs
  // at 1000 sessions). Nothing of libcoap's is due, or its timerfd would be among the events.
  if (woken && s.batch.empty()) return;
  const std::uint64_t datagrams_before = s.ingress.datagrams.load(std::memory_order_relaxed);
  // A fired timer must be walked for at once: the walk re-arms it (see kWalkDeferral).
  bool walk_skipped = false;
  if (!timer_fired && std::chrono::steady_clock::now() < s.last_walk + kWalkDeferral) {
    detail::SkipSessionWalks skip;
    coap_io_do_epoll(s.context, s.batch.data(), s.batch.size());
    walk_skipped = skip.skipped();
  } else {
    coap_io_do_epoll(s.context, s.batch.data(), s.batch.size());
  }
  if (walk_skipped) {
    s.walk_owed = true;
  } else {
    s.walk_owed = false;
    s.last_walk = std::chrono::steady_clock::now();
  }
  s.send_queued_blocks();
  if (ready_endpoints == 0) return;
  const std::uint64_t read = s.ingress.datagrams.load(std::memory_order_relaxed) - datagrams_before;
  const std::uint64_t tried = std::uint64_t{s.reads_per_ready_endpoint} * ready_endpoints;
  const std::uint64_t next =
      read >= tried ? 2 * std::uint64_t{s.reads_per_ready_endpoint} : read / ready_endpoints + 1;
  s.reads_per_ready_endpoint =
      static_cast<std::uint32_t>(std::clamp<std::uint64_t>(next, 1, s.options.datagrams_per_pass));
}

bool CoapDtlsServer::watch_wake_fd(int fd) {
  Impl& s = *impl_;
  if (s.options.datagrams_per_pass <= 1 || s.coap_fd < 0 || fd < 0) return false;
  if (s.wake_fd >= 0)
    throw std::logic_error("CoapDtlsServer: a wake descriptor is already watched");
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.ptr = &s.wake_marker;
  if (epoll_ctl(s.coap_fd, EPOLL_CTL_ADD, fd, &event) != 0)
    throw TransportError(std::string("cannot watch the wake descriptor: ") + std::strerror(errno));
  s.wake_fd = fd;
  return true;
}

}  // namespace edgetrain::transport
