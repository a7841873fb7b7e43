// The gossip peer (worker/gossip_peer.h) over real DTLS with X.509 identities on loopback:
// bad input is refused and counted and never averaged in, strangers are kept out (a
// certificate of another CA fails the handshake; a fleet certificate that is not a
// neighbour gets 4.03), an AD-PSGD average moves both peers to the midpoint, and D-PSGD
// mixes with Metropolis weights. Certificates are made at test time by make_test_certificates.sh.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "worker/gossip_peer.h"
#include "tests/support/server_thread.h"
#include "transport/codec.h"

namespace {

namespace fs = std::filesystem;
using namespace edgetrain;
using runtime::GossipPeer;
using runtime::GossipPeerConfig;
using transport::CoapCode;
using transport::CoapDtlsClient;
using transport::CoapDtlsServer;
using transport::CoapRequest;
using transport::CoapResponse;
using transport::Method;

constexpr const char* kModel = "input 4x4x1; fc 8 relu; fc 3";

// A tiny data set: 60 random 4x4 images in 3 classes.
runtime::Dataset tiny_data() {
  runtime::Dataset d;
  d.height = d.width = 4;
  d.channels = 1;
  d.num_classes = 3;
  for (int i = 0; i < 60; ++i) {
    for (int p = 0; p < 16; ++p)
      d.pixels.push_back(static_cast<std::uint8_t>((i * 37 + p * 11) % 256));
    d.labels.push_back(i % 3);
  }
  return d;
}

std::vector<std::uint32_t> sizes_of(const runtime::Model& model) {
  std::vector<std::uint32_t> sizes;
  for (const auto& t : model.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
  return sizes;
}

// The encoder refuses non-finite values, as it should; a hostile peer sends them anyway:
// the encoded model with every `marker` value's bytes replaced by `replacement`'s.
std::vector<std::uint8_t> with_value_replaced(std::vector<std::uint8_t> bytes, float marker,
                                              float replacement) {
  std::uint8_t from[4], to[4];
  std::memcpy(from, &marker, 4);
  std::memcpy(to, &replacement, 4);
  int replaced = 0;
  for (std::size_t i = 0; i + 4 <= bytes.size(); ++i)
    if (std::memcmp(bytes.data() + i, from, 4) == 0) {
      std::memcpy(bytes.data() + i, to, 4);
      ++replaced;
    }
  EXPECT_GT(replaced, 0);
  return bytes;
}

// A channel whose neighbours answer from a table of models (dense, version 1).
class FakeNeighbours : public runtime::PeerChannel {
 public:
  std::map<std::uint32_t, std::vector<float>> models;
  std::uint64_t layout_id = 0;
  std::vector<std::uint32_t> sizes;
  std::optional<std::uint32_t> poisoned;  // this neighbour's marker values arrive as NaN
  std::optional<std::uint32_t>
      deltas_that_never_fit;       // this neighbour answers every pull with such a delta
  std::vector<std::string> paths;  // every request's path, in order
  static constexpr float kMarker = 1234.5f;
  CoapResponse request(std::uint32_t neighbour, Method, const std::string& path,
                       std::span<const std::uint8_t>) override {
    paths.push_back(path);
    if (deltas_that_never_fit == neighbour) {
      // A delta from version 7, which nobody holds, with a digest of nothing in particular.
      transport::ModelDelta delta{layout_id, 7, 8, 12345, {}};
      return {CoapCode::kContent, transport::encode_model_delta(delta).value()};
    }
    auto bytes = transport::encode_dense_model(layout_id, 1, sizes, models.at(neighbour)).value();
    if (poisoned == neighbour)
      bytes = with_value_replaced(bytes, kMarker, std::numeric_limits<float>::quiet_NaN());
    return {CoapCode::kContent, bytes};
  }
};

// Peer 0's neighbours on the ring of 4: peer 1's model is all 1, peer 3's all -2. Returns
// the parameter count.
std::size_t with_ring_neighbours(FakeNeighbours& channel, const runtime::Model& model) {
  channel.layout_id = model.layout_id();
  channel.sizes = sizes_of(model);
  const std::size_t n = model.parameter_count();
  channel.models[1] = std::vector<float>(n, 1.0f);
  channel.models[3] = std::vector<float>(n, -2.0f);
  return n;
}

class NoNeighbours : public runtime::PeerChannel {
 public:
  CoapResponse request(std::uint32_t, Method, const std::string&,
                       std::span<const std::uint8_t>) override {
    throw transport::TransportError("unreachable");
  }
};

GossipPeerConfig config_for(std::uint32_t self, runtime::GossipAlgorithm algorithm) {
  GossipPeerConfig c;
  c.model = kModel;
  c.topology = runtime::make_topology(runtime::TopologyKind::kRing, 4);
  c.self = self;
  c.algorithm = algorithm;
  c.balance.base_batch = c.balance.min_batch = c.balance.max_batch = 5;
  c.balance.base_lr = 0.1;
  c.neighbour_wait_seconds = 0;
  return c;
}

class GossipPeerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certificates_ =
        fs::temp_directory_path() / ("edgetrain-gossip-certs-" + std::to_string(::getpid()));
    const std::string command = std::string("bash ") + EDGETRAIN_TEST_SCRIPTS_DIR +
                                "/make_test_certificates.sh " + certificates_.string() +
                                " peer-0 peer-1 peer-2 peer-3";
    const int status = std::system(command.c_str());
    if (status == -1 || !WIFEXITED(status))
      setup_failure_ = "could not run " + command;
    else if (WEXITSTATUS(status) == 77)
      openssl_missing_ = true;
    else if (WEXITSTATUS(status) != 0)
      setup_failure_ = "make_test_certificates.sh failed";
  }
  static void TearDownTestSuite() { fs::remove_all(certificates_); }
  void SetUp() override {
    if (openssl_missing_)
      GTEST_SKIP() << "the openssl CLI is not installed (package openssl): no test certificates";
    ASSERT_TRUE(setup_failure_.empty()) << setup_failure_;
  }
  static transport::CertificateFiles identity(const std::string& name,
                                              const std::string& ca = "ca.crt") {
    return {certificates_ / (name + ".crt"), certificates_ / (name + ".key"), certificates_ / ca};
  }
  static CoapDtlsClient client(std::uint16_t port, const std::string& name,
                               const std::string& ca = "ca.crt") {
    CoapDtlsClient::Options o("127.0.0.1", port, {}, 4000);
    o.certificates = identity(name, ca);
    return CoapDtlsClient(o);
  }
  static inline fs::path certificates_;
  static inline bool openssl_missing_ = false;
  static inline std::string setup_failure_;
};

using edgetrain::testing::ServerThread;

TEST_F(GossipPeerTest, BadInputOverDtlsIsRefusedCountedAndNeverAveragedIn) {
  const runtime::Dataset data = tiny_data();
  NoNeighbours channel;
  std::atomic<bool> stop{false};
  GossipPeer peer(config_for(0, runtime::GossipAlgorithm::kAdpsgd), data, channel, stop);
  CoapDtlsServer::Options options;
  options.certificates = identity("peer-0");
  CoapDtlsServer server(options);
  peer.attach(server);
  ServerThread running(server);
  const std::vector<float> before = peer.parameters();
  runtime::Model model(runtime::model_spec_from_argument(kModel));
  const auto sizes = sizes_of(model);

  CoapDtlsClient neighbour = client(server.port(), "peer-1");
  const std::vector<std::uint8_t> garbage = {1, 2, 3, 4, 5};
  EXPECT_EQ(neighbour.request(Method::kPost, "gossip/average", garbage).code,
            CoapCode::kBadRequest);
  std::vector<float> poisoned(before.size(), 0.5f);
  poisoned[3] = 1234.5f;
  const auto encoded = transport::encode_dense_model(model.layout_id(), 1, sizes, poisoned).value();
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    EXPECT_EQ(
        neighbour
            .request(Method::kPost, "gossip/average", with_value_replaced(encoded, 1234.5f, bad))
            .code,
        CoapCode::kBadRequest);
  // Another model's layout.
  EXPECT_EQ(
      neighbour
          .request(Method::kPost, "gossip/average",
                   transport::encode_dense_model(model.layout_id() + 1, 1, sizes, before).value())
          .code,
      CoapCode::kBadRequest);
  EXPECT_EQ(neighbour.request(Method::kGet, "gossip/model?since=twelve").code,
            CoapCode::kBadRequest);
  EXPECT_EQ(neighbour.request(Method::kGet, "gossip/model?version=1").code, CoapCode::kBadRequest);
  EXPECT_EQ(peer.parameters(), before) << "a refused model changed the peer's";
  auto stats = peer.stats();
  EXPECT_EQ(stats.requests_refused, 6u);
  // The codec refuses non-finite values itself (CODEC.md): "bad model", with its reason.
  EXPECT_EQ(stats.refused["bad model"], 4u);
  EXPECT_EQ(stats.refused["bad query"], 2u);

  // A fleet certificate, but peer-2 is not peer-0's neighbour in a ring of 4.
  CoapDtlsClient not_a_neighbour = client(server.port(), "peer-2");
  EXPECT_EQ(not_a_neighbour.request(Method::kGet, "gossip/model").code, CoapCode::kForbidden);
  EXPECT_EQ(peer.stats().refused["not a neighbour"], 1u);
  // The other way round: a peer dialling a neighbour checks the name in its certificate.
  CoapDtlsClient::Options expecting("127.0.0.1", server.port(), {}, 4000);
  expecting.certificates = identity("peer-1");
  expecting.expected_peer_name = "peer-3";
  CoapDtlsClient wrong_name(expecting);
  EXPECT_THROW(wrong_name.request(Method::kGet, "gossip/model"), transport::TransportError);
  expecting.expected_peer_name = "peer-0";
  CoapDtlsClient right_name(expecting);
  EXPECT_EQ(right_name.request(Method::kGet, "gossip/model").code, CoapCode::kContent);
  // A certificate of another CA never gets a session.
  CoapDtlsClient stranger = client(server.port(), "stranger", "ca.crt");
  EXPECT_THROW(stranger.request(Method::kGet, "gossip/model"), transport::TransportError);

  // A good average: both end at the midpoint.
  std::vector<float> theirs(before.size());
  for (std::size_t i = 0; i < theirs.size(); ++i) theirs[i] = 0.25f * static_cast<float>(i % 7);
  const CoapResponse answer =
      neighbour.request(Method::kPost, "gossip/average",
                        transport::encode_dense_model(model.layout_id(), 3, sizes, theirs).value());
  ASSERT_EQ(answer.code, CoapCode::kChanged) << std::string(answer.payload.begin(), answer.payload.end());
  const auto returned = transport::decode_dense_model(answer.payload, {model.layout_id(), sizes});
  ASSERT_TRUE(returned);
  EXPECT_EQ(returned.value().values, before);  // what peer-0 had
  const std::vector<float> after = peer.parameters();
  for (std::size_t i = 0; i < after.size(); ++i)
    ASSERT_FLOAT_EQ(after[i], 0.5f * (before[i] + theirs[i])) << i;
}

TEST_F(GossipPeerTest, DpsgdMixesWithMetropolisWeightsAndRefusesANonFiniteNeighbour) {
  const runtime::Dataset data = tiny_data();
  runtime::Model model(runtime::model_spec_from_argument(kModel));
  FakeNeighbours channel;
  const std::size_t n = with_ring_neighbours(channel, model);
  std::atomic<bool> stop{false};
  GossipPeer peer(config_for(0, runtime::GossipAlgorithm::kDpsgd), data, channel, stop);
  peer.iterate();
  // Both neighbours were first asked for a delta from the fleet's seeded initial model.
  ASSERT_EQ(channel.paths.size(), 2u);
  EXPECT_EQ(channel.paths[0], "gossip/model?since=0");
  EXPECT_EQ(channel.paths[1], "gossip/model?since=0");
  // What peer-0 published at iteration 1 (its model right after the local step).
  CoapRequest ask;
  ask.identity = "peer-1";
  const CoapResponse published = peer.get_model(ask);
  ASSERT_EQ(published.code, CoapCode::kContent);
  const auto own =
      transport::decode_dense_model(published.payload, {model.layout_id(), channel.sizes});
  ASSERT_TRUE(own);
  EXPECT_EQ(own.value().version, 1u);
  // Ring of 4: every degree is 2, so w = 1/3 for each neighbour and for itself.
  const std::vector<float> x = peer.parameters();
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_NEAR(x[i],
                own.value().values[i] + (1.0f - own.value().values[i]) / 3 +
                    (-2.0f - own.value().values[i]) / 3,
                1e-5)
        << i;
  EXPECT_EQ(peer.stats().exchanges, 2u);

  channel.models[3][5] = FakeNeighbours::kMarker;
  channel.poisoned = 3;
  peer.iterate();
  const auto stats = peer.stats();
  EXPECT_EQ(stats.models_refused, 1u);
  EXPECT_EQ(stats.exchanges, 3u);  // only peer-1's this time
  for (float v : peer.parameters()) ASSERT_TRUE(std::isfinite(v));

  // A neighbour whose every answer is a delta that does not fit: refused after two, not
  // pulled forever.
  channel.poisoned.reset();
  channel.deltas_that_never_fit = 1;
  peer.iterate();
  EXPECT_EQ(peer.stats().models_refused, 2u);
  // Both refusals by one reason: the codec itself refuses the NaN above.
  EXPECT_EQ(peer.stats().refused.at("bad model from a neighbour"), 2u);
}

// FakeNeighbours that may be asked by several threads at once: each request waits (at most
// 5 s) until `expected` requests are in flight, and the most seen at once is kept.
class ConcurrentFakeNeighbours : public FakeNeighbours {
 public:
  int expected = 2;
  int most_in_flight = 0;
  bool concurrent_neighbours() const override { return true; }
  CoapResponse request(std::uint32_t neighbour, Method method, const std::string& path,
                       std::span<const std::uint8_t> body) override {
    {
      std::unique_lock lock(mutex_);
      most_in_flight = std::max(most_in_flight, ++in_flight_);
      all_in_flight_.notify_all();
      all_in_flight_.wait_for(lock, std::chrono::seconds(5),
                              [&] { return most_in_flight >= expected; });
    }
    std::lock_guard lock(mutex_);
    CoapResponse answer = FakeNeighbours::request(neighbour, method, path, body);
    --in_flight_;
    return answer;
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_in_flight_;
  int in_flight_ = 0;
};

TEST_F(GossipPeerTest, DpsgdPullsEveryNeighbourAtOnceWhenTheChannelAllowsIt) {
  const runtime::Dataset data = tiny_data();
  runtime::Model model(runtime::model_spec_from_argument(kModel));
  ConcurrentFakeNeighbours channel;
  with_ring_neighbours(channel, model);
  std::atomic<bool> stop{false};
  GossipPeer peer(config_for(0, runtime::GossipAlgorithm::kDpsgd), data, channel, stop);
  peer.iterate();
  // One after the other, the first pull would have waited alone for its 5 s.
  EXPECT_EQ(channel.most_in_flight, 2);
  EXPECT_EQ(peer.stats().exchanges, 2u);
  EXPECT_EQ(peer.stats().neighbours_skipped, 0u);
}

// FakeNeighbours whose peer-1 is slow: it answers its model at version `slow_version` for
// its first `lagging_answers` pulls of each iteration (the puller sleeps 20 ms after each),
// then at `version`, as peer-3 always does.
class LaggingNeighbours : public FakeNeighbours {
 public:
  std::uint64_t version = 1, slow_version = 0;
  int lagging_answers = 0;
  CoapResponse request(std::uint32_t neighbour, Method, const std::string& path,
                       std::span<const std::uint8_t>) override {
    paths.push_back(path);
    const bool behind = neighbour == 1 && lagged_++ < lagging_answers;
    return {CoapCode::kContent,
            transport::encode_dense_model(layout_id, behind ? slow_version : version, sizes,
                                          models.at(neighbour))
                .value()};
  }
  void next_iteration() { ++version, ++slow_version, lagged_ = 0; }

 private:
  int lagged_ = 0;
};

TEST_F(GossipPeerTest, DpsgdTrainsWhileANeighbourIsBehindUpToWaitSteps) {
  const runtime::Dataset data = tiny_data();
  runtime::Model model(runtime::model_spec_from_argument(kModel));
  for (const std::uint32_t wait_steps : {0u, 3u}) {
    LaggingNeighbours channel;
    with_ring_neighbours(channel, model);
    channel.lagging_answers = 10;  // ~200 ms behind: time for many steps of this tiny model
    GossipPeerConfig config = config_for(0, runtime::GossipAlgorithm::kDpsgd);
    config.neighbour_wait_seconds = 5;
    config.wait_steps = wait_steps;
    std::atomic<bool> stop{false};
    GossipPeer peer(config, data, channel, stop);
    // The first wait: no steps, as the peer has no measure yet of how long it will last.
    peer.iterate();
    auto stats = peer.stats();
    EXPECT_EQ(stats.exchanges, 2u) << wait_steps;
    EXPECT_EQ(stats.wait_steps, 0u);
    // The second: the last one's ~200 ms hold many steps of this model; the cap holds.
    channel.next_iteration();
    peer.iterate();
    stats = peer.stats();
    EXPECT_EQ(stats.exchanges, 4u) << wait_steps;  // the barrier held: both neighbours mixed in
    EXPECT_EQ(stats.wait_steps, wait_steps);
    EXPECT_EQ(stats.steps, 2u + wait_steps);
    EXPECT_EQ(stats.examples, 5u * (2u + wait_steps));
    // Neighbours that are ready: no step beyond the iteration's own.
    channel.next_iteration();
    channel.lagging_answers = 0;
    peer.iterate();
    stats = peer.stats();
    EXPECT_EQ(stats.exchanges, 6u);
    EXPECT_EQ(stats.wait_steps, wait_steps);
    EXPECT_EQ(stats.steps, 3u + wait_steps);
    for (float v : peer.parameters()) ASSERT_TRUE(std::isfinite(v));
  }
  // Only D-PSGD has a barrier to wait at.
  GossipPeerConfig adpsgd = config_for(0, runtime::GossipAlgorithm::kAdpsgd);
  adpsgd.wait_steps = 2;
  EXPECT_THROW(runtime::check_gossip_peer_config(adpsgd), std::invalid_argument);
}

TEST_F(GossipPeerTest, ACheckpointIsResumedAtItsIterationAndADamagedOneIsRefused) {
  const runtime::Dataset data = tiny_data();
  NoNeighbours channel;
  std::atomic<bool> stop{false};
  const fs::path dir =
      fs::temp_directory_path() / ("edgetrain-gossip-ckpt-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  GossipPeerConfig c = config_for(1, runtime::GossipAlgorithm::kDpsgd);
  c.checkpoint_path = (dir / "peer.safetensors").string();
  c.checkpoint_every = 3;
  c.max_iterations = 7;
  std::vector<float> at_seven;
  {
    GossipPeer peer(c, data, channel, stop);
    EXPECT_EQ(peer.run().iteration, 7u);
    at_seven = peer.parameters();
  }
  c.max_iterations = 9;
  GossipPeer resumed(c, data, channel, stop);
  EXPECT_EQ(resumed.stats().resumed_iteration, 7u);
  EXPECT_EQ(resumed.parameters(), at_seven);
  EXPECT_EQ(resumed.run().iteration, 9u);
  {
    std::ofstream damaged(c.checkpoint_path, std::ios::binary | std::ios::trunc);
    damaged << "not a checkpoint";
  }
  EXPECT_THROW(GossipPeer(c, data, channel, stop), runtime::ModelError);
  fs::remove_all(dir);
}

// Issue 37: a neighbour that serves a model whose output bias is 1e30 (finite, so the codec
// and the old finiteness check took it) is refused by the magnitude bound, counted under its
// name and logged once; the peer's model stays finite and bounded, it keeps mixing with its
// other neighbour and iterating.
TEST(GossipPeerNeighbours, AModelWithA1e30BiasIsRefusedCountedLoggedOnceAndTrainingGoesOn) {
  const runtime::Dataset data = tiny_data();
  runtime::Model model(runtime::model_spec_from_argument(kModel));
  FakeNeighbours channel;
  with_ring_neighbours(channel, model);
  model.initialize(1);  // the fleet's initial model (config_for's seed)
  // Honest models for both, then peer-3's output bias (the last tensor, fc 3) poisoned.
  channel.models[1] = std::vector<float>(model.parameters().begin(), model.parameters().end());
  channel.models[3] = channel.models[1];
  const auto& bias = model.tensors().back();
  ASSERT_EQ(bias.size, 3u);
  for (std::size_t k = 0; k < bias.size; ++k) channel.models[3][bias.offset + k] = 1e30f;
  std::atomic<bool> stop{false};
  std::vector<std::string> lines;
  GossipPeer peer(config_for(0, runtime::GossipAlgorithm::kDpsgd), data, channel, stop,
                  [&](const std::string& line) { lines.push_back(line); });
  // Until peer-3 has been refused twice (it is backed off after each refusal: at most
  // 0.5 s, then 1 s), at least 20 iterations.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::uint64_t iterations = 0;
  while ((iterations < 20 || peer.stats().neighbours.at("peer-3").refused < 2) &&
         std::chrono::steady_clock::now() < give_up) {
    peer.iterate();
    ++iterations;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto stats = peer.stats();
  EXPECT_EQ(stats.iteration, iterations);
  EXPECT_EQ(stats.steps, iterations);
  const auto& bad = stats.neighbours.at("peer-3");
  const auto& good = stats.neighbours.at("peer-1");
  EXPECT_GE(bad.refused, 2u);
  EXPECT_EQ(bad.mixed, 0u);
  EXPECT_EQ(bad.last_refusal, "model above the magnitude bound from a neighbour");
  EXPECT_EQ(good.refused, 0u);
  EXPECT_EQ(good.mixed, iterations);
  EXPECT_EQ(stats.models_refused, bad.refused);
  EXPECT_EQ(stats.refused.at("model above the magnitude bound from a neighbour"), bad.refused);
  for (float v : peer.parameters()) {
    ASSERT_TRUE(std::isfinite(v));
    ASSERT_LT(std::fabs(v), 10.0f);
  }
  // Logged once, when first refused.
  int said = 0;
  for (const std::string& line : lines)
    if (line.find("peer-3") != std::string::npos && line.find("refused") != std::string::npos)
      ++said;
  EXPECT_EQ(said, 1);

  // With no bound the same model is mixed in (the behaviour of issue 37), and with a clip it
  // moves the peer by at most γ·w·τ per iteration.
  auto unbounded = config_for(0, runtime::GossipAlgorithm::kDpsgd);
  unbounded.max_neighbour_magnitude = 0;
  unbounded.neighbour_clip = 1;
  unbounded.balance.base_lr = 0;  // mixing alone
  FakeNeighbours channel2;
  with_ring_neighbours(channel2, model);
  channel2.models[1] = channel.models[1];
  channel2.models[3] = channel.models[3];
  GossipPeer clipped(unbounded, data, channel2, stop);
  const std::vector<float> before = clipped.parameters();
  clipped.iterate();
  const auto after = clipped.parameters();
  double moved = 0;
  for (std::size_t i = 0; i < after.size(); ++i) moved += std::pow(after[i] - before[i], 2);
  // w = 1/3 on the ring of 4, γ = 1, τ = 1; peer-1 holds the peer's own model: no move.
  EXPECT_NEAR(std::sqrt(moved), 1.0 / 3, 1e-4);
  EXPECT_EQ(clipped.stats().neighbours.at("peer-3").clipped, 1u);
  EXPECT_EQ(clipped.stats().neighbours.at("peer-1").clipped, 0u);

  // AD-PSGD: an average request carrying the poisoned model is refused (4.00) and counted
  // under its sender; the peer's model does not move.
  GossipPeer responder(config_for(0, runtime::GossipAlgorithm::kAdpsgd), data, channel2, stop);
  const std::vector<float> mine = responder.parameters();
  const std::vector<std::uint8_t> poisoned_body =
      transport::encode_dense_model(model.layout_id(), 1, sizes_of(model), channel.models[3])
          .value();
  CoapRequest average;
  average.identity = "peer-3";
  average.payload = poisoned_body;
  const CoapResponse refused = responder.post_average(average);
  EXPECT_EQ(refused.code, CoapCode::kBadRequest)
      << std::string(refused.payload.begin(), refused.payload.end());
  EXPECT_EQ(responder.parameters(), mine);
  EXPECT_EQ(responder.stats().requests_refused, 1u);
  EXPECT_EQ(responder.stats().neighbours.at("peer-3").refused, 1u);
  EXPECT_EQ(responder.stats().neighbours.at("peer-3").last_refusal,
            "model above the magnitude bound");
}

// GossipPeerConfig::outgoing and mix_neighbours (edgetrain-gossip-attacker's): the neighbours
// see the rewritten model (published, and an AD-PSGD answer), the peer's own model is never
// moved toward theirs, and nothing is counted as mixed.
TEST(GossipPeerNeighbours, AnOutgoingRewriteIsWhatNeighboursSeeAndNothingIsMixedIn) {
  const runtime::Dataset data = tiny_data();
  runtime::Model model(runtime::model_spec_from_argument(kModel));
  FakeNeighbours channel;
  const std::size_t n = with_ring_neighbours(channel, model);
  std::atomic<bool> stop{false};
  auto config = config_for(0, runtime::GossipAlgorithm::kDpsgd);
  config.balance.base_lr = 0;  // no local step moves the model either
  config.outgoing = [](std::span<float> x) {
    for (float& v : x) v *= -4;
  };
  config.mix_neighbours = false;
  GossipPeer peer(config, data, channel, stop);
  const std::vector<float> before = peer.parameters();
  peer.iterate();
  EXPECT_EQ(peer.parameters(), before);
  EXPECT_EQ(channel.paths.size(), 2u);  // it still pulls both neighbours (the barrier's pace)
  EXPECT_EQ(peer.stats().exchanges, 0u);
  EXPECT_EQ(peer.stats().neighbours.at("peer-1").mixed, 0u);
  CoapRequest ask;
  ask.identity = "peer-1";
  const CoapResponse published = peer.get_model(ask);
  const auto seen =
      transport::decode_dense_model(published.payload, {model.layout_id(), channel.sizes});
  ASSERT_TRUE(seen);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(seen.value().values[i], -4 * before[i]) << i;

  config.algorithm = runtime::GossipAlgorithm::kAdpsgd;
  GossipPeer responder(config, data, channel, stop);
  const std::vector<float> mine = responder.parameters();
  const std::vector<std::uint8_t> body =
      transport::encode_dense_model(model.layout_id(), 1, sizes_of(model), channel.models[3])
          .value();
  CoapRequest average;
  average.identity = "peer-3";
  average.payload = body;  // a view
  const CoapResponse answer = responder.post_average(average);
  ASSERT_EQ(answer.code, CoapCode::kChanged)
      << std::string(answer.payload.begin(), answer.payload.end());
  const auto answered =
      transport::decode_dense_model(answer.payload, {model.layout_id(), channel.sizes});
  ASSERT_TRUE(answered);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(answered.value().values[i], -4 * mine[i]) << i;
  EXPECT_EQ(responder.parameters(), mine);
  EXPECT_EQ(responder.stats().neighbours.at("peer-3").mixed, 0u);
}

}  // namespace
