// The server's resources over real loopback DTLS-PSK (transport::CoapDtlsClient against a
// CoapDtlsServer carrying ServerResources): every kind of bad update gets its 4.xx code
// with a diagnostic and leaves the served model byte-identical, the server keeps serving,
// unknown identities fail the handshake, a replayed update applies once, /status is JSON.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <random>
#include <nlohmann/json.hpp>
#include <thread>

#include "worker/model_replica.h"
#include "server/resources.h"
#include "tests/support/served_resources.h"
#include "transport/coap_dtls.h"

namespace {

using namespace edgetrain;
using edgetrain::testing::bytes_of;
using edgetrain::testing::text_of;
using transport::CoapCode;
using transport::CoapDtlsClient;
using transport::CoapResponse;
using transport::Method;

// ~9.6 kB as a dense model: GET /model needs block-wise transfer.
runtime::Model test_model() {
  return edgetrain::testing::initialized_model("input 8x8x1; fc 32 relu; fc 10", "test-mlp", 3);
}

class ServerOverDtls : public ::testing::Test {
 protected:
  void SetUp() override {
    server::ServerStateOptions options;
    options.store.max_staleness = 2;
    options.max_update_bytes = 4096;
    served_ = std::make_unique<edgetrain::testing::ServedResources>(
        "resources", test_model(), options,
        edgetrain::testing::psk_server_options(
            {{"device-1", "key-one-0123456789"}, {"device-2", "key-two-9876543210"}}));
    state_ = &served_->state();
    resources_ = &served_->resources();
    server_ = &served_->server();
    sizes_ = edgetrain::testing::tensor_sizes(state_->model());
  }
  void TearDown() override { served_.reset(); }
  CoapDtlsClient client(const std::string& identity, const std::string& key) {
    return CoapDtlsClient({"127.0.0.1", server_->port(), {identity, bytes_of(key)}, 5000});
  }
  CoapDtlsClient device1() { return client("device-1", "key-one-0123456789"); }

  transport::SparseUpdate update(std::uint64_t sequence, std::uint64_t fetched) const {
    return {
        state_->model_id(), sequence, fetched, {{1, sizes_[1], {0, 5, 31}, {0.5f, -1.0f, 2.0f}}}};
  }
  static std::vector<std::uint8_t> encode(const transport::SparseUpdate& u) {
    return transport::encode_sparse_update(u).value();
  }

  std::vector<std::uint32_t> sizes_;
  std::unique_ptr<edgetrain::testing::ServedResources> served_;
  server::ServerState* state_ = nullptr;
  server::ServerResources* resources_ = nullptr;
  transport::CoapDtlsServer* server_ = nullptr;
};

TEST_F(ServerOverDtls, BadUpdatesGetTheirCodeAndLeaveTheModelUnchanged) {
  auto c = device1();
  const CoapResponse before = c.request(Method::kGet, "model");
  ASSERT_EQ(before.code, CoapCode::kContent);
  auto decoded = transport::decode_dense_model(before.payload, {state_->model_id(), sizes_});
  ASSERT_TRUE(decoded.ok()) << decoded.error().message;
  EXPECT_EQ(decoded.value().version, 0u);

  const auto good = encode(update(1, 0));
  std::vector<std::uint8_t> nan_bytes = good, inf_bytes = good;
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  std::memcpy(nan_bytes.data() + nan_bytes.size() - 4, &nan, 4);  // the last value
  std::memcpy(inf_bytes.data() + inf_bytes.size() - 8, &inf, 4);
  auto wrong_size = update(1, 0);
  wrong_size.tensors[0].size += 10;  // lets index 35 past the model's 32 through the encoder
  wrong_size.tensors[0].indices.back() = sizes_[1] + 3;
  auto no_such_tensor = update(1, 0);
  no_such_tensor.tensors[0].tensor = 9;
  auto wrong_model = update(1, 0);
  wrong_model.model_id ^= 0xff;
  auto future = update(1, 7);

  struct Case {
    const char* name;
    std::vector<std::uint8_t> body;
    int code;
  };
  const std::vector<Case> cases = {
      {"garbage", bytes_of("this is not an update"), CoapCode::kBadRequest},
      {"empty", {}, CoapCode::kBadRequest},
      {"truncated", {good.begin(), good.end() - 3}, CoapCode::kBadRequest},
      {"trailing bytes",
       [&] {
         auto b = good;
         b.push_back(0);
         return b;
       }(),
       CoapCode::kBadRequest},
      {"oversized", std::vector<std::uint8_t>(5000, 0x45), CoapCode::kRequestEntityTooLarge},
      {"NaN", nan_bytes, CoapCode::kBadRequest},
      {"Inf", inf_bytes, CoapCode::kBadRequest},
      {"index out of range", encode(wrong_size), CoapCode::kBadRequest},
      {"tensor out of range", encode(no_such_tensor), CoapCode::kBadRequest},
      {"from the future", encode(future), CoapCode::kBadRequest},
      {"wrong model", encode(wrong_model), CoapCode::kConflict},
  };
  for (const Case& bad : cases) {
    const CoapResponse r = c.request(Method::kPost, "update", bad.body);
    EXPECT_EQ(r.code, bad.code) << bad.name << ": " << text_of(r);
    EXPECT_FALSE(r.payload.empty()) << bad.name << ": no diagnostic";
  }
  const CoapResponse after = c.request(Method::kGet, "model");
  EXPECT_EQ(after.payload, before.payload);

  // Still serving, and a good update goes through.
  const CoapResponse ok = c.request(Method::kPost, "update", good);
  ASSERT_EQ(ok.code, CoapCode::kChanged) << text_of(ok);
  EXPECT_EQ(server::decode_update_reply(ok.payload), 1u);
  const CoapResponse changed = c.request(Method::kGet, "model");
  EXPECT_NE(changed.payload, before.payload);
  EXPECT_EQ(changed.etag, 1u);
  EXPECT_EQ(
      transport::decode_dense_model(changed.payload, {state_->model_id(), sizes_}).value().version,
      1u);
}

TEST_F(ServerOverDtls, TooStaleUpdateAsksForARepull) {
  auto c = device1();
  for (std::uint64_t s = 1; s <= 3; ++s)
    ASSERT_EQ(c.request(Method::kPost, "update", encode(update(s, s - 1))).code,
              CoapCode::kChanged);
  const CoapResponse stale =
      c.request(Method::kPost, "update", encode(update(4, 0)));  // delay 3 > D = 2
  EXPECT_EQ(stale.code, CoapCode::kConflict);
  EXPECT_NE(text_of(stale).find("stale"), std::string::npos) << text_of(stale);
}

TEST_F(ServerOverDtls, ReplayedUpdateIsAppliedOnceAndAnsweredTheSame) {
  auto c = device1();
  const auto body = encode(update(42, 0));
  const CoapResponse first = c.request(Method::kPost, "update", body);
  const CoapResponse replay = c.request(Method::kPost, "update", body);
  ASSERT_EQ(first.code, CoapCode::kChanged);
  ASSERT_EQ(replay.code, CoapCode::kChanged);
  EXPECT_EQ(replay.payload, first.payload);
  // The same bytes from another identity are that identity's own update.
  auto c2 = client("device-2", "key-two-9876543210");
  const CoapResponse other = c2.request(Method::kPost, "update", body);
  ASSERT_EQ(other.code, CoapCode::kChanged);
  EXPECT_EQ(server::decode_update_reply(other.payload), 2u);
  const auto status = nlohmann::json::parse(text_of(c.request(Method::kGet, "status")));
  EXPECT_EQ(status["version"], 2);
  EXPECT_EQ(status["duplicates_answered"], 1);
}

TEST_F(ServerOverDtls, UnknownIdentityOrWrongKeyIsRefusedInTheHandshake) {
  auto intruder = client("intruder", "key-one-0123456789");
  EXPECT_THROW(intruder.request(Method::kPost, "update", encode(update(1, 0))),
               transport::TransportError);
  auto wrong_key = client("device-1", "not-the-right-key!");
  EXPECT_THROW(wrong_key.request(Method::kGet, "status"), transport::TransportError);
  // Nothing got through, and the server still answers a proper client.
  auto c = device1();
  const auto status = nlohmann::json::parse(text_of(c.request(Method::kGet, "status")));
  EXPECT_EQ(status["version"], 0);
}

TEST_F(ServerOverDtls, StatusIsReadableJson) {
  auto c = device1();
  ASSERT_EQ(c.request(Method::kPost, "update", encode(update(1, 0))).code, CoapCode::kChanged);
  ASSERT_EQ(c.request(Method::kPost, "update", bytes_of("junk")).code, CoapCode::kBadRequest);
  resources_->report_accuracy(1, 0.5);
  const CoapResponse r = c.request(Method::kGet, "status");
  ASSERT_EQ(r.code, CoapCode::kContent);
  const auto status = nlohmann::json::parse(text_of(r));
  EXPECT_EQ(status["version"], 1);
  EXPECT_EQ(status["model"], "test-mlp");
  EXPECT_EQ(status["updates_applied_since_start"], 1);
  EXPECT_EQ(status["updates_refused"], 1);
  EXPECT_EQ(status["workers_seen"], nlohmann::json::array({"device-1"}));
  EXPECT_GT(status["ingress_payload_bytes"].get<std::uint64_t>(), 4u);
  EXPECT_EQ(status["last_test_accuracy"]["accuracy"], 0.5);
  EXPECT_TRUE(status.contains("uptime_seconds"));
  // The refused update is not part of the time breakdown.
  EXPECT_EQ(status["submit_seconds"]["applied_updates"], 1);
  EXPECT_GT(status["submit_seconds"]["wal_append_fdatasync"].get<double>(), 0.0);
}

TEST_F(ServerOverDtls, StatusCountsSocketBytesBeyondPayloadsIncludingHandshakes) {
  auto c = device1();
  std::uint64_t payload = 0;
  for (std::uint64_t s = 1; s <= 3; ++s) {
    const auto body = encode(update(s, s - 1));
    payload += body.size();
    ASSERT_EQ(c.request(Method::kPost, "update", body).code, CoapCode::kChanged);
  }
  // A status request is counted before it is answered, so each reading includes itself.
  const auto first = nlohmann::json::parse(text_of(c.request(Method::kGet, "status")));
  EXPECT_EQ(first["ingress_payload_bytes"].get<std::uint64_t>(), payload);
  EXPECT_GT(first["ingress_socket_bytes"].get<std::uint64_t>(),
            payload + 4 * 13);  // + a record header each
  EXPECT_GE(first["ingress_socket_datagrams"].get<std::uint64_t>(),
            3u + 4u);  // handshake + 4 requests

  const auto open_session = nlohmann::json::parse(text_of(c.request(Method::kGet, "status")));
  auto fresh = client("device-2", "key-two-9876543210");
  const auto fresh_session = nlohmann::json::parse(text_of(fresh.request(Method::kGet, "status")));
  auto delta = [](const nlohmann::json& later, const nlohmann::json& earlier, const char* key) {
    return later[key].get<std::uint64_t>() - earlier[key].get<std::uint64_t>();
  };
  // On an open session a status request is one datagram per block of the answer (with the
  // per-device section it may take two 1024-byte blocks); on a fresh one the handshake
  // comes first (ClientHello twice for the cookie, then the key exchange and Finished).
  const std::uint64_t request_datagrams = delta(open_session, first, "ingress_socket_datagrams");
  EXPECT_GE(request_datagrams, 1u);
  EXPECT_LE(request_datagrams, 2u);
  EXPECT_GE(delta(fresh_session, open_session, "ingress_socket_datagrams"), request_datagrams + 3u);
  EXPECT_GT(delta(fresh_session, open_session, "ingress_socket_bytes"),
            delta(open_session, first, "ingress_socket_bytes") + 150);
  EXPECT_EQ(delta(fresh_session, first, "ingress_payload_bytes"), 0u);
}

TEST_F(ServerOverDtls, SparsePullsGiveTheServersParametersBitForBitDuringConcurrentUpdates) {
  // Two devices post updates as fast as the server takes them while a third client keeps a
  // ModelReplica (the worker's copy) current with GET /model?since=V.
  constexpr int kUpdatesPerDevice = 25;
  std::atomic<int> posters_done = 0;
  std::atomic<bool> first_pull_done = false;  // so that pulls and posts really overlap
  auto post_updates = [&](const std::string& identity, const std::string& key, std::uint32_t seed) {
    auto c = client(identity, key);
    while (!first_pull_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::mt19937 rng(seed);
    std::uint64_t sequence = 0;
    for (int applied = 0; applied < kUpdatesPerDevice;) {
      transport::SparseTensor weights{0, sizes_[0], {}, {}};
      for (std::uint32_t i = 0; i < sizes_[0]; ++i)
        if (rng() % 40 == 0) {
          weights.indices.push_back(i);
          weights.values.push_back(std::uniform_real_distribution<float>(-1, 1)(rng));
        }
      transport::SparseUpdate u{
          state_->model_id(), ++sequence, state_->snapshot().version, {weights}};
      const CoapResponse r = c.request(Method::kPost, "update", encode(u));
      if (r.code == CoapCode::kChanged)
        ++applied;
      else
        ASSERT_EQ(r.code, CoapCode::kConflict) << text_of(r);  // too stale: try again
    }
    ++posters_done;
  };
  std::thread first(post_updates, "device-1", "key-one-0123456789", 1);
  std::thread second(post_updates, "device-2", "key-two-9876543210", 2);

  runtime::ModelReplica replica(state_->model_id(), sizes_);
  auto puller = client("device-1", "key-one-0123456789");
  int deltas = 0, compared = 0;
  auto pull = [&] {
    const CoapResponse r = puller.request(Method::kGet, replica.pull_path());
    ASSERT_EQ(r.code, CoapCode::kContent) << text_of(r);
    const auto outcome = replica.take(r.payload);
    ASSERT_NE(outcome, runtime::ModelReplica::PullOutcome::kMismatch) << replica.mismatch();
    if (outcome == runtime::ModelReplica::PullOutcome::kDelta) {
      ++deltas;
      EXPECT_LT(r.payload.size(), transport::dense_model_bytes(sizes_));
    }
    const auto snapshot = state_->snapshot();
    if (snapshot.version == replica.version()) {
      ++compared;
      ASSERT_EQ(std::memcmp(snapshot.parameters.data(), replica.parameters().data(),
                            snapshot.parameters.size() * sizeof(float)),
                0)
          << "at version " << snapshot.version;
    }
  };
  pull();
  first_pull_done = true;
  while (posters_done < 2 && !HasFatalFailure()) pull();
  first.join();
  second.join();
  ASSERT_FALSE(HasFatalFailure());
  pull();
  ASSERT_EQ(replica.version(), 2u * kUpdatesPerDevice);
  std::printf(
      "%d pulls were deltas, %d compared with the server's parameters at the same version\n",
      deltas, compared);
  EXPECT_GE(deltas, 2);
  EXPECT_GE(compared, 1);
  // The final copy is what a dense pull gives, bit for bit.
  const CoapResponse dense = puller.request(Method::kGet, "model");
  auto decoded = transport::decode_dense_model(dense.payload, {state_->model_id(), sizes_});
  ASSERT_TRUE(decoded.ok()) << decoded.error().message;
  EXPECT_EQ(decoded.value().version, replica.version());
  ASSERT_EQ(std::memcmp(decoded.value().values.data(), replica.parameters().data(),
                        decoded.value().values.size() * sizeof(float)),
            0);
  const auto status = nlohmann::json::parse(text_of(puller.request(Method::kGet, "status")));
  EXPECT_EQ(status["model_delta_pulls"].get<int>(), deltas);
}

TEST_F(ServerOverDtls, BadModelQueriesGet400AndOtherBasesTheDenseModel) {
  auto c = device1();
  for (const char* query : {"since=abc", "since=", "since=-1", "since=+5", "since=1&since=2",
                            "since=1x", "foo=1", "since=18446744073709551616"}) {
    const CoapResponse r = c.request(Method::kGet, std::string("model?") + query);
    EXPECT_EQ(r.code, CoapCode::kBadRequest) << query;
    EXPECT_NE(text_of(r).find("bad query"), std::string::npos) << query << ": " << text_of(r);
  }
  ASSERT_EQ(c.request(Method::kPost, "update", encode(update(1, 0))).code, CoapCode::kChanged);
  // A base the server has not reached: the dense model.
  for (const char* query : {"since=2", "since=18446744073709551615"}) {
    const CoapResponse r = c.request(Method::kGet, std::string("model?") + query);
    ASSERT_EQ(r.code, CoapCode::kContent) << query;
    EXPECT_EQ(transport::model_message_kind(r.payload), transport::ModelMessageKind::kDense)
        << query;
  }
  // Version 0 → 1 changed three entries: a delta of one tensor record.
  const CoapResponse r = c.request(Method::kGet, "model?since=0");
  ASSERT_EQ(r.code, CoapCode::kContent);
  ASSERT_EQ(transport::model_message_kind(r.payload), transport::ModelMessageKind::kDelta);
  auto delta = transport::decode_model_delta(r.payload, {state_->model_id(), sizes_});
  ASSERT_TRUE(delta.ok()) << delta.error().message;
  ASSERT_EQ(delta.value().tensors.size(), 1u);
  EXPECT_EQ(delta.value().tensors[0].indices, (std::vector<std::uint32_t>{0, 5, 31}));
  EXPECT_EQ(r.etag, 1u);
  const auto status = nlohmann::json::parse(text_of(c.request(Method::kGet, "status")));
  EXPECT_EQ(status["model_queries_refused"], 8);
  EXPECT_EQ(status["model_delta_pulls"], 1);
}

// The poisoning sequence over DTLS (issue 18, part 2): fourteen valid updates with
// −3.4e38 at one bias each get 4.22 with a diagnostic, the served model stays byte for byte
// what it was, /status counts them for the device, and the device trains on afterwards.
TEST_F(ServerOverDtls, PoisoningSequenceGets422AndTheModelIsStillServed) {
  auto c = device1();
  ASSERT_EQ(c.request(Method::kPost, "update", encode(update(1, 0))).code, CoapCode::kChanged);
  const CoapResponse before = c.request(Method::kGet, "model");
  ASSERT_EQ(before.code, CoapCode::kContent);
  for (std::uint64_t n = 2; n <= 15; ++n) {
    const transport::SparseUpdate poison{
        state_->model_id(), n, 1, {{1, sizes_[1], {0}, {-3.4e38f}}}};
    const CoapResponse r = c.request(Method::kPost, "update", encode(poison));
    EXPECT_EQ(r.code, CoapCode::kUnprocessableEntity) << n << ": " << text_of(r);
    EXPECT_EQ(text_of(r).rfind("out of bounds: ", 0), 0u) << text_of(r);
  }
  const CoapResponse after = c.request(Method::kGet, "model");
  ASSERT_EQ(after.code, CoapCode::kContent);
  EXPECT_EQ(after.payload, before.payload);
  const auto status = nlohmann::json::parse(text_of(c.request(Method::kGet, "status")));
  EXPECT_EQ(status["version"], 1);
  EXPECT_EQ(status["updates_refused_by_reason"]["out of bounds"], 14);
  EXPECT_EQ(status["devices_refused"]["device-1"]["refused"]["out of bounds"], 14);
  EXPECT_EQ(status["devices_refused"]["device-1"]["consecutive_bad"], 14);
  EXPECT_EQ(status["devices_refused"]["device-1"]["reported"], true);
  EXPECT_EQ(status["devices_refused"]["device-1"]["quarantined"], false);
  const CoapResponse ok = c.request(Method::kPost, "update", encode(update(16, 1)));
  ASSERT_EQ(ok.code, CoapCode::kChanged) << text_of(ok);
  EXPECT_EQ(server::decode_update_reply(ok.payload), 2u);
}

// With --quarantine-after, a device that keeps failing gets 4.03 for everything it posts;
// the other device is not affected.
TEST(ServerQuarantineOverDtls, ADeviceThatKeepsFailingGets403) {
  server::ServerStateOptions options;
  options.quarantine_after = 2;
  edgetrain::testing::ServedResources served(
      "quarantine", test_model(), options,
      edgetrain::testing::psk_server_options(
          {{"device-1", "key-one-0123456789"}, {"device-2", "key-two-9876543210"}}));
  const auto sizes = edgetrain::testing::tensor_sizes(served.state().model());
  auto post = [&](CoapDtlsClient& c, std::uint64_t sequence, float value) {
    const transport::SparseUpdate u{served.state().model_id(),
                                    sequence,
                                    served.state().version(),
                                    {{1, sizes[1], {0}, {value}}}};
    return c.request(Method::kPost, "update", transport::encode_sparse_update(u).value());
  };
  CoapDtlsClient one(
      {"127.0.0.1", served.server().port(), {"device-1", bytes_of("key-one-0123456789")}, 5000});
  CoapDtlsClient two(
      {"127.0.0.1", served.server().port(), {"device-2", bytes_of("key-two-9876543210")}, 5000});
  EXPECT_EQ(post(one, 1, -3.4e38f).code, CoapCode::kUnprocessableEntity);
  EXPECT_EQ(post(one, 1, -3.4e38f).code, CoapCode::kUnprocessableEntity);
  const CoapResponse refused = post(one, 1, 0.5f);
  EXPECT_EQ(refused.code, CoapCode::kForbidden) << text_of(refused);
  EXPECT_EQ(text_of(refused).rfind("quarantined: ", 0), 0u) << text_of(refused);
  EXPECT_EQ(post(two, 1, 0.5f).code, CoapCode::kChanged);
  const auto status = nlohmann::json::parse(text_of(two.request(Method::kGet, "status")));
  EXPECT_EQ(status["devices_refused"]["device-1"]["quarantined"], true);
  EXPECT_EQ(status["updates_refused_by_reason"]["quarantined"], 1);
}

// The cheap pull over DTLS (server/README.md, "Cheap pull"): two devices each keep a
// ModelReplica with GET /model?since=V while one of them posts; each gets its own deltas from
// the server's record of its copy, smaller than the dense model, and each checks its digest;
// a handler run again for the same request (what the transport does when it no longer holds
// a block-wise body) gives the same bytes and ETag while the model moves on.
TEST(ServerCheapPullOverDtls, EachDeviceGetsDeltasFromItsOwnRecordAndChecksThem) {
  server::ServerStateOptions options;
  options.store.max_staleness = 64;
  options.replica_pull = {{0.05, 4}, 4};
  edgetrain::testing::ServedResources served(
      "cheap-pull", test_model(), options,
      edgetrain::testing::psk_server_options(
          {{"device-1", "key-one-0123456789"}, {"device-2", "key-two-9876543210"}}));
  server::ServerState& state = served.state();
  const auto sizes = edgetrain::testing::tensor_sizes(state.model());
  CoapDtlsClient one(
      {"127.0.0.1", served.server().port(), {"device-1", bytes_of("key-one-0123456789")}, 5000});
  CoapDtlsClient two(
      {"127.0.0.1", served.server().port(), {"device-2", bytes_of("key-two-9876543210")}, 5000});
  runtime::ModelReplica copy_one(state.model_id(), sizes), copy_two(state.model_id(), sizes);
  // device-2 asks for fp16 increments (values=fp16-increment) from a server that does not
  // send them: it gets fp32 deltas as before.
  copy_two.accept_fp16_increments(true);
  std::size_t largest_delta = 0;
  auto pull = [&](CoapDtlsClient& c, runtime::ModelReplica& copy) {
    const CoapResponse r = c.request(Method::kGet, copy.pull_path());
    ASSERT_EQ(r.code, CoapCode::kContent) << text_of(r);
    const auto outcome = copy.take(r.payload);
    ASSERT_NE(outcome, runtime::ModelReplica::PullOutcome::kMismatch) << copy.mismatch();
    if (outcome == runtime::ModelReplica::PullOutcome::kDelta)
      largest_delta = std::max(largest_delta, r.payload.size());
  };
  std::mt19937 rng(5);
  std::uint64_t sequence = 0;
  auto post = [&] {  // a quarter of the first tensor's entries, from device-2's copy's version
    transport::SparseTensor weights{0, sizes[0], {}, {}};
    for (std::uint32_t i = 0; i < sizes[0]; ++i)
      if (rng() % 4 == 0) {
        weights.indices.push_back(i);
        weights.values.push_back(std::uniform_real_distribution<float>(-1, 1)(rng));
      }
    const transport::SparseUpdate u{state.model_id(), ++sequence, copy_two.version(), {weights}};
    ASSERT_EQ(two.request(Method::kPost, "update", transport::encode_sparse_update(u).value()).code,
              CoapCode::kChanged);
  };
  pull(one, copy_one);
  pull(two, copy_two);
  for (int i = 0; i < 12 && !::testing::Test::HasFatalFailure(); ++i) {
    post();
    pull(two, copy_two);
    if (i % 3 == 2) pull(one, copy_one);  // device-1 pulls less often: its deltas differ
  }
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(copy_two.version(), state.version());
  EXPECT_EQ(copy_one.version(), state.version());
  EXPECT_GT(largest_delta, 0u);
  EXPECT_LT(largest_delta, transport::dense_model_bytes(sizes));
  // Cheap: 5% of each tensor per pull, so the copies lag the model, each in its own way.
  const auto model = state.snapshot().parameters;
  EXPECT_NE(std::vector<float>(copy_one.parameters().begin(), copy_one.parameters().end()), model);
  EXPECT_NE(std::vector<float>(copy_one.parameters().begin(), copy_one.parameters().end()),
            std::vector<float>(copy_two.parameters().begin(), copy_two.parameters().end()));

  // The same request again (a block-wise answer asked for after the transport let it go),
  // with updates landing in between: the same body and ETag each time.
  transport::CoapRequest request;
  request.identity = "device-1";
  request.authentication = transport::PeerAuthentication::kPsk;
  request.query = "since=" + std::to_string(copy_one.version());
  post();
  const CoapResponse first = served.resources().get_model(request);
  ASSERT_EQ(first.code, CoapCode::kContent);
  ASSERT_EQ(transport::model_message_kind(first.payload), transport::ModelMessageKind::kDelta);
  for (int i = 0; i < 2; ++i) {
    post();
    const CoapResponse again = served.resources().get_model(request);
    EXPECT_EQ(again.payload, first.payload);
    EXPECT_EQ(again.etag, first.etag);
  }
  // ... and over the network too, where the worker applies it and checks the digest.
  pull(one, copy_one);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  // A base this device was not given gets the dense model.
  const CoapResponse other_base = one.request(Method::kGet, "model?since=1");
  EXPECT_EQ(transport::model_message_kind(other_base.payload), transport::ModelMessageKind::kDense);
  EXPECT_EQ(other_base.etag, state.version());
  const auto status = nlohmann::json::parse(text_of(one.request(Method::kGet, "status")));
  EXPECT_EQ(status["cheap_pull"]["records"], 2);
  EXPECT_EQ(status["cheap_pull"]["dense_pulls"], 3);  // the two first pulls and since=1
  EXPECT_EQ(status["cheap_pull"]["repeated_pulls"], 3);
  EXPECT_GT(status["model_pull_cpu_seconds"].get<double>(), 0);
  const std::string metrics = served.resources().metrics_text();
  EXPECT_NE(metrics.find("edgetrain_cheap_pull_records 2\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("edgetrain_model_pulls_total{kind=\"dense\"} 3\n"), std::string::npos)
      << metrics;
}

// --pull-values fp16-increment: the device that asks (worker --pull-values fp16-increment)
// gets deltas of fp16 increments, which its ModelReplica adds and checks against the digest of
// its record; the device that does not gets fp32 deltas, as before. Same pulls, fewer bytes.
TEST(ServerCheapPullOverDtls, Fp16IncrementsGoToTheDeviceThatAsksAndKeepItsCopyExact) {
  server::ServerStateOptions options;
  options.store.max_staleness = 64;
  options.replica_pull = {{0.05, 4}, 4};
  options.replica_pull.pull.values = transport::ValueEncoding::kFp16Increment;
  edgetrain::testing::ServedResources served(
      "cheap-pull-fp16-increments", test_model(), options,
      edgetrain::testing::psk_server_options(
          {{"device-1", "key-one-0123456789"}, {"device-2", "key-two-9876543210"}}));
  server::ServerState& state = served.state();
  const auto sizes = edgetrain::testing::tensor_sizes(state.model());
  CoapDtlsClient one(
      {"127.0.0.1", served.server().port(), {"device-1", bytes_of("key-one-0123456789")}, 5000});
  CoapDtlsClient two(
      {"127.0.0.1", served.server().port(), {"device-2", bytes_of("key-two-9876543210")}, 5000});
  runtime::ModelReplica asks(state.model_id(), sizes), does_not(state.model_id(), sizes);
  asks.accept_fp16_increments(true);
  transport::DecodeLimits any_reader;
  any_reader.accept_fp16_increment_delta_values = true;
  std::size_t delta_bytes[2] = {0, 0}, deltas[2] = {0, 0};
  auto pull = [&](CoapDtlsClient& c, runtime::ModelReplica& copy, int who) {
    const CoapResponse r = c.request(Method::kGet, copy.pull_path());
    ASSERT_EQ(r.code, CoapCode::kContent) << text_of(r);
    if (transport::model_message_kind(r.payload) == transport::ModelMessageKind::kDelta) {
      const auto decoded = transport::decode_model_delta(r.payload, {state.model_id(), sizes}, any_reader);
      ASSERT_TRUE(decoded.ok()) << decoded.error().message;
      EXPECT_EQ(decoded.value().values, who == 0 ? transport::ValueEncoding::kFp16Increment
                                                 : transport::ValueEncoding::kFp32);
      delta_bytes[who] += r.payload.size();
      ++deltas[who];
    }
    ASSERT_NE(copy.take(r.payload), runtime::ModelReplica::PullOutcome::kMismatch) << copy.mismatch();
  };
  std::mt19937 rng(7);
  std::uint64_t sequence = 0;
  auto post = [&] {
    transport::SparseTensor weights{0, sizes[0], {}, {}};
    for (std::uint32_t i = 0; i < sizes[0]; ++i)
      if (rng() % 4 == 0) {
        weights.indices.push_back(i);
        weights.values.push_back(std::uniform_real_distribution<float>(-1, 1)(rng));
      }
    const transport::SparseUpdate u{state.model_id(), ++sequence, does_not.version(), {weights}};
    ASSERT_EQ(two.request(Method::kPost, "update", transport::encode_sparse_update(u).value()).code,
              CoapCode::kChanged);
  };
  pull(one, asks, 0);
  pull(two, does_not, 1);
  for (int i = 0; i < 10 && !::testing::Test::HasFatalFailure(); ++i) {
    post();
    pull(one, asks, 0);
    pull(two, does_not, 1);
  }
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(asks.version(), state.version());
  EXPECT_EQ(does_not.version(), state.version());
  ASSERT_EQ(deltas[0], 10u);
  ASSERT_EQ(deltas[1], 10u);
  EXPECT_LT(delta_bytes[0], delta_bytes[1]);  // 2 bytes a value instead of 4
  const auto status = nlohmann::json::parse(text_of(one.request(Method::kGet, "status")));
  EXPECT_EQ(status["cheap_pull"]["dense_pulls"], 2);  // the two first pulls only
}

}  // namespace

namespace {

// Per-device health over DTLS (server/README.md, "Watching a fleet"): the devices section of
// /status, /status?device=NAME with its input checked, monitors apart from workers.
TEST_F(ServerOverDtls, StatusHasAPerDeviceSectionAndMonitorsApart) {
  auto worker = device1();
  const auto body = encode(update(1, 0));
  ASSERT_EQ(worker.request(Method::kGet, "model").code, CoapCode::kContent);
  ASSERT_EQ(worker.request(Method::kPost, "update", body).code, CoapCode::kChanged);
  ASSERT_EQ(worker.request(Method::kPost, "update", encode(update(2, 0))).code,
            CoapCode::kChanged);  // staleness 1
  ASSERT_EQ(worker.request(Method::kPost, "update", bytes_of("junk")).code, CoapCode::kBadRequest);
  auto monitor = client("device-2", "key-two-9876543210");  // only reads /status
  const CoapResponse r = monitor.request(Method::kGet, "status");
  ASSERT_EQ(r.code, CoapCode::kContent);
  const auto status = nlohmann::json::parse(text_of(r));
  EXPECT_EQ(status["workers_seen"], nlohmann::json::array({"device-1"}));
  EXPECT_EQ(status["monitors"], nlohmann::json::array({"device-2"}));
  ASSERT_TRUE(status["devices"].contains("device-1")) << status.dump();
  EXPECT_FALSE(status["devices"].contains("device-2"));
  const auto& d = status["devices"]["device-1"];
  EXPECT_EQ(d["updates_accepted"], 2);
  EXPECT_EQ(d["requests"], 4);
  EXPECT_DOUBLE_EQ(d["mean_staleness"].get<double>(), 0.5);
  EXPECT_EQ(d["refused"]["malformed"], 1);  // the refusal counts ServerState keeps, folded in
  EXPECT_EQ(d["silent"], false);
  EXPECT_LT(d["last_seen_seconds_ago"].get<double>(), 5.0);
  EXPECT_EQ(d["last_seen"].get<std::string>().size(), 20u);  // 2024-05-01T12:34:56Z
  EXPECT_GT(d["step_rate_per_second"].get<double>(), 0.0);
  EXPECT_EQ(d["request_payload_bytes"], body.size() + encode(update(2, 0)).size() + 4);
  EXPECT_GT(d["answer_payload_bytes"].get<std::uint64_t>(),
            16u);  // the model, two versions, a diagnostic
  EXPECT_EQ(status["devices_silent"], 0);

  const CoapResponse one = monitor.request(Method::kGet, "status?device=device-1");
  ASSERT_EQ(one.code, CoapCode::kContent) << text_of(one);
  const auto device = nlohmann::json::parse(text_of(one));
  EXPECT_EQ(device["device"], "device-1");
  EXPECT_EQ(device["role"], "worker");
  EXPECT_EQ(device["updates_accepted"], 2);
  EXPECT_EQ(nlohmann::json::parse(
                text_of(monitor.request(Method::kGet, "status?device=device-2")))["role"],
            "monitor");
}

TEST_F(ServerOverDtls, DeviceQueriesAreCheckedAndChangeNothing) {
  auto worker = device1();
  ASSERT_EQ(worker.request(Method::kPost, "update", encode(update(1, 0))).code, CoapCode::kChanged);
  const auto model_before = state_->encoded_model();
  const std::vector<std::uint8_t> model_bytes(model_before.begin(), model_before.end());
  EXPECT_EQ(worker.request(Method::kGet, "status?device=nobody").code, CoapCode::kNotFound);
  for (const std::string& query :
       std::vector<std::string>{"device=", "device=a%20b", "device=x&device=y", "since=3",
                                "device=" + std::string(65, 'a')}) {
    const CoapResponse r = worker.request(Method::kGet, "status?" + query);
    EXPECT_EQ(r.code, CoapCode::kBadRequest) << query << ": " << text_of(r);
  }
  EXPECT_EQ(state_->version(), 1u);
  const auto model_after = state_->encoded_model();
  EXPECT_EQ(std::vector<std::uint8_t>(model_after.begin(), model_after.end()), model_bytes);
  const auto status = nlohmann::json::parse(text_of(worker.request(Method::kGet, "status")));
  EXPECT_EQ(status["updates_applied_since_start"], 1);
  EXPECT_EQ(status["updates_refused"], 0);
  EXPECT_EQ(status["devices"]["device-1"]["updates_accepted"], 1);
}

TEST_F(ServerOverDtls, MetricsTextHasTheCountersAndEscapedDeviceLabels) {
  auto worker = device1();
  ASSERT_EQ(worker.request(Method::kPost, "update", encode(update(1, 0))).code, CoapCode::kChanged);
  ASSERT_EQ(worker.request(Method::kPost, "update", bytes_of("junk")).code, CoapCode::kBadRequest);
  resources_->report_accuracy(1, 0.25);
  const std::string text = resources_->metrics_text();
  for (const std::string line :
       {"edgetrain_model_version 1", "edgetrain_updates_applied_total 1",
        "edgetrain_updates_refused_total{reason=\"malformed\"} 1",
        "edgetrain_last_test_accuracy 0.25", "edgetrain_workers 1",
        "edgetrain_device_updates_accepted_total{device=\"device-1\"} 1",
        "edgetrain_device_updates_refused_total{device=\"device-1\",reason=\"malformed\"} 1",
        "# TYPE edgetrain_updates_applied_total counter"})
    EXPECT_NE(text.find(line + "\n"), std::string::npos) << line << "\n" << text;
}

}  // namespace
