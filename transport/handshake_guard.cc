// The front guard of handshake_guard.h: ClientHello parsing, stateless cookies, the
// HelloVerifyRequest, and the limits on handshakes that libcoap goes on to keep state for.
// Also the two link-time wraps that make libcoap's Mbed TLS check this guard's cookies.
#include "transport/handshake_guard.h"

#include <coap3/coap.h>
#include <mbedtls/ssl_cookie.h>
#include <netinet/in.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>

// The C library's (through --wrap, transport/CMakeLists.txt): this file's own cookie calls
// must reach Mbed TLS, not the wraps below.
extern "C" int __real_mbedtls_ssl_cookie_write(void* ctx, unsigned char** p, unsigned char* end,
                                               const unsigned char* cli_id, size_t cli_id_len);
extern "C" int __real_mbedtls_ssl_cookie_check(void* ctx, const unsigned char* cookie,
                                               size_t cookie_len, const unsigned char* cli_id,
                                               size_t cli_id_len);

namespace edgetrain::transport {

void check_handshake_limits(const HandshakeLimits& limits) {
  if (!(limits.timeout_seconds >= 1 && limits.timeout_seconds <= 120))
    throw std::invalid_argument("handshake timeout must be 1..120 seconds");
  if (limits.max_pending < 1 || limits.max_pending > 100000)
    throw std::invalid_argument("max pending handshakes must be 1..100000");
  if (limits.max_pending_per_address < 1 || limits.max_pending_per_address > 100000)
    throw std::invalid_argument("max pending handshakes per address must be 1..100000");
  if (!(limits.rate_per_address >= 0.1 && limits.rate_per_address <= 100000))
    throw std::invalid_argument("handshake rate per address must be 0.1..100000 per second");
}

namespace detail {
namespace {

constexpr std::uint8_t kContentTypeHandshake = 22;
constexpr std::uint8_t kHandshakeClientHello = 1;
constexpr std::uint8_t kHandshakeHelloVerifyRequest = 3;
constexpr std::size_t kRecordHeaderBytes = 13;
constexpr std::size_t kHandshakeHeaderBytes = 12;
constexpr std::size_t kRandomBytes = 32;
constexpr std::size_t kMaxSessionIdBytes = 32;
// DTLS 1.0 on the wire (RFC 6347 4.2.1: a HelloVerifyRequest SHOULD say 1.0 whatever
// version follows).
constexpr std::uint8_t kDtls10[2] = {254, 255};

std::uint32_t read_u16(const std::uint8_t* p) { return (std::uint32_t{p[0]} << 8) | p[1]; }
std::uint32_t read_u24(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 16) | (std::uint32_t{p[1]} << 8) | p[2];
}

// One random key for the process's cookies, made on first use.
class CookieKey {
 public:
  static CookieKey& instance() {
    static CookieKey key;
    return key;
  }
  // Mbed TLS's cookie: 4 bytes of time and a 28-byte HMAC-SHA224.
  Cookie write(std::span<const std::uint8_t> identity) {
    Cookie cookie;
    unsigned char* end = cookie.bytes.data();
    std::lock_guard lock(mutex_);
    if (__real_mbedtls_ssl_cookie_write(&ctx_, &end, cookie.bytes.data() + cookie.bytes.size(),
                                        identity.data(), identity.size()) == 0)
      cookie.size = static_cast<std::size_t>(end - cookie.bytes.data());
    return cookie;
  }
  bool check(std::span<const std::uint8_t> cookie, std::span<const std::uint8_t> identity) {
    std::lock_guard lock(mutex_);
    return __real_mbedtls_ssl_cookie_check(&ctx_, cookie.data(), cookie.size(), identity.data(),
                                           identity.size()) == 0;
  }

 private:
  CookieKey() {
    mbedtls_ssl_cookie_init(&ctx_);
    if (mbedtls_ssl_cookie_setup(&ctx_, &system_random, nullptr) != 0)
      throw std::runtime_error("cannot set up the DTLS cookie key");
  }
  static int system_random(void*, unsigned char* output, size_t length) {
    while (length > 0) {
      const ssize_t got = getrandom(output, length, 0);
      if (got < 0) {
        if (errno == EINTR) continue;
        return -1;
      }
      output += got;
      length -= static_cast<size_t>(got);
    }
    return 0;
  }
  std::mutex mutex_;
  mbedtls_ssl_cookie_ctx ctx_;
};

// What a ClientHello must hold after its handshake header: version, random, session id,
// cookie, cipher suites, compression methods (extensions follow and are Mbed TLS's to read).
bool parse_client_hello_body(std::span<const std::uint8_t> body, ClientHello* hello) {
  std::size_t at = 2 + kRandomBytes;
  if (body.size() < at + 1) return false;
  const std::size_t session_id_bytes = body[at];
  if (session_id_bytes > kMaxSessionIdBytes) return false;
  at += 1 + session_id_bytes;
  if (body.size() < at + 1) return false;
  const std::size_t cookie_bytes = body[at];
  if (body.size() < at + 1 + cookie_bytes) return false;
  const std::span<const std::uint8_t> cookie = body.subspan(at + 1, cookie_bytes);
  at += 1 + cookie_bytes;
  if (body.size() < at + 2) return false;
  const std::size_t suites_bytes = read_u16(&body[at]);
  if (suites_bytes < 2 || suites_bytes % 2 != 0 || body.size() < at + 2 + suites_bytes)
    return false;
  at += 2 + suites_bytes;
  if (body.size() < at + 1) return false;
  const std::size_t compression_bytes = body[at];
  if (compression_bytes < 1 || body.size() < at + 1 + compression_bytes) return false;
  if (hello) hello->cookie.assign(cookie.begin(), cookie.end());
  return true;
}

void put_u16(std::vector<std::uint8_t>& out, std::size_t value) {
  out.push_back(static_cast<std::uint8_t>(value >> 8));
  out.push_back(static_cast<std::uint8_t>(value));
}
void put_u24(std::vector<std::uint8_t>& out, std::size_t value) {
  out.push_back(static_cast<std::uint8_t>(value >> 16));
  put_u16(out, value & 0xffff);
}

// The local address a datagram arrived at (IP_PKTINFO / IPV6_PKTINFO, which libcoap asks
// for), as control data for the answer, so that a server bound to 0.0.0.0 on a machine with
// several addresses answers from the one the client wrote to, as libcoap does.
std::size_t reply_control(const msghdr& received, std::uint8_t* buffer, std::size_t capacity) {
  auto& message = const_cast<msghdr&>(received);  // the CMSG macros take no const
  if (!message.msg_control || message.msg_controllen < sizeof(cmsghdr)) return 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c; c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO &&
        capacity >= CMSG_SPACE(sizeof(in_pktinfo))) {
      in_pktinfo got;
      std::memcpy(&got, CMSG_DATA(c), sizeof(got));
      in_pktinfo answer{};
      answer.ipi_ifindex = got.ipi_ifindex;
      answer.ipi_spec_dst = got.ipi_addr;
      auto* out = reinterpret_cast<cmsghdr*>(buffer);
      out->cmsg_level = IPPROTO_IP;
      out->cmsg_type = IP_PKTINFO;
      out->cmsg_len = CMSG_LEN(sizeof(answer));
      std::memcpy(CMSG_DATA(out), &answer, sizeof(answer));
      return CMSG_SPACE(sizeof(answer));
    }
    if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO &&
        capacity >= CMSG_SPACE(sizeof(in6_pktinfo))) {
      auto* out = reinterpret_cast<cmsghdr*>(buffer);
      out->cmsg_level = IPPROTO_IPV6;
      out->cmsg_type = IPV6_PKTINFO;
      out->cmsg_len = CMSG_LEN(sizeof(in6_pktinfo));
      std::memcpy(CMSG_DATA(out), CMSG_DATA(c), sizeof(in6_pktinfo));
      return CMSG_SPACE(sizeof(in6_pktinfo));
    }
  }
  return 0;
}

void send_reply(int fd, const msghdr& received, std::span<const std::uint8_t> reply) {
  iovec part{const_cast<std::uint8_t*>(reply.data()), reply.size()};
  alignas(cmsghdr)
      std::uint8_t control[CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(in_pktinfo))] = {};
  msghdr message{};
  message.msg_name = received.msg_name;
  message.msg_namelen = received.msg_namelen;
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  const std::size_t control_bytes = reply_control(received, control, sizeof(control));
  if (control_bytes > 0) {
    message.msg_control = control;
    message.msg_controllen = control_bytes;
  }
  if (sendmsg(fd, &message, MSG_DONTWAIT) < 0 && control_bytes > 0) {
    // A local address we cannot send from (a broadcast one): let the kernel pick one.
    message.msg_control = nullptr;
    message.msg_controllen = 0;
    sendmsg(fd, &message, MSG_DONTWAIT);
  }
}

}  // namespace

PeerAddress PeerAddress::source() const {
  PeerAddress source;
  source.family = family;
  const std::size_t kept = family == 6 ? 8 : 4;  // IPv6: the /64 a subscriber usually gets
  std::copy_n(ip.begin(), kept, source.ip.begin());
  return source;
}

std::array<std::uint8_t, 19> PeerAddress::cookie_identity() const {
  std::array<std::uint8_t, 19> bytes{};
  bytes[0] = family;
  std::copy(ip.begin(), ip.end(), bytes.begin() + 1);
  bytes[17] = static_cast<std::uint8_t>(port >> 8);
  bytes[18] = static_cast<std::uint8_t>(port);
  return bytes;
}

PeerAddress peer_address(const sockaddr* address, socklen_t length) {
  PeerAddress peer;
  if (!address) return peer;
  if (address->sa_family == AF_INET && length >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    sockaddr_in in;
    std::memcpy(&in, address, sizeof(in));
    peer.family = 4;
    std::memcpy(peer.ip.data(), &in.sin_addr, 4);
    peer.port = ntohs(in.sin_port);
  } else if (address->sa_family == AF_INET6 &&
             length >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    sockaddr_in6 in6;
    std::memcpy(&in6, address, sizeof(in6));
    peer.port = ntohs(in6.sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      peer.family = 4;
      std::memcpy(peer.ip.data(), &in6.sin6_addr.s6_addr[12], 4);
    } else {
      peer.family = 6;
      std::memcpy(peer.ip.data(), &in6.sin6_addr, 16);
    }
  }
  return peer;
}

DatagramKind classify_datagram(std::span<const std::uint8_t> datagram, ClientHello* hello) {
  if (datagram.size() <= kRecordHeaderBytes || datagram[0] != kContentTypeHandshake)
    return DatagramKind::kOther;
  if (read_u16(&datagram[3]) != 0 || datagram[kRecordHeaderBytes] != kHandshakeClientHello)
    return DatagramKind::kOther;
  // From here on the datagram says it is a ClientHello: it must be a whole one.
  const std::size_t record_bytes = read_u16(&datagram[11]);
  if (record_bytes < kHandshakeHeaderBytes || datagram.size() - kRecordHeaderBytes < record_bytes)
    return DatagramKind::kMalformedClientHello;
  const std::span<const std::uint8_t> record = datagram.subspan(kRecordHeaderBytes, record_bytes);
  const std::size_t message_bytes = read_u24(&record[1]);
  const std::size_t fragment_offset = read_u24(&record[6]);
  const std::size_t fragment_bytes = read_u24(&record[9]);
  if (fragment_offset != 0 || fragment_bytes != message_bytes ||
      record_bytes - kHandshakeHeaderBytes < message_bytes)
    return DatagramKind::kMalformedClientHello;
  if (!parse_client_hello_body(record.subspan(kHandshakeHeaderBytes, message_bytes), hello))
    return DatagramKind::kMalformedClientHello;
  if (hello) {
    std::copy_n(&datagram[5], 6, hello->record_sequence.begin());
    hello->message_seq = static_cast<std::uint16_t>(read_u16(&record[4]));
  }
  return DatagramKind::kClientHello;
}

void hello_verify_request(const ClientHello& hello, std::span<const std::uint8_t> cookie,
                          std::vector<std::uint8_t>& out) {
  const std::size_t body_bytes = 2 + 1 + cookie.size();
  out.clear();
  out.reserve(kRecordHeaderBytes + kHandshakeHeaderBytes + body_bytes);
  // Record header: the ClientHello's record sequence number (RFC 6347 4.2.1).
  out.push_back(kContentTypeHandshake);
  out.insert(out.end(), kDtls10, kDtls10 + 2);
  put_u16(out, 0);  // epoch
  out.insert(out.end(), hello.record_sequence.begin(), hello.record_sequence.end());
  put_u16(out, kHandshakeHeaderBytes + body_bytes);
  // Handshake header: the ClientHello's message_seq, one unfragmented message.
  out.push_back(kHandshakeHelloVerifyRequest);
  put_u24(out, body_bytes);
  put_u16(out, hello.message_seq);
  put_u24(out, 0);
  put_u24(out, body_bytes);
  out.insert(out.end(), kDtls10, kDtls10 + 2);
  out.push_back(static_cast<std::uint8_t>(cookie.size()));
  out.insert(out.end(), cookie.begin(), cookie.end());
}

Cookie make_cookie(const PeerAddress& peer) {
  return CookieKey::instance().write(peer.cookie_identity());
}

bool cookie_is_valid(const PeerAddress& peer, std::span<const std::uint8_t> cookie) {
  if (cookie.empty() || cookie.size() > kMaxCookieBytes) return false;
  return CookieKey::instance().check(cookie, peer.cookie_identity());
}

HandshakeGuard::HandshakeGuard(const HandshakeLimits& limits) : limits_(limits) {
  check_handshake_limits(limits);
}

HandshakeGuard::Decision HandshakeGuard::decide(const PeerAddress& peer,
                                                std::span<const std::uint8_t> datagram,
                                                GuardClock::time_point now,
                                                std::vector<std::uint8_t>& reply) {
  ClientHello hello;
  switch (classify_datagram(datagram, &hello)) {
    case DatagramKind::kOther:
      return Decision::kPass;
    case DatagramKind::kMalformedClientHello:
      ++stats_.malformed_client_hellos;
      return Decision::kDropMalformed;
    case DatagramKind::kClientHello:
      break;
  }
  if (!cookie_is_valid(peer, hello.cookie)) {
    const Cookie cookie = make_cookie(peer);
    if (cookie.size == 0)
      return Decision::kDropMalformed;  // Mbed TLS failed: nothing sensible to answer
    hello_verify_request(hello, cookie.view(), reply);
    ++stats_.hello_verify_requests;
    return Decision::kAnswerWithCookie;
  }
  return admit_verified(peer, now);
}

// A ClientHello with a valid cookie: the peer receives at its address.
HandshakeGuard::Decision HandshakeGuard::admit_verified(const PeerAddress& peer,
                                                        GuardClock::time_point now) {
  if (pending_.count(peer)) {  // a retransmission within a handshake in progress
    ++stats_.client_hellos_admitted;
    return Decision::kPass;
  }
  const PeerAddress source = peer.source();
  const auto from_source = pending_by_source_.find(source);
  if (pending_.size() >= limits_.max_pending ||
      (from_source != pending_by_source_.end() &&
       from_source->second >= limits_.max_pending_per_address)) {
    ++stats_.refused_too_many_pending;
    return Decision::kDropTooManyPending;
  }
  if (!take_token(source, now)) {
    ++stats_.refused_rate_limited;
    return Decision::kDropRateLimited;
  }
  ++stats_.client_hellos_admitted;
  return Decision::kPass;
}

bool HandshakeGuard::take_token(const PeerAddress& source, GuardClock::time_point now) {
  const double capacity = std::max(1.0, limits_.rate_per_address);
  auto it = buckets_.find(source);
  if (it == buckets_.end()) {
    if (buckets_.size() >= kMaxRateLimitedSources) forget_idle_sources(now);
    if (buckets_.size() >= kMaxRateLimitedSources) return false;
    it = buckets_.emplace(source, Bucket{capacity, now}).first;
  }
  Bucket& bucket = it->second;
  const double elapsed = std::chrono::duration<double>(now - bucket.refilled).count();
  bucket.tokens =
      std::min(capacity, bucket.tokens + std::max(0.0, elapsed) * limits_.rate_per_address);
  bucket.refilled = now;
  if (bucket.tokens < 1) return false;
  bucket.tokens -= 1;
  return true;
}

void HandshakeGuard::forget_idle_sources(GuardClock::time_point now) {
  const double capacity = std::max(1.0, limits_.rate_per_address);
  std::erase_if(buckets_, [&](const auto& entry) {
    const double elapsed = std::chrono::duration<double>(now - entry.second.refilled).count();
    return entry.second.tokens + elapsed * limits_.rate_per_address >= capacity;
  });
}

bool HandshakeGuard::admit(int fd, const msghdr& received, std::span<const std::uint8_t> datagram) {
  const PeerAddress peer =
      peer_address(static_cast<const sockaddr*>(received.msg_name), received.msg_namelen);
  if (peer.family == 0) return true;
  const Decision decision = decide(peer, datagram, GuardClock::now(), reply_);
  if (decision == Decision::kAnswerWithCookie) send_reply(fd, received, reply_);
  return decision == Decision::kPass;
}

void HandshakeGuard::handshake_started(const void* session, const PeerAddress& peer,
                                       GuardClock::time_point now) {
  if (by_session_.count(session)) handshake_ended(session);
  const auto previous = pending_.find(peer);
  if (previous != pending_.end()) handshake_ended(previous->second.session);
  const auto timeout = std::chrono::duration_cast<GuardClock::duration>(
      std::chrono::duration<double>(limits_.timeout_seconds));
  pending_[peer] = Pending{session, now + timeout, std::nullopt};
  by_session_[session] = peer;
  ++pending_by_source_[peer.source()];
}

std::optional<std::string> HandshakeGuard::handshake_ended(const void* session) {
  const auto found = by_session_.find(session);
  if (found == by_session_.end()) return std::nullopt;
  const PeerAddress peer = found->second;
  by_session_.erase(found);
  std::optional<std::string> identity;
  if (const auto it = pending_.find(peer); it != pending_.end() && it->second.session == session) {
    identity = std::move(it->second.known_identity);
    pending_.erase(it);
    const auto source = pending_by_source_.find(peer.source());
    if (source != pending_by_source_.end() && --source->second == 0)
      pending_by_source_.erase(source);
  }
  return identity;
}

void HandshakeGuard::note_known_identity(const void* session, std::string identity) {
  const auto found = by_session_.find(session);
  if (found == by_session_.end()) return;
  if (const auto it = pending_.find(found->second); it != pending_.end())
    it->second.known_identity = std::move(identity);
}

std::optional<std::string> HandshakeGuard::known_identity(const void* session) const {
  const auto found = by_session_.find(session);
  if (found == by_session_.end()) return std::nullopt;
  const auto it = pending_.find(found->second);
  return it == pending_.end() ? std::nullopt : it->second.known_identity;
}

std::vector<std::pair<const void*, PeerAddress>> HandshakeGuard::overdue(
    GuardClock::time_point now) const {
  std::vector<std::pair<const void*, PeerAddress>> late;
  for (const auto& [peer, pending] : pending_)
    if (pending.deadline <= now) late.emplace_back(pending.session, peer);
  return late;
}

std::vector<const void*> HandshakeGuard::pending_sessions() const {
  std::vector<const void*> sessions;
  sessions.reserve(by_session_.size());
  for (const auto& entry : by_session_) sessions.push_back(entry.first);
  return sessions;
}

HandshakeStats HandshakeGuard::stats() const {
  HandshakeStats stats = stats_;
  stats.pending = static_cast<std::uint32_t>(pending_.size());
  return stats;
}

}  // namespace detail
}  // namespace edgetrain::transport

// libcoap's Mbed TLS backend gives every server session a cookie context of its own with a
// random key (setup_server_ssl_session() in src/coap_mbedtls.c of 4.3.1), so a cookie made
// by the guard would fail there and the client would be sent a second HelloVerifyRequest.
// The link maps libcoap's two cookie callbacks here (--wrap), and both use the guard's
// process-wide key instead. libcoap passes the session's coap_address_t as the client's
// transport id (mbedtls_ssl_set_client_transport_id() in coap_dtls_hello()); it is turned
// into the guard's identity bytes, so both compute the same cookie. Any other caller's
// transport id goes to Mbed TLS unchanged.
namespace {

std::optional<edgetrain::transport::detail::PeerAddress> libcoap_peer(const unsigned char* cli_id,
                                                                      size_t length) {
  if (!cli_id || length != sizeof(coap_address_t)) return std::nullopt;
  coap_address_t address;
  std::memcpy(&address, cli_id, sizeof(address));
  if (address.size > static_cast<socklen_t>(sizeof(address.addr))) return std::nullopt;
  const auto peer = edgetrain::transport::detail::peer_address(&address.addr.sa, address.size);
  if (peer.family == 0) return std::nullopt;
  return peer;
}

}  // namespace

extern "C" int __wrap_mbedtls_ssl_cookie_write(void* ctx, unsigned char** p, unsigned char* end,
                                               const unsigned char* cli_id, size_t cli_id_len) {
  const auto peer = libcoap_peer(cli_id, cli_id_len);
  if (!peer) return __real_mbedtls_ssl_cookie_write(ctx, p, end, cli_id, cli_id_len);
  edgetrain::transport::detail::Cookie cookie;
  try {
    cookie = edgetrain::transport::detail::make_cookie(*peer);
  } catch (...) {
  }
  if (cookie.size == 0 || static_cast<std::size_t>(end - *p) < cookie.size)
    return MBEDTLS_ERR_SSL_BUFFER_TOO_SMALL;
  std::memcpy(*p, cookie.bytes.data(), cookie.size);
  *p += cookie.size;
  return 0;
}

extern "C" int __wrap_mbedtls_ssl_cookie_check(void* ctx, const unsigned char* cookie,
                                               size_t cookie_len, const unsigned char* cli_id,
                                               size_t cli_id_len) {
  const auto peer = libcoap_peer(cli_id, cli_id_len);
  if (!peer) return __real_mbedtls_ssl_cookie_check(ctx, cookie, cookie_len, cli_id, cli_id_len);
  try {
    if (edgetrain::transport::detail::cookie_is_valid(
            *peer, std::span<const std::uint8_t>(cookie, cookie_len)))
      return 0;
  } catch (...) {
  }
  return -1;
}
