// Federated rounds on the server (server/round_coordinator.h) without a network: the round
// closes when every selected device answered or at the deadline; deltas of a closed round,
// of the wrong round or model and malformed ones get a clear code and change nothing; an
// acknowledged delta survives a restart and the close replays bit for bit; the round log is
// of the WAL's format and its damage is handled as the WAL's.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>

#include "privacy/distributed_noise.h"
#include "privacy/quantize.h"
#include "privacy/secagg_messages.h"
#include "privacy/skellam.h"
#include "server/round_coordinator.h"
#include "server/wal_repair.h"
#include "server/write_ahead_log.h"
#include "tests/support/served_resources.h"

namespace {

using namespace edgetrain;
using edgetrain::testing::random_sparse_update;
using edgetrain::testing::TempDir;
using server::RoundCoordinator;
using server::RoundOptions;
using server::ServerState;
using server::ServerStateOptions;
using transport::CoapCode;

runtime::Model small_model() {
  return edgetrain::testing::initialized_model("input 4x4x1; fc 8 relu; fc 3", "tiny", 5);
}

struct Clock {
  std::chrono::steady_clock::time_point now =
      std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
};

struct Server {
  Server(const TempDir& dir, Clock& clock, RoundOptions round_options = {},
         ServerStateOptions options = {}) {
    options.state_dir = dir.path();
    options.store.learning_rate = 0.05f;
    options.now = [&clock] { return clock.now; };
    state = std::make_unique<ServerState>(small_model(), options);
    round_options.store_learning_rate = 0.05f;
    round_options.now = [&clock] { return clock.now; };
    rounds = std::make_unique<RoundCoordinator>(*state, round_options);
  }
  std::unique_ptr<ServerState> state;
  std::unique_ptr<RoundCoordinator> rounds;
};

transport::CoapRequest request(const std::string& identity, std::span<const std::uint8_t> body = {},
                               std::string query = "examples=10") {
  transport::CoapRequest r;
  r.method = body.empty() ? transport::Method::kGet : transport::Method::kPost;
  r.authentication = transport::PeerAuthentication::kPsk;
  r.identity = identity;
  r.payload = body;
  r.query = std::move(query);
  return r;
}

nlohmann::json round_info(RoundCoordinator& rounds, const std::string& identity) {
  const auto answer = rounds.get_round(request(identity));
  EXPECT_EQ(answer.code, CoapCode::kContent);
  return nlohmann::json::parse(std::string(answer.payload.begin(), answer.payload.end()));
}

std::string text(const transport::CoapResponse& response) {
  return {response.payload.begin(), response.payload.end()};
}

// A delta of `count` standard normal draws scaled to L2 norm `norm`.
std::vector<float> delta_with_norm(std::mt19937& rng, std::size_t count, double norm) {
  std::vector<float> delta(count);
  std::normal_distribution<float> normal(0, 1);
  double squares = 0;
  for (float& v : delta) {
    v = normal(rng);
    squares += static_cast<double>(v) * v;
  }
  for (float& v : delta) v = static_cast<float>(v * norm / std::sqrt(squares));
  return delta;
}

// Devices `names` of a secure round's session, each step sent to the server's secure-
// aggregation handler as a RoundWorker would; every answer is asserted (wrap the steps in
// ASSERT_NO_FATAL_FAILURE).
struct SecureDevices {
  SecureDevices(Server& server, std::uint64_t session, std::vector<std::string> names)
      : server(server), session(session), names(std::move(names)) {
    for (const auto& name : this->names)
      devices.push_back(std::make_unique<privacy::SecAggDevice>(name, session, random));
  }
  transport::CoapResponse call(transport::Method method, const std::string& step,
                               const std::string& name, const std::vector<std::uint8_t>& body = {}) {
    auto r = request(name, body,
                     method == transport::Method::kGet ? "session=" + std::to_string(session) : "");
    r.method = method;
    return server.rounds->secagg_request(method, step, r);
  }
  void post_keys(std::size_t i) {
    ASSERT_EQ(call(transport::Method::kPost, "keys", names[i],
                   privacy::serialize(devices[i]->advertise_keys()))
                  .code,
              CoapCode::kChanged);
  }
  void share(std::size_t i) {
    const auto directory = call(transport::Method::kGet, "keys", names[i]);
    ASSERT_EQ(directory.code, CoapCode::kContent);
    ASSERT_EQ(call(transport::Method::kPost, "shares", names[i],
                   privacy::serialize(
                       devices[i]->share_keys(privacy::parse_key_directory(directory.payload))))
                  .code,
              CoapCode::kChanged);
  }
  void input(std::size_t i, const std::vector<std::uint32_t>& quantized) {
    const auto shares = call(transport::Method::kGet, "shares", names[i]);
    ASSERT_EQ(shares.code, CoapCode::kContent);
    ASSERT_EQ(call(transport::Method::kPost, "input", names[i],
                   privacy::serialize(devices[i]->masked_input(
                       privacy::parse_encrypted_shares(shares.payload), quantized)))
                  .code,
              CoapCode::kChanged);
  }
  void unmask(std::size_t i) {
    const auto survivors = call(transport::Method::kGet, "survivors", names[i]);
    ASSERT_EQ(survivors.code, CoapCode::kContent);
    ASSERT_EQ(call(transport::Method::kPost, "unmask", names[i],
                   privacy::serialize(devices[i]->unmasking_shares(
                       privacy::parse_survivor_list(survivors.payload))))
                  .code,
              CoapCode::kChanged);
  }

  Server& server;
  std::uint64_t session;
  std::vector<std::string> names;
  privacy::SecureRandom random;
  std::vector<std::unique_ptr<privacy::SecAggDevice>> devices;
};

RoundOptions two_devices() {
  RoundOptions options;
  options.min_clients = 2;
  options.deadline_seconds = 30;
  return options;
}

TEST(RoundCoordinator, AnnouncesLocalStepsOrEpochs) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  RoundOptions options;
  options.local_steps = 7;
  {
    Server server(dir, clock, options);
    const auto info = round_info(*server.rounds, "a");
    EXPECT_EQ(info["local_steps"], 7);
    EXPECT_EQ(info["local_epochs"], 0);
  }
  TempDir other("edgetrain-rounds");
  options.local_epochs = 2;
  Server server(other, clock, options);
  EXPECT_EQ(round_info(*server.rounds, "a")["local_epochs"], 2);
}

TEST(RoundCoordinator, ClosesWhenEverySelectedDeviceAnsweredWithTheWeightedMean) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  Server server(dir, clock, two_devices());
  const std::vector<float> before = server.state->snapshot().parameters;
  EXPECT_EQ(round_info(*server.rounds, "a")["round"], 0);
  EXPECT_EQ(round_info(*server.rounds, "b")["selected"], true);
  std::mt19937 rng(3);
  const auto delta_a = random_sparse_update(rng, server.state->model(), 1, 0);
  const auto delta_b = random_sparse_update(rng, server.state->model(), 1, 0);
  ASSERT_EQ(server.rounds->post_round_update(request("a", delta_a, "examples=10")).code,
            CoapCode::kChanged);
  EXPECT_EQ(server.rounds->round(), 0u);                          // b has not answered yet
  EXPECT_EQ(round_info(*server.rounds, "a")["selected"], false);  // a is done for this round
  ASSERT_EQ(server.rounds->post_round_update(request("b", delta_b, "examples=30")).code,
            CoapCode::kChanged);
  EXPECT_EQ(server.rounds->round(), 1u);

  // Reference: parameters + masked mean, weights 10 and 30.
  const auto sizes = edgetrain::testing::tensor_sizes(server.state->model());
  std::vector<server::RoundDelta> deltas(2);
  deltas[0] = {10,
               transport::decode_sparse_update(delta_a, {server.state->model_id(), sizes}).value()};
  deltas[1] = {30,
               transport::decode_sparse_update(delta_b, {server.state->model_id(), sizes}).value()};
  const auto mean = server::aggregate_deltas(deltas, sizes, server::Aggregation::kMasked);
  const std::vector<float> after = server.state->snapshot().parameters;
  ASSERT_EQ(after.size(), before.size());
  for (std::size_t i = 0; i < after.size(); ++i)
    EXPECT_NEAR(after[i], before[i] + mean[i], 1e-5f) << i;
}

TEST(RoundCoordinator, RefusesBadDeltasWithAClearCodeAndAppliesNothing) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  Server server(dir, clock, two_devices());
  round_info(*server.rounds, "a");
  std::mt19937 rng(4);
  const auto good = random_sparse_update(rng, server.state->model(), 1, 0);
  const auto future = random_sparse_update(rng, server.state->model(), 1, 5);
  auto expect_refused = [&](const transport::CoapResponse& answer, int code,
                            const std::string& reason) {
    EXPECT_EQ(answer.code, code) << text(answer);
    EXPECT_NE(text(answer).find(reason), std::string::npos) << text(answer);
    EXPECT_EQ(server.rounds->deltas_received(), 0u);
    EXPECT_EQ(server.state->version(), 0u);
  };
  expect_refused(server.rounds->post_round_update(request("a", future)), CoapCode::kConflict,
                 "wrong round");
  auto wrong_model = good;
  wrong_model[8] ^= 0xff;  // the model id follows the magic and format fields
  expect_refused(server.rounds->post_round_update(request("a", wrong_model)), CoapCode::kConflict,
                 "wrong model");
  const std::vector<std::uint8_t> garbage = {1, 2, 3, 4, 5};
  expect_refused(server.rounds->post_round_update(request("a", garbage)), CoapCode::kBadRequest,
                 "malformed");
  expect_refused(server.rounds->post_round_update(request("a", good, "")), CoapCode::kBadRequest,
                 "examples");
  expect_refused(server.rounds->post_round_update(request("a", good, "examples=0")),
                 CoapCode::kBadRequest, "examples");
  expect_refused(server.rounds->post_round_update(request("", good)), CoapCode::kUnauthorized,
                 "identity");

  // A delta of a closed round (a straggler dropped at the deadline).
  ASSERT_EQ(server.rounds->post_round_update(request("a", good)).code, CoapCode::kChanged);
  round_info(*server.rounds, "b");
  clock.now += std::chrono::seconds(31);
  ASSERT_TRUE(server.rounds->poll());
  const std::vector<float> closed = server.state->snapshot().parameters;
  const auto late = random_sparse_update(rng, server.state->model(), 1, 0);
  const auto answer = server.rounds->post_round_update(request("b", late));
  EXPECT_EQ(answer.code, CoapCode::kConflict);
  EXPECT_NE(text(answer).find("round closed"), std::string::npos) << text(answer);
  EXPECT_EQ(server.state->snapshot().parameters, closed);
  const auto status = nlohmann::json::parse(server.rounds->status_json());
  EXPECT_EQ(status["round_late_deltas_refused"], 1);
  EXPECT_EQ(status["round_stragglers"], 1);
  EXPECT_EQ(status["rounds_closed"], 1);
  EXPECT_EQ(status["round_malformed_deltas"], 3);
}

TEST(RoundCoordinator, WaitAllWaitsPastTheDeadlineUntilItsSafetyLimit) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  RoundOptions options = two_devices();
  options.policy = server::RoundPolicy::kWaitAll;
  Server server(dir, clock, options);
  round_info(*server.rounds, "a");
  round_info(*server.rounds, "b");
  std::mt19937 rng(5);
  ASSERT_EQ(
      server.rounds
          ->post_round_update(request("a", random_sparse_update(rng, server.state->model(), 1, 0)))
          .code,
      CoapCode::kChanged);
  clock.now += std::chrono::seconds(31);
  EXPECT_FALSE(server.rounds->poll());
  clock.now += std::chrono::seconds(static_cast<int>(30 * server::kWaitAllSafetyFactor));
  EXPECT_TRUE(server.rounds->poll());
  EXPECT_EQ(server.rounds->round(), 1u);
}

TEST(RoundCoordinator, AnAcknowledgedDeltaSurvivesARestartAndTheCloseIsBitExact) {
  TempDir crashed("edgetrain-rounds"), uninterrupted("edgetrain-rounds");
  Clock clock;
  std::mt19937 rng(6);
  const runtime::Model model = small_model();
  std::vector<std::vector<std::uint8_t>> deltas;
  for (int r = 0; r < 2; ++r)
    for (int d = 0; d < 2; ++d)
      deltas.push_back(random_sparse_update(rng, model, 1, static_cast<std::uint64_t>(r)));
  {
    Server server(uninterrupted, clock, two_devices());
    for (int n = 0; n < 4; ++n) {
      const std::string who = n % 2 ? "b" : "a";
      round_info(*server.rounds, who);
      ASSERT_EQ(
          server.rounds
              ->post_round_update(request(who, deltas[n], "examples=" + std::to_string(7 + n)))
              .code,
          CoapCode::kChanged);
    }
    ASSERT_EQ(server.rounds->round(), 2u);
  }
  std::vector<float> expected;
  {
    Server server(uninterrupted, clock, two_devices());
    expected = server.state->snapshot().parameters;
  }
  for (int n = 0; n < 4; ++n) {
    // A crash (the objects dropped) after every acknowledged delta.
    Server server(crashed, clock, two_devices());
    EXPECT_EQ(server.rounds->deltas_received(), static_cast<std::size_t>(n % 2));
    EXPECT_EQ(server.rounds->round(), static_cast<std::uint64_t>(n / 2));
    const std::string who = n % 2 ? "b" : "a";
    round_info(*server.rounds, "a");
    round_info(*server.rounds, "b");
    ASSERT_EQ(server.rounds
                  ->post_round_update(request(who, deltas[n], "examples=" + std::to_string(7 + n)))
                  .code,
              CoapCode::kChanged);
  }
  Server server(crashed, clock, two_devices());
  EXPECT_EQ(server.rounds->round(), 2u);
  EXPECT_EQ(server.rounds->deltas_received(), 0u);
  EXPECT_EQ(server.state->snapshot().parameters, expected);
}

TEST(RoundCoordinator, ClientSamplingIsSeededAndSelectsAboutTheFraction) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  RoundOptions options;
  options.client_fraction = 0.3;
  options.seed = 9;
  Server server(dir, clock, options);
  int chosen = 0;
  for (int d = 0; d < 1000; ++d)
    chosen += server.rounds->selected("pi-" + std::to_string(d), 4) ? 1 : 0;
  EXPECT_GT(chosen, 240);
  EXPECT_LT(chosen, 360);
  EXPECT_EQ(server.rounds->selected("pi-7", 4), server.rounds->selected("pi-7", 4));
  int differs = 0;
  for (int d = 0; d < 100; ++d)
    differs += server.rounds->selected("pi-" + std::to_string(d), 4) !=
               server.rounds->selected("pi-" + std::to_string(d), 5);
  EXPECT_GT(differs, 10);  // a new draw each round
}



// rounds.wal (the WAL's format, kind kRoundDeltas) with one flipped byte in the second of
// four acknowledged deltas of the open round: the start is refused with the offset and the
// records after the damage, the file is left as it was, and repair-wal's two choices keep
// what they say.
class RoundLogDamage : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(9);
    const runtime::Model model = small_model();
    RoundOptions open_round;
    open_round.min_clients = 5;  // four deltas leave the round open
    Server server(dir, clock, open_round);
    for (const std::string who : {"a", "b", "c", "d"}) {
      round_info(*server.rounds, who);
      const auto delta = random_sparse_update(rng, model, 1, 0);
      ASSERT_EQ(server.rounds->post_round_update(request(who, delta)).code, CoapCode::kChanged);
    }
    ASSERT_EQ(server.rounds->deltas_received(), 4u);
    path = dir.path() / "rounds.wal";
    const server::WalContents contents = server::read_wal(path);
    ASSERT_EQ(contents.header.kind, server::WalKind::kRoundDeltas);
    ASSERT_EQ(contents.records.size(), 4u);
    damaged_at = contents.record_offsets[1];
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(damaged_at + 30));
    char byte = 0;
    file.seekg(static_cast<std::streamoff>(damaged_at + 30));
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    file.seekp(static_cast<std::streamoff>(damaged_at + 30));
    file.write(&byte, 1);
  }
  RoundOptions open_round() const {
    RoundOptions o;
    o.min_clients = 5;
    return o;
  }
  std::vector<char> bytes() const {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  TempDir dir{"edgetrain-rounds"};
  Clock clock;
  std::filesystem::path path;
  std::uint64_t damaged_at = 0;
};

TEST_F(RoundLogDamage, RefusesTheStartNamingTheOffsetAndChangesNothing) {
  const std::vector<char> before = bytes();
  try {
    Server server(dir, clock, open_round());
    FAIL() << "a round log damaged in the middle was accepted";
  } catch (const server::StateError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("byte " + std::to_string(damaged_at)), std::string::npos) << what;
    EXPECT_NE(what.find("2 intact records follow"), std::string::npos) << what;
    EXPECT_NE(what.find("repair-wal"), std::string::npos) << what;
  }
  EXPECT_EQ(bytes(), before);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "rounds.wal.damaged"));
}

TEST_F(RoundLogDamage, RepairSkippingTheDamageKeepsTheThreeIntactDeltas) {
  const server::WalRepairResult listed =
      server::repair_wal(path, server::WalRepairChoice::kListOnly);
  EXPECT_TRUE(listed.damaged);
  EXPECT_FALSE(listed.changed);
  const server::WalRepairResult repaired =
      server::repair_wal(path, server::WalRepairChoice::kSkipDamaged);
  ASSERT_TRUE(repaired.changed);
  EXPECT_TRUE(std::filesystem::exists(repaired.kept_original));
  Server server(dir, clock, open_round());
  EXPECT_EQ(server.rounds->deltas_received(), 3u);
  EXPECT_EQ(server.rounds->round(), 0u);
}

TEST_F(RoundLogDamage, RepairCuttingAtTheDamageKeepsTheDeltaBeforeIt) {
  ASSERT_TRUE(server::repair_wal(path, server::WalRepairChoice::kCutAtDamage).changed);
  Server server(dir, clock, open_round());
  EXPECT_EQ(server.rounds->deltas_received(), 1u);
}

TEST_F(RoundLogDamage, ATornLastRecordIsCutAndTheRestReloaded) {
  // Undo the flip by repairing nothing: a fresh log with a torn tail instead.
  ASSERT_TRUE(server::repair_wal(path, server::WalRepairChoice::kSkipDamaged).changed);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  Server server(dir, clock, open_round());
  EXPECT_EQ(server.rounds->deltas_received(), 2u);
}

// A rounds.log of the release before rounds.wal: its open round's deltas move over.
TEST(RoundCoordinator, AnEarlierReleasesRoundLogIsMovedOntoTheWalFormat) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  std::mt19937 rng(4);
  const runtime::Model model = small_model();
  std::uint64_t model_id = 0;
  {
    Server server(dir, clock);
    model_id = server.state->model_id();
  }
  std::filesystem::remove(dir.path() / "rounds.wal");
  std::vector<std::uint8_t> legacy = {'E', 'T', 'R', 'L'};
  auto put = [&legacy](std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) legacy.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
  };
  put(model_id, 8);
  for (const std::string who : {"a", "b"}) {
    const auto delta = random_sparse_update(rng, model, 1, 0);
    std::vector<std::uint8_t> body;
    std::swap(body, legacy);
    put(0, 8);   // round
    put(12, 8);  // examples
    put(who.size(), 2);
    legacy.insert(legacy.end(), who.begin(), who.end());
    legacy.insert(legacy.end(), delta.begin(), delta.end());
    std::swap(body, legacy);
    put(body.size(), 4);
    put(crc32(crc32(0L, Z_NULL, 0), body.data(), static_cast<uInt>(body.size())), 4);
    legacy.insert(legacy.end(), body.begin(), body.end());
  }
  {
    std::ofstream out(dir.path() / "rounds.log", std::ios::binary);
    out.write(reinterpret_cast<const char*>(legacy.data()),
              static_cast<std::streamsize>(legacy.size()));
  }
  RoundOptions options;
  options.min_clients = 3;
  Server server(dir, clock, options);
  EXPECT_EQ(server.rounds->deltas_received(), 2u);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "rounds.log"));
  EXPECT_EQ(server::read_wal(dir.path() / "rounds.wal").records.size(), 2u);
}

// A delta whose every entry is `value`, for round `round`.
std::vector<std::uint8_t> uniform_delta(const runtime::Model& model, float value,
                                        std::uint64_t round) {
  transport::SparseUpdate update;
  update.model_id = model.layout_id();
  update.sequence = 1;
  update.fetched_version = round;
  const std::vector<std::uint32_t> sizes = model.tensor_sizes();
  for (std::uint32_t t = 0; t < sizes.size(); ++t) {
    transport::SparseTensor tensor{t, sizes[t], {}, {}};
    for (std::uint32_t i = 0; i < sizes[t]; ++i) {
      tensor.indices.push_back(i);
      tensor.values.push_back(value);
    }
    update.tensors.push_back(std::move(tensor));
  }
  return transport::encode_sparse_update(update).value();
}

bool all_finite(const std::vector<float>& values) {
  for (float v : values)
    if (!std::isfinite(v)) return false;
  return true;
}

// Issue 37: a delta of ±1e30 used to be acknowledged and then stall every close (refused
// by the bound, retried forever); one of ±3.4e38 overflowed when scaled and ended the server.
TEST(RoundHardening, HugeDeltasAreRefusedWith422AndTheRoundClosesWithTheHonestOnes) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  const runtime::Model model = small_model();
  Server server(dir, clock, two_devices());
  round_info(*server.rounds, "a");
  round_info(*server.rounds, "b");
  for (const float huge : {1e30f, -3.4e38f}) {
    const auto poisoned = uniform_delta(model, huge, 0);
    const auto answer = server.rounds->post_round_update(request("a", poisoned));
    EXPECT_EQ(answer.code, CoapCode::kUnprocessableEntity) << text(answer);
    EXPECT_NE(text(answer).find("parameter bound"), std::string::npos) << text(answer);
  }
  EXPECT_EQ(server.rounds->deltas_received(), 0u);
  EXPECT_EQ(server::read_wal(dir.path() / "rounds.wal").records.size(), 0u)
      << "a refused delta reached the log that replays";
  const auto honest = uniform_delta(model, 0.01f, 0);
  ASSERT_EQ(server.rounds->post_round_update(request("a", honest)).code, CoapCode::kChanged);
  ASSERT_EQ(server.rounds->post_round_update(request("b", honest)).code, CoapCode::kChanged);
  EXPECT_EQ(server.rounds->round(), 1u) << "the round did not close";
  EXPECT_TRUE(all_finite(server.state->snapshot().parameters));
  const auto status = nlohmann::json::parse(server.rounds->status_json());
  EXPECT_EQ(status.at("round_deltas_refused_values"), 2);
  EXPECT_EQ(server.state->device_refusals().at("a").refused.at("out of bounds"), 2u);
}

TEST(RoundHardening, ADeviceThatKeepsSendingBadDeltasIsQuarantined) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  const runtime::Model model = small_model();
  ServerStateOptions options;
  options.quarantine_after = 2;
  options.quarantine_seconds = 60;
  Server server(dir, clock, two_devices(), options);
  round_info(*server.rounds, "a");
  const auto poisoned = uniform_delta(model, 1e30f, 0);
  EXPECT_EQ(server.rounds->post_round_update(request("a", poisoned)).code,
            CoapCode::kUnprocessableEntity);
  EXPECT_EQ(server.rounds->post_round_update(request("a", poisoned)).code,
            CoapCode::kUnprocessableEntity);
  const auto honest = uniform_delta(model, 0.01f, 0);
  EXPECT_EQ(server.rounds->post_round_update(request("a", honest)).code, CoapCode::kForbidden);
  clock.now += std::chrono::seconds(61);
  EXPECT_EQ(server.rounds->post_round_update(request("a", honest)).code, CoapCode::kChanged)
      << "the quarantine ended";
}

// Deltas each within the bound whose aggregate the store still refuses (it would take a
// parameter past the bound): the round goes on without them instead of retrying forever.
TEST(RoundHardening, AnAggregateTheStoreRefusesStartsTheRoundAgainWithoutItsDeltas) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  const runtime::Model model = small_model();
  ServerStateOptions options;
  options.store.max_parameter_magnitude = 1.0f;
  RoundOptions rounds = two_devices();
  rounds.max_parameter_magnitude = 1.0f;
  Server server(dir, clock, rounds, options);
  const std::vector<float> before = server.state->snapshot().parameters;
  round_info(*server.rounds, "a");
  round_info(*server.rounds, "b");
  const auto near_bound = uniform_delta(model, 0.99f, 0);  // W + 0.99 passes 1 where W > 0.01
  ASSERT_EQ(server.rounds->post_round_update(request("a", near_bound)).code, CoapCode::kChanged);
  ASSERT_EQ(server.rounds->post_round_update(request("b", near_bound)).code, CoapCode::kChanged);
  EXPECT_EQ(server.rounds->round(), 0u);
  EXPECT_EQ(server.rounds->deltas_received(), 0u);
  EXPECT_EQ(server.state->snapshot().parameters, before);
  EXPECT_EQ(nlohmann::json::parse(server.rounds->status_json()).at("round_close_failures"), 1);
  EXPECT_EQ(server::read_wal(dir.path() / "rounds.wal").records.size(), 0u);
  const auto honest = uniform_delta(model, 0.001f, 0);
  ASSERT_EQ(server.rounds->post_round_update(request("a", honest)).code, CoapCode::kChanged);
  ASSERT_EQ(server.rounds->post_round_update(request("b", honest)).code, CoapCode::kChanged);
  EXPECT_EQ(server.rounds->round(), 1u) << "the round closed with the deltas sent again";
}

// Per-device norm clipping (issue 37): the round log keeps the clipped delta, so a restart
// with another --round-clip-norm (here none) closes the round exactly as without the crash.
TEST(RoundHardening, AClippedDeltaIsLoggedClippedAndTheCloseReplaysBitExact) {
  TempDir crashed("edgetrain-rounds"), uninterrupted("edgetrain-rounds");
  Clock clock;
  const runtime::Model model = small_model();
  RoundOptions clipping = two_devices();
  clipping.clip_norm = 1.0;
  const auto large = uniform_delta(model, 0.5f, 0);  // norm 0.5·√(parameters) > 1
  const auto small = uniform_delta(model, 0.001f, 0);
  std::vector<float> expected;
  {
    Server server(uninterrupted, clock, clipping);
    round_info(*server.rounds, "a");
    round_info(*server.rounds, "b");
    ASSERT_EQ(server.rounds->post_round_update(request("a", large)).code, CoapCode::kChanged);
    const auto status = nlohmann::json::parse(server.rounds->status_json());
    EXPECT_EQ(status.at("round_deltas_clipped"), 1);
    const auto logged = server::read_wal(uninterrupted.path() / "rounds.wal");
    ASSERT_EQ(logged.records.size(), 1u);
    const std::vector<std::uint32_t> sizes = model.tensor_sizes();
    auto decoded = transport::decode_sparse_update(logged.records[0].update,
                                                   {server.state->model_id(), sizes});
    ASSERT_TRUE(decoded.ok());
    EXPECT_NEAR(server::clip_round_delta(decoded.value(), 0), 1.0, 1e-5)
        << "the log holds the delta as clipped";
    ASSERT_EQ(server.rounds->post_round_update(request("b", small)).code, CoapCode::kChanged);
    ASSERT_EQ(server.rounds->round(), 1u);
    EXPECT_EQ(nlohmann::json::parse(server.rounds->status_json()).at("round_deltas_clipped"), 1)
        << "b's small delta is not clipped";
    expected = server.state->snapshot().parameters;
  }
  {
    Server server(crashed, clock, clipping);
    round_info(*server.rounds, "a");
    round_info(*server.rounds, "b");
    ASSERT_EQ(server.rounds->post_round_update(request("a", large)).code, CoapCode::kChanged);
  }
  Server server(crashed, clock, two_devices());  // restarted without clipping
  ASSERT_EQ(server.rounds->deltas_received(), 1u);
  round_info(*server.rounds, "b");
  ASSERT_EQ(server.rounds->post_round_update(request("b", small)).code, CoapCode::kChanged);
  ASSERT_EQ(server.rounds->round(), 1u);
  EXPECT_EQ(server.state->snapshot().parameters, expected);
}

// A robust rule on the server: the median of three deltas leaves out the one far away.
TEST(RoundHardening, TheMedianLeavesOutAnOutlyingDevice) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  const runtime::Model model = small_model();
  RoundOptions options = two_devices();
  options.min_clients = 3;
  options.rule = server::Aggregation::kMedian;
  Server server(dir, clock, options);
  const std::vector<float> before = server.state->snapshot().parameters;
  for (const char* who : {"a", "b", "c"}) round_info(*server.rounds, who);
  ASSERT_EQ(server.rounds->post_round_update(request("a", uniform_delta(model, 0.01f, 0))).code,
            CoapCode::kChanged);
  ASSERT_EQ(server.rounds->post_round_update(request("b", uniform_delta(model, 0.02f, 0))).code,
            CoapCode::kChanged);
  ASSERT_EQ(server.rounds->post_round_update(request("c", uniform_delta(model, 100.0f, 0))).code,
            CoapCode::kChanged);
  ASSERT_EQ(server.rounds->round(), 1u);
  const std::vector<float> after = server.state->snapshot().parameters;
  for (std::size_t i = 0; i < after.size(); ++i)
    ASSERT_NEAR(after[i] - before[i], 0.02f, 1e-5f) << i;  // server_lr 1 · median 0.02
  EXPECT_EQ(nlohmann::json::parse(server.rounds->status_json()).at("round_aggregation"), "median");
}

// ---- Client-level differential privacy (dp-fedavg, issue 39) ----

RoundOptions dp_options(double noise_multiplier, double target_epsilon = 0) {
  RoundOptions options = two_devices();
  options.rule = server::Aggregation::kDpFedAvg;
  options.rule.expected_devices = 2;
  options.clip_norm = 1.0;
  options.privacy.noise_multiplier = noise_multiplier;
  options.privacy.target_epsilon = target_epsilon;
  return options;
}

// The close is Σ clipped deltas / m plus N(0, (z·S/m)²) from the secure generator; the WAL
// holds it, noise included, so a restart has the same parameters; ε is the accountant's.
TEST(RoundPrivacy, TheCloseAddsNoiseOfTheStatedSizeAndTheWalKeepsIt) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  const runtime::Model model = small_model();
  const double z = 0.5;
  std::vector<float> after;
  std::vector<float> before;
  {
    Server server(dir, clock, dp_options(z));
    before = server.state->snapshot().parameters;
    round_info(*server.rounds, "a");
    round_info(*server.rounds, "b");
    const auto large = uniform_delta(model, 0.5f, 0);  // clipped to norm 1
    ASSERT_EQ(server.rounds->post_round_update(request("a", large, "examples=1")).code,
              CoapCode::kChanged);
    ASSERT_EQ(server.rounds->post_round_update(request("b", large, "examples=1000")).code,
              CoapCode::kChanged);
    ASSERT_EQ(server.rounds->round(), 1u);
    after = server.state->snapshot().parameters;
    const auto status = nlohmann::json::parse(server.rounds->status_json());
    server::DpAccountant expected(1.0, z);
    expected.add_rounds(1);
    EXPECT_NEAR(status.at("dp_epsilon").get<double>(), expected.epsilon(1e-5).epsilon, 1e-9);
    EXPECT_EQ(status.at("dp_budget_exhausted"), false);
  }
  // Each clipped entry is ±0.5·(1/‖0.5·1‖) = 1/√P: the sum of two over m = 2 is 1/√P; the
  // noise's standard deviation is z·S/m = 0.25. Weights by examples play no part.
  const double n = static_cast<double>(after.size());
  const double signal = 1.0 / std::sqrt(n);
  double sum = 0, squares = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    const double noise = (after[i] - before[i]) - signal;
    sum += noise;
    squares += noise * noise;
  }
  const double mean = sum / n, stddev = std::sqrt(squares / n - mean * mean);
  // 163 parameters: the sample's standard deviation is within 6 of its own standard errors
  // (0.25/√(2·163) ≈ 0.014) of 0.25, and far from 0.5 or 0.125 (a noise of z·S, or S/m).
  EXPECT_NEAR(stddev, 0.25, 0.085) << "over " << n << " parameters";
  EXPECT_NEAR(mean, 0.0, 6 * 0.25 / std::sqrt(n));
  Server restarted(dir, clock, dp_options(z));
  EXPECT_EQ(restarted.state->snapshot().parameters, after) << "the WAL holds the noised close";
}

TEST(RoundPrivacy, ARoundThatWouldPassTheTargetEpsilonIsNotClosedAndTheRunEnds) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  const runtime::Model model = small_model();
  server::DpAccountant one(1.0, 2.0), two(1.0, 2.0);
  one.add_rounds(1);
  two.add_rounds(2);
  const double target = (one.epsilon(1e-5).epsilon + two.epsilon(1e-5).epsilon) / 2;
  Server server(dir, clock, dp_options(2.0, target));
  const auto small = uniform_delta(model, 0.001f, 0);
  for (const char* who : {"a", "b"}) {
    round_info(*server.rounds, who);
    ASSERT_EQ(server.rounds->post_round_update(request(who, small)).code, CoapCode::kChanged);
  }
  ASSERT_EQ(server.rounds->round(), 1u) << "the first round fits the budget";
  EXPECT_FALSE(server.rounds->privacy_exhausted());
  const auto next = uniform_delta(model, 0.001f, 1);
  for (const char* who : {"a", "b"}) {
    round_info(*server.rounds, who);
    ASSERT_EQ(server.rounds->post_round_update(request(who, next)).code, CoapCode::kChanged);
  }
  EXPECT_EQ(server.rounds->round(), 1u) << "the second would pass it";
  ASSERT_TRUE(server.rounds->privacy_exhausted());
  EXPECT_NE(server.rounds->privacy_exhausted()->find("--dp-target-epsilon"), std::string::npos);
  EXPECT_EQ(round_info(*server.rounds, "a")["selected"], false);
  const auto status = nlohmann::json::parse(server.rounds->status_json());
  EXPECT_EQ(status.at("dp_budget_exhausted"), true);
  EXPECT_LE(status.at("dp_epsilon").get<double>(), target);
}

TEST(RoundPrivacy, DpFedAvgRefusesToStartWithoutClipNoiseOrDenominator) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  RoundOptions no_clip = dp_options(1.0);
  no_clip.clip_norm = 0;
  EXPECT_THROW(Server(dir, clock, no_clip), std::invalid_argument);
  RoundOptions no_noise = dp_options(0.0);
  EXPECT_THROW(Server(dir, clock, no_noise), std::invalid_argument);
  RoundOptions no_denominator = dp_options(1.0);
  no_denominator.rule.expected_devices = 0;
  EXPECT_THROW(Server(dir, clock, no_denominator), std::invalid_argument);
}

// ---- Adaptive clipping (issue 39; server/adaptive_clipping.h) ----

RoundOptions adaptive_options() {
  RoundOptions options = dp_options(0.1);  // σ_b = m/20 = 0.1 needs z < 2σ_b = 0.2
  options.privacy.adaptive = {0.5, 0.2, 0};
  return options;
}

// Both devices under S: b̃ = (2 + N(0, 0.1²))/2, so S moves by e^(−0.2·(b̃ − 0.5)), within
// [e^(−0.2·0.8), e^(−0.2·0.2)] unless the draw is past 6σ; the next round clips at it, and
// a restart goes on with it (round_clip.json).
TEST(RoundAdaptiveClipping, TheClipNormFollowsTheQuantileAndSurvivesARestart) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  const runtime::Model model = small_model();
  double after_one = 0;
  {
    Server server(dir, clock, adaptive_options());
    EXPECT_EQ(server.rounds->clip_norm(), 1.0);
    const auto small = uniform_delta(model, 0.001f, 0);  // norm ≈ 0.013, under S = 1
    for (const char* who : {"a", "b"}) {
      round_info(*server.rounds, who);
      ASSERT_EQ(server.rounds->post_round_update(request(who, small)).code, CoapCode::kChanged);
    }
    ASSERT_EQ(server.rounds->round(), 1u);
    after_one = server.rounds->clip_norm();
    EXPECT_GT(after_one, std::exp(-0.2 * 0.8));
    EXPECT_LT(after_one, std::exp(-0.2 * 0.2));
    const auto status = nlohmann::json::parse(server.rounds->status_json());
    EXPECT_EQ(status.at("round_clip_norm").get<double>(), after_one);
    EXPECT_NEAR(status.at("dp_delta_noise_multiplier").get<double>(),
                server::delta_noise_multiplier(0.1, 0.1), 1e-12);
  }
  Server restarted(dir, clock, adaptive_options());
  EXPECT_EQ(restarted.rounds->clip_norm(), after_one);
  // A delta above the new S is clipped to it.
  const auto large = uniform_delta(model, 0.5f, 1);
  round_info(*restarted.rounds, "a");
  ASSERT_EQ(restarted.rounds->post_round_update(request("a", large)).code, CoapCode::kChanged);
  const auto status = nlohmann::json::parse(restarted.rounds->status_json());
  EXPECT_EQ(status.at("round_deltas_clipped"), 1);
}

// round_clip.json is written before the close is submitted: one round ahead of the state
// means the close never landed, so the round's deltas are clipped at the previous norm.
TEST(RoundAdaptiveClipping, AClipStateOneRoundAheadMeansTheCloseDidNotLand) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  { Server fresh(dir, clock, adaptive_options()); }
  {
    std::ofstream out(dir.path() / "round_clip.json");
    out << R"({"round": 1, "clip_norm": 0.7, "previous_clip_norm": 0.9})";
  }
  {
    Server server(dir, clock, adaptive_options());
    EXPECT_EQ(server.rounds->round(), 0u);
    EXPECT_EQ(server.rounds->clip_norm(), 0.9);
  }
  {
    std::ofstream out(dir.path() / "round_clip.json");
    out << R"({"round": 0, "clip_norm": 0.7, "previous_clip_norm": 0.9})";
  }
  {
    Server server(dir, clock, adaptive_options());
    EXPECT_EQ(server.rounds->clip_norm(), 0.7);
  }
  {
    std::ofstream out(dir.path() / "round_clip.json");
    out << R"({"round": 0, "clip_norm": -1})";
  }
  EXPECT_THROW(Server(dir, clock, adaptive_options()), server::StateError);
}

TEST(RoundAdaptiveClipping, RefusedWithoutDpFedAvgOrWithTooLittleCountNoise) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  RoundOptions plain = two_devices();
  plain.clip_norm = 1;
  plain.privacy.adaptive = {0.5, 0.2, 0};
  EXPECT_THROW(Server(dir, clock, plain), std::invalid_argument);
  RoundOptions too_little = dp_options(1.0);  // σ_b = 0.1 ≤ z/2 = 0.5
  too_little.privacy.adaptive = {0.5, 0.2, 0};
  EXPECT_THROW(Server(dir, clock, too_little), std::invalid_argument);
}

// SecAgg+ (--secagg-neighbours k): GET /round announces k to the selected devices, and the
// status says it; without it neither does.
TEST(RoundSecureAggregation, GetRoundAnnouncesTheNeighbours) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  RoundOptions options;
  options.secure.enabled = true;
  options.secure.neighbours = 4;
  options.clip_norm = 1;
  options.min_clients = 3;
  Server server(dir, clock, options);
  EXPECT_EQ(round_info(*server.rounds, "a")["secagg_neighbours"], 4);
  EXPECT_EQ(nlohmann::json::parse(server.rounds->status_json())["secagg_neighbours"], 4);
  TempDir other_dir("edgetrain-rounds");
  options.secure.neighbours = 0;
  Server everyone(other_dir, clock, options);
  EXPECT_FALSE(round_info(*everyone.rounds, "a").contains("secagg_neighbours"));
}

// --secure-aggregation through the coordinator (server/secure_round.h): three devices take
// the steps with the protocol core's SecAggDevice; the close moves the model by server_lr
// times the mean of their quantized clipped deltas read back (nothing else), as one update of
// the main WAL; a plain delta is refused meanwhile. The settings it cannot go with are refused.
TEST(RoundSecureAggregation, TheCloseAppliesTheMeanOfTheMaskedDeltas) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  RoundOptions options;
  options.secure.enabled = true;
  options.clip_norm = 1;
  options.min_clients = 3;
  options.server_lr = 0.5f;
  Server server(dir, clock, options);
  const std::vector<float> before = server.state->snapshot().parameters;
  const std::vector<std::string> names = {"a", "b", "c"};
  std::vector<nlohmann::json> infos;
  for (const auto& name : names) infos.push_back(round_info(*server.rounds, name));
  ASSERT_EQ(infos[0]["secure"], true);
  EXPECT_EQ(infos[1]["secagg_identity"], "b");
  clock.now += std::chrono::hours(1);  // no key yet: the keys step's deadline has not started
  EXPECT_EQ(round_info(*server.rounds, "a")["deadline_seconds"], options.deadline_seconds);
  const auto session = infos[0]["secagg_session"].get<std::uint64_t>();
  std::mt19937 rng(7);
  const auto plain = random_sparse_update(rng, server.state->model(), 1, 0);
  EXPECT_EQ(server.rounds->post_round_update(request("a", plain, "examples=10")).code, CoapCode::kConflict);

  SecureDevices secure(server, session, names);
  for (std::size_t i = 0; i < names.size(); ++i) ASSERT_NO_FATAL_FAILURE(secure.post_keys(i));
  for (std::size_t i = 0; i < names.size(); ++i) ASSERT_NO_FATAL_FAILURE(secure.share(i));
  const std::size_t count = before.size();
  std::vector<std::uint32_t> ring_sum(count, 0);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::vector<float> delta = delta_with_norm(rng, count, 0.9);  // norm 0.9 < S
    const auto quantized = privacy::quantize(delta, 1.0, 3, privacy::Rounding::kNearest);
    for (std::size_t k = 0; k < count; ++k) ring_sum[k] += quantized[k];
    ASSERT_NO_FATAL_FAILURE(secure.input(i, quantized));
  }
  for (std::size_t i = 0; i < 2; ++i) {  // c never answers: t = 2 answers unmask
    ASSERT_NO_FATAL_FAILURE(secure.unmask(i));
  }
  ASSERT_EQ(server.rounds->round(), 1u);
  const std::vector<double> sum = privacy::dequantize(ring_sum, 1.0, 3);
  const std::vector<float> after = server.state->snapshot().parameters;
  for (std::size_t k = 0; k < count; ++k)
    EXPECT_NEAR(after[k], before[k] + 0.5 * sum[k] / 3, 1e-6 * (1 + std::fabs(before[k]))) << k;
  const auto status = nlohmann::json::parse(server.rounds->status_json());
  EXPECT_EQ(status["secagg_last_survivors"], 3);
  EXPECT_EQ(status["secagg_last_unmasking_senders"], 2);
  EXPECT_EQ(status["secagg_round"], 1);  // the next round began
}

TEST(RoundSecureAggregation, TheKeysStepWaitsForDevicesHeardFromLatelyOnly) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  RoundOptions options;
  options.secure.enabled = true;
  options.clip_norm = 1;
  options.min_clients = 2;
  options.deadline_seconds = 10;
  Server server(dir, clock, options);
  const auto session = round_info(*server.rounds, "gone")["secagg_session"].get<std::uint64_t>();
  clock.now += std::chrono::seconds(21);  // "gone" last heard two deadlines ago
  privacy::SecureRandom random;
  std::vector<std::unique_ptr<privacy::SecAggDevice>> devices;
  for (const std::string name : {"a", "b", "late"}) round_info(*server.rounds, name);
  for (const std::string name : {"a", "b"}) {  // "late": heard from, keys not sent yet
    devices.push_back(std::make_unique<privacy::SecAggDevice>(name, session, random));
    const auto keys = privacy::serialize(devices.back()->advertise_keys());  // the request's span points here
    ASSERT_EQ(server.rounds->secagg_request(transport::Method::kPost, "keys", request(name, keys, "")).code,
              CoapCode::kChanged);
  }
  EXPECT_EQ(nlohmann::json::parse(server.rounds->status_json())["secagg_step"], "keys");  // waits for "late"
  devices.push_back(std::make_unique<privacy::SecAggDevice>("late", session, random));
  const auto keys = privacy::serialize(devices.back()->advertise_keys());
  ASSERT_EQ(server.rounds->secagg_request(transport::Method::kPost, "keys", request("late", keys, "")).code,
            CoapCode::kChanged);
  const auto status = nlohmann::json::parse(server.rounds->status_json());
  EXPECT_EQ(status["secagg_step"], "shares");  // not waiting for "gone"
  EXPECT_EQ(status["secagg_keys"], 3);
}

// dp-fedavg with --secure-aggregation (privacy/distributed_noise.h): GET /round announces
// each device's share of the noise, σ_d = z·S/√c with c = --min-clients, and the ring's range
// B = S + 10·σ_d; the keys step does not close with fewer than c keys even past its deadline.
// The devices here add no noise, so the model after the close must be exactly the start plus
// Σ/m of their quantized deltas: any noise of the server's (z·S/m = 0.33 per value) would
// show. ε is counted as in central dp-fedavg, and a round whose close would pass
// --dp-target-epsilon is not begun: nobody is selected.
TEST(RoundSecureAggregation, DpFedAvgAnnouncesTheDevicesNoiseAndAddsNoneItself) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  const double z = 1.0;
  server::DpAccountant one(1.0, z), two(1.0, z);
  one.add_rounds(1);
  two.add_rounds(2);
  // A budget for one round: the second is not begun (devices would work for nothing).
  RoundOptions options = dp_options(z, (one.epsilon(1e-5).epsilon + two.epsilon(1e-5).epsilon) / 2);
  options.secure.enabled = true;
  options.min_clients = 3;
  options.rule.expected_devices = 4;  // m: the close divides the sum of 3 by 4
  Server server(dir, clock, options);
  const std::vector<float> before = server.state->snapshot().parameters;
  const std::vector<std::string> names = {"a", "b", "c"};
  std::vector<nlohmann::json> infos;
  for (const auto& name : names) infos.push_back(round_info(*server.rounds, name));
  const double stddev = z * 1.0 / std::sqrt(3.0);
  const double bound = 1.0 + privacy::kNoiseTailStddevs * stddev;
  EXPECT_DOUBLE_EQ(infos[0]["dp_device_noise_stddev"].get<double>(), stddev);
  EXPECT_EQ(infos[0]["dp_noise_survivors"], 3);
  EXPECT_DOUBLE_EQ(infos[0]["secagg_value_bound"].get<double>(), bound);
  const auto session = infos[0]["secagg_session"].get<std::uint64_t>();

  SecureDevices secure(server, session, names);
  for (std::size_t i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(secure.post_keys(i));
  clock.now += std::chrono::seconds(static_cast<int>(options.deadline_seconds) + 1);
  round_info(*server.rounds, "a");
  EXPECT_EQ(nlohmann::json::parse(server.rounds->status_json())["secagg_step"], "keys")
      << "two keys past the deadline: fewer than c = 3 survivors could not carry the noise";
  ASSERT_NO_FATAL_FAILURE(secure.post_keys(2));
  for (std::size_t i = 0; i < names.size(); ++i) ASSERT_NO_FATAL_FAILURE(secure.share(i));
  EXPECT_EQ(nlohmann::json::parse(server.rounds->status_json())["secagg_threshold"], 3) << "t ≥ c";
  const std::size_t count = before.size();
  std::vector<std::uint32_t> ring_sum(count, 0);
  std::mt19937 rng(11);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::vector<float> delta = delta_with_norm(rng, count, 0.9);
    const auto quantized = privacy::quantize_bounded(delta, bound, 3, privacy::Rounding::kNearest);
    for (std::size_t k = 0; k < count; ++k) ring_sum[k] += quantized[k];
    ASSERT_NO_FATAL_FAILURE(secure.input(i, quantized));
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    ASSERT_NO_FATAL_FAILURE(secure.unmask(i));
  }
  ASSERT_EQ(server.rounds->round(), 1u);
  const std::vector<double> sum = privacy::dequantize(ring_sum, bound, 3);
  const std::vector<float> after = server.state->snapshot().parameters;
  for (std::size_t k = 0; k < count; ++k)
    ASSERT_NEAR(after[k], before[k] + sum[k] / 4, 1e-6 * (1 + std::fabs(before[k]))) << k << ": the server added noise";
  const auto status = nlohmann::json::parse(server.rounds->status_json());
  server::DpAccountant expected(1.0, z);
  expected.add_rounds(1);
  EXPECT_NEAR(status.at("dp_epsilon").get<double>(), expected.epsilon(1e-5).epsilon, 1e-9);
  EXPECT_DOUBLE_EQ(status.at("dp_device_noise_stddev").get<double>(), stddev);
  EXPECT_EQ(status["secagg_last_survivors"], 3);
  ASSERT_TRUE(server.rounds->privacy_exhausted()) << "round 1 would pass --dp-target-epsilon";
  EXPECT_EQ(round_info(*server.rounds, "a")["selected"], false);
  EXPECT_EQ(status.at("dp_budget_exhausted"), true);
}

// --dp-noise skellam (privacy/skellam.h): GET /round announces the plan for c = --min-clients
// over the model's parameters (γ, v_d, Δ2) and no Gaussian share; /status reports it, and ε
// is the Skellam accountant's at that plan, not the Gaussian's. Without secure aggregation
// the setting is refused: the server's own noise is Gaussian.
TEST(RoundSecureAggregation, SkellamNoiseAnnouncesThePlanAndCountsItsBound) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  const double z = 1.0;
  RoundOptions options = dp_options(z, 0);
  options.secure.enabled = true;
  options.privacy.skellam = true;
  options.min_clients = 3;
  options.rule.expected_devices = 4;
  Server server(dir, clock, options);
  const std::size_t length = server.state->snapshot().parameters.size();
  const privacy::SkellamPlan plan = privacy::skellam_plan(z, options.clip_norm, 3, length);
  const nlohmann::json info = round_info(*server.rounds, "a");
  EXPECT_EQ(info["dp_noise"], "skellam");
  EXPECT_EQ(info["dp_noise_survivors"], 3);
  EXPECT_DOUBLE_EQ(info["secagg_skellam_scale"].get<double>(), plan.scale);
  EXPECT_DOUBLE_EQ(info["secagg_skellam_variance"].get<double>(), plan.device_variance);
  EXPECT_DOUBLE_EQ(info["secagg_skellam_l2_bound"].get<double>(), plan.l2_bound);
  EXPECT_FALSE(info.contains("dp_device_noise_stddev")) << "no Gaussian share besides";
  const auto status = nlohmann::json::parse(server.rounds->status_json());
  EXPECT_EQ(status["dp_noise"], "skellam");
  EXPECT_DOUBLE_EQ(status["dp_skellam_l2_sensitivity"].get<double>(), plan.l2_bound);
  EXPECT_EQ(status["dp_epsilon"], 0.0) << "nothing released yet";

  RoundOptions central = dp_options(z, 0);
  central.privacy.skellam = true;
  TempDir other("edgetrain-rounds");
  try {
    Server refused(other, clock, central);
    ADD_FAILURE() << "skellam noise without secure aggregation was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--dp-noise skellam needs"), std::string::npos) << e.what();
  }
}

// Adaptive clipping under secure aggregation (privacy/distributed_noise.h, the count): GET
// /round announces the devices' Gaussian share at z_Δ (not z) of the current clip norm, the
// count's share σ_b/√c and its range; each device's masked vector has one more value. Here the
// three devices send noiseless values and counts of 1 (not clipped): the close moves the
// model by Σ/m of the deltas alone, and the clip norm to S·exp(−η(3/m − γ)), durable in
// round_clip.json and announced for the next round with its new σ_d and B.
TEST(RoundSecureAggregation, AdaptiveClippingCountsTheMaskedBitsAndMovesTheClipNorm) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  const double z = 1.0;
  RoundOptions options = dp_options(z);
  options.secure.enabled = true;
  options.min_clients = 3;
  options.rule.expected_devices = 4;
  options.privacy.adaptive = {0.5, 0.2, 2.0};  // γ, η, σ_b
  Server server(dir, clock, options);
  const std::vector<float> before = server.state->snapshot().parameters;
  const std::vector<std::string> names = {"a", "b", "c"};
  std::vector<nlohmann::json> infos;
  for (const auto& name : names) infos.push_back(round_info(*server.rounds, name));
  const double z_delta = server::delta_noise_multiplier(z, 2.0);
  const double stddev = z_delta * 1.0 / std::sqrt(3.0);
  const double bound = 1.0 + privacy::kNoiseTailStddevs * stddev;
  const double count_stddev = 2.0 / std::sqrt(3.0);
  const double count_bound = privacy::count_value_bound(count_stddev);
  EXPECT_DOUBLE_EQ(infos[0]["dp_device_noise_stddev"].get<double>(), stddev);
  EXPECT_DOUBLE_EQ(infos[0]["secagg_value_bound"].get<double>(), bound);
  EXPECT_DOUBLE_EQ(infos[0]["dp_clip_count_device_stddev"].get<double>(), count_stddev);
  EXPECT_DOUBLE_EQ(infos[0]["secagg_count_value_bound"].get<double>(), count_bound);
  const auto session = infos[0]["secagg_session"].get<std::uint64_t>();

  SecureDevices secure(server, session, names);
  for (std::size_t i = 0; i < names.size(); ++i) ASSERT_NO_FATAL_FAILURE(secure.post_keys(i));
  for (std::size_t i = 0; i < names.size(); ++i) ASSERT_NO_FATAL_FAILURE(secure.share(i));
  const std::size_t count = before.size();
  std::vector<std::uint32_t> ring_sum(count, 0);
  std::mt19937 rng(13);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::vector<float> delta = delta_with_norm(rng, count, 0.5);
    auto quantized = privacy::quantize_bounded(delta, bound, 3, privacy::Rounding::kNearest);
    for (std::size_t k = 0; k < count; ++k) ring_sum[k] += quantized[k];
    const float one = 1.0f;  // not clipped, no noise: the server cannot tell
    quantized.push_back(privacy::quantize_bounded(std::span(&one, 1), count_bound, 3, privacy::Rounding::kNearest)[0]);
    ASSERT_NO_FATAL_FAILURE(secure.input(i, quantized));
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    ASSERT_NO_FATAL_FAILURE(secure.unmask(i));
  }
  ASSERT_EQ(server.rounds->round(), 1u);
  const std::vector<double> sum = privacy::dequantize(ring_sum, bound, 3);
  const std::vector<float> after = server.state->snapshot().parameters;
  for (std::size_t k = 0; k < count; ++k)
    ASSERT_NEAR(after[k], before[k] + sum[k] / 4, 1e-6 * (1 + std::fabs(before[k]))) << k;
  const double next = 1.0 * std::exp(-0.2 * (3.0 / 4 - 0.5));
  const auto status = nlohmann::json::parse(server.rounds->status_json());
  EXPECT_NEAR(status.at("round_clip_norm").get<double>(), next, 1e-6);
  std::ifstream saved(dir.path() / "round_clip.json");
  EXPECT_NEAR(nlohmann::json::parse(saved).at("clip_norm").get<double>(), next, 1e-6);
  const nlohmann::json next_info = round_info(*server.rounds, "a");
  EXPECT_NEAR(next_info["clip_norm"].get<double>(), next, 1e-6);
  // (The count is read back within its quantization step: next within 1e-6.)
  EXPECT_NEAR(next_info["dp_device_noise_stddev"].get<double>(), stddev * next, 1e-6);
  EXPECT_NEAR(next_info["secagg_value_bound"].get<double>(), next + privacy::kNoiseTailStddevs * stddev * next, 1e-5);
}

TEST(RoundSecureAggregation, RefusedWithRobustRulesAndWithoutAClipNorm) {
  TempDir dir("edgetrain-rounds");
  Clock clock;
  RoundOptions options;
  options.secure.enabled = true;
  EXPECT_THROW(Server(dir, clock, options), std::invalid_argument);  // no clip norm
  options.clip_norm = 1;
  for (const auto rule : {server::Aggregation::kTrimmedMean, server::Aggregation::kMedian}) {
    options.rule = {rule};
    EXPECT_THROW(Server(dir, clock, options), std::invalid_argument);
  }
  RoundOptions private_options = dp_options(1.0);
  private_options.secure.enabled = true;
  EXPECT_NO_THROW(Server(dir, clock, private_options));  // distributed noise
  private_options.privacy.adaptive = {0.5, 0.2, 1};  // the count is a value of the masked vector
  EXPECT_NO_THROW(Server(dir, clock, private_options));
  private_options.privacy.skellam = true;  // not yet: the count's value is Gaussian
  EXPECT_THROW(Server(dir, clock, private_options), std::invalid_argument);
  private_options.privacy.skellam = false;
  private_options.secure.subset_fraction = 0.1;  // not yet
  EXPECT_THROW(Server(dir, clock, private_options), std::invalid_argument);
}

}  // namespace
