// A CoAP server and client of ours talking DTLS-PSK over loopback: identities, keys,
// block-wise bodies and error codes.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <vector>
#include <thread>

#include "transport/coap_dtls.h"

namespace {

using namespace edgetrain::transport;

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

class DtlsRoundTrip : public ::testing::Test {
 protected:
  void SetUp() override {
    CoapDtlsServer::Options options;
    options.psk_lookup = [](std::string_view id) -> std::optional<std::vector<std::uint8_t>> {
      if (id == "device-1") return bytes_of("key-one-0123456789");
      if (id == "device-2") return bytes_of("key-two-9876543210");
      return std::nullopt;
    };
    server_ = std::make_unique<CoapDtlsServer>(options);
    server_->add_resource("whoami", Method::kGet, [](const CoapRequest& request) {
      return CoapResponse{CoapCode::kContent, bytes_of(request.identity)};
    });
    server_->add_resource("echo", Method::kPost, [](const CoapRequest& request) {
      return CoapResponse{CoapCode::kChanged, {request.payload.rbegin(), request.payload.rend()}};
    });
    server_->add_resource("reject", Method::kPost, [](const CoapRequest&) {
      return CoapResponse{CoapCode::kBadRequest, bytes_of("malformed")};
    });
    server_->add_resource("throws", Method::kGet, [](const CoapRequest&) -> CoapResponse {
      throw std::runtime_error("handler bug");
    });
    thread_ = std::thread([this] {
      while (!stop_) server_->run_once(10);
    });
  }
  void TearDown() override {
    stop_ = true;
    thread_.join();
  }
  CoapDtlsClient client(const std::string& identity, const std::string& key,
                        int timeout_ms = 10000) {
    return CoapDtlsClient({"127.0.0.1", server_->port(), {identity, bytes_of(key)}, timeout_ms});
  }

  std::unique_ptr<CoapDtlsServer> server_;
  std::thread thread_;
  std::atomic<bool> stop_ = false;
};

TEST_F(DtlsRoundTrip, IdentityComesFromTheHandshake) {
  ASSERT_NE(server_->port(), 0);
  auto c1 = client("device-1", "key-one-0123456789");
  auto c2 = client("device-2", "key-two-9876543210");
  CoapResponse r1 = c1.request(Method::kGet, "whoami");
  CoapResponse r2 = c2.request(Method::kGet, "/whoami");
  EXPECT_EQ(r1.code, CoapCode::kContent);
  EXPECT_EQ(std::string(r1.payload.begin(), r1.payload.end()), "device-1");
  EXPECT_EQ(std::string(r2.payload.begin(), r2.payload.end()), "device-2");
}

TEST_F(DtlsRoundTrip, LargeBodiesTravelBlockWiseBothWays) {
  auto c = client("device-1", "key-one-0123456789");
  for (std::size_t size : {0u, 1u, 1024u, 1025u, 20000u}) {
    std::vector<std::uint8_t> body(size);
    for (std::size_t i = 0; i < size; i++) body[i] = static_cast<std::uint8_t>(i * 7 + size);
    CoapResponse r = c.request(Method::kPost, "echo", body);
    ASSERT_EQ(r.code, CoapCode::kChanged) << size;
    ASSERT_EQ(r.payload.size(), size);
    EXPECT_TRUE(std::equal(body.rbegin(), body.rend(), r.payload.begin())) << size;
  }
}

TEST_F(DtlsRoundTrip, ErrorCodesAndDiagnosticsReachTheClient) {
  auto c = client("device-2", "key-two-9876543210");
  CoapResponse bad = c.request(Method::kPost, "reject", bytes_of("x"));
  EXPECT_EQ(bad.code, CoapCode::kBadRequest);
  EXPECT_EQ(std::string(bad.payload.begin(), bad.payload.end()), "malformed");
  EXPECT_EQ(c.request(Method::kGet, "no-such-resource").code, CoapCode::kNotFound);
  EXPECT_EQ(c.request(Method::kGet, "throws").code, CoapCode::kInternalServerError);
  // The server survived all of that.
  EXPECT_EQ(c.request(Method::kGet, "whoami").code, CoapCode::kContent);
}

TEST_F(DtlsRoundTrip, UnknownIdentityIsRefusedInTheHandshake) {
  auto c = client("intruder", "key-one-0123456789", 5000);
  EXPECT_THROW(c.request(Method::kGet, "whoami"), TransportError);
}

TEST_F(DtlsRoundTrip, WrongKeyIsRefusedInTheHandshake) {
  auto c = client("device-1", "key-two-9876543210", 5000);
  EXPECT_THROW(c.request(Method::kGet, "whoami"), TransportError);
  // A correct client still gets through afterwards.
  auto good = client("device-1", "key-one-0123456789");
  EXPECT_EQ(good.request(Method::kGet, "whoami").code, CoapCode::kContent);
}

TEST_F(DtlsRoundTrip, ClientRecoversAfterAFailedRequest) {
  auto c = client("device-1", "key-one-0123456789", 3000);
  EXPECT_EQ(c.request(Method::kGet, "whoami").code, CoapCode::kContent);
  stop_ = true;
  thread_.join();  // server goes silent
  EXPECT_THROW(c.request(Method::kGet, "whoami"), TransportError);
  stop_ = false;
  thread_ = std::thread([this] {
    while (!stop_) server_->run_once(10);
  });
  EXPECT_EQ(c.request(Method::kGet, "whoami").code, CoapCode::kContent);
}

struct Ingress {
  std::uint64_t bytes, datagrams;
};
Ingress ingress_of(const CoapDtlsServer& server) {
  return {server.bytes_received(), server.datagrams_received()};
}
Ingress operator-(Ingress a, Ingress b) { return {a.bytes - b.bytes, a.datagrams - b.datagrams}; }

TEST_F(DtlsRoundTrip, SocketIngressCountsRecordsAndHandshakesBeyondThePayload) {
  EXPECT_EQ(server_->bytes_received(), 0u);
  EXPECT_EQ(server_->datagrams_received(), 0u);
  // Every datagram of a request reaches the server before it answers, so once request()
  // returns the counters hold the whole exchange.
  const std::vector<std::uint8_t> body(3000, 0x5a);
  auto c = client("device-1", "key-one-0123456789");
  Ingress before = ingress_of(*server_);
  ASSERT_EQ(c.request(Method::kPost, "echo", body).code, CoapCode::kChanged);
  const Ingress fresh_session = ingress_of(*server_) - before;
  before = ingress_of(*server_);
  ASSERT_EQ(c.request(Method::kPost, "echo", body).code, CoapCode::kChanged);
  const Ingress open_session = ingress_of(*server_) - before;

  // Three Block1 datagrams carry the body; each adds a DTLS record header, nonce, tag and
  // the CoAP header and options; the reply's later Block2 blocks are asked for by more
  // (small) requests.
  EXPECT_GT(open_session.bytes, body.size() + 3 * 13);
  EXPECT_LT(open_session.bytes, body.size() + 8 * 120);
  EXPECT_GE(open_session.datagrams, 3u);
  // The same exchange on a fresh session adds the handshake: ClientHello twice (the cookie
  // exchange), then ClientKeyExchange, ChangeCipherSpec and Finished.
  EXPECT_GE(fresh_session.datagrams, open_session.datagrams + 3)
      << fresh_session.datagrams << " vs " << open_session.datagrams;
  EXPECT_GT(fresh_session.bytes, open_session.bytes + 150);

  // A request that fits one datagram is one datagram.
  before = ingress_of(*server_);
  ASSERT_EQ(c.request(Method::kGet, "whoami").code, CoapCode::kContent);
  const Ingress small = ingress_of(*server_) - before;
  EXPECT_EQ(small.datagrams, 1u);
  EXPECT_GT(small.bytes, 13u + 4u);  // record header + CoAP header at least
  EXPECT_LT(small.bytes, 120u);
}

TEST_F(DtlsRoundTrip, SocketIngressIsCountedPerServer) {
  CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view) { return std::optional(bytes_of("other-key-000000")); };
  CoapDtlsServer other(options);
  other.add_resource("ping", Method::kGet,
                     [](const CoapRequest&) { return CoapResponse{CoapCode::kContent}; });
  std::atomic<bool> stop_other = false;
  std::thread other_thread([&] {
    while (!stop_other) other.run_once(10);
  });
  CoapDtlsClient to_other(
      {"127.0.0.1", other.port(), {"anyone", bytes_of("other-key-000000")}, 10000});
  const CoapResponse reply = to_other.request(Method::kGet, "ping");
  stop_other = true;
  other_thread.join();
  EXPECT_EQ(reply.code, CoapCode::kContent);
  EXPECT_GT(other.bytes_received(), 0u);
  EXPECT_GE(other.datagrams_received(), 4u);  // handshake and request
  // Neither this server's socket nor the clients' sockets (whose replies are read with
  // recv) are charged with that exchange.
  EXPECT_EQ(server_->bytes_received(), 0u);
}

}  // namespace

namespace {

// Observe (RFC 7641) on the server side: only a GET handler can be observable, notifying
// with no subscriber reports none, and a plain GET of an observable resource is answered as
// before. Subscriptions and notifications are tested with Debian's coap-client
// (tests/integration/fleet_watch.sh): CoapDtlsClient does not subscribe.
TEST(DtlsObserve, OnlyGetHandlersAreObservableAndPlainGetsStillWork) {
  CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view id) -> std::optional<std::vector<std::uint8_t>> {
    if (id == "device-1") return bytes_of("key-one-0123456789");
    return std::nullopt;
  };
  CoapDtlsServer server(options);
  int reads = 0;
  server.add_resource("status", Method::kGet, [&reads](const CoapRequest&) {
    ++reads;
    return CoapResponse{CoapCode::kContent, bytes_of("fine")};
  });
  server.add_resource("update", Method::kPost,
                      [](const CoapRequest&) { return CoapResponse{CoapCode::kChanged}; });
  EXPECT_THROW(server.make_observable("update"), std::logic_error);
  EXPECT_THROW(server.make_observable("nowhere"), std::logic_error);
  server.make_observable("status");
  EXPECT_FALSE(server.notify_observers("status"));  // nobody subscribed
  EXPECT_FALSE(server.notify_observers("nowhere"));

  std::atomic<bool> stop = false;
  std::thread loop([&] {
    while (!stop) server.run_once(10);
  });
  CoapDtlsClient client(
      {"127.0.0.1", server.port(), {"device-1", bytes_of("key-one-0123456789")}, 10000});
  const CoapResponse r = client.request(Method::kGet, "status");
  stop = true;
  loop.join();
  EXPECT_EQ(r.code, CoapCode::kContent);
  EXPECT_EQ(std::string(r.payload.begin(), r.payload.end()), "fine");
  EXPECT_EQ(reads, 1);
  EXPECT_FALSE(server.notify_observers("status"));  // a plain GET does not subscribe
}

}  // namespace

namespace {

// Options::reuse_port (edgetrain-server --loop-threads): servers that ask for it share one
// port, each answering the sessions the kernel hands to its socket, each counting its own
// socket's ingress. (libcoap's own SO_REUSEADDR already lets a second server bind a UDP
// port, but then one socket gets every datagram: only SO_REUSEPORT spreads them.)
TEST(DtlsReusePort, ServersThatAskShareAPortAndTheKernelSpreadsSessionsOverThem) {
  CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view) { return std::optional(bytes_of("shared-key-00000")); };
  options.reuse_port = true;
  std::vector<std::unique_ptr<CoapDtlsServer>> servers;
  servers.push_back(std::make_unique<CoapDtlsServer>(options));
  options.port = servers[0]->port();
  servers.push_back(std::make_unique<CoapDtlsServer>(options));
  ASSERT_EQ(servers[1]->port(), servers[0]->port());
  for (int n = 0; n < 2; ++n)
    servers[n]->add_resource("which", Method::kGet, [n](const CoapRequest&) {
      return CoapResponse{CoapCode::kContent, {static_cast<std::uint8_t>('0' + n)}};
    });
  std::atomic<bool> stop = false;
  std::vector<std::thread> loops;
  for (auto& server : servers)
    loops.emplace_back([&stop, &server] {
      while (!stop) server->run_once(10);
    });

  // Each client session is answered by one server; with 16 source ports both answer (the
  // kernel's hash puts all 16 on one socket with probability 2^-15).
  std::set<char> answered_by;
  for (int c = 0; c < 16; ++c) {
    CoapDtlsClient client(
        {"127.0.0.1", options.port, {"anyone", bytes_of("shared-key-00000")}, 10000});
    const CoapResponse first = client.request(Method::kGet, "which");
    const CoapResponse second = client.request(Method::kGet, "which");
    ASSERT_EQ(first.code, CoapCode::kContent);
    ASSERT_EQ(first.payload.size(), 1u);
    EXPECT_EQ(second.payload, first.payload) << "a session moved between servers";
    answered_by.insert(static_cast<char>(first.payload[0]));
  }
  stop = true;
  for (auto& loop : loops) loop.join();
  EXPECT_EQ(answered_by, (std::set<char>{'0', '1'}));
  EXPECT_GT(servers[0]->datagrams_received(), 0u);
  EXPECT_GT(servers[1]->datagrams_received(), 0u);
}

}  // namespace
