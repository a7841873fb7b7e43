// libcoap-backed implementation of coap_dtls.h. The only file (with its siblings in
// transport/) that includes libcoap: C callbacks translate into C++ handlers here, and
// no exception ever crosses back into libcoap.
#include "transport/coap_dtls.h"

#include "transport/coap_address_internal.h"

#include <coap3/coap.h>
#include <mbedtls/oid.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crt.h>
#include <netdb.h>
#include <sys/epoll.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <random>
#include <thread>

#include "transport/socket_ingress.h"

namespace edgetrain::transport {
namespace {

void coap_library_startup() {
  static std::once_flag once;
  std::call_once(once, [] {
    coap_startup();
    // libcoap logs to stderr. Keep it to real problems unless EDGETRAIN_COAP_LOG asks
    // for more (syslog levels, 7 = debug). Mbed TLS's own debug output reports a peer's
    // ordinary close_notify as an error; handshake failures reach callers as exceptions
    // anyway. libcoap 4.3.1 switches Mbed TLS's debug output off only for levels
    // between LOG_WARNING and LOG_INFO (LOG_ERR and below map to Mbed TLS level 1).
    int level = LOG_ERR, dtls_level = LOG_WARNING;
    if (const char* env = std::getenv("EDGETRAIN_COAP_LOG")) level = dtls_level = std::atoi(env);
    coap_set_log_level(level);
    coap_dtls_set_log_level(dtls_level);
  });
}

coap_pdu_code_t to_request_code(Method method) {
  switch (method) {
    case Method::kGet: return COAP_REQUEST_CODE_GET;
    case Method::kPost: return COAP_REQUEST_CODE_POST;
    case Method::kPut: return COAP_REQUEST_CODE_PUT;
    case Method::kDelete: return COAP_REQUEST_CODE_DELETE;
  }
  return COAP_REQUEST_CODE_GET;
}

coap_request_t to_libcoap_method(Method method) {
  switch (method) {
    case Method::kGet: return COAP_REQUEST_GET;
    case Method::kPost: return COAP_REQUEST_POST;
    case Method::kPut: return COAP_REQUEST_PUT;
    case Method::kDelete: return COAP_REQUEST_DELETE;
  }
  return COAP_REQUEST_GET;
}

Method from_request_code(coap_pdu_code_t code) {
  switch (code) {
    case COAP_REQUEST_CODE_POST: return Method::kPost;
    case COAP_REQUEST_CODE_PUT: return Method::kPut;
    case COAP_REQUEST_CODE_DELETE: return Method::kDelete;
    default: return Method::kGet;
  }
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

// Owns a payload handed to libcoap's *_large_* calls until libcoap releases it.
void release_payload(coap_session_t*, void* app_ptr) { delete static_cast<std::vector<std::uint8_t>*>(app_ptr); }

coap_fixed_point_t to_fixed_point(double value) {
  const long thousandths = std::lround(value * 1000);
  return {static_cast<uint16_t>(thousandths / 1000), static_cast<uint16_t>(thousandths % 1000)};
}

void apply_timing(coap_session_t* session, const CoapTiming& timing) {
  coap_session_set_ack_timeout(session, to_fixed_point(timing.ack_timeout_seconds));
  coap_session_set_ack_random_factor(session, to_fixed_point(timing.ack_random_factor));
  coap_session_set_max_retransmit(session, static_cast<uint16_t>(timing.max_retransmit));
  coap_session_set_nstart(session, static_cast<uint16_t>(timing.nstart));
}

// libcoap parses the PEM files only during a handshake (and then only logs what went
// wrong), so a missing or unreadable file is reported here, up front, by name.
void check_certificate_files(const CertificateFiles& files) {
  const std::pair<const char*, const std::string*> named[] = {
      {"certificate", &files.certificate_file}, {"private key", &files.private_key_file}, {"CA", &files.ca_file}};
  for (const auto& [what, path] : named) {
    if (path->empty()) throw TransportError(std::string("X.509: no ") + what + " file given");
    std::ifstream in(*path);
    if (!in) throw TransportError(std::string("X.509: cannot read the ") + what + " file '" + *path + "'");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("-----BEGIN ") == std::string::npos)
      throw TransportError(std::string("X.509: the ") + what + " file '" + *path + "' is not PEM");
  }
}

// Both sides verify the peer's certificate against the CA file; libcoap copies this
// struct but not the strings it points to, which `files` must keep alive.
coap_dtls_pki_t pki_setup(const CertificateFiles& files) {
  coap_dtls_pki_t pki{};
  pki.version = COAP_DTLS_PKI_SETUP_VERSION;
  pki.verify_peer_cert = 1;
  pki.check_common_ca = 1;
  pki.allow_self_signed = 0;
  pki.allow_expired_certs = 0;
  pki.cert_chain_validation = 1;
  pki.cert_chain_verify_depth = 2;
  pki.check_cert_revocation = 0;
  pki.pki_key.key_type = COAP_PKI_KEY_PEM;
  pki.pki_key.key.pem.public_cert = files.certificate_file.c_str();
  pki.pki_key.key.pem.private_key = files.private_key_file.c_str();
  pki.pki_key.key.pem.ca_file = files.ca_file.c_str();
  return pki;
}

// Certificate CNs become identities: the same shape as keystore names, so that logs,
// the WAL and /status never see control characters or unbounded strings.
bool is_plain_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
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
  const mbedtls_x509_crt* certificate = mbedtls_ssl_get_peer_cert(static_cast<const mbedtls_ssl_context*>(tls));
  if (!certificate) return std::nullopt;
  for (const mbedtls_x509_name* name = &certificate->subject; name; name = name->next) {
    if (MBEDTLS_OID_CMP(MBEDTLS_OID_AT_CN, &name->oid) == 0) {
      return std::string(reinterpret_cast<const char*>(name->val.p), name->val.len);
    }
  }
  return std::string();  // a certificate without a CN: an empty identity, refused upstream
}

std::string address_string(const coap_address_t* address) {
  if (!address) return {};
  unsigned char text[INET6_ADDRSTRLEN + 8] = {};
  const size_t length = coap_print_addr(address, text, sizeof(text) - 1);
  return std::string(reinterpret_cast<const char*>(text), length);
}

}  // namespace

const char* peer_authentication_name(PeerAuthentication authentication) {
  switch (authentication) {
    case PeerAuthentication::kNone: return "none";
    case PeerAuthentication::kPsk: return "psk";
    case PeerAuthentication::kCertificate: return "certificate";
  }
  return "none";
}

void check_timing(const CoapTiming& timing) {
  // libcoap ignores values it does not accept (an ACK_TIMEOUT below 1 s among them)
  // without a word, so they are refused here.
  if (!(timing.ack_timeout_seconds >= 1.0 && timing.ack_timeout_seconds <= 60.0))
    throw std::invalid_argument("CoAP ACK_TIMEOUT must be 1..60 seconds (libcoap 4.3.1 takes nothing below 1 s)");
  if (!(timing.ack_random_factor >= 1.0 && timing.ack_random_factor <= 4.0))
    throw std::invalid_argument("CoAP ACK_RANDOM_FACTOR must be 1..4");
  if (timing.max_retransmit < 1 || timing.max_retransmit > 10)
    throw std::invalid_argument("CoAP MAX_RETRANSMIT must be 1..10");
  if (timing.nstart < 1 || timing.nstart > 16) throw std::invalid_argument("CoAP NSTART must be 1..16");
}

coap_address_t resolve_udp_address(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0 || !found) {
    throw TransportError("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  coap_address_t address;
  coap_address_init(&address);
  address.size = found->ai_addrlen;
  std::memcpy(&address.addr.sa, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  return address;
}

std::string tls_library_description() {
  coap_library_startup();
  const coap_tls_version_t* version = coap_get_tls_library_version();
  std::string name;
  switch (version->type) {
    case COAP_TLS_LIBRARY_MBEDTLS: name = "Mbed TLS"; break;
    case COAP_TLS_LIBRARY_OPENSSL: name = "OpenSSL"; break;
    case COAP_TLS_LIBRARY_GNUTLS: name = "GnuTLS"; break;
    case COAP_TLS_LIBRARY_TINYDTLS: name = "TinyDTLS"; break;
    default: return "no (D)TLS";
  }
  if (version->type == COAP_TLS_LIBRARY_MBEDTLS) {
    // Mbed TLS encodes its version as 0xMMmmpp00.
    const auto v = version->version;
    name += " " + std::to_string((v >> 24) & 0xff) + "." + std::to_string((v >> 16) & 0xff) + "." +
            std::to_string((v >> 8) & 0xff);
  }
  return name;
}

bool tls_library_is_mbedtls() {
  coap_library_startup();
  return coap_get_tls_library_version()->type == COAP_TLS_LIBRARY_MBEDTLS;
}

std::string coap_code_string(int code) {
  std::string detail = std::to_string(code % 100);
  if (detail.size() < 2) detail.insert(0, "0");
  return std::to_string(code / 100) + "." + detail;
}

// ------------------------------------------------------------------------------------
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
  coap_pdu_t* pdu = coap_pdu_init(COAP_MESSAGE_CON, static_cast<coap_pdu_code_t>(COAP_RESPONSE_CODE(response.code)),
                                  coap_new_message_id(session), coap_session_max_pdu_size(session));
  if (!pdu) return;
  coap_add_token(pdu, state->token.size(), state->token.data());
  // Options in ascending number: ETag (4), Content-Format (12), Block1 (27).
  if (response.etag) {
    std::uint8_t buffer[8];
    coap_add_option(pdu, COAP_OPTION_ETAG, coap_encode_var_safe8(buffer, sizeof(buffer), *response.etag), buffer);
  }
  if (!response.payload.empty()) {
    std::uint8_t buffer[4];
    coap_add_option(pdu, COAP_OPTION_CONTENT_FORMAT,
                    coap_encode_var_safe(buffer, sizeof(buffer), COAP_MEDIATYPE_APPLICATION_OCTET_STREAM), buffer);
  }
  if (state->has_block1 && response.code / 100 == 2)
    coap_add_option(pdu, COAP_OPTION_BLOCK1, state->block1.size(), state->block1.data());
  if (!response.payload.empty())
    coap_add_data(pdu, std::min<std::size_t>(response.payload.size(), 512), response.payload.data());
  coap_send(session, pdu);  // libcoap owns the pdu now, and retransmits it until ACKed
}

struct CoapDtlsServer::Impl {
  struct Resource {
    Impl* server = nullptr;
    std::map<Method, RequestHandler> handlers;
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

  static const coap_bin_const_t* validate_identity(coap_bin_const_t* identity, coap_session_t*, void* arg) {
    auto* self = static_cast<Impl*>(arg);
    if (!identity || !self->options.psk_lookup) return nullptr;
    try {
      std::string_view id(reinterpret_cast<const char*>(identity->s), identity->length);
      auto key = self->options.psk_lookup(id);
      if (!key || key->empty()) return nullptr;  // unknown identity: refuse the handshake
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
    if (event == COAP_EVENT_SERVER_SESSION_DEL) self->last_answers.erase(session);
    return 0;
  }

  // The declared identity of a plain CoAP request: the value of its `id` URI query.
  static std::string declared_identity(const coap_string_t* query) {
    if (!query || !query->s) return {};
    std::string_view text(reinterpret_cast<const char*>(query->s), query->length);
    while (!text.empty()) {
      const auto amp = text.find('&');
      const std::string_view item = text.substr(0, amp);
      if (item.substr(0, 3) == "id=") return std::string(item.substr(3));  // a CoAP option: at most 255 bytes
      if (amp == std::string_view::npos) break;
      text.remove_prefix(amp + 1);
    }
    return {};
  }

  static void handle(coap_resource_t* resource, coap_session_t* session, const coap_pdu_t* request,
                     const coap_string_t* query, coap_pdu_t* response) {
    auto* entry = static_cast<Resource*>(coap_resource_get_userdata(resource));
    Impl& server = *entry->server;
    CoapResponse reply;
    bool deferred = false;
    const coap_mid_t mid = coap_pdu_get_mid(request);
    const bool idempotent = coap_pdu_get_code(request) == COAP_REQUEST_CODE_GET;
    const auto last = server.last_answers.find(session);
    if (!idempotent && last != server.last_answers.end() && last->second.mid == mid) {
      reply = last->second.reply;  // a retransmission of a request the handler already answered
      deferred = reply.code == 0;  // or will answer later: acknowledge it empty again
    } else try {
      CoapRequest req;
      req.method = from_request_code(coap_pdu_get_code(request));
      if (coap_pdu_get_type(request) == COAP_MESSAGE_CON) {
        req.defer = [&deferred, entry, session, request] {
          auto state = std::make_unique<DeferredResponse::State>();
          state->session = coap_session_reference(session);
          const coap_bin_const_t token = coap_pdu_get_token(request);
          state->token.assign(token.s, token.s + token.length);
          coap_opt_iterator_t options;
          if (coap_opt_t* block1 = coap_check_option(request, COAP_OPTION_BLOCK1, &options)) {
            state->has_block1 = true;
            state->block1.assign(coap_opt_value(block1), coap_opt_value(block1) + coap_opt_length(block1));
          }
          state->registry = &entry->server->deferred;
          state->registry->insert(state.get());
          deferred = true;
          return DeferredResponse(std::move(state));
        };
      }
      req.peer_address = address_string(coap_session_get_addr_remote(session));
      if (coap_session_get_proto(session) != COAP_PROTO_DTLS) {
        req.authentication = PeerAuthentication::kNone;
        req.identity = declared_identity(query);
      } else if (const coap_bin_const_t* id = coap_session_get_psk_identity(session); id && id->length > 0) {
        req.authentication = PeerAuthentication::kPsk;
        req.identity.assign(reinterpret_cast<const char*>(id->s), id->length);
      } else if (auto name = certificate_name(session)) {
        req.authentication = PeerAuthentication::kCertificate;
        req.identity = *name;
      }
      size_t length = 0, offset = 0, total = 0;
      const uint8_t* data = nullptr;
      if (coap_get_data_large(request, &length, &data, &offset, &total) && data) {
        req.payload = std::span<const std::uint8_t>(data, length);
      }
      if (query && query->s) req.query.assign(reinterpret_cast<const char*>(query->s), query->length);
      auto it = entry->handlers.find(req.method);
      if (data && (offset != 0 || length != total)) {
        // Only part of a block-wise body (seen: libcoap 4.3.1 hands a retransmitted last
        // Block1 block, whose ACK was lost, to the handler again on its own).
        reply.code = kRequestEntityIncomplete;
        const std::string why = "incomplete block-wise body";
        reply.payload.assign(why.begin(), why.end());
      } else if (req.authentication == PeerAuthentication::kCertificate && !is_plain_name(req.identity)) {
        // Identities end up in logs, the WAL and /status: only plain names, as in keystores.
        reply.code = CoapCode::kForbidden;
        const std::string why = "certificate subject CN is not a plain name (1..64 of [A-Za-z0-9._-])";
        reply.payload.assign(why.begin(), why.end());
      } else if (it == entry->handlers.end()) {
        reply.code = 405;
      } else {
        reply = it->second(req);
      }
    } catch (const std::exception& e) {
      deferred = false;  // answered now; a handle the handler kept can only send a late duplicate
      reply.code = CoapCode::kInternalServerError;
      reply.payload.assign(e.what(), e.what() + std::strlen(e.what()));
    } catch (...) {
      deferred = false;
      reply.code = CoapCode::kInternalServerError;
    }
    if (deferred) reply = {};  // remembered as "answered later" (code 0)
    if (!idempotent && reply.payload.size() <= kMaxRememberedAnswerBytes) {
      try {
        server.last_answers[session] = {mid, reply};
      } catch (...) {
      }
    }
    // Answered later: leaving the response code 0 makes libcoap send an empty ACK.
    if (deferred) return;
    coap_pdu_set_code(response, static_cast<coap_pdu_code_t>(COAP_RESPONSE_CODE(reply.code)));
    if (reply.etag) {
      // Single-block bodies: libcoap adds no ETag itself. Block-wise bodies: libcoap
      // replaces this option with its `etag` argument below, in every block.
      std::uint8_t buffer[8];
      std::size_t length = coap_encode_var_safe8(buffer, sizeof(buffer), *reply.etag);
      if (length == 0) {  // 0 encodes as no bytes, but an ETag has 1 to 8 (RFC 7252 5.10.6): peers drop the PDU
        buffer[0] = 0;
        length = 1;
      }
      coap_add_option(response, COAP_OPTION_ETAG, length, buffer);
    }
    if (!reply.payload.empty()) {
      auto* body = new std::vector<std::uint8_t>(std::move(reply.payload));
      coap_add_data_large_response(resource, session, request, response, query,
                                   COAP_MEDIATYPE_APPLICATION_OCTET_STREAM, -1, reply.etag.value_or(0), body->size(),
                                   body->data(), release_payload, body);
    }
  }
};

CoapDtlsServer::CoapDtlsServer(Options options) : impl_(std::make_unique<Impl>()) {
  coap_library_startup();
  check_timing(options.timing);
  if (options.datagrams_per_pass < 1 || options.datagrams_per_pass > 1024)
    throw std::invalid_argument("datagrams per pass must be 1..1024");
  if (options.certificates) check_certificate_files(*options.certificates);
  impl_->options = std::move(options);
  Impl& s = *impl_;
  s.context = coap_new_context(nullptr);
  if (!s.context) throw TransportError("coap_new_context failed");
  // From here on the destructor would not run: free the context on any failure.
  try {
    coap_set_app_data(s.context, impl_.get());
    coap_register_event_handler(s.context, &Impl::on_event);
    coap_context_set_block_mode(s.context, COAP_BLOCK_USE_LIBCOAP | COAP_BLOCK_SINGLE_BODY);

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
    coap_address_t address = resolve_udp_address(s.options.bind_address, s.options.port);
    s.endpoint = coap_new_endpoint(s.context, &address, COAP_PROTO_DTLS);
    if (!s.endpoint) {
      throw TransportError("cannot listen on " + s.options.bind_address + ":" + std::to_string(s.options.port) +
                           " (port in use?)");
    }
    if (s.options.plaintext_port) {
      coap_address_t plain = resolve_udp_address(s.options.bind_address, *s.options.plaintext_port);
      s.plaintext_endpoint = coap_new_endpoint(s.context, &plain, COAP_PROTO_UDP);
      if (!s.plaintext_endpoint) {
        throw TransportError("cannot listen for plain CoAP on " + s.options.bind_address + ":" +
                             std::to_string(*s.options.plaintext_port) + " (port in use?)");
      }
    }
    // "127.0.0.1:5684 DTLS" or "[::1]:5684 DTLS": the port the kernel actually bound.
    auto bound_port_of = [](coap_endpoint_t* endpoint) {
      std::string description = coap_endpoint_str(endpoint);
      auto space = description.rfind(' ');
      auto colon = description.rfind(':', space);
      return static_cast<std::uint16_t>(std::stoi(description.substr(colon + 1, space - colon - 1)));
    };
    s.bound_port = bound_port_of(s.endpoint);
    if (s.plaintext_endpoint) s.bound_plaintext_port = bound_port_of(s.plaintext_endpoint);

    for (std::uint16_t port : {s.bound_port, s.bound_plaintext_port}) {
      if (port == 0) continue;
      const coap_address_t bound = resolve_udp_address(s.options.bind_address, port);
      const int fd = detail::find_bound_udp_socket(&bound.addr.sa, bound.size);
      if (fd < 0) {
        throw TransportError("cannot find the socket of " + s.options.bind_address + ":" + std::to_string(port) +
                             " to count its ingress (is /proc mounted?)");
      }
      detail::count_ingress(fd, &s.ingress);
      s.endpoint_fds.push_back(fd);
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
  for (int fd : impl_->endpoint_fds) detail::stop_counting_ingress(fd);
  if (impl_->context) coap_free_context(impl_->context);
}

void CoapDtlsServer::add_resource(const std::string& path, Method method, RequestHandler handler) {
  auto& entry = impl_->resources[path];
  if (!entry) {
    entry = std::make_unique<Impl::Resource>();
    entry->server = impl_.get();
    coap_str_const_t* uri = coap_new_str_const(reinterpret_cast<const uint8_t*>(path.data()), path.size());
    coap_resource_t* resource = coap_resource_init(uri, COAP_RESOURCE_FLAGS_RELEASE_URI);
    if (!resource) throw TransportError("cannot create resource " + path);
    coap_resource_set_userdata(resource, entry.get());
    coap_add_resource(impl_->context, resource);
    for (Method m : {Method::kGet, Method::kPost, Method::kPut, Method::kDelete}) {
      coap_register_handler(resource, to_libcoap_method(m), &Impl::handle);
    }
  }
  entry->handlers[method] = std::move(handler);
}

std::uint16_t CoapDtlsServer::port() const { return impl_->bound_port; }

std::uint16_t CoapDtlsServer::plaintext_port() const { return impl_->bound_plaintext_port; }

std::uint64_t CoapDtlsServer::bytes_received() const { return impl_->ingress.bytes.load(std::memory_order_relaxed); }

std::uint64_t CoapDtlsServer::datagrams_received() const {
  return impl_->ingress.datagrams.load(std::memory_order_relaxed);
}

// coap_io_process() as libcoap 4.3.1 does it with epoll (prepare: timeouts and
// retransmissions of every session; epoll_wait; coap_io_do_epoll, which reads ONE datagram
// per ready socket and then prepares again), except that a ready endpoint is handed to
// coap_io_do_epoll() several times in one call, so that several datagrams share the two
// walks over all sessions. A server has one socket per endpoint for all its sessions,
// which is why this matters: at 1000 sessions the walks were 44 % of its CPU. How many
// reads adapts to the load: twice what the previous pass found while every read finds a
// datagram, else one more than it found, so an idle server pays at most one read that
// finds nothing (EAGAIN, which libcoap logs only at LOG_WARNING and above).
void CoapDtlsServer::run_once(int timeout_ms) {
  Impl& s = *impl_;
  const auto wait_ms = static_cast<std::uint32_t>(timeout_ms < 0 ? 0 : timeout_ms);
  if (s.options.datagrams_per_pass <= 1 || s.coap_fd < 0) {
    coap_io_process(s.context, wait_ms);
    return;
  }
  coap_tick_t now;
  coap_ticks(&now);
  const unsigned int libcoap_timeout = coap_io_prepare_epoll(s.context, now);
  const unsigned int wait = libcoap_timeout == 0 ? wait_ms : std::min(libcoap_timeout, wait_ms);
  epoll_event ready[16];
  const int count = epoll_wait(s.coap_fd, ready, 16, static_cast<int>(wait));
  s.batch.clear();
  std::size_t ready_endpoints = 0;
  for (int i = 0; i < count; ++i) {
    s.batch.push_back(ready[i]);
    // libcoap's event data is its coap_socket_t, whose first member is the descriptor
    // (coap_io_internal.h of 4.3.1). Were that to change, no event would match and every
    // pass would read one datagram, as libcoap's own loop does.
    const int* socket = static_cast<const int*>(ready[i].data.ptr);
    if (socket == nullptr || !(ready[i].events & EPOLLIN) ||
        std::find(s.endpoint_fds.begin(), s.endpoint_fds.end(), *socket) == s.endpoint_fds.end())
      continue;
    ++ready_endpoints;
    for (std::uint32_t extra = 1; extra < s.reads_per_ready_endpoint; ++extra) s.batch.push_back(ready[i]);
  }
  const std::uint64_t datagrams_before = s.ingress.datagrams.load(std::memory_order_relaxed);
  coap_io_do_epoll(s.context, s.batch.data(), s.batch.size());
  if (ready_endpoints == 0) return;
  const std::uint64_t read = s.ingress.datagrams.load(std::memory_order_relaxed) - datagrams_before;
  const std::uint64_t tried = std::uint64_t{s.reads_per_ready_endpoint} * ready_endpoints;
  const std::uint64_t next = read >= tried ? 2 * std::uint64_t{s.reads_per_ready_endpoint} : read / ready_endpoints + 1;
  s.reads_per_ready_endpoint = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(next, 1, s.options.datagrams_per_pass));
}

// ------------------------------------------------------------------------------------
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
