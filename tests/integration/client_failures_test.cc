// CoapDtlsClient's failures told apart (issue 12), on loopback: a port that takes datagrams
// and never answers (what a firewall does), a closed port, a wrong key, an identity the
// server does not know, a server that closed the session; and the stop flag, which ends a
// waiting request within a fraction of a second instead of libcoap's 31 s handshake.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "transport/coap_dtls.h"

namespace {

using namespace edgetrain::transport;
using Clock = std::chrono::steady_clock;

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// A UDP socket on 127.0.0.1 that the kernel keeps open (datagrams are queued, no ICMP comes
// back) and nobody reads: a server behind a firewall that drops everything looks the same.
class SilentPort {
 public:
  SilentPort() : fd_(socket(AF_INET, SOCK_DGRAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      throw std::runtime_error("cannot bind a UDP socket");
    }
    port_ = ntohs(address.sin_port);
  }
  ~SilentPort() { close(fd_); }
  std::uint16_t port() const { return port_; }

 private:
  int fd_;
  std::uint16_t port_ = 0;
};

// The failure of one request, or fails the test if it got an answer.
TransportError failure_of(CoapDtlsClient& client) {
  try {
    client.request(Method::kGet, "whoami");
  } catch (const TransportError& e) {
    return e;
  }
  ADD_FAILURE() << "the request got an answer";
  return TransportError("");
}

TEST(ClientFailures, APortThatNeverAnswersIsNoAnswerNamingTheAddress) {
  SilentPort silent;
  CoapDtlsClient client(
      {"127.0.0.1", silent.port(), {"device-1", bytes_of("key-one-0123456789")}, 1500});
  const TransportError e = failure_of(client);
  EXPECT_EQ(e.failure(), TransportFailure::kNoAnswer) << e.what();
  EXPECT_NE(std::string(e.what()).find("no answer from 127.0.0.1:" + std::to_string(silent.port())),
            std::string::npos)
      << e.what();
  EXPECT_EQ(std::string(e.what()).find("handshake failed"), std::string::npos)
      << "no wrong diagnosis: " << e.what();
}

TEST(ClientFailures, AClosedPortIsUnreachableAtOnce) {
  std::uint16_t port;
  {
    SilentPort closed;
    port = closed.port();
  }
  CoapDtlsClient client({"127.0.0.1", port, {"device-1", bytes_of("key-one-0123456789")}, 10000});
  const auto started = Clock::now();
  const TransportError e = failure_of(client);
  EXPECT_EQ(e.failure(), TransportFailure::kUnreachable) << e.what();
  EXPECT_NE(std::string(e.what()).find("nothing listens on 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << e.what();
  EXPECT_LT(Clock::now() - started, std::chrono::seconds(3))
      << "ICMP port unreachable comes back at once";
}

TEST(ClientFailures, TheStopFlagEndsAWaitingHandshakeWithinAFractionOfASecond) {
  SilentPort silent;
  std::atomic<bool> stop = false;
  CoapDtlsClient::Options options{
      "127.0.0.1", silent.port(), {"device-1", bytes_of("key-one-0123456789")}, 60000};
  options.stop = &stop;
  CoapDtlsClient client(options);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
  });
  const auto started = Clock::now();
  const TransportError e = failure_of(client);
  const auto waited = Clock::now() - started;
  stopper.join();
  EXPECT_EQ(e.failure(), TransportFailure::kInterrupted) << e.what();
  EXPECT_GE(waited, std::chrono::milliseconds(300));
  EXPECT_LT(waited, std::chrono::milliseconds(300 + 250))
      << "the flag is looked at at least every 100 ms";
}

// Options::longest_request_ms: a request the server keeps answering gets the timeout again
// after each answer, never more than the longest in all; without it, the timeout bounds the
// whole request, answers or not.
TEST(ClientFailures, TheDeadlineMovesWithAnswersUpToTheLongestRequest) {
  using std::chrono::milliseconds;
  const Clock::time_point t0{};
  const milliseconds timeout(3000), longest(30000);
  EXPECT_EQ(request_deadline(t0, t0, timeout, longest), t0 + timeout) << "nothing heard yet";
  EXPECT_EQ(request_deadline(t0, t0 + milliseconds(2500), timeout, longest),
            t0 + milliseconds(5500))
      << "a block at 2.5 s: 3 s more";
  EXPECT_EQ(request_deadline(t0, t0 + milliseconds(28000), timeout, longest), t0 + longest)
      << "never past the longest";
  EXPECT_EQ(request_deadline(t0, t0 + milliseconds(2500), timeout, milliseconds(0)), t0 + timeout)
      << "off: the timeout bounds the whole request";
  EXPECT_EQ(request_deadline(t0, t0 + milliseconds(2500), timeout, milliseconds(2000)),
            t0 + timeout)
      << "a longest below the timeout is no extension";
  EXPECT_EQ(request_deadline(t0, t0 - milliseconds(100), timeout, longest), t0 + timeout)
      << "an answer from before the request does not shorten it";
}

TEST(ClientFailures, AKeyLongerThanMbedTlsTakesIsRefusedUpFront) {
  try {
    CoapDtlsClient client(
        {"127.0.0.1", 5684, {"device-1", std::vector<std::uint8_t>(kMaxPskBytes + 1, 7)}, 1000});
    ADD_FAILURE() << "a 33-byte key was accepted";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("MBEDTLS_PSK_MAX_LEN"), std::string::npos) << e.what();
  }
}

class ServerRefusals : public ::testing::Test {
 protected:
  void SetUp() override {
    CoapDtlsServer::Options options;
    options.psk_lookup = [](std::string_view id) -> std::optional<std::vector<std::uint8_t>> {
      if (id == "device-1") return bytes_of("key-one-0123456789");
      return std::nullopt;
    };
    server_ = std::make_unique<CoapDtlsServer>(options);
    server_->add_resource("whoami", Method::kGet, [](const CoapRequest& request) {
      return CoapResponse{CoapCode::kContent, bytes_of(request.identity)};
    });
    start();
  }
  void TearDown() override { halt(); }
  void start() {
    stop_ = false;
    thread_ = std::thread([this] {
      while (!stop_) server_->run_once(10);
    });
  }
  void halt() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  CoapDtlsClient client(const std::string& identity, const std::string& key) {
    return CoapDtlsClient({"127.0.0.1", server_->port(), {identity, bytes_of(key)}, 10000});
  }

  std::unique_ptr<CoapDtlsServer> server_;
  std::thread thread_;
  std::atomic<bool> stop_ = false;
};

TEST_F(ServerRefusals, AWrongKeyIsAHandshakeRefusedByTheServer) {
  auto wrong = client("device-1", "not-the-right-key!");
  const auto started = Clock::now();
  const TransportError e = failure_of(wrong);
  EXPECT_EQ(e.failure(), TransportFailure::kHandshakeRefused) << e.what();
  EXPECT_NE(std::string(e.what()).find("refused the DTLS handshake (alert "), std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("wrong key for identity 'device-1'"), std::string::npos)
      << e.what();
  EXPECT_LT(Clock::now() - started, std::chrono::seconds(3))
      << "the server's alert ends it, not a timeout";
}

TEST_F(ServerRefusals, AnUnknownIdentityIsToldApartFromAWrongKey) {
  auto stranger = client("stranger", "key-one-0123456789");
  const TransportError e = failure_of(stranger);
  EXPECT_EQ(e.failure(), TransportFailure::kUnknownIdentity) << e.what();
  EXPECT_NE(std::string(e.what()).find("does not know the PSK identity 'stranger'"),
            std::string::npos)
      << e.what();
  // The right client still gets through afterwards.
  auto good = client("device-1", "key-one-0123456789");
  EXPECT_EQ(good.request(Method::kGet, "whoami").code, CoapCode::kContent);
}

TEST_F(ServerRefusals, AServerThatWentSilentAfterAnsweringIsATimeoutNotNoAnswer) {
  CoapDtlsClient c(
      {"127.0.0.1", server_->port(), {"device-1", bytes_of("key-one-0123456789")}, 2000});
  ASSERT_EQ(c.request(Method::kGet, "whoami").code, CoapCode::kContent);
  halt();  // the socket stays open, nothing answers
  const TransportError e = failure_of(c);
  EXPECT_EQ(e.failure(), TransportFailure::kTimedOut) << e.what();
  EXPECT_NE(std::string(e.what()).find("the server answered before"), std::string::npos)
      << e.what();
}

}  // namespace
