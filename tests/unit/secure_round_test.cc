// Secure aggregation's CoAP side on the server (server/secure_round.h) without a network: three
// devices run the protocol core's SecAggDevice against SecureRound's handlers under a fake
// clock. The sum comes back as the dequantized sum of every input that arrived, also when a
// device leaves after its input; every wrong message gets its code (4.00 malformed, 4.09 wrong
// session or step, 4.13 too large, 4.22 refused by the protocol, 5.03 not yet) and changes
// nothing; a step short of devices at its deadline abandons the attempt, and the attempt
// number survives a restart (secagg_attempt.json); a restart mid-step goes on with the session
// secagg.wal holds, and one whose log does not replay begins the next attempt.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <random>

#include "privacy/quantize.h"
#include "privacy/secagg_messages.h"
#include "server/secure_round.h"

namespace {

using namespace edgetrain;
using server::SecureRound;
using transport::CoapCode;
using transport::CoapRequest;
using transport::Method;

constexpr std::uint32_t kLength = 50;
constexpr double kClip = 1.0;

struct Fixture {
  Fixture() {
    dir = std::filesystem::temp_directory_path() /
          ("secure_round_test_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir);
  }
  ~Fixture() { std::filesystem::remove_all(dir); }
  std::unique_ptr<SecureRound> make() {
    server::SecureRoundOptions o;
    o.threshold_fraction = 0.6;
    o.step_seconds = 5;
    o.clip_norm = kClip;
    o.min_devices = 3;
    o.now = [this] { return now; };
    return std::make_unique<SecureRound>(o, dir / "secagg_attempt.json");
  }
  std::filesystem::path dir;
  std::chrono::steady_clock::time_point now = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
};

transport::CoapResponse call(SecureRound& round, Method method, const std::string& resource,
                             const std::string& identity, const std::vector<std::uint8_t>& body = {},
                             std::string query = {}) {
  CoapRequest r;
  r.method = method;
  r.identity = identity;
  r.payload = body;
  r.query = std::move(query);
  return round.handle(method, resource, identity, r, /*selected=*/true);
}

std::string session_query(const SecureRound& round) { return "session=" + std::to_string(round.session()); }

std::vector<float> delta_of(int device) {
  std::vector<float> d(kLength);
  for (std::uint32_t i = 0; i < kLength; ++i) d[i] = 0.01f * static_cast<float>((device + 1) * (static_cast<int>(i % 7) - 3));
  return d;
}

TEST(SecureRound, ClosesWithTheSumOfEveryInputWhenADeviceLeavesAfterItsInput) {
  Fixture f;
  auto round = f.make();
  round->begin(7, kLength);
  privacy::SecureRandom random;
  const std::vector<std::string> names = {"a", "b", "c"};
  std::vector<std::unique_ptr<privacy::SecAggDevice>> devices;
  for (const auto& name : names)
    devices.push_back(std::make_unique<privacy::SecAggDevice>(name, round->session(), random));

  // Keys: before the step closes its answer is 5.03; a key for another identity is 4.22; a
  // message of another session 4.09; garbage 4.00; something too large 4.13.
  EXPECT_EQ(call(*round, Method::kGet, "keys", "a", {}, session_query(*round)).code, server::kCoapNotYet);
  auto wrong = devices[1]->advertise_keys();
  EXPECT_EQ(call(*round, Method::kPost, "keys", "a", privacy::serialize(wrong)).code, CoapCode::kUnprocessableEntity);
  privacy::SecAggDevice other_session("a", round->session() + 1, random);
  EXPECT_EQ(call(*round, Method::kPost, "keys", "a", privacy::serialize(other_session.advertise_keys())).code,
            CoapCode::kConflict);
  EXPECT_EQ(call(*round, Method::kPost, "keys", "a", {1, 2, 3}).code, CoapCode::kBadRequest);
  EXPECT_EQ(call(*round, Method::kPost, "keys", "a", std::vector<std::uint8_t>(4096, 1)).code,
            CoapCode::kRequestEntityTooLarge);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto body = privacy::serialize(devices[i]->advertise_keys());
    EXPECT_EQ(call(*round, Method::kPost, "keys", names[i], body).code, CoapCode::kChanged);
    EXPECT_EQ(call(*round, Method::kPost, "keys", names[i], body).code, CoapCode::kChanged);  // a retransmission
  }
  EXPECT_FALSE(round->poll(3));
  EXPECT_EQ(round->step(), SecureRound::Step::kShares);
  EXPECT_EQ(round->threshold(), 2u);  // max(⌊3/2⌋ + 1, ⌈0.6 · 3⌉)
  EXPECT_EQ(call(*round, Method::kGet, "keys", "a", {}, "session=999").code, CoapCode::kConflict);
  EXPECT_EQ(call(*round, Method::kPost, "keys", "a", privacy::serialize(devices[0]->advertise_keys())).code,
            CoapCode::kChanged);  // a's keys again after the step closed: taken then, 2.04
  privacy::SecAggDevice latecomer("d", round->session(), random);
  EXPECT_EQ(call(*round, Method::kPost, "keys", "d", privacy::serialize(latecomer.advertise_keys())).code,
            CoapCode::kConflict);  // the keys step closed without d: wrong step

  // Shares.
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto got = call(*round, Method::kGet, "keys", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    const auto shares = devices[i]->share_keys(privacy::parse_key_directory(got.payload));
    EXPECT_EQ(call(*round, Method::kPost, "shares", names[i], privacy::serialize(shares)).code, CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(3));
  ASSERT_EQ(round->step(), SecureRound::Step::kMaskedInput);

  // Masked inputs: all three arrive; then c leaves.
  std::vector<std::uint32_t> plain_sum(kLength, 0);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto got = call(*round, Method::kGet, "shares", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    const auto quantized = privacy::quantize(delta_of(static_cast<int>(i)), kClip, 3, privacy::Rounding::kNearest);
    for (std::uint32_t k = 0; k < kLength; ++k) plain_sum[k] += quantized[k];
    const auto masked = devices[i]->masked_input(privacy::parse_encrypted_shares(got.payload), quantized);
    EXPECT_EQ(call(*round, Method::kPost, "input", names[i], privacy::serialize(masked)).code, CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(3));
  ASSERT_EQ(round->step(), SecureRound::Step::kUnmasking);

  // a answers; with t = 2 the step waits for b (c has gone).
  for (std::size_t i = 0; i < 2; ++i) {
    const auto got = call(*round, Method::kGet, "survivors", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    const auto shares = devices[i]->unmasking_shares(privacy::parse_survivor_list(got.payload));
    EXPECT_EQ(call(*round, Method::kPost, "unmask", names[i], privacy::serialize(shares)).code, CoapCode::kChanged);
    if (i == 0) EXPECT_FALSE(round->poll(3));
  }
  const auto sum = round->poll(3);
  ASSERT_TRUE(sum);
  EXPECT_EQ(sum->survivors, 3u);
  EXPECT_EQ(sum->unmasking_senders, 2u);
  const std::vector<double> expected = privacy::dequantize(plain_sum, kClip, 3);
  ASSERT_EQ(sum->values.size(), expected.size());
  for (std::uint32_t k = 0; k < kLength; ++k) {
    EXPECT_EQ(sum->values[k], expected[k]) << k;
    EXPECT_NEAR(sum->values[k], delta_of(0)[k] + delta_of(1)[k] + delta_of(2)[k], 1e-6) << k;
  }
}

TEST(SecureRound, AStepShortOfDevicesAtItsDeadlineBeginsTheNextAttemptAndARestartDoesToo) {
  Fixture f;
  auto round = f.make();
  round->begin(3, kLength);
  const std::uint64_t first = round->session();
  privacy::SecureRandom random;
  for (const std::string name : {"a", "b", "c"}) {
    privacy::SecAggDevice device(name, round->session(), random);
    EXPECT_EQ(call(*round, Method::kPost, "keys", name, privacy::serialize(device.advertise_keys())).code,
              CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(3));
  ASSERT_EQ(round->step(), SecureRound::Step::kShares);
  f.now += std::chrono::seconds(6);  // nobody shared: fewer than t at the deadline
  EXPECT_FALSE(round->poll(3));
  EXPECT_EQ(round->step(), SecureRound::Step::kKeys);
  EXPECT_NE(round->session(), first);
  const std::uint64_t second = round->session();
  // A restart (the object gone, as in a SIGKILL) begins yet another attempt of round 3.
  round = f.make();
  round->begin(3, kLength);
  EXPECT_NE(round->session(), first);
  EXPECT_NE(round->session(), second);
  EXPECT_EQ(round->session() & 0xffff, 2u);
  // A new round starts from attempt 0.
  round->begin(4, kLength);
  EXPECT_EQ(round->session(), std::uint64_t{4} << 16);
}

TEST(SecureRound, ARestartMidInputGoesOnWithTheSessionSecaggWalHolds) {
  Fixture f;
  auto round = f.make();
  round->begin(2, kLength);
  const std::uint64_t session = round->session();
  privacy::SecureRandom random;
  const std::vector<std::string> names = {"a", "b", "c"};
  std::vector<std::unique_ptr<privacy::SecAggDevice>> devices;
  for (const auto& name : names) {
    devices.push_back(std::make_unique<privacy::SecAggDevice>(name, session, random));
    ASSERT_EQ(call(*round, Method::kPost, "keys", name, privacy::serialize(devices.back()->advertise_keys())).code,
              CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(3));
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto got = call(*round, Method::kGet, "keys", names[i], {}, session_query(*round));
    const auto shares = devices[i]->share_keys(privacy::parse_key_directory(got.payload));
    ASSERT_EQ(call(*round, Method::kPost, "shares", names[i], privacy::serialize(shares)).code, CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(3));
  std::vector<std::uint32_t> plain_sum(kLength, 0);
  std::vector<privacy::MaskedInput> inputs;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto got = call(*round, Method::kGet, "shares", names[i], {}, session_query(*round));
    const auto quantized = privacy::quantize(delta_of(static_cast<int>(i)), kClip, 3, privacy::Rounding::kNearest);
    for (std::uint32_t k = 0; k < kLength; ++k) plain_sum[k] += quantized[k];
    inputs.push_back(devices[i]->masked_input(privacy::parse_encrypted_shares(got.payload), quantized));
  }
  ASSERT_EQ(call(*round, Method::kPost, "input", "a", privacy::serialize(inputs[0])).code, CoapCode::kChanged);
  ASSERT_EQ(call(*round, Method::kPost, "input", "b", privacy::serialize(inputs[1])).code, CoapCode::kChanged);
  EXPECT_FALSE(round->poll(3));

  round = f.make();  // a SIGKILL: only the files remain
  round->resume_or_begin(2, kLength);
  EXPECT_EQ(round->session(), session);
  ASSERT_EQ(round->step(), SecureRound::Step::kMaskedInput);
  // b's input again (its 2.04 lost in the crash): taken once.
  EXPECT_EQ(call(*round, Method::kPost, "input", "b", privacy::serialize(inputs[1])).code, CoapCode::kChanged);
  EXPECT_FALSE(round->poll(3));
  EXPECT_EQ(call(*round, Method::kPost, "input", "c", privacy::serialize(inputs[2])).code, CoapCode::kChanged);
  EXPECT_FALSE(round->poll(3));
  ASSERT_EQ(round->step(), SecureRound::Step::kUnmasking);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto got = call(*round, Method::kGet, "survivors", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    const auto shares = devices[i]->unmasking_shares(privacy::parse_survivor_list(got.payload));
    EXPECT_EQ(call(*round, Method::kPost, "unmask", names[i], privacy::serialize(shares)).code, CoapCode::kChanged);
  }
  const auto sum = round->poll(3);
  ASSERT_TRUE(sum);
  EXPECT_EQ(sum->survivors, 3u);
  EXPECT_EQ(sum->values, privacy::dequantize(plain_sum, kClip, 3));

  // A log that does not replay (here: cut inside its first record) begins the next attempt.
  round = f.make();
  round->begin(5, kLength);
  privacy::SecAggDevice late("a", round->session(), random);
  ASSERT_EQ(call(*round, Method::kPost, "keys", "a", privacy::serialize(late.advertise_keys())).code, CoapCode::kChanged);
  const std::uint64_t before = round->session();
  std::filesystem::resize_file(f.dir / "secagg.wal", 40);
  round = f.make();
  round->resume_or_begin(5, kLength);
  EXPECT_EQ(round->session(), before + 1);
  EXPECT_EQ(round->step(), SecureRound::Step::kKeys);
}

TEST(SecureRound, ARoundThatCannotBeginDurablyRefusesEverythingUntilItCan) {
  Fixture f;
  auto round = f.make();
  round->begin(1, kLength);
  std::filesystem::remove(f.dir / "secagg.wal");
  std::filesystem::create_directories(f.dir / "secagg.wal" / "in-the-way");  // not replaceable
  round->begin_next_round(2, kLength);
  privacy::SecureRandom random;
  privacy::SecAggDevice device("a", std::uint64_t{2} << 16, random);
  EXPECT_EQ(call(*round, Method::kPost, "keys", "a", privacy::serialize(device.advertise_keys())).code,
            CoapCode::kInternalServerError);
  EXPECT_FALSE(round->poll(3));
  std::filesystem::remove_all(f.dir / "secagg.wal");
  EXPECT_FALSE(round->poll(3));  // begins now (each failed try took an attempt number: ours)
  EXPECT_EQ(round->session() >> 16, 2u);
  privacy::SecAggDevice again("a", round->session(), random);
  EXPECT_EQ(call(*round, Method::kPost, "keys", "a", privacy::serialize(again.advertise_keys())).code,
            CoapCode::kChanged);
}

TEST(SecureRound, RefusesAMinorityThresholdAndNoClipNorm) {
  Fixture f;
  server::SecureRoundOptions o;
  o.clip_norm = 1;
  o.threshold_fraction = 0.5;
  EXPECT_THROW(SecureRound(o, f.dir / "a.json"), std::invalid_argument);
  o.threshold_fraction = 0.6;
  o.clip_norm = 0;
  EXPECT_THROW(SecureRound(o, f.dir / "a.json"), std::invalid_argument);
}

}  // namespace
