// Q-Block2 (RFC 9177) between our CoAP client and server over DTLS-PSK on loopback: a GET's
// body comes in bursts of MAX_PAYLOADS blocks, each burst asked for by one request; a
// server with Q-Block off is read with RFC 7959 Block2; every body arrives whole at 5% and
// 10% loss; the bodies the server keeps for their next bursts stay within their bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/server_thread.h"
#include "tests/support/udp_delay_proxy.h"
#include "transport/coap_dtls.h"

namespace {

using namespace edgetrain::transport;
using edgetrain::testing::ServerThread;

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
const std::string kKey = "q-block-test-key-0123456789";

// 56,420 bytes: 56 blocks of 1,024, the last one partial, as a paper-CNN model delta
// needs ~55. Its bytes depend on `seed`, so a mixed-up or misplaced block shows.
std::vector<std::uint8_t> body_for(unsigned seed, std::size_t size = 56 * 1024 - 924) {
  std::vector<std::uint8_t> body(size);
  std::uint32_t state = seed * 2654435761u + 1;
  for (auto& byte : body) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<std::uint8_t>(state >> 24);
  }
  return body;
}

// GET /body?n=SEED answers body_for(SEED); `calls` counts the handler's runs.
std::unique_ptr<CoapDtlsServer> body_server(bool q_block, std::atomic<int>& calls,
                                            std::size_t max_bodies = 256) {
  CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view) { return std::optional(bytes_of(kKey)); };
  options.timing.q_block = q_block;
  options.max_bodies_in_progress = max_bodies;
  auto server = std::make_unique<CoapDtlsServer>(options);
  server->add_resource("body", Method::kGet, [&calls](const CoapRequest& request) {
    ++calls;
    const unsigned seed = request.query.rfind("n=", 0) == 0
                              ? static_cast<unsigned>(std::stoul(request.query.substr(2)))
                              : 0;
    return CoapResponse{CoapCode::kContent, body_for(seed)};
  });
  // A dense paper-CNN model's size: 1,648 blocks.
  server->add_resource("model", Method::kGet, [&calls](const CoapRequest&) {
    ++calls;
    return CoapResponse{CoapCode::kContent, body_for(9, 1686628), 0};  // ETag 0 as version 0
  });
  return server;
}

CoapDtlsClient::Options client_options(std::uint16_t port, bool q_block) {
  CoapDtlsClient::Options options("127.0.0.1", port, {"device-1", bytes_of(kKey)}, 60000);
  options.timing.q_block = q_block;
  return options;
}

TEST(QBlock2, ABodyComesInBurstsEachAskedForByOneRequest) {
  std::atomic<int> calls = 0;
  auto server = body_server(true, calls);
  ServerThread running(*server);
  CoapDtlsClient q_block(client_options(server->port(), true));
  CoapDtlsClient block2(client_options(server->port(), false));
  ASSERT_EQ(q_block.request(Method::kGet, "body?n=1").payload, body_for(1));  // handshake
  ASSERT_EQ(block2.request(Method::kGet, "body?n=1").payload, body_for(1));

  // The counters are read once the server has sent everything of an exchange.
  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  auto datagrams_in = [&] {
    settle();
    return server->datagrams_received();
  };
  auto datagrams_out = [&] { return server->datagrams_sent(); };  // after datagrams_in()
  std::uint64_t in = datagrams_in(), out = datagrams_out();
  const CoapResponse fast = q_block.request(Method::kGet, "body?n=2");
  const std::uint64_t q_in = datagrams_in() - in, q_out = datagrams_out() - out;
  in = datagrams_in();
  out = datagrams_out();
  const CoapResponse slow = block2.request(Method::kGet, "body?n=2");
  const std::uint64_t b_in = datagrams_in() - in, b_out = datagrams_out() - out;
  std::printf("56-block GET: Q-Block2 %llu in / %llu out, Block2 %llu in / %llu out\n",
              static_cast<unsigned long long>(q_in), static_cast<unsigned long long>(q_out),
              static_cast<unsigned long long>(b_in), static_cast<unsigned long long>(b_out));

  EXPECT_EQ(fast.code, CoapCode::kContent);
  EXPECT_EQ(fast.payload, body_for(2));
  EXPECT_EQ(slow.payload, body_for(2));
  // 56 blocks in bursts of 10: the first request and 5 more, one per burst; each block
  // one datagram out. Block2 asks for every block with a request of its own.
  EXPECT_EQ(q_in, 6u);
  EXPECT_EQ(q_out, 56u);
  EXPECT_EQ(b_in, 56u);
  EXPECT_EQ(b_out, 56u);
  // The handler ran once per body, whatever the number of requests.
  EXPECT_EQ(server->q_block2_bodies_served(), 2u);
  EXPECT_EQ(calls, 4);
  // The ETag every Q-Block2 block carries reaches the caller (the handler gave none: ours).
  EXPECT_TRUE(fast.etag.has_value());
  // A dense model: 165 bursts, the handler run once.
  const int calls_before = calls;
  const CoapResponse model = q_block.request(Method::kGet, "model");
  EXPECT_EQ(model.payload, body_for(9, 1686628));
  EXPECT_EQ(model.etag, std::optional<std::uint64_t>(0));
  EXPECT_EQ(calls, calls_before + 1);
  // Bodies of one block, errors: answered as they are.
  EXPECT_EQ(q_block.request(Method::kGet, "nothing").code, CoapCode::kNotFound);
}

TEST(QBlock2, AServerWithoutQBlockIsReadWithBlock2) {
  std::atomic<int> calls = 0;
  auto server = body_server(false, calls);
  ServerThread running(*server);
  CoapDtlsClient client(client_options(server->port(), true));
  std::uint64_t in = server->datagrams_received();
  EXPECT_EQ(client.request(Method::kGet, "body?n=3").payload, body_for(3));
  const std::uint64_t first = server->datagrams_received() - in;
  in = server->datagrams_received();
  EXPECT_EQ(client.request(Method::kGet, "body?n=4").payload, body_for(4));
  const std::uint64_t second = server->datagrams_received() - in;
  EXPECT_EQ(server->q_block2_bodies_served(), 0u);
  // The refused Q-Block2 request (4.02 Bad Option) is paid once: the next GET asks with
  // Block2 straight away, one request per block.
  EXPECT_EQ(second, 56u);
  EXPECT_GE(first, second + 1);
}

// Each body through a link that drops `loss` of the datagrams each way (seeded): every
// body arrives whole and right, the lost blocks asked for again by the client.
void every_body_arrives_whole(double loss, std::uint64_t seed) {
  std::atomic<int> calls = 0;
  auto server = body_server(true, calls);
  ServerThread running(*server);
  edgetrain::testing::UdpDelayProxy lossy(server->port(), std::chrono::milliseconds(0), 0, seed);
  CoapDtlsClient client(client_options(lossy.port(), true));
  ASSERT_EQ(client.request(Method::kGet, "body?n=0").payload, body_for(0));  // lossless handshake
  lossy.set_loss_rate(loss);
  const auto start = std::chrono::steady_clock::now();
  constexpr unsigned kBodies = 4;
  for (unsigned n = 1; n <= kBodies; ++n) {
    const CoapResponse response = client.request(Method::kGet, "body?n=" + std::to_string(n));
    ASSERT_EQ(response.code, CoapCode::kContent) << "body " << n;
    ASSERT_EQ(response.payload, body_for(n)) << "body " << n;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%.0f%% loss: %u bodies of 56 blocks in %.1f s, %llu datagrams dropped\n",
              loss * 100, kBodies, seconds,
              static_cast<unsigned long long>(lossy.datagrams_dropped()));
  EXPECT_GT(lossy.datagrams_dropped(), 5u);
  EXPECT_EQ(server->q_block2_bodies_served(), kBodies + 1);
}

TEST(QBlock2OverLoss, EveryBodyArrivesWholeAtFivePercentLoss) { every_body_arrives_whole(0.05, 3); }
TEST(QBlock2OverLoss, EveryBodyArrivesWholeAtTenPercentLoss) { every_body_arrives_whole(0.10, 7); }

// Bodies kept for their next bursts: at most max_bodies_in_progress. Four clients pulling
// at once from a server that keeps two: each body still arrives whole (a request for a
// body no longer kept runs the handler again; the body is the same, so is its ETag).
TEST(QBlock2Limits, KeptBodiesStayWithinTheBound) {
  std::atomic<int> calls = 0;
  auto server = body_server(true, calls, /*max_bodies=*/2);
  ServerThread running(*server);
  std::vector<std::unique_ptr<CoapDtlsClient>> clients;
  for (int i = 0; i < 4; ++i)
    clients.push_back(std::make_unique<CoapDtlsClient>(client_options(server->port(), true)));
  std::vector<std::thread> pulls;
  std::atomic<int> whole = 0;
  std::atomic<std::size_t> most_held = 0;
  for (int i = 0; i < 4; ++i) {
    pulls.emplace_back([&, i] {
      for (unsigned n = 0; n < 3; ++n) {
        const unsigned seed = 10 * i + n;
        if (clients[i]->request(Method::kGet, "body?n=" + std::to_string(seed)).payload ==
            body_for(seed))
          ++whole;
      }
    });
  }
  while (whole < 12 && calls < 1000) {
    most_held = std::max(most_held.load(), server->q_block2_bodies_held());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& pull : pulls) pull.join();
  EXPECT_EQ(whole, 12);
  EXPECT_LE(most_held, 2u);
  EXPECT_LE(server->q_block2_bodies_held(), 2u);
}

// POST /sink: the handler checks the body against body_for(SEED of ?n=SEED, SIZE of
// &size=SIZE) and answers 2.04 with "whole" or 4.00 "damaged"; `calls` counts its runs.
std::unique_ptr<CoapDtlsServer> sink_server(bool q_block, std::atomic<int>& calls,
                                            std::atomic<int>& damaged) {
  CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view) { return std::optional(bytes_of(kKey)); };
  options.timing.q_block = q_block;
  auto server = std::make_unique<CoapDtlsServer>(options);
  server->add_resource("sink", Method::kPost, [&calls, &damaged](const CoapRequest& request) {
    ++calls;
    const auto amp = request.query.find("&size=");
    const unsigned seed = static_cast<unsigned>(std::stoul(request.query.substr(2, amp - 2)));
    const std::size_t size = std::stoul(request.query.substr(amp + 6));
    const std::vector<std::uint8_t> expected = body_for(seed, size);
    if (!std::equal(request.payload.begin(), request.payload.end(), expected.begin(),
                    expected.end())) {
      ++damaged;
      return CoapResponse{CoapCode::kBadRequest, bytes_of("damaged")};
    }
    return CoapResponse{CoapCode::kChanged, bytes_of("whole")};
  });
  return server;
}

std::string sink_path(unsigned seed, std::size_t size) {
  return "sink?n=" + std::to_string(seed) + "&size=" + std::to_string(size);
}

TEST(QBlock1, ABodyGoesInBurstsEachAnsweredOnce) {
  std::atomic<int> calls = 0, damaged = 0;
  auto server = sink_server(true, calls, damaged);
  ServerThread running(*server);
  CoapDtlsClient q_block(client_options(server->port(), true));
  CoapDtlsClient block1(client_options(server->port(), false));
  constexpr std::size_t kSize = 22 * 1024 + 385;  // 23 blocks, as a paper-CNN AdaComp update
  ASSERT_EQ(q_block.request(Method::kPost, sink_path(1, kSize), body_for(1, kSize)).code,
            CoapCode::kChanged);  // the handshakes
  ASSERT_EQ(block1.request(Method::kPost, sink_path(1, kSize), body_for(1, kSize)).code,
            CoapCode::kChanged);
  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  settle();
  std::uint64_t in = server->datagrams_received(), out = server->datagrams_sent();
  const CoapResponse fast = q_block.request(Method::kPost, sink_path(2, kSize), body_for(2, kSize));
  settle();
  const std::uint64_t q_in = server->datagrams_received() - in, q_out = server->datagrams_sent() - out;
  in = server->datagrams_received();
  out = server->datagrams_sent();
  const CoapResponse slow = block1.request(Method::kPost, sink_path(2, kSize), body_for(2, kSize));
  settle();
  const std::uint64_t b_in = server->datagrams_received() - in, b_out = server->datagrams_sent() - out;
  std::printf("23-block POST: Q-Block1 %llu in / %llu out, Block1 %llu in / %llu out\n",
              static_cast<unsigned long long>(q_in), static_cast<unsigned long long>(q_out),
              static_cast<unsigned long long>(b_in), static_cast<unsigned long long>(b_out));
  EXPECT_EQ(fast.code, CoapCode::kChanged);
  EXPECT_EQ(slow.code, CoapCode::kChanged);
  // 23 blocks in bursts of 10: a 2.31 after blocks 9 and 19, the answer after block 22.
  EXPECT_EQ(q_in, 23u);
  EXPECT_EQ(q_out, 3u);
  EXPECT_EQ(b_in, 23u);
  EXPECT_EQ(b_out, 23u);
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(damaged, 0);
}

TEST(QBlock1, AServerWithoutQBlockGetsBlock1) {
  std::atomic<int> calls = 0, damaged = 0;
  auto server = sink_server(false, calls, damaged);
  ServerThread running(*server);
  CoapDtlsClient client(client_options(server->port(), true));
  for (unsigned n : {5u, 6u})  // 8 blocks: the first burst's last block is confirmable
    EXPECT_EQ(client.request(Method::kPost, sink_path(n, 8000), body_for(n, 8000)).code,
              CoapCode::kChanged);
  // 30 blocks: the second body goes straight to Block1 (the 4.02 came with the first).
  EXPECT_EQ(client.request(Method::kPost, sink_path(7, 30000), body_for(7, 30000)).code,
            CoapCode::kChanged);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(damaged, 0);
}

TEST(QBlock1, ALargeBodyFallsBackToBlock1AfterAProbe) {
  std::atomic<int> calls = 0, damaged = 0;
  auto server = sink_server(false, calls, damaged);
  ServerThread running(*server);
  CoapDtlsClient client(client_options(server->port(), true));
  // 30 blocks: the first burst's non-confirmable blocks get resets from a server without
  // Q-Block; the confirmable probe after NON_RECEIVE_TIMEOUT gets 4.02.
  EXPECT_EQ(client.request(Method::kPost, sink_path(8, 30000), body_for(8, 30000)).code,
            CoapCode::kChanged);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(damaged, 0);
}

void every_post_arrives_once_and_whole(double loss, std::uint64_t seed) {
  std::atomic<int> calls = 0, damaged = 0;
  auto server = sink_server(true, calls, damaged);
  ServerThread running(*server);
  edgetrain::testing::UdpDelayProxy lossy(server->port(), std::chrono::milliseconds(0), 0, seed);
  CoapDtlsClient client(client_options(lossy.port(), true));
  ASSERT_EQ(client.request(Method::kPost, sink_path(0, 2000), body_for(0, 2000)).code,
            CoapCode::kChanged);  // lossless handshake
  lossy.set_loss_rate(loss);
  const auto start = std::chrono::steady_clock::now();
  constexpr unsigned kBodies = 5;
  for (unsigned n = 1; n <= kBodies; ++n) {
    const std::size_t size = 20000 + 1500 * n;
    const CoapResponse response = client.request(Method::kPost, sink_path(n, size), body_for(n, size));
    ASSERT_EQ(response.code, CoapCode::kChanged) << "body " << n;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%.0f%% loss: %u POSTs of 21-28 blocks in %.1f s, %llu datagrams dropped\n",
              loss * 100, kBodies, seconds,
              static_cast<unsigned long long>(lossy.datagrams_dropped()));
  EXPECT_EQ(calls, static_cast<int>(kBodies) + 1);  // once per body
  EXPECT_EQ(damaged, 0);
  EXPECT_GT(lossy.datagrams_dropped(), 3u);
}

TEST(QBlock1OverLoss, EveryBodyArrivesOnceAndWholeAtFivePercentLoss) {
  every_post_arrives_once_and_whole(0.05, 11);
}
TEST(QBlock1OverLoss, EveryBodyArrivesOnceAndWholeAtTenPercentLoss) {
  every_post_arrives_once_and_whole(0.10, 13);
}

}  // namespace
