// CoAP over DTLS 1.2 with pre-shared keys (default) or X.509 certificates, and plain CoAP
// only when explicitly asked for (insecure): a server that dispatches requests to
// handlers, and a blocking client. Built on libcoap (Mbed TLS backend); this header
// does not expose libcoap, so nothing outside transport/ includes it.
//
// Bodies of any size travel with block-wise transfer (RFC 7959), handled by libcoap, except
// that the server assembles request bodies (Block1) itself, to refuse oversize ones early,
// and that bodies between these two classes use Q-Block (RFC 9177: bodies in bursts, one
// request or one answer per burst; CoapTiming::q_block), implemented here over libcoap 4.3.1.
// Neither class is thread-safe: each instance is driven by one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace edgetrain::transport {

// Why a request got no answer, as far as this side can tell: what a caller needs to decide
// between retrying later (the server is away) and giving up (a wrong key will not become
// right). The message of the TransportError says the same in words a person acts on.
enum class TransportFailure {
  kOther,        // set-up failures and the rest: a send that failed, a reset exchange
  kNoAnswer,     // nothing came back from the server's address, not even a DTLS record: a
                 // firewall dropping the datagrams, a wrong address, a host that is down
  kUnreachable,  // an ICMP error came back: nothing listens on that port, or no route to the host
  kHandshakeRefused,  // the DTLS handshake was refused: the server sent a fatal alert (a wrong
                      // key, a certificate it does not accept), or this side refused the
                      // server's certificate
  kUnknownIdentity,   // the server does not know this PSK identity (alert unknown_psk_identity)
  kTimedOut,          // the server had answered (a session, a handshake begun) but this request
                      // got no answer in time: a server gone, overloaded, or a lossy link
  kSessionLost,       // the server closed the session (and a fresh one failed too)
  kInterrupted,       // the client's stop flag was set (Options::stop)
};
const char* transport_failure_name(TransportFailure failure);  // "no answer", "unreachable", ...

// Raised for set-up failures and for requests that got no answer (timeout, handshake
// refused, connection lost). A CoAP error code from the peer is not an exception: it is
// a CoapResponse with that code.
class TransportError : public std::runtime_error {
 public:
  explicit TransportError(const std::string& what,
                          TransportFailure failure = TransportFailure::kOther)
      : std::runtime_error(what), failure_(failure) {}
  TransportFailure failure() const { return failure_; }

 private:
  TransportFailure failure_;
};

// The (D)TLS library libcoap was built with, e.g. "Mbed TLS 2.28.3".
std::string tls_library_description();
bool tls_library_is_mbedtls();

enum class Method { kGet, kPost, kPut, kDelete };

// CoAP response codes as class * 100 + detail: 205 is 2.05 Content.
struct CoapCode {
  static constexpr int kCreated = 201;
  static constexpr int kChanged = 204;
  static constexpr int kContent = 205;
  static constexpr int kBadRequest = 400;
  static constexpr int kUnauthorized = 401;
  static constexpr int kForbidden = 403;
  static constexpr int kNotFound = 404;
  static constexpr int kMethodNotAllowed = 405;
  static constexpr int kConflict = 409;
  static constexpr int kRequestEntityTooLarge = 413;
  static constexpr int kUnprocessableEntity = 422;  // RFC 8132
  static constexpr int kInternalServerError = 500;
};
// "2.05" for 205.
std::string coap_code_string(int code);

// The longest pre-shared key Mbed TLS 2.28 can use (MBEDTLS_PSK_MAX_LEN, checked against
// the library's header in coap_session.cc): with a longer key every handshake fails, and the
// failure looks like a wrong key.
inline constexpr std::size_t kMaxPskBytes = 32;

struct PskCredentials {
  std::string identity;
  std::vector<std::uint8_t> key;  // at most kMaxPskBytes
};

struct CoapResponse;

// The answer to a request, sent after its handler has returned: a CoAP separate response
// (RFC 7252 5.2.2) as a confirmable message of its own. The server uses it to acknowledge
// an update only once it is durable. Move-only; used on the thread that drives the server.
// Only small payloads (up to 512 bytes are sent; no block-wise transfer). Sending after the
// peer's session ended, or after the server was destroyed, does nothing; destroying it
// unsent sends nothing (the client times out or retransmits).
class DeferredResponse {
 public:
  struct State;
  DeferredResponse();
  explicit DeferredResponse(std::unique_ptr<State> state);
  DeferredResponse(DeferredResponse&&) noexcept;
  DeferredResponse& operator=(DeferredResponse&&) noexcept;
  ~DeferredResponse();
  // Sends `response` (at most once; later calls do nothing).
  void send(const CoapResponse& response);
  bool sent_or_empty() const { return !state_; }

 private:
  std::unique_ptr<State> state_;
};

// How the peer of a request proved who it is.
enum class PeerAuthentication {
  kNone,         // plain CoAP (insecure endpoint): `identity` is whatever the peer declared
  kPsk,          // DTLS-PSK: `identity` is the PSK identity
  kCertificate,  // DTLS with X.509: `identity` is the subject CN of the peer's certificate
};
const char* peer_authentication_name(
    PeerAuthentication authentication);  // "none", "psk", "certificate"

// PEM files for DTLS with X.509 certificates. The files are read again at every handshake
// (libcoap's Mbed TLS backend parses them per session), so they must stay in place.
struct CertificateFiles {
  std::string certificate_file;  // this side's certificate
  std::string private_key_file;  // its private key (unencrypted PEM)
  std::string ca_file;           // the peer's certificate must be signed by this CA
};

// CoAP transmission parameters (RFC 7252, section 4.8), applied to every session.
struct CoapTiming {
  double ack_timeout_seconds =
      1.0;  // first retransmission after ACK_TIMEOUT × [1, ACK_RANDOM_FACTOR]
  double ack_random_factor = 1.5;
  int max_retransmit = 4;  // retransmissions before giving up on a message
  int nstart = 1;          // outstanding confirmable messages per peer
  // RFC 9177 Q-Block (transport/README.md, "Q-Block"). Q-Block2, for GET answers of more
  // than one block: the client asks for the whole body with one request and the server
  // sends its blocks in bursts of max_payloads, each burst asked for by one request.
  // Q-Block1, for POST/PUT bodies of more than one block: the client sends them in bursts
  // of max_payloads, the server answers each burst once (2.31, or 4.08 with the missing
  // blocks). A server with it off answers a Q-Block request 4.02 Bad Option (libcoap does
  // not know the options), and the client then falls back to RFC 7959 with that server.
  bool q_block = true;
  int max_payloads = 10;  // RFC 9177 MAX_PAYLOADS: blocks sent per burst (1..64)
  // RFC 7252's defaults: 2 s, 1.5, 4, 1.
  static CoapTiming rfc7252() { return {2.0, 1.5, 4, 1}; }
  // edgetrain's default for a WAN of cheap boards (transport/README.md, "Timing"): the
  // first retransmission twice as early as the RFC's (a lost block costs half the wait),
  // and giving up on a silent server after 31-47 s instead of 62-93 s.
  static CoapTiming wan() { return {}; }
};
// Throws std::invalid_argument naming the parameter when a value is outside what libcoap
// accepts (ACK_TIMEOUT 1..60 s, ACK_RANDOM_FACTOR 1..4, MAX_RETRANSMIT 1..10, NSTART 1..16)
// or MAX_PAYLOADS is outside 1..64.
void check_timing(const CoapTiming& timing);

// How the server bounds DTLS handshakes (transport/README.md, "Handshake floods"). No
// state is kept for a peer before it has answered a stateless cookie (HelloVerifyRequest);
// after that:
struct HandshakeLimits {
  // A handshake not finished this long after its ClientHello is ended and its state freed.
  double timeout_seconds = 10;
  // Handshakes in progress at once, in all; a ClientHello beyond it is dropped (the client
  // retransmits it 1 s later, doubling). libcoap's own cap is set to the same number.
  std::uint32_t max_pending = 100;
  // ...and from one source address (IPv4 address, IPv6 /64); above max_pending it is max_pending.
  std::uint32_t max_pending_per_address = 25;
  // New handshakes per second from one source address (a token bucket holding as many).
  double rate_per_address = 50;
};
// Throws std::invalid_argument naming the limit that is out of range (timeout 1..120 s,
// max_pending and max_pending_per_address 1..100000, rate 0.1..100000 per s).
void check_handshake_limits(const HandshakeLimits& limits);

// What the server's handshake guard did since start (CoapDtlsServer::handshake_stats()).
struct HandshakeStats {
  std::uint64_t hello_verify_requests =
      0;  // ClientHellos without a valid cookie, answered statelessly
  std::uint64_t client_hellos_admitted = 0;  // with a valid cookie, handed to libcoap
  std::uint64_t refused_rate_limited = 0;  // with a valid cookie, dropped: rate per source address
  std::uint64_t refused_too_many_pending = 0;  // dropped: max_pending or max_pending_per_address
  std::uint64_t malformed_client_hellos = 0;
  std::uint64_t handshakes_timed_out = 0;  // ended by timeout_seconds
  std::uint32_t pending = 0;               // handshakes in progress now
};

// A failed DTLS handshake of an identity the server's psk_lookup knows (a known device
// with a wrong key, or one that went silent after naming itself).
struct HandshakeFailure {
  std::string identity;      // as the peer sent it: escape before showing it
  std::string peer_address;  // "203.0.113.5:40123"
  std::string reason;        // "wrong key or corrupted handshake", "timed out"
};

struct CoapRequest {
  Method method = Method::kGet;
  // DTLS: the identity the peer proved in the handshake (PSK identity or certificate CN);
  // never taken from the payload. Plain CoAP: the identity the peer declared with the
  // `id` URI query (?id=NAME, as sent: up to 255 bytes), unproven; empty if it declared none.
  std::string identity;
  std::span<const std::uint8_t> payload;
  // The Uri-Query options joined with '&' ("since=42"); empty when there are none.
  std::string query;
  // Set by CoapDtlsServer for confirmable requests; callable only while the handler runs.
  // A handler that calls it answers later
  // through the returned handle: the value it returns is then ignored and the request is
  // acknowledged at once with an empty ACK (so the client stops retransmitting it). Empty
  // when there is no network (handlers called directly) or the request is non-confirmable:
  // the handler must answer in its return value.
  std::function<DeferredResponse()> defer;
  PeerAuthentication authentication = PeerAuthentication::kNone;
  std::string peer_address;  // "127.0.0.1:43210", for logs
};

struct CoapResponse {
  CoapResponse() = default;
  CoapResponse(int code, std::vector<std::uint8_t> payload = {},
               std::optional<std::uint64_t> etag = {})
      : code(code), payload(std::move(payload)), etag(etag) {}
  int code = 0;
  std::vector<std::uint8_t> payload;
  // The ETag option (RFC 7252 5.10.6) as an unsigned integer. Set by a handler, the server
  // sends it; the client fills it from the response. libcoap 4.3.1 reserves 0 for block-wise
  // bodies (it substitutes a value of its own), so an ETag of 0 is only kept on single-block
  // bodies.
  std::optional<std::uint64_t> etag;
};

// A response whose payload is a UTF-8 message: the reason a request was refused, or a short
// status for the peer.
inline CoapResponse text_response(int code, std::string_view text) {
  return {code, {text.begin(), text.end()}};
}

using RequestHandler = std::function<CoapResponse(const CoapRequest&)>;
// Returns the key for a PSK identity, or nullopt to refuse the handshake.
using PskLookup =
    std::function<std::optional<std::vector<std::uint8_t>>(std::string_view identity)>;

class CoapDtlsServer {
 public:
  struct Options {
    std::string bind_address = "127.0.0.1";
    std::uint16_t port = 0;  // 0: the kernel picks a free port; see port()
    PskLookup psk_lookup;
    // Checked once per request (per whole body) on a PSK session, when set: the key the
    // identity has now. If it returns none (the device was removed) or another key than the
    // session's (it was re-keyed), the request gets 4.01 "session key revoked" and the
    // session is closed, so a key an operator revokes stops working at once, not when the
    // session ends. Unset: sessions keep their key until they end.
    PskLookup current_psk;
    // Also accept clients with a certificate signed by `ca_file` (mutual authentication);
    // PSK clients are accepted alongside as long as psk_lookup is set.
    std::optional<CertificateFiles> certificates;
    // INSECURE: also serve plain CoAP (no DTLS, no proven identity) on this UDP port of
    // bind_address (0: any free port, see plaintext_port()). Unset: no plaintext endpoint.
    std::optional<std::uint16_t> plaintext_port;
    CoapTiming timing = CoapTiming::wan();
    // At most this many datagrams are read from a ready endpoint per pass of the event
    // loop (run_once). libcoap 4.3.1 reads one per pass and, around every pass, walks all
    // sessions for their timeouts: at 1000 sessions that walk is most of the server's CPU.
    // 1 gives libcoap's own loop (coap_io_process) back.
    std::uint32_t datagrams_per_pass = 32;
    // Request bodies (any resource). The server assembles block-wise (Block1) bodies
    // itself, block by block, so that one above max_body_bytes is refused with 4.13 (and
    // a Size1 option saying the limit, RFC 7959 2.9.3) as soon as its Size1 option
    // announces more, or the blocks received so far pass it: memory per session stays at
    // most max_body_bytes. At most max_bodies_in_progress bodies are assembled at once
    // (one per session); a body beyond that gets 5.03 and its first block is dropped.
    // Worst case: max_bodies_in_progress × max_body_bytes.
    std::size_t max_body_bytes = std::size_t{4} << 20;
    std::size_t max_bodies_in_progress = 256;
    HandshakeLimits handshake;
    // Bind the endpoints with SO_REUSEPORT, so that several servers (one per event-loop
    // thread, edgetrain-server --loop-threads) share one port: the kernel hands each
    // datagram to one of them by a hash of its source and destination, so all datagrams of
    // one client address:port, hence its DTLS session, reach the same server while the set
    // of sockets stays the same. Every socket of the group must set it; the first may bind
    // port 0 and the others then bind port(). The handshake limits hold per server.
    bool reuse_port = false;
    // Called (on the thread that drives the server) for every failed handshake of an
    // identity psk_lookup returned a key for. Unknown identities are psk_lookup's to report.
    std::function<void(const HandshakeFailure&)> on_handshake_failure;
  };
  // Throws TransportError if an endpoint cannot be opened or a certificate file is
  // unreadable, std::invalid_argument for bad timing values, handshake limits,
  // datagrams_per_pass outside 1..1024, or a max_body_bytes or max_bodies_in_progress of 0.
  explicit CoapDtlsServer(Options options);
  ~CoapDtlsServer();
  CoapDtlsServer(const CoapDtlsServer&) = delete;
  CoapDtlsServer& operator=(const CoapDtlsServer&) = delete;

  // Registers `handler` for `method` on the resource at `path` (no leading slash).
  void add_resource(const std::string& path, Method method, RequestHandler handler);
  // CoAP Observe (RFC 7641) on the GET handler of `path`, which must be registered: a GET
  // with Observe: 0 subscribes, its answer carries the Observe option, and every
  // notify_observers(path) has the handler run again for each subscriber and its answer
  // sent to it (non-confirmable, every fifth confirmable; block-wise for large bodies), on
  // the next run_once(). A subscriber is dropped when a notification fails or its answer
  // is not 2.xx. Throws std::logic_error when `path` has no GET handler.
  void make_observable(const std::string& path);
  // Returns whether `path` has subscribers (then they are notified on the next run_once()).
  bool notify_observers(const std::string& path);
  std::uint16_t port() const;
  // The plain CoAP port, or 0 when there is no plaintext endpoint.
  std::uint16_t plaintext_port() const;
  // What reached the server's UDP sockets (DTLS and, if any, plaintext) since
  // construction: every datagram libcoap read from them (DTLS handshakes and records, CoAP headers,
  // block-wise overhead, retransmissions, and datagrams it then dropped), counted as UDP payload
  // bytes (IP and UDP headers excluded). Safe to call from any thread.
  std::uint64_t bytes_received() const;
  std::uint64_t datagrams_received() const;
  // What left them the same way (answers, Block2 bodies, handshakes, retransmissions).
  std::uint64_t bytes_sent() const;
  std::uint64_t datagrams_sent() const;
  // Block-wise bodies being assembled now, and the ones refused since construction for
  // passing max_body_bytes (4.13) or max_bodies_in_progress (5.03).
  std::size_t bodies_in_progress() const;
  std::uint64_t bodies_refused() const;
  // GET bodies sent with Q-Block2 since construction (each counted once however many
  // requests its bursts took), and the ones kept now for their next bursts (at most
  // max_bodies_in_progress, each for at most 10 s after its last request). Safe to call
  // from any thread.
  std::uint64_t q_block2_bodies_served() const;
  std::size_t q_block2_bodies_held() const;
  // How many of libcoap's records of finished block-wise bodies were freed at once rather
  // than 93 s later (transport/libcoap_block_bodies.h). Call on the thread that drives the server.
  std::uint64_t block_records_freed() const;
  // What the handshake guard did since construction. Call on the thread that drives the server.
  HandshakeStats handshake_stats() const;
  // Handles network events for at most `timeout_ms` milliseconds.
  void run_once(int timeout_ms);
  // Lets another thread end a run_once() wait early: `fd` (an eventfd, or any descriptor that
  // turns readable; the caller owns it and keeps it open while this server lives) is watched
  // with the endpoints, and a run_once() that finds it readable drains it (one 8-byte read)
  // and returns after its pass. Only with the batched loop (datagrams_per_pass > 1 on a
  // libcoap built with epoll): returns false otherwise, and the caller has to poll.
  bool watch_wake_fd(int fd);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// When a request that started at `started` and last heard from the server at `last_heard`
// times out (CoapDtlsClient::Options::longest_request_ms): started + timeout without an
// extension (longest <= timeout), else last_heard + timeout, at least started + timeout and
// at most started + longest.
std::chrono::steady_clock::time_point request_deadline(
    std::chrono::steady_clock::time_point started, std::chrono::steady_clock::time_point last_heard,
    std::chrono::milliseconds timeout, std::chrono::milliseconds longest);

class CoapDtlsClient {
 public:
  struct Options {
    // The four settings every client names, so that {host, port, psk, timeout} keeps
    // working (and -Wextra quiet) now that the rest have defaults.
    Options(std::string host = "127.0.0.1", std::uint16_t port = 5684, PskCredentials psk = {},
            int timeout_ms = 10000)
        : host(std::move(host)), port(port), psk(std::move(psk)), timeout_ms(timeout_ms) {}
    std::string host;
    std::uint16_t port;
    PskCredentials psk;
    int timeout_ms;  // for one whole request, handshake and blocks included
    // Ours (issue 38 part 1): 0 (the default) or at most timeout_ms, and timeout_ms bounds
    // the whole request. Above it, a request the server keeps answering (a block, a block's
    // acknowledgement, a pong) gets timeout_ms more after each answer, up to this in all
    // (request_deadline()): a wide transfer that keeps moving on a slow device is not cut
    // by a timeout meant to find a silent server; a silent one still fails at timeout_ms.
    int longest_request_ms = 0;
    // DTLS with this certificate instead of PSK; the server's certificate must be signed
    // by `ca_file`.
    std::optional<CertificateFiles> certificates;
    // With certificates: the CN the server's certificate must carry (a gossip peer dials a
    // neighbour by its name); the handshake fails otherwise. Empty: any name the CA signed.
    std::string expected_peer_name;
    // INSECURE: plain CoAP, no DTLS. psk.identity, if set, is declared with every request
    // as the URI query ?id=IDENTITY (the server cannot check it); the key is not used.
    bool plaintext = false;
    CoapTiming timing = CoapTiming::wan();
    // Not owned; may be null. While a request waits (for the handshake, an answer, the pause
    // before a reconnection), this flag is looked at at least every 100 ms: once true, the
    // request ends with TransportError (kInterrupted). A SIGTERM handler sets it.
    const std::atomic<bool>* stop = nullptr;
  };
  // Throws TransportError for unusable credentials (no PSK, a key longer than kMaxPskBytes,
  // unreadable certificate files) and an unresolvable host, std::invalid_argument for bad
  // timing values.
  explicit CoapDtlsClient(Options options);
  ~CoapDtlsClient();
  CoapDtlsClient(const CoapDtlsClient&) = delete;
  CoapDtlsClient& operator=(const CoapDtlsClient&) = delete;

  // Sends one confirmable request and waits for its response, all within timeout_ms. `path`
  // may end in a query ("model?since=42"): each '&'-separated part becomes one Uri-Query
  // option. One session is kept across requests. If a session that already carried an exchange
  // fails before the deadline (the server closed it, or lost it and libcoap gave up
  // retransmitting), the request is sent once more on a fresh session after a 100-300 ms
  // pause. Throws TransportError if no answer arrives in time or the fresh session fails
  // too (its failure() says why: TransportFailure); the failed session is dropped and the
  // next request starts a new one. Every new
  // session is a full handshake: libcoap 4.3.1 with Mbed TLS cannot resume a DTLS session
  // (transport/README.md, "Reconnection").
  // `timeout_ms` > 0 bounds this request alone, whole (a reachability probe), instead of
  // the options' timeout_ms and longest_request_ms.
  CoapResponse request(Method method, const std::string& path,
                       std::span<const std::uint8_t> payload = {}, int timeout_ms = 0);
  // Sessions (handshakes) started so far, the first one included.
  std::uint64_t sessions_started() const;
  // Of those, the ones started inside a request because the kept session had failed.
  std::uint64_t reconnections() const;
  // Of those failures, the ones found by the liveness probe: a kept session on which neither
  // the request nor a CoAP ping got an answer (a server that restarted forgets its sessions).
  std::uint64_t silent_sessions() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace edgetrain::transport
