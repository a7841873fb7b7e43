// The transport's security modes on loopback: plain CoAP only where explicitly enabled
// (and then with an unproven, declared identity), X.509 mutual authentication next to
// PSK (identity = certificate CN, certificates from another CA refused in the handshake),
// CoAP timing parameters checked, and what a reconnection after the server lost the
// session costs. Certificates are made at test time by make_test_certificates.sh.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/support/server_thread.h"
#include "tests/support/udp_delay_proxy.h"
#include "transport/coap_dtls.h"

#ifndef EDGETRAIN_TEST_SCRIPTS_DIR
#error "EDGETRAIN_TEST_SCRIPTS_DIR must name tests/integration"
#endif

namespace {

using namespace edgetrain::transport;
namespace fs = std::filesystem;

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

const std::string kDeviceKey = "device-1-key-0123456789";

// Runs a server's event loop on its own thread until destroyed.
using edgetrain::testing::ServerThread;

// One server with every mode this test needs: PSK (device-1), certificates from the
// test CA, and a plaintext endpoint when asked for. Its resources report who asked.
std::unique_ptr<CoapDtlsServer> make_server(const fs::path& certificates, bool plaintext) {
  CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view id) -> std::optional<std::vector<std::uint8_t>> {
    if (id == "device-1") return bytes_of(kDeviceKey);
    return std::nullopt;
  };
  if (!certificates.empty()) {
    options.certificates = CertificateFiles{certificates / "server.crt",
                                            certificates / "server.key", certificates / "ca.crt"};
  }
  if (plaintext) options.plaintext_port = 0;
  auto server = std::make_unique<CoapDtlsServer>(options);
  auto describe = [](const CoapRequest& request) {
    return CoapResponse{
        CoapCode::kContent,
        bytes_of(std::string(peer_authentication_name(request.authentication)) + " " +
                 request.identity + " " + std::to_string(request.payload.size()))};
  };
  server->add_resource("whoami", Method::kGet, describe);
  server->add_resource("whoami", Method::kPost, describe);
  return server;
}

class TransportSecurity : public ::testing::Test {
 protected:
  // Skips only when the openssl CLI is missing (the script's exit status 77); any other
  // failure to make the certificates (a script error, a file it did not leave) fails.
  static void SetUpTestSuite() {
    certificates_ = fs::temp_directory_path() / ("edgetrain-certs-" + std::to_string(::getpid()));
    const std::string command = std::string("bash ") + EDGETRAIN_TEST_SCRIPTS_DIR +
                                "/make_test_certificates.sh " + certificates_.string() +
                                " device-7 'bad name'";
    const int status = std::system(command.c_str());
    if (status == -1 || !WIFEXITED(status)) {
      setup_failure_ = "could not run " + command;
    } else if (WEXITSTATUS(status) == 77) {
      openssl_missing_ = true;
    } else if (WEXITSTATUS(status) != 0) {
      setup_failure_ = "make_test_certificates.sh failed (exit status " +
                       std::to_string(WEXITSTATUS(status)) + "; its messages are above)";
    } else {
      for (const char* name : {"ca", "server", "device-7", "bad name", "other-ca", "stranger"})
        for (const char* extension : {".crt", ".key"})
          if (!fs::exists(certificates_ / (std::string(name) + extension)))
            setup_failure_ +=
                "make_test_certificates.sh left no " + std::string(name) + extension + "; ";
    }
  }
  static void TearDownTestSuite() { fs::remove_all(certificates_); }
  void SetUp() override {
    if (openssl_missing_)
      GTEST_SKIP() << "the openssl CLI is not installed (package openssl): no test certificates";
    ASSERT_TRUE(setup_failure_.empty()) << setup_failure_;
  }
  static CertificateFiles device(const std::string& name, const std::string& ca = "ca.crt") {
    return {certificates_ / (name + ".crt"), certificates_ / (name + ".key"), certificates_ / ca};
  }
  static CoapDtlsClient::Options client_options(std::uint16_t port, int timeout_ms = 10000) {
    CoapDtlsClient::Options options;
    options.port = port;
    options.timeout_ms = timeout_ms;
    return options;
  }

  static inline fs::path certificates_;
  static inline bool openssl_missing_ = false;
  static inline std::string setup_failure_;
};

TEST_F(TransportSecurity, PlaintextEndpointOnlyWhenAskedFor) {
  auto dtls_only = make_server({}, false);
  EXPECT_EQ(dtls_only->plaintext_port(), 0);
  ServerThread running(*dtls_only);
  // Plain CoAP to the DTLS port gets nothing back: libcoap's DTLS endpoint drops it.
  auto options = client_options(dtls_only->port(), 3000);
  options.plaintext = true;
  options.psk.identity = "pi-9";
  CoapDtlsClient plain(options);
  EXPECT_THROW(plain.request(Method::kGet, "whoami"), TransportError);
  // DTLS on the same port works.
  auto psk = client_options(dtls_only->port());
  psk.psk = {"device-1", bytes_of(kDeviceKey)};
  EXPECT_EQ(text_of(CoapDtlsClient(psk).request(Method::kGet, "whoami").payload), "psk device-1 0");
}

TEST_F(TransportSecurity, PlaintextRequestsCarryTheDeclaredIdentityUnproven) {
  auto server = make_server({}, true);
  ASSERT_NE(server->plaintext_port(), 0);
  ASSERT_NE(server->plaintext_port(), server->port());
  ServerThread running(*server);
  auto options = client_options(server->plaintext_port());
  options.plaintext = true;
  options.psk.identity = "pi-9";
  CoapDtlsClient plain(options);
  EXPECT_EQ(text_of(plain.request(Method::kGet, "whoami").payload), "none pi-9 0");
  // Block-wise: the declared identity reaches the handler with the reassembled body.
  const std::vector<std::uint8_t> body(5000, 0x42);
  EXPECT_EQ(text_of(plain.request(Method::kPost, "whoami", body).payload), "none pi-9 5000");
  // A client that declares nothing is handed over with an empty identity.
  options.psk.identity.clear();
  CoapDtlsClient anonymous(options);
  EXPECT_EQ(text_of(anonymous.request(Method::kGet, "whoami").payload), "none  0");
  // Plaintext datagrams are counted with the DTLS ones: 1 + 5 blocks + 1.
  EXPECT_GE(server->datagrams_received(), 7u);
  // The DTLS endpoint of the same server still authenticates.
  auto psk = client_options(server->port());
  psk.psk = {"device-1", bytes_of(kDeviceKey)};
  EXPECT_EQ(text_of(CoapDtlsClient(psk).request(Method::kGet, "whoami").payload), "psk device-1 0");
}

TEST_F(TransportSecurity, CertificateIdentityIsTheSubjectCn) {
  auto server = make_server(certificates_, false);
  ServerThread running(*server);
  auto options = client_options(server->port());
  options.certificates = device("device-7");
  CoapDtlsClient client(options);
  EXPECT_EQ(text_of(client.request(Method::kGet, "whoami").payload), "certificate device-7 0");
  // The client's certificate chain travels to the server: a bigger handshake than PSK's.
  EXPECT_GT(server->bytes_received(), 1000u);
  std::printf("X.509 handshake + one small request: %llu bytes in %llu datagrams to the server\n",
              static_cast<unsigned long long>(server->bytes_received()),
              static_cast<unsigned long long>(server->datagrams_received()));
  const std::vector<std::uint8_t> body(3000, 0x17);
  EXPECT_EQ(text_of(client.request(Method::kPost, "whoami", body).payload),
            "certificate device-7 3000");
  EXPECT_EQ(client.sessions_started(), 1u);
  // PSK devices are served by the same endpoint at the same time.
  auto psk = client_options(server->port());
  psk.psk = {"device-1", bytes_of(kDeviceKey)};
  EXPECT_EQ(text_of(CoapDtlsClient(psk).request(Method::kGet, "whoami").payload), "psk device-1 0");
  EXPECT_EQ(text_of(client.request(Method::kGet, "whoami").payload), "certificate device-7 0");
}

TEST_F(TransportSecurity, CertificateFromAnotherCaIsRefusedInTheHandshake) {
  auto server = make_server(certificates_, false);
  ServerThread running(*server);
  // The stranger trusts the server's CA, but its own certificate is from another CA.
  auto options = client_options(server->port(), 5000);
  options.certificates = device("stranger");
  options.certificates->ca_file = certificates_ / "ca.crt";
  CoapDtlsClient stranger(options);
  EXPECT_THROW(stranger.request(Method::kGet, "whoami"), TransportError);
  // A client that does not trust the server's CA refuses the server.
  options.certificates = device("device-7", "other-ca.crt");
  CoapDtlsClient distrustful(options);
  EXPECT_THROW(distrustful.request(Method::kGet, "whoami"), TransportError);
  // The server is still fine for a good client.
  auto good = client_options(server->port());
  good.certificates = device("device-7");
  EXPECT_EQ(text_of(CoapDtlsClient(good).request(Method::kGet, "whoami").payload),
            "certificate device-7 0");
}

TEST_F(TransportSecurity, CertificateWhoseCnIsNoPlainNameIsForbidden) {
  auto server = make_server(certificates_, false);
  ServerThread running(*server);
  auto options = client_options(server->port(), 5000);
  options.certificates = device("bad name");  // signed by the right CA, CN "bad name"
  CoapDtlsClient client(options);
  const CoapResponse response = client.request(Method::kGet, "whoami");
  EXPECT_EQ(response.code, CoapCode::kForbidden);
  EXPECT_NE(text_of(response.payload).find("not a plain name"), std::string::npos);
}

TEST_F(TransportSecurity, UnusableCredentialsAndTimingAreClearErrors) {
  CoapDtlsServer::Options server_options;
  server_options.certificates = CertificateFiles{
      certificates_ / "missing.crt", certificates_ / "server.key", certificates_ / "ca.crt"};
  try {
    CoapDtlsServer server(server_options);
    ADD_FAILURE() << "a missing certificate file was accepted";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.crt"), std::string::npos) << e.what();
  }
  auto options = client_options(5684);
  options.certificates = CertificateFiles{certificates_ / "device-7.crt", certificates_ / "ca.srl",
                                          certificates_ / "ca.crt"};
  EXPECT_THROW(CoapDtlsClient{options}, TransportError);  // ca.srl is no PEM
  options = client_options(5684);
  EXPECT_THROW(CoapDtlsClient{options}, TransportError);  // DTLS-PSK without a key
  options.psk = {"device-1", bytes_of(kDeviceKey)};
  options.timing.ack_timeout_seconds = 0.5;  // libcoap would silently keep 2 s
  EXPECT_THROW(CoapDtlsClient{options}, std::invalid_argument);
  options.timing = CoapTiming::rfc7252();
  options.timing.nstart = 0;
  EXPECT_THROW(CoapDtlsClient{options}, std::invalid_argument);
  server_options = {};
  server_options.timing.max_retransmit = 0;
  EXPECT_THROW(CoapDtlsServer{server_options}, std::invalid_argument);
}

}  // namespace

namespace {

// Lossy link: when the ACK of a POST's last block is lost, the client retransmits that
// block. The handler must see every body once and whole, and the retransmission must get
// the first answer (libcoap 4.3.1 alone hands the lone last block to the handler again).
TEST(TransportOverLoss, EveryPostReachesTheHandlerOnceAndWhole) {
  CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view) { return std::optional(bytes_of(kDeviceKey)); };
  CoapDtlsServer server(options);
  int calls = 0, partial_bodies = 0;
  server.add_resource("collect", Method::kPost, [&](const CoapRequest& request) {
    ++calls;
    // Bodies are 3,000 bytes of one value: anything else is a piece of a body.
    const bool whole = request.payload.size() == 3000 &&
                       std::all_of(request.payload.begin(), request.payload.end(),
                                   [&](std::uint8_t b) { return b == request.payload[0]; });
    if (!whole) ++partial_bodies;
    return CoapResponse{CoapCode::kChanged, {static_cast<std::uint8_t>(calls)}};
  });
  ServerThread running(server);
  edgetrain::testing::UdpDelayProxy lossy(server.port(), std::chrono::milliseconds(0), 0,
                                          /*seed=*/6);
  CoapDtlsClient::Options client_options;
  client_options.port = lossy.port();
  client_options.psk = {"device-1", bytes_of(kDeviceKey)};
  client_options.timeout_ms = 60000;
  CoapDtlsClient client(client_options);
  ASSERT_EQ(client.request(Method::kGet, "collect").code, 405);  // the handshake, lossless
  // Then 15% of the datagrams in each direction are dropped; each loss costs 1 to 1.5 s
  // (ACK_TIMEOUT). With this seed the ACK of body 3's last block is lost: without the
  // server's answer memory that retransmitted block reached the handler on its own.
  lossy.set_loss_rate(0.15);
  constexpr int kBodies = 5;
  for (int i = 1; i <= kBodies; ++i) {
    const CoapResponse response =
        client.request(Method::kPost, "collect", std::vector<std::uint8_t>(3000, i));
    ASSERT_EQ(response.code, CoapCode::kChanged)
        << "body " << i << ": " << text_of(response.payload);
    EXPECT_EQ(response.payload, std::vector<std::uint8_t>{static_cast<std::uint8_t>(i)})
        << "body " << i;
  }
  EXPECT_EQ(calls, kBodies);
  EXPECT_EQ(partial_bodies, 0);
  EXPECT_GT(lossy.datagrams_dropped(), 3u);
}

}  // namespace

namespace {

// A server that answers GET /ping for device-1 on `port` (0: any free port). A restart
// with the port of the first one is a server that has lost every session.
std::unique_ptr<CoapDtlsServer> ping_server(std::uint16_t port = 0) {
  CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view) { return std::optional(bytes_of(kDeviceKey)); };
  options.port = port;
  auto server = std::make_unique<CoapDtlsServer>(options);
  server->add_resource("ping", Method::kGet, [](const CoapRequest&) {
    return CoapResponse{CoapCode::kContent, bytes_of("pong")};
  });
  return server;
}

// The server loses every session (it restarts on the same port). The client's next
// request on its old session cannot be answered; the client must notice, handshake again
// and get through. The cost of that full handshake is counted at the new server's socket.
TEST(TransportReconnection, ClientHandshakesAgainAfterTheServerLostItsSession) {
  auto server = ping_server();
  const std::uint16_t port = server->port();
  CoapDtlsClient::Options client_options;
  client_options.port = server->port();
  client_options.psk = {"device-1", bytes_of(kDeviceKey)};
  client_options.timeout_ms = 60000;
  CoapDtlsClient client(client_options);
  std::uint64_t first_session_bytes = 0, first_session_datagrams = 0, request_bytes = 0;
  {
    ServerThread running(*server);
    ASSERT_EQ(client.request(Method::kGet, "ping").code, CoapCode::kContent);
    first_session_bytes = server->bytes_received();
    first_session_datagrams = server->datagrams_received();
    ASSERT_EQ(client.request(Method::kGet, "ping").code, CoapCode::kContent);
    request_bytes = server->bytes_received() - first_session_bytes;
    std::printf(
        "full handshake: %llu bytes in %llu datagrams to the server (a request on the open "
        "session: %llu "
        "bytes in 1 datagram)\n",
        static_cast<unsigned long long>(first_session_bytes - request_bytes),
        static_cast<unsigned long long>(first_session_datagrams - 1),
        static_cast<unsigned long long>(request_bytes));
  }
  server.reset();  // every DTLS session state of the server is gone
  server = ping_server(port);
  ServerThread running(*server);
  const auto started = std::chrono::steady_clock::now();
  const CoapResponse response = client.request(Method::kGet, "ping");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(response.code, CoapCode::kContent);
  EXPECT_EQ(client.sessions_started(), 2u);
  EXPECT_EQ(client.reconnections(), 1u);
  std::printf(
      "reconnection after the server lost the session: %.2f s, new server received %llu bytes in "
      "%llu "
      "datagrams (first session: %llu bytes in %llu datagrams)\n",
      seconds, static_cast<unsigned long long>(server->bytes_received()),
      static_cast<unsigned long long>(server->datagrams_received()),
      static_cast<unsigned long long>(first_session_bytes),
      static_cast<unsigned long long>(first_session_datagrams));
  // A full handshake again (no resumption with libcoap 4.3.1 + Mbed TLS: transport/README.md).
  EXPECT_GE(server->datagrams_received(), first_session_datagrams);
}

}  // namespace

namespace {

// The same after a silent loss (a server killed with SIGKILL sends no close_notify): the
// client's records reach a server that knows nothing of them and answers nothing; once
// libcoap gives up retransmitting, the client handshakes again within the same request.
TEST(TransportReconnection, ClientHandshakesAgainAfterASilentSessionLoss) {
  auto server = ping_server();
  const std::uint16_t port = server->port();
  edgetrain::testing::UdpDelayProxy relay(server->port(), std::chrono::milliseconds(0));
  CoapDtlsClient::Options client_options;
  client_options.port = relay.port();
  client_options.psk = {"device-1", bytes_of(kDeviceKey)};
  client_options.timeout_ms = 30000;
  client_options.timing.max_retransmit = 1;  // give up after 1 + 2 ACK timeouts: a short test
  CoapDtlsClient client(client_options);
  {
    ServerThread running(*server);
    ASSERT_EQ(client.request(Method::kGet, "ping").code, CoapCode::kContent);
    relay.set_loss_rate(1.0);  // the old server's close_notify never arrives
  }
  server.reset();
  server = ping_server(port);
  ServerThread running(*server);
  relay.set_loss_rate(0);
  const auto to_server = relay.datagrams_to_server(), to_client = relay.datagrams_to_client();
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(client.request(Method::kGet, "ping").code, CoapCode::kContent);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf(
      "silent session loss: %llu datagrams to the server (the lost session's request and its "
      "retransmission, then handshake and request), %llu back; %llu bytes reached the new server\n",
      static_cast<unsigned long long>(relay.datagrams_to_server() - to_server),
      static_cast<unsigned long long>(relay.datagrams_to_client() - to_client),
      static_cast<unsigned long long>(server->bytes_received()));
  EXPECT_EQ(client.reconnections(), 1u);
  // How long it took is printed, not asserted: usually libcoap's 1 + 2 ACK timeouts (~3 s)
  // pass first, but when the new server answers the stale session's records the loss shows
  // at once (seen: 0.16 s under ASan), which is the better outcome.
  std::printf("silent session loss: the request got through after %.2f s\n", seconds);
}

// The same at libcoap's default MAX_RETRANSMIT (4: it would retransmit for 45 s): the
// client's liveness probe finds the silent session (no answer to the request's first two
// retransmissions, then none to a CoAP ping) and handshakes again within the request. The
// probe counter says which way the loss was found: libcoap's keepalive or its last
// retransmission would leave it at 0.
TEST(TransportReconnection, ClientProbesASilentSessionInsteadOfRetransmittingIntoTheVoid) {
  auto server = ping_server();
  const std::uint16_t port = server->port();
  edgetrain::testing::UdpDelayProxy relay(server->port(), std::chrono::milliseconds(0));
  CoapDtlsClient::Options client_options;
  client_options.port = relay.port();
  client_options.psk = {"device-1", bytes_of(kDeviceKey)};
  client_options.timeout_ms = 60000;
  client_options.timing.ack_random_factor = 1;  // the probe after 3 s of silence, 3 s more
  CoapDtlsClient client(client_options);
  {
    ServerThread running(*server);
    ASSERT_EQ(client.request(Method::kGet, "ping").code, CoapCode::kContent);
    relay.set_loss_rate(1.0);
  }
  server.reset();
  // The old server's close_notify must be dropped before the loss ends: relayed late (a
  // slow relay thread under ASan), it would close the session at once and leave nothing
  // for the probe to find.
  for (int i = 0; i < 200 && relay.datagrams_dropped() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(relay.datagrams_dropped(), 1u) << "the old server sent no close_notify";
  server = ping_server(port);
  ServerThread running(*server);
  relay.set_loss_rate(0);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(client.request(Method::kGet, "ping").code, CoapCode::kContent);
  EXPECT_EQ(client.silent_sessions(), 1u);
  EXPECT_EQ(client.reconnections(), 1u);
  EXPECT_EQ(client.sessions_started(), 2u);
  std::printf("silent session found by the probe: the request got through after %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

// A live session answers the probe's ping: an answer that comes 7 s after the empty ACK
// (a separate response, as the update server's once an update is durable) is waited for
// through two probes, on the same session.
TEST(TransportReconnection, ProbeKeepsALiveSessionWhoseAnswerIsLate) {
  CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view) { return std::optional(bytes_of(kDeviceKey)); };
  auto server = std::make_unique<CoapDtlsServer>(options);
  std::vector<edgetrain::transport::DeferredResponse> waiting;  // loop thread only
  std::atomic<int> deferred = 0;
  std::atomic<bool> answer_now = false, stop = false;
  server->add_resource("ping", Method::kGet, [](const CoapRequest&) {
    return CoapResponse{CoapCode::kContent, bytes_of("pong")};
  });
  server->add_resource("slow", Method::kGet, [&](const CoapRequest& request) {
    waiting.push_back(request.defer());
    ++deferred;
    return CoapResponse{CoapCode::kBadRequest};  // ignored once deferred
  });
  std::thread loop([&] {
    while (!stop) {
      server->run_once(10);
      if (answer_now.exchange(false))
        for (auto& answer : waiting) answer.send({CoapCode::kContent, bytes_of("late")});
    }
  });
  CoapDtlsClient::Options client_options;
  client_options.port = server->port();
  client_options.psk = {"device-1", bytes_of(kDeviceKey)};
  client_options.timeout_ms = 30000;
  client_options.timing.ack_random_factor = 1;  // a probe every 3 s of silence
  CoapDtlsClient client(client_options);
  ASSERT_EQ(client.request(Method::kGet, "ping").code, CoapCode::kContent);
  std::thread answer_later([&] {
    while (deferred < 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::seconds(7));
    answer_now = true;
  });
  const CoapResponse late = client.request(Method::kGet, "slow");
  answer_later.join();
  stop = true;
  loop.join();
  EXPECT_EQ(late.code, CoapCode::kContent);
  EXPECT_EQ(late.payload, bytes_of("late"));
  EXPECT_EQ(client.silent_sessions(), 0u);
  EXPECT_EQ(client.sessions_started(), 1u);
}

// The server's event loop reads several datagrams per pass (Options::datagrams_per_pass)
// instead of libcoap's one: a burst of 60 plain CoAP GETs queued on the socket before the
// loop runs is answered in a few passes, and in 60 with datagrams_per_pass = 1.
int passes_to_answer_a_burst(std::uint32_t datagrams_per_pass) {
  CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view) -> std::optional<std::vector<std::uint8_t>> {
    return std::nullopt;
  };
  options.plaintext_port = 0;
  options.datagrams_per_pass = datagrams_per_pass;
  CoapDtlsServer server(options);
  server.add_resource("whoami", Method::kGet,
                      [](const CoapRequest&) { return CoapResponse{CoapCode::kContent}; });
  const int client = ::socket(AF_INET, SOCK_DGRAM, 0);
  EXPECT_GE(client, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(server.plaintext_port());
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  constexpr int kBurst = 60;
  for (int i = 0; i < kBurst; ++i) {
    // CON GET /whoami, no token, message id 0x1000 + i (RFC 7252 3, option delta 11 = Uri-Path).
    const std::uint8_t get[] = {0x40, 0x01, 0x10, static_cast<std::uint8_t>(i), 0xB6, 'w', 'h', 'o',
                                'a',  'm',  'i'};
    EXPECT_EQ(
        ::sendto(client, get, sizeof get, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to),
        static_cast<ssize_t>(sizeof get));
  }
  int answered = 0, passes = 0;
  while (answered < kBurst && passes < 500) {
    server.run_once(0);
    ++passes;
    std::uint8_t reply[64];
    ssize_t n;
    while ((n = ::recv(client, reply, sizeof reply, MSG_DONTWAIT)) > 0) {
      EXPECT_EQ(reply[0] & 0x30, 0x20) << "not an ACK";
      EXPECT_EQ(reply[1], 0x45) << "not 2.05";
      ++answered;
    }
  }
  ::close(client);
  EXPECT_EQ(answered, kBurst);
  return passes;
}

TEST(ServerEventLoop, ABurstOfDatagramsIsReadInAFewPasses) {
  const int batched = passes_to_answer_a_burst(32);
  const int one_by_one = passes_to_answer_a_burst(1);
  std::printf(
      "60 queued requests answered in %d passes (32 per pass at most) and %d (1 per pass)\n",
      batched, one_by_one);
  EXPECT_LE(batched, 10);  // 1 + 2 + 4 + 8 + 16 + 29 reads: 6 passes
  EXPECT_GE(one_by_one, 60);
}

TEST(ServerEventLoop, DatagramsPerPassOutOfRangeIsAClearError) {
  for (std::uint32_t bad : {0u, 1025u}) {
    CoapDtlsServer::Options options;
    options.psk_lookup = [](std::string_view) -> std::optional<std::vector<std::uint8_t>> {
      return std::nullopt;
    };
    options.datagrams_per_pass = bad;
    EXPECT_THROW(CoapDtlsServer{options}, std::invalid_argument) << bad;
  }
}

}  // namespace
