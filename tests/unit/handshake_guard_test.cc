// The server's handshake guard (transport/handshake_guard.h) without a network: what it
// takes for a ClientHello, the HelloVerifyRequest it answers with, its stateless cookies,
// and the limits on the handshakes it lets through.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "tests/support/dtls_hello_flood.h"
#include "transport/handshake_guard.h"

namespace {

using namespace edgetrain::transport;
using namespace edgetrain::transport::detail;
using edgetrain::testing::dtls_client_hello;
using Decision = HandshakeGuard::Decision;

PeerAddress ipv4(const char* text, std::uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  inet_pton(AF_INET, text, &address.sin_addr);
  return peer_address(reinterpret_cast<const sockaddr*>(&address), sizeof(address));
}

PeerAddress ipv6(const char* text, std::uint16_t port) {
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_port = htons(port);
  inet_pton(AF_INET6, text, &address.sin6_addr);
  return peer_address(reinterpret_cast<const sockaddr*>(&address), sizeof(address));
}

// The cookie of the HelloVerifyRequest `reply` (its last bytes after the length byte).
std::vector<std::uint8_t> cookie_of(const std::vector<std::uint8_t>& reply) {
  const std::size_t length = reply.at(13 + 12 + 2);
  return {reply.end() - static_cast<std::ptrdiff_t>(length), reply.end()};
}

TEST(HandshakeGuardParsing, AClientHelloIsRecognizedWithItsCookieAndSequenceNumbers) {
  const std::vector<std::uint8_t> cookie = {1, 2, 3, 4, 5};
  ClientHello hello;
  ASSERT_EQ(classify_datagram(dtls_client_hello(0x010203040506, cookie), &hello),
            DatagramKind::kClientHello);
  EXPECT_EQ(hello.cookie, cookie);
  EXPECT_EQ(hello.message_seq, 1);
  EXPECT_EQ(hello.record_sequence, (std::array<std::uint8_t, 6>{1, 2, 3, 4, 5, 6}));
  ASSERT_EQ(classify_datagram(dtls_client_hello(7), &hello), DatagramKind::kClientHello);
  EXPECT_TRUE(hello.cookie.empty());
  EXPECT_EQ(hello.message_seq, 0);
}

TEST(HandshakeGuardParsing, EveryTruncationIsMalformedAndNothingReadsPastTheEnd) {
  const auto whole = dtls_client_hello(3, std::vector<std::uint8_t>(32, 9));
  for (std::size_t length = 14; length < whole.size(); ++length) {
    // The record length still claims the whole message: a cut datagram must not pass.
    const std::vector<std::uint8_t> cut(whole.begin(),
                                        whole.begin() + static_cast<std::ptrdiff_t>(length));
    EXPECT_EQ(classify_datagram(cut, nullptr), DatagramKind::kMalformedClientHello) << length;
  }
  EXPECT_EQ(classify_datagram(std::span(whole).first(13), nullptr), DatagramKind::kOther);
  EXPECT_EQ(classify_datagram({}, nullptr), DatagramKind::kOther);
}

TEST(HandshakeGuardParsing, LyingLengthsAndFragmentsAreMalformed) {
  auto longer_cookie = dtls_client_hello(0);
  longer_cookie[13 + 12 + 2 + 32 + 1] = 200;  // cookie length beyond the message
  EXPECT_EQ(classify_datagram(longer_cookie, nullptr), DatagramKind::kMalformedClientHello);
  auto fragment = dtls_client_hello(0);
  fragment[13 + 8] = 1;  // fragment_offset 1
  EXPECT_EQ(classify_datagram(fragment, nullptr), DatagramKind::kMalformedClientHello);
  auto long_session_id = dtls_client_hello(0);
  long_session_id[13 + 12 + 2 + 32] = 33;
  EXPECT_EQ(classify_datagram(long_session_id, nullptr), DatagramKind::kMalformedClientHello);
}

TEST(HandshakeGuardParsing, OtherRecordsAreLeftToLibcoap) {
  auto epoch_one = dtls_client_hello(0);
  epoch_one[4] = 1;
  EXPECT_EQ(classify_datagram(epoch_one, nullptr), DatagramKind::kOther);
  auto application_data = dtls_client_hello(0);
  application_data[0] = 23;
  EXPECT_EQ(classify_datagram(application_data, nullptr), DatagramKind::kOther);
  auto client_key_exchange = dtls_client_hello(0);
  client_key_exchange[13] = 16;
  EXPECT_EQ(classify_datagram(client_key_exchange, nullptr), DatagramKind::kOther);
  const std::vector<std::uint8_t> coap = {0x40, 0x01, 0x12, 0x34};
  EXPECT_EQ(classify_datagram(coap, nullptr), DatagramKind::kOther);
}

TEST(HandshakeGuardParsing, TheHelloVerifyRequestEchoesTheClientHelloAsRfc6347Asks) {
  ClientHello hello;
  ASSERT_EQ(classify_datagram(dtls_client_hello(0x0a0b0c0d0e0f), &hello),
            DatagramKind::kClientHello);
  const std::vector<std::uint8_t> cookie(32, 0x5a);
  std::vector<std::uint8_t> reply;
  hello_verify_request(hello, cookie, reply);
  ASSERT_EQ(reply.size(), 13u + 12 + 3 + 32);
  EXPECT_EQ(reply[0], 22);  // handshake
  EXPECT_EQ(std::vector<std::uint8_t>(reply.begin() + 1, reply.begin() + 3),
            (std::vector<std::uint8_t>{254, 255}));
  EXPECT_EQ(std::vector<std::uint8_t>(reply.begin() + 3, reply.begin() + 5),
            (std::vector<std::uint8_t>{0, 0}));
  EXPECT_EQ(std::vector<std::uint8_t>(reply.begin() + 5, reply.begin() + 11),
            (std::vector<std::uint8_t>{0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
                                       0x0f}));  // the ClientHello's record number
  EXPECT_EQ(reply[11] * 256 + reply[12], 12 + 3 + 32);
  EXPECT_EQ(reply[13], 3);  // hello_verify_request
  EXPECT_EQ(reply[14] * 65536 + reply[15] * 256 + reply[16], 35);
  EXPECT_EQ(reply[17] * 256 + reply[18], 0);  // message_seq of the ClientHello
  EXPECT_EQ(cookie_of(reply), cookie);
}

TEST(HandshakeGuardCookies, ACookieHoldsForItsAddressAndPortOnly) {
  const PeerAddress a = ipv4("198.51.100.7", 40000);
  const auto made = make_cookie(a);
  const std::vector<std::uint8_t> cookie(made.view().begin(), made.view().end());
  ASSERT_FALSE(cookie.empty());
  EXPECT_TRUE(cookie_is_valid(a, cookie));
  EXPECT_FALSE(cookie_is_valid(ipv4("198.51.100.7", 40001), cookie));
  EXPECT_FALSE(cookie_is_valid(ipv4("198.51.100.8", 40000), cookie));
  EXPECT_FALSE(cookie_is_valid(ipv6("2001:db8::7", 40000), cookie));
  auto forged = cookie;
  forged.back() ^= 1;
  EXPECT_FALSE(cookie_is_valid(a, forged));
  EXPECT_FALSE(cookie_is_valid(a, {}));
}

TEST(HandshakeGuardCookies, SourcesAreIpv4AddressesAndIpv6Slash64s) {
  EXPECT_EQ(ipv4("192.0.2.1", 1).source(), ipv4("192.0.2.1", 2).source());
  EXPECT_NE(ipv4("192.0.2.1", 1).source(), ipv4("192.0.2.2", 1).source());
  EXPECT_EQ(ipv6("2001:db8:0:1::1", 1).source(), ipv6("2001:db8:0:1:ffff::9", 2).source());
  EXPECT_NE(ipv6("2001:db8:0:1::1", 1).source(), ipv6("2001:db8:0:2::1", 1).source());
  EXPECT_EQ(ipv6("::ffff:192.0.2.1", 5), ipv4("192.0.2.1", 5));  // IPv4-mapped counts as IPv4
}

class HandshakeGuardLimits : public ::testing::Test {
 protected:
  HandshakeGuardLimits() : guard_(limits()) {}
  static HandshakeLimits limits() {
    HandshakeLimits limits;
    limits.rate_per_address = 3;
    limits.max_pending = 5;
    limits.max_pending_per_address = 2;
    limits.timeout_seconds = 10;
    return limits;
  }
  // The peer's ClientHello with the cookie the guard gave it: what a real client sends second.
  Decision hello_with_cookie(const PeerAddress& peer) {
    std::vector<std::uint8_t> reply;
    EXPECT_EQ(guard_.decide(peer, dtls_client_hello(0), now_, reply), Decision::kAnswerWithCookie);
    return guard_.decide(peer, dtls_client_hello(1, cookie_of(reply)), now_, reply);
  }
  HandshakeGuard guard_;
  GuardClock::time_point now_ = GuardClock::now();
  int next_session_ = 0;
  std::vector<int> sessions_ = std::vector<int>(100);
};

TEST_F(HandshakeGuardLimits, AFirstClientHelloGetsACookieAndLeavesNoState) {
  std::vector<std::uint8_t> reply;
  for (std::uint32_t i = 0; i < 10000;
       ++i) {  // a spoofed flood: every ClientHello from another source
    const std::string address = "10." + std::to_string(i / 65536) + "." +
                                std::to_string(i / 256 % 256) + "." + std::to_string(i % 256);
    ASSERT_EQ(guard_.decide(ipv4(address.c_str(), 1000), dtls_client_hello(i), now_, reply),
              Decision::kAnswerWithCookie);
  }
  EXPECT_EQ(guard_.stats().hello_verify_requests, 10000u);
  EXPECT_EQ(guard_.stats().pending, 0u);
  EXPECT_EQ(guard_.tracked_sources(), 0u);
  // A cookie made for one address does not open the door to another.
  const auto made = make_cookie(ipv4("10.0.0.1", 1000));
  const std::vector<std::uint8_t> cookie(made.view().begin(), made.view().end());
  EXPECT_EQ(guard_.decide(ipv4("10.0.0.2", 1000), dtls_client_hello(1, cookie), now_, reply),
            Decision::kAnswerWithCookie);
  EXPECT_EQ(guard_.decide(ipv4("10.0.0.1", 1000), dtls_client_hello(1, cookie), now_, reply),
            Decision::kPass);
}

TEST_F(HandshakeGuardLimits, OtherDatagramsPassAndMalformedClientHellosAreDropped) {
  std::vector<std::uint8_t> reply;
  const std::vector<std::uint8_t> record = {23, 254, 253, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0};
  EXPECT_EQ(guard_.decide(ipv4("192.0.2.1", 1), record, now_, reply), Decision::kPass);
  auto cut = dtls_client_hello(0);
  cut.resize(40);
  EXPECT_EQ(guard_.decide(ipv4("192.0.2.1", 1), cut, now_, reply), Decision::kDropMalformed);
  EXPECT_EQ(guard_.stats().malformed_client_hellos, 1u);
}

TEST_F(HandshakeGuardLimits, EachSourceAddressGetsItsRateOfNewHandshakes) {
  for (std::uint16_t port = 1; port <= 3; ++port)
    EXPECT_EQ(hello_with_cookie(ipv4("192.0.2.1", port)), Decision::kPass);
  EXPECT_EQ(hello_with_cookie(ipv4("192.0.2.1", 4)), Decision::kDropRateLimited);
  EXPECT_EQ(hello_with_cookie(ipv4("192.0.2.2", 1)),
            Decision::kPass);              // another address has its own bucket
  now_ += std::chrono::milliseconds(340);  // 3 per second: one more token
  EXPECT_EQ(hello_with_cookie(ipv4("192.0.2.1", 4)), Decision::kPass);
  EXPECT_EQ(hello_with_cookie(ipv4("192.0.2.1", 5)), Decision::kDropRateLimited);
  EXPECT_EQ(guard_.stats().refused_rate_limited, 2u);
  now_ += std::chrono::seconds(5);
  guard_.forget_idle_sources(now_);
  EXPECT_EQ(guard_.tracked_sources(), 0u);  // full buckets are forgotten
}

TEST_F(HandshakeGuardLimits, PendingHandshakesAreCappedPerAddressAndInAll) {
  auto start = [&](const PeerAddress& peer) {
    const Decision decision = hello_with_cookie(peer);
    if (decision == Decision::kPass)
      guard_.handshake_started(&sessions_[next_session_++], peer, now_);
    return decision;
  };
  EXPECT_EQ(start(ipv4("192.0.2.1", 1)), Decision::kPass);
  EXPECT_EQ(start(ipv4("192.0.2.1", 2)), Decision::kPass);
  EXPECT_EQ(start(ipv4("192.0.2.1", 3)), Decision::kDropTooManyPending);  // 2 per address
  // A retransmitted ClientHello of a pending handshake still reaches libcoap.
  EXPECT_EQ(hello_with_cookie(ipv4("192.0.2.1", 1)), Decision::kPass);
  EXPECT_EQ(start(ipv4("192.0.2.2", 1)), Decision::kPass);
  EXPECT_EQ(start(ipv4("192.0.2.3", 1)), Decision::kPass);
  EXPECT_EQ(start(ipv4("192.0.2.4", 1)), Decision::kPass);
  EXPECT_EQ(guard_.stats().pending, 5u);
  EXPECT_EQ(start(ipv4("192.0.2.5", 1)), Decision::kDropTooManyPending);  // 5 in all
  guard_.handshake_ended(&sessions_[0]);
  EXPECT_EQ(start(ipv4("192.0.2.5", 1)), Decision::kPass);
  now_ += std::chrono::seconds(1);
  EXPECT_EQ(start(ipv4("192.0.2.1", 3)), Decision::kDropTooManyPending);  // 5 in all again
  EXPECT_EQ(guard_.stats().refused_too_many_pending, 3u);
}

TEST_F(HandshakeGuardLimits, HandshakesPastTheTimeoutAreOverdueWithTheirKnownIdentity) {
  guard_.handshake_started(&sessions_[0], ipv4("192.0.2.1", 1), now_);
  guard_.handshake_started(&sessions_[1], ipv4("192.0.2.2", 1), now_ + std::chrono::seconds(5));
  guard_.note_known_identity(&sessions_[0], "pi-kitchen");
  EXPECT_TRUE(guard_.overdue(now_ + std::chrono::seconds(9)).empty());
  const auto late = guard_.overdue(now_ + std::chrono::seconds(10));
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].first, &sessions_[0]);
  EXPECT_EQ(late[0].second, ipv4("192.0.2.1", 1));
  EXPECT_EQ(guard_.known_identity(&sessions_[0]), "pi-kitchen");
  EXPECT_EQ(guard_.handshake_ended(&sessions_[0]), "pi-kitchen");
  EXPECT_FALSE(guard_.is_pending(&sessions_[0]));
  EXPECT_EQ(guard_.handshake_ended(&sessions_[1]), std::nullopt);
  EXPECT_EQ(guard_.stats().pending, 0u);
}

TEST(HandshakeGuardSettings, LimitsOutOfRangeAreRefused) {
  HandshakeLimits limits;
  EXPECT_NO_THROW(check_handshake_limits(limits));
  limits.max_pending_per_address = 0;
  EXPECT_THROW(check_handshake_limits(limits), std::invalid_argument);
  limits = {};
  limits.timeout_seconds = 0.5;
  EXPECT_THROW(check_handshake_limits(limits), std::invalid_argument);
  limits = {};
  limits.rate_per_address = 0;
  EXPECT_THROW(check_handshake_limits(limits), std::invalid_argument);
  limits = {};
  limits.max_pending = 0;
  EXPECT_THROW(check_handshake_limits(limits), std::invalid_argument);
}

}  // namespace
