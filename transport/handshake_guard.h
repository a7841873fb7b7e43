// The server's front guard against DTLS handshake floods (transport-internal; not for use
// outside transport/). transport/README.md, "Handshake floods", has the why at length.
//
// libcoap 4.3.1 keeps a session with a whole Mbed TLS context (~40 kB) for every source
// address:port that sends a ClientHello, BEFORE the cookie exchange, and frees such a
// half-open session only after 30 s and only when another ClientHello arrives; beyond 100
// of them it ignores every new ClientHello. So one second of spoofed ClientHellos locked
// out every new device for half a minute. This guard sits in front of libcoap, on the
// datagrams its recvmsg() reads from the DTLS endpoint (socket_ingress.h), and keeps no
// state for a peer until the peer has proved it receives at its address:
//  - a ClientHello without a valid cookie is answered here with a HelloVerifyRequest
//    (RFC 6347 4.2.1) carrying a stateless cookie (an HMAC of the peer's address and the
//    time, Mbed TLS's ssl_cookie under one key per process) and never reaches libcoap;
//  - a ClientHello with a valid cookie reaches libcoap, whose Mbed TLS checks the same
//    cookie (the link maps libcoap's calls of mbedtls_ssl_cookie_write/check to this
//    guard's key: --wrap in transport/CMakeLists.txt), so the client sees one cookie
//    exchange, as before; unless its source address already started more than its share:
//    a token bucket per source address (IPv4 address, IPv6 /64), a cap on the handshakes
//    pending per source address and one on all pending handshakes;
//  - a handshake not finished within the timeout is ended (the server calls overdue()).
// Every other datagram passes untouched.
//
// Thread: one instance is used by the thread that drives its server (libcoap reads, and
// calls Mbed TLS's cookie callbacks, on that thread). The cookie key is per process and
// thread-safe.
#pragma once

#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/coap_dtls.h"
#include "transport/socket_ingress.h"

namespace edgetrain::transport::detail {

using GuardClock = std::chrono::steady_clock;

// A peer as the guard keys it: family, address (IPv4 in its first 4 bytes; an IPv4-mapped
// IPv6 address counts as IPv4) and port.
struct PeerAddress {
  std::uint8_t family = 0;  // 4 or 6; 0 = not an IP address
  std::array<std::uint8_t, 16> ip{};
  std::uint16_t port = 0;
  auto operator<=>(const PeerAddress&) const = default;
  // What rate limits are kept by: the IPv4 address, or the /64 of an IPv6 address.
  PeerAddress source() const;
  // The bytes the cookie is computed over (family, address, port).
  std::array<std::uint8_t, 19> cookie_identity() const;
};
PeerAddress peer_address(const sockaddr* address, socklen_t length);

// What the guard needs from a datagram that is a DTLS ClientHello.
struct ClientHello {
  std::array<std::uint8_t, 6> record_sequence{};  // echoed in the HelloVerifyRequest
  std::uint16_t message_seq = 0;                  // echoed too (RFC 6347 4.2.1)
  std::vector<std::uint8_t> cookie;               // empty in a first ClientHello
};
enum class DatagramKind { kOther, kClientHello, kMalformedClientHello };
// Classifies a datagram read from a DTLS endpoint: a first record of content type
// handshake, epoch 0, whose message is a ClientHello is one (every length checked against
// the datagram; a fragmented ClientHello counts as malformed: Mbed TLS 2.28 refuses those
// anyway); everything else is kOther and goes to libcoap unexamined.
DatagramKind classify_datagram(std::span<const std::uint8_t> datagram, ClientHello* hello);

// The HelloVerifyRequest that answers `hello` with `cookie` (one datagram), in `out`
// (cleared first; its capacity is reused, so a guard answers a flood without allocating).
void hello_verify_request(const ClientHello& hello, std::span<const std::uint8_t> cookie,
                          std::vector<std::uint8_t>& out);

// Stateless cookies for a peer: Mbed TLS's ssl_cookie (4 bytes of time and an HMAC of
// them and the peer's address) under one random key per process, valid for 60 s.
inline constexpr std::size_t kMaxCookieBytes = 64;
struct Cookie {
  std::array<std::uint8_t, kMaxCookieBytes> bytes{};
  std::size_t size = 0;  // 0: none could be made
  std::span<const std::uint8_t> view() const { return {bytes.data(), size}; }
};
Cookie make_cookie(const PeerAddress& peer);
bool cookie_is_valid(const PeerAddress& peer, std::span<const std::uint8_t> cookie);

// Token bucket and pending-handshake bookkeeping; decides what happens to a datagram.
class HandshakeGuard : public DatagramFilter {
 public:
  explicit HandshakeGuard(const HandshakeLimits& limits);

  enum class Decision {
    kPass,              // to libcoap
    kAnswerWithCookie,  // `reply` holds a HelloVerifyRequest; drop the datagram
    kDropMalformed,
    kDropRateLimited,     // this source address started too many handshakes lately
    kDropTooManyPending,  // the server (or this source address) has too many pending
  };
  // The decision for one datagram from `peer` (no I/O; `reply` is set for
  // kAnswerWithCookie). Counts it in stats(). Allocates nothing for a ClientHello without
  // a cookie once `reply` has grown to a HelloVerifyRequest's size.
  Decision decide(const PeerAddress& peer, std::span<const std::uint8_t> datagram,
                  GuardClock::time_point now, std::vector<std::uint8_t>& reply);
  // DatagramFilter: decide(), and send the HelloVerifyRequest from the same local address
  // the datagram arrived at.
  bool admit(int fd, const msghdr& received, std::span<const std::uint8_t> datagram) override;

  // libcoap made a session for an admitted ClientHello (COAP_EVENT_SERVER_SESSION_NEW):
  // it is pending until handshake_ended() or its deadline. `session` is only a key.
  void handshake_started(const void* session, const PeerAddress& peer, GuardClock::time_point now);
  // The session finished its handshake or is gone. Returns the identity noted for it.
  std::optional<std::string> handshake_ended(const void* session);
  // The PSK identity a pending handshake presented, when the server knows it (for the
  // failure report of a known identity).
  void note_known_identity(const void* session, std::string identity);
  std::optional<std::string> known_identity(const void* session) const;
  bool is_pending(const void* session) const { return by_session_.count(session) != 0; }
  // Pending handshakes past their deadline, with their peers; still pending until ended.
  std::vector<std::pair<const void*, PeerAddress>> overdue(GuardClock::time_point now) const;
  std::vector<const void*> pending_sessions() const;
  void count_timed_out() { ++stats_.handshakes_timed_out; }
  // Forgets idle rate-limit entries (a full bucket) so the table stays small.
  void forget_idle_sources(GuardClock::time_point now);
  std::size_t tracked_sources() const { return buckets_.size(); }

  HandshakeStats stats() const;

 private:
  struct Bucket {
    double tokens = 0;
    GuardClock::time_point refilled;
  };
  struct Pending {
    const void* session = nullptr;
    GuardClock::time_point deadline;
    std::optional<std::string> known_identity;
  };
  bool take_token(const PeerAddress& source, GuardClock::time_point now);
  Decision admit_verified(const PeerAddress& peer, GuardClock::time_point now);

  HandshakeLimits limits_;
  std::vector<std::uint8_t> reply_;         // admit()'s, reused
  std::map<PeerAddress, Bucket> buckets_;   // by source (PeerAddress::source())
  std::map<PeerAddress, Pending> pending_;  // by peer address:port
  std::map<PeerAddress, std::uint32_t> pending_by_source_;
  std::unordered_map<const void*, PeerAddress> by_session_;
  HandshakeStats stats_;
};

// Most sources the rate limiter remembers at once; a source beyond it is refused until
// idle entries are forgotten. Only sources that returned a valid cookie get an entry.
inline constexpr std::size_t kMaxRateLimitedSources = 65536;

}  // namespace edgetrain::transport::detail
