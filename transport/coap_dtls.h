// CoAP over DTLS 1.2 with pre-shared keys: a server that dispatches requests to
// handlers, and a blocking client. Built on libcoap (Mbed TLS backend); this header
// does not expose libcoap, so nothing outside transport/ includes it.
//
// Bodies of any size travel with block-wise transfer (RFC 7959), handled by libcoap.
// Neither class is thread-safe: each instance is driven by one thread.
#pragma once

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

// Raised for set-up failures and for requests that got no answer (timeout, handshake
// refused, connection lost). A CoAP error code from the peer is not an exception: it is
// a CoapResponse with that code.
class TransportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
  static constexpr int kConflict = 409;
  static constexpr int kRequestEntityTooLarge = 413;
  static constexpr int kInternalServerError = 500;
};
// "2.05" for 205.
std::string coap_code_string(int code);

struct PskCredentials {
  std::string identity;
  std::vector<std::uint8_t> key;
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

struct CoapRequest {
  Method method = Method::kGet;
  // The PSK identity the peer proved in the DTLS handshake; never taken from the payload.
  std::string identity;
  std::span<const std::uint8_t> payload;
  // Set by CoapDtlsServer for confirmable requests; callable only while the handler runs.
  // A handler that calls it answers later
  // through the returned handle: the value it returns is then ignored and the request is
  // acknowledged at once with an empty ACK (so the client stops retransmitting it). Empty
  // when there is no network (handlers called directly) or the request is non-confirmable:
  // the handler must answer in its return value.
  std::function<DeferredResponse()> defer;
};

struct CoapResponse {
  CoapResponse() = default;
  CoapResponse(int code, std::vector<std::uint8_t> payload = {}, std::optional<std::uint64_t> etag = {})
      : code(code), payload(std::move(payload)), etag(etag) {}
  int code = 0;
  std::vector<std::uint8_t> payload;
  // The ETag option (RFC 7252 5.10.6) as an unsigned integer. Set by a handler, the server
  // sends it; the client fills it from the response. libcoap 4.3.1 reserves 0 for block-wise
  // bodies (it substitutes a value of its own), so an ETag of 0 is only kept on single-block
  // bodies.
  std::optional<std::uint64_t> etag;
};

using RequestHandler = std::function<CoapResponse(const CoapRequest&)>;
// Returns the key for a PSK identity, or nullopt to refuse the handshake.
using PskLookup = std::function<std::optional<std::vector<std::uint8_t>>(std::string_view identity)>;

class CoapDtlsServer {
 public:
  struct Options {
    std::string bind_address = "127.0.0.1";
    std::uint16_t port = 0;  // 0: the kernel picks a free port; see port()
    PskLookup psk_lookup;
  };
  explicit CoapDtlsServer(Options options);
  ~CoapDtlsServer();
  CoapDtlsServer(const CoapDtlsServer&) = delete;
  CoapDtlsServer& operator=(const CoapDtlsServer&) = delete;

  // Registers `handler` for `method` on the resource at `path` (no leading slash).
  void add_resource(const std::string& path, Method method, RequestHandler handler);
  std::uint16_t port() const;
  // What reached the server's UDP socket since construction: every datagram libcoap read
  // from it (DTLS handshakes and records, CoAP headers, block-wise overhead,
  // retransmissions, and datagrams it then dropped), counted as UDP payload bytes (IP and
  // UDP headers excluded). Safe to call from any thread.
  std::uint64_t bytes_received() const;
  std::uint64_t datagrams_received() const;
  // Handles network events for at most `timeout_ms` milliseconds.
  void run_once(int timeout_ms);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class CoapDtlsClient {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    std::uint16_t port = 5684;
    PskCredentials psk;
    int timeout_ms = 10000;  // for one whole request, handshake and blocks included
  };
  explicit CoapDtlsClient(Options options);
  ~CoapDtlsClient();
  CoapDtlsClient(const CoapDtlsClient&) = delete;
  CoapDtlsClient& operator=(const CoapDtlsClient&) = delete;

  // Sends one confirmable request and waits for its response. Throws TransportError if
  // none arrives in time or the DTLS session fails.
  CoapResponse request(Method method, const std::string& path, std::span<const std::uint8_t> payload = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace edgetrain::transport
