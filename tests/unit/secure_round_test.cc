// Secure aggregation's CoAP side on the server (server/secure_round.h) without a network: three
// devices run the protocol core's SecAggDevice against SecureRound's handlers under a fake
// clock. The sum comes back as the dequantized sum of every input that arrived, also when a
// device leaves after its input; every wrong message gets its code (4.00 malformed, 4.09 wrong
// session or step, 4.13 too large, 4.22 refused by the protocol, 5.03 not yet) and changes
// nothing; a step short of devices at its deadline abandons the attempt, and the attempt
// number survives a restart (secagg_attempt.json); a restart mid-step goes on with the session
// secagg.wal holds, and one whose log does not replay begins the next attempt. With a subset
// (--secagg-subset, privacy/subset.h) the devices mask the announced entries only and the sum
// is theirs, scattered to the whole vector, also after a restart; a masked input of the
// vector's length is then malformed (4.00) (the generator itself: secagg_protocol_test). Three real
// RoundWorkers (worker/round_worker.h, in threads) take two subset rounds against a
// SecureRound: each sum is the sum of the entries they quantized, and each keeps the rest.
// With dp-fedavg's distributed noise announced (privacy/distributed_noise.h), three real
// RoundWorkers each add their share before quantizing in the announced range: each device's
// quantized values differ from its clipped delta by noise of the announced variance, and the
// sum by the sum of the three shares. With signed keys (--secagg-signed-keys,
// privacy/secagg_signed.h), three SignedSecAggDevices take a round through the consistency
// step: unsigned keys, keys signed by another device's certificate and a signature over
// another list are refused (4.22), and a SIGKILL in the consistency step resumes it from
// secagg.wal with the signatures taken; the sum is the plain one.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "privacy/distributed_noise.h"
#include "privacy/quantize.h"
#include "privacy/secagg_messages.h"
#include "privacy/secagg_signed.h"
#include "privacy/skellam.h"
#include "privacy/subset.h"
#include "server/secure_round.h"
#include "tests/support/in_memory_pki.h"
#include "model/model.h"
#include "transport/codec.h"
#include "worker/round_worker.h"
#include "worker/server_channel.h"

namespace {

using namespace edgetrain;
using server::SecureRound;
using transport::CoapCode;
using transport::CoapRequest;
using transport::CoapResponse;
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
  std::unique_ptr<SecureRound> make(double subset_fraction = 0,
                                    std::shared_ptr<const privacy::CertificateAuthority> signing_ca = nullptr,
                                    std::uint32_t neighbours = 0) {
    server::SecureRoundOptions o;
    o.signing_ca = std::move(signing_ca);
    o.subset_fraction = subset_fraction;
    o.neighbours = neighbours;
    o.model_id = 0x5eed;
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
    if (i == 0) {
      EXPECT_FALSE(round->poll(3));
    }
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

// SecAgg+ (--secagg-neighbours 4) over the resources: 12 devices, each GETs a directory of
// itself and its 4 neighbours and a survivor list of its neighbourhood; one device leaves
// before its input, one after it; the server is killed in the input step and goes on with the
// same graph (its seed is in the keys close record); the sum is exact.
TEST(SecureRound, WithNeighboursEachDeviceGetsItsNeighbourhoodAndTheSumIsExactAcrossARestart) {
  Fixture f;
  auto round = f.make(0, nullptr, 4);
  round->begin(9, kLength);
  const std::uint64_t session = round->session();
  privacy::SecureRandom random;
  constexpr int kDevices = 12;
  std::vector<std::string> names;
  std::vector<std::unique_ptr<privacy::SecAggDevice>> devices;
  for (int i = 0; i < kDevices; ++i) {
    names.push_back("dev" + std::to_string(10 + i));  // byte order = index order
    devices.push_back(std::make_unique<privacy::SecAggDevice>(names.back(), session, random));
    ASSERT_EQ(call(*round, Method::kPost, "keys", names[i], privacy::serialize(devices[i]->advertise_keys())).code,
              CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(kDevices));
  ASSERT_EQ(round->step(), SecureRound::Step::kShares);
  EXPECT_EQ(round->threshold(), 3u);  // max(⌊5/2⌋ + 1, ⌈0.6 · 5⌉): the 5 holders of a neighbourhood
  EXPECT_EQ(nlohmann::json::parse(round->status_json())["secagg_neighbours"], 4);
  std::vector<std::vector<std::string>> neighbourhood(kDevices);
  for (int i = 0; i < kDevices; ++i) {
    const auto got = call(*round, Method::kGet, "keys", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    const privacy::KeyDirectory directory = privacy::parse_key_directory(got.payload);
    EXPECT_EQ(directory.devices.size(), 5u) << names[i];
    EXPECT_EQ(directory.key_holder_count(), 12u);
    EXPECT_EQ(directory.config.neighbours, 4u);
    for (const auto& entry : directory.devices) neighbourhood[i].push_back(entry.identity);
    const auto shares = devices[i]->share_keys(directory);
    EXPECT_EQ(shares.shares.size(), 4u);
    ASSERT_EQ(call(*round, Method::kPost, "shares", names[i], privacy::serialize(shares)).code, CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(kDevices));
  ASSERT_EQ(round->step(), SecureRound::Step::kMaskedInput);
  const int before_input = 3, after_input = 8;
  std::vector<std::uint32_t> plain_sum(kLength, 0);
  std::vector<privacy::MaskedInput> inputs(kDevices);
  for (int i = 0; i < kDevices; ++i) {
    if (i == before_input) continue;
    const auto got = call(*round, Method::kGet, "shares", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    const auto quantized = privacy::quantize(delta_of(i % 3), kClip, kDevices, privacy::Rounding::kNearest);  // within the clip
    for (std::uint32_t k = 0; k < kLength; ++k) plain_sum[k] += quantized[k];
    inputs[i] = devices[i]->masked_input(privacy::parse_encrypted_shares(got.payload), quantized);
    if (i < 6) {
      ASSERT_EQ(call(*round, Method::kPost, "input", names[i], privacy::serialize(inputs[i])).code, CoapCode::kChanged);
    }
  }
  EXPECT_FALSE(round->poll(kDevices));

  round = f.make(0, nullptr, 4);  // a SIGKILL mid-input: the graph must come back from the log
  round->resume_or_begin(9, kLength);
  EXPECT_EQ(round->session(), session);
  ASSERT_EQ(round->step(), SecureRound::Step::kMaskedInput);
  for (int i = 6; i < kDevices; ++i) {
    ASSERT_EQ(call(*round, Method::kPost, "input", names[i], privacy::serialize(inputs[i])).code, CoapCode::kChanged);
  }
  f.now += std::chrono::seconds(6);  // device 3 never sends: the step closes at its deadline
  EXPECT_FALSE(round->poll(kDevices));
  ASSERT_EQ(round->step(), SecureRound::Step::kUnmasking);
  for (int i = 0; i < kDevices; ++i) {
    if (i == before_input || i == after_input) continue;
    const auto got = call(*round, Method::kGet, "survivors", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    const privacy::SurvivorList survivors = privacy::parse_survivor_list(got.payload);
    for (const std::string& survivor : survivors.survivors) {  // its neighbourhood only
      EXPECT_NE(std::find(neighbourhood[i].begin(), neighbourhood[i].end(), survivor), neighbourhood[i].end());
    }
    const auto shares = devices[i]->unmasking_shares(survivors);
    EXPECT_EQ(call(*round, Method::kPost, "unmask", names[i], privacy::serialize(shares)).code, CoapCode::kChanged);
  }
  const auto sum = round->poll(kDevices);
  ASSERT_TRUE(sum);
  EXPECT_EQ(sum->survivors, 11u);
  EXPECT_EQ(sum->key_holders, 12u);
  EXPECT_EQ(sum->values, privacy::dequantize(plain_sum, kClip, kDevices));
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

TEST(SecureRoundSigned, SignedKeysAndTheConsistencyStepSurviveARestart) {
  Fixture f;
  privacy::test_pki::Pki& pki = privacy::test_pki::fleet();
  auto round = f.make(0, pki.ca);
  round->begin(3, kLength);
  const std::uint64_t session = round->session();
  privacy::SecureRandom random;
  const std::vector<std::string> names = {"a", "b", "c"};
  std::vector<std::unique_ptr<privacy::SignedSecAggDevice>> devices;
  for (const auto& name : names)
    devices.push_back(std::make_unique<privacy::SignedSecAggDevice>(name, session, random, pki.issue(name), pki.ca));

  // Unsigned keys, and keys signed by b's certificate posted by a: 4.22, nothing taken.
  privacy::SecAggDevice unsigned_device("a", session, random);
  EXPECT_EQ(call(*round, Method::kPost, "keys", "a", privacy::serialize(unsigned_device.advertise_keys())).code,
            CoapCode::kUnprocessableEntity);
  privacy::SignedKeys as_b = devices[1]->advertise_keys();
  as_b.keys.identity = "a";
  EXPECT_EQ(call(*round, Method::kPost, "keys", "a", privacy::serialize(as_b)).code, CoapCode::kUnprocessableEntity);
  for (std::size_t i = 0; i < names.size(); ++i)
    ASSERT_EQ(call(*round, Method::kPost, "keys", names[i], privacy::serialize(devices[i]->advertise_keys())).code,
              CoapCode::kChanged);
  EXPECT_FALSE(round->poll(3));
  ASSERT_EQ(round->step(), SecureRound::Step::kShares);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto got = call(*round, Method::kGet, "keys", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    const auto shares = devices[i]->share_keys(privacy::parse_signed_key_directory(got.payload));
    ASSERT_EQ(call(*round, Method::kPost, "shares", names[i], privacy::serialize(shares)).code, CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(3));
  std::vector<std::uint32_t> plain_sum(kLength, 0);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto got = call(*round, Method::kGet, "shares", names[i], {}, session_query(*round));
    const auto quantized = privacy::quantize(delta_of(static_cast<int>(i)), kClip, 3, privacy::Rounding::kNearest);
    for (std::uint32_t k = 0; k < kLength; ++k) plain_sum[k] += quantized[k];
    const auto masked = devices[i]->masked_input(privacy::parse_encrypted_shares(got.payload), quantized);
    ASSERT_EQ(call(*round, Method::kPost, "input", names[i], privacy::serialize(masked)).code, CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(3));
  ASSERT_EQ(round->step(), SecureRound::Step::kConsistency);
  EXPECT_EQ(call(*round, Method::kGet, "consistency", "a", {}, session_query(*round)).code, server::kCoapNotYet);
  EXPECT_EQ(call(*round, Method::kPost, "unmask", "a", privacy::serialize(privacy::UnmaskingShares{session, "a", {}})).code,
            CoapCode::kConflict);  // no unmasking before step 3 closed

  std::vector<privacy::ConsistencySignature> signatures;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto got = call(*round, Method::kGet, "survivors", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    signatures.push_back(devices[i]->sign_survivors(privacy::parse_survivor_list(got.payload)));
  }
  // c's signature posted by a, and a signature over another list: refused.
  privacy::ConsistencySignature forged = signatures[2];
  forged.identity = "a";
  EXPECT_EQ(call(*round, Method::kPost, "consistency", "a", privacy::serialize(forged)).code,
            CoapCode::kUnprocessableEntity);
  ASSERT_EQ(call(*round, Method::kPost, "consistency", "a", privacy::serialize(signatures[0])).code, CoapCode::kChanged);
  ASSERT_EQ(call(*round, Method::kPost, "consistency", "b", privacy::serialize(signatures[1])).code, CoapCode::kChanged);
  EXPECT_FALSE(round->poll(3));

  round = f.make(0, pki.ca);  // a SIGKILL in the consistency step: only the files remain
  round->resume_or_begin(3, kLength);
  EXPECT_EQ(round->session(), session);
  ASSERT_EQ(round->step(), SecureRound::Step::kConsistency);
  EXPECT_EQ(nlohmann::json::parse(round->status_json())["secagg_consistency_signers"], 2);
  EXPECT_EQ(call(*round, Method::kPost, "consistency", "b", privacy::serialize(signatures[1])).code,
            CoapCode::kChanged);  // a retransmission: taken once
  ASSERT_EQ(call(*round, Method::kPost, "consistency", "c", privacy::serialize(signatures[2])).code, CoapCode::kChanged);
  EXPECT_FALSE(round->poll(3));
  ASSERT_EQ(round->step(), SecureRound::Step::kUnmasking);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto got = call(*round, Method::kGet, "consistency", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    const auto shares = devices[i]->unmasking_shares(privacy::parse_consistency_signatures(got.payload));
    EXPECT_EQ(call(*round, Method::kPost, "unmask", names[i], privacy::serialize(shares)).code, CoapCode::kChanged);
  }
  const auto sum = round->poll(3);
  ASSERT_TRUE(sum);
  EXPECT_EQ(sum->survivors, 3u);
  EXPECT_EQ(sum->values, privacy::dequantize(plain_sum, kClip, 3));

  // An unsigned server has no consistency step.
  auto plain = f.make();
  plain->begin(9, kLength);
  EXPECT_EQ(call(*plain, Method::kPost, "consistency", "a", privacy::serialize(signatures[0])).code,
            CoapCode::kNotFound);
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

TEST(SecureRoundSubset, TheSumIsThePlainSumOfTheAnnouncedEntriesAlsoAfterARestart) {
  Fixture f;
  auto round = f.make(0.2);
  round->begin(9, kLength);
  ASSERT_TRUE(round->subset());
  const SecureRound::Subset subset = *round->subset();
  EXPECT_EQ(subset.length, 10u);  // 0.2 of 50
  EXPECT_EQ(subset.seed, privacy::subset_seed(0x5eed, round->session()));
  EXPECT_EQ(round->sent_length(), 10u);
  const std::vector<std::uint32_t> indices = privacy::subset_indices(subset.seed, kLength, subset.length);
  privacy::SecureRandom random;
  const std::vector<std::string> names = {"a", "b", "c"};
  std::vector<std::unique_ptr<privacy::SecAggDevice>> devices;
  for (const auto& name : names) {
    devices.push_back(std::make_unique<privacy::SecAggDevice>(name, round->session(), random));
    ASSERT_EQ(call(*round, Method::kPost, "keys", name, privacy::serialize(devices.back()->advertise_keys())).code,
              CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(3));
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto got = call(*round, Method::kGet, "keys", names[i], {}, session_query(*round));
    ASSERT_EQ(got.code, CoapCode::kContent);
    EXPECT_EQ(privacy::parse_key_directory(got.payload).config.vector_length, subset.length);
    const auto shares = devices[i]->share_keys(privacy::parse_key_directory(got.payload));
    ASSERT_EQ(call(*round, Method::kPost, "shares", names[i], privacy::serialize(shares)).code, CoapCode::kChanged);
  }
  EXPECT_FALSE(round->poll(3));
  ASSERT_EQ(round->step(), SecureRound::Step::kMaskedInput);
  std::vector<std::uint32_t> plain_sum(subset.length, 0);
  std::vector<double> float_sum(kLength, 0);
  std::vector<privacy::MaskedInput> inputs;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto got = call(*round, Method::kGet, "shares", names[i], {}, session_query(*round));
    const auto received = privacy::parse_encrypted_shares(got.payload);
    const std::vector<float> delta = delta_of(static_cast<int>(i));
    std::vector<float> picked;
    for (const auto index : indices) {
      picked.push_back(delta[index]);
      float_sum[index] += delta[index];
    }
    const auto quantized = privacy::quantize(picked, kClip, 3, privacy::Rounding::kNearest);
    for (std::uint32_t k = 0; k < subset.length; ++k) plain_sum[k] += quantized[k];
    if (i == 0) {
      // The whole vector's length where the subset's is announced: malformed, 4.00, nothing
      // taken.
      privacy::MaskedInput wrong{round->session(), "a", std::vector<std::uint32_t>(kLength, 1)};
      const auto refused = call(*round, Method::kPost, "input", "a", privacy::serialize(wrong));
      EXPECT_EQ(refused.code, CoapCode::kBadRequest);
      EXPECT_NE(std::string(refused.payload.begin(), refused.payload.end()).find("secagg_subset_length"),
                std::string::npos);
      wrong.masked.resize(subset.length + 1);
      EXPECT_EQ(call(*round, Method::kPost, "input", "a", privacy::serialize(wrong)).code, CoapCode::kBadRequest);
      // Above the cap for the subset's length (which the whole vector's would have allowed).
      EXPECT_EQ(call(*round, Method::kPost, "input", "a", std::vector<std::uint8_t>(14 + 256 + 4 * kLength, 0)).code,
                CoapCode::kRequestEntityTooLarge);
    }
    inputs.push_back(devices[i]->masked_input(received, quantized));
  }
  ASSERT_EQ(call(*round, Method::kPost, "input", "a", privacy::serialize(inputs[0])).code, CoapCode::kChanged);
  ASSERT_EQ(call(*round, Method::kPost, "input", "b", privacy::serialize(inputs[1])).code, CoapCode::kChanged);
  EXPECT_FALSE(round->poll(3));

  round = f.make(0.2);  // a SIGKILL mid-input: secagg.wal's session goes on with the same subset
  round->resume_or_begin(9, kLength);
  ASSERT_EQ(round->step(), SecureRound::Step::kMaskedInput);
  ASSERT_TRUE(round->subset());
  EXPECT_EQ(round->subset()->seed, subset.seed);
  EXPECT_EQ(round->subset()->length, subset.length);
  ASSERT_EQ(call(*round, Method::kPost, "input", "c", privacy::serialize(inputs[2])).code, CoapCode::kChanged);
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
  EXPECT_EQ(sum->entries_summed, subset.length);
  ASSERT_EQ(sum->values.size(), kLength);
  // /status's record of the close (each set in its own key).
  const auto status = nlohmann::json::parse(round->status_json());
  EXPECT_EQ(status["secagg_last_key_holders"], 3);
  EXPECT_EQ(status["secagg_last_survivors"], 3);
  EXPECT_EQ(status["secagg_last_unmasking_senders"], 2);
  EXPECT_EQ(status["secagg_sent_length"], subset.length);
  const std::vector<double> expected = privacy::dequantize(plain_sum, kClip, 3);
  std::size_t k = 0;
  for (std::uint32_t i = 0; i < kLength; ++i) {
    if (k < indices.size() && indices[k] == i) {
      EXPECT_EQ(sum->values[i], expected[k]) << i;
      EXPECT_NEAR(sum->values[i], float_sum[i], 1e-6) << i;
      ++k;
    } else {
      EXPECT_EQ(sum->values[i], 0.0) << i << ": outside the subset";
    }
  }
  // The next round (attempt 0 of round 10) sends another subset.
  round->begin_next_round(10, kLength);
  EXPECT_NE(round->subset()->seed, subset.seed);
}

// The worker's side of a subset round with the worker's own code: three RoundWorkers against
// one SecureRound, as RoundCoordinator drives it (poll after every message; the next round
// begins when one closes). The workers dump what they quantized (--test-secagg-dump).
class SubsetRoundServer {
 public:
  static constexpr const char* kModelSpec = "input 8x8x1; fc 10";
  // `extra_values`: the sessions' vectors are that much longer than the model (adaptive
  // clipping's count).
  explicit SubsetRoundServer(std::unique_ptr<SecureRound> round, std::uint32_t extra_values = 0)
      : round_(std::move(round)), model_(runtime::model_spec_from_argument(kModelSpec)), extra_values_(extra_values) {
    model_.initialize(3);
    round_->begin(round_number_, length() + extra_values_);
  }
  std::uint32_t length() const { return static_cast<std::uint32_t>(model_.parameter_count()); }

  struct Closed {
    std::uint64_t round;
    SecureRound::Subset subset;
    SecureRound::Sum sum;
  };
  std::vector<Closed> closed;  // read after the workers stopped
  std::atomic<bool> stop{false};
  // What GET /round announces besides the session (set before the workers start).
  double clip_norm = 100;
  nlohmann::json announced = nlohmann::json::object();
  std::size_t expected_devices = 3;  // the keys step's poll(): the workers run_three_round_workers starts

  class Channel : public runtime::ServerChannel {
   public:
    Channel(SubsetRoundServer& server, std::string identity) : server_(server), identity_(std::move(identity)) {}
    CoapResponse get_model(const std::string&) override {
      std::lock_guard lock(server_.mutex_);
      std::vector<std::uint32_t> sizes;
      for (const auto& t : server_.model_.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
      auto bytes = transport::encode_dense_model(server_.model_.layout_id(), server_.round_number_, sizes,
                                                 server_.model_.parameters());
      return {CoapCode::kContent, bytes.value(), server_.round_number_};
    }
    CoapResponse post_update(std::span<const std::uint8_t>) override { return {CoapCode::kNotFound, {}, {}}; }
    CoapResponse get_round() override {
      std::lock_guard lock(server_.mutex_);
      nlohmann::json answer = {{"round", server_.round_number_}, {"model_version", server_.round_number_},
                               {"deadline_seconds", 5}, {"selected", server_.closed.size() < 2},
                               {"local_steps", 2}, {"policy", "drop-stragglers"},
                               {"secure", true}, {"secagg_session", server_.round_->session()},
                               {"secagg_identity", identity_}, {"clip_norm", server_.clip_norm}};
      answer.update(server_.announced);
      if (const auto subset = server_.round_->subset()) {
        answer["secagg_subset_seed"] = subset->seed;
        answer["secagg_subset_length"] = subset->length;
      }
      const std::string text = answer.dump();
      return {CoapCode::kContent, {text.begin(), text.end()}, {}};
    }
    CoapResponse request(Method method, const std::string& path, std::span<const std::uint8_t> body) override {
      std::lock_guard lock(server_.mutex_);
      constexpr std::string_view kPrefix = "round/secagg/";
      const std::size_t question = path.find('?');
      CoapRequest r;
      r.method = method;
      r.identity = identity_;
      r.payload = body;
      if (question != std::string::npos) r.query = path.substr(question + 1);
      const std::string resource = path.substr(kPrefix.size(), question - kPrefix.size());
      CoapResponse answer = server_.round_->handle(method, resource, identity_, r, /*selected=*/true);
      if (auto sum = server_.round_->poll(server_.expected_devices)) {
        server_.closed.push_back({server_.round_number_, server_.round_->subset().value_or(SecureRound::Subset{}),
                                  std::move(*sum)});
        if (server_.closed.size() == 2) server_.stop = true;
        server_.round_->begin_next_round(++server_.round_number_, server_.length() + server_.extra_values_);
      }
      return answer;
    }

   private:
    SubsetRoundServer& server_;
    std::string identity_;
  };

 private:
  std::mutex mutex_;
  std::unique_ptr<SecureRound> round_;
  runtime::Model model_;
  std::uint32_t extra_values_ = 0;
  std::uint64_t round_number_ = 1;
};

std::vector<char> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Three real RoundWorkers (w0, w1, w2) on a small data set, each on its own thread, polling
// `server` until it says stop (or 30 s pass). The workers point into `run`'s data and
// channels, so `run` stays where it is.
struct ThreeRoundWorkers {
  std::vector<std::string> names = {"w0", "w1", "w2"};  // more for a test that needs them
  runtime::Dataset data;
  std::vector<std::unique_ptr<SubsetRoundServer::Channel>> channels;
  std::vector<std::unique_ptr<runtime::RoundWorker>> workers;
};

void run_three_round_workers(SubsetRoundServer& server, const std::filesystem::path& dir,
                             ThreeRoundWorkers& run) {
  runtime::Dataset& data = run.data;
  data.height = data.width = 8;
  data.channels = 1;
  data.num_classes = 10;
  for (int i = 0; i < 40; ++i) {
    for (int p = 0; p < 64; ++p) data.pixels.push_back(p == i % 64 ? 0 : 255);
    data.labels.push_back(i % 10);
  }
  for (std::uint32_t w = 0; w < run.names.size(); ++w) {
    runtime::RoundWorkerConfig config;
    config.worker.model = SubsetRoundServer::kModelSpec;
    config.worker.batch = 4;
    config.worker.worker_id = w;
    config.worker.worker_count = static_cast<std::uint32_t>(run.names.size());
    config.worker.compressor.method = runtime::CompressionMethod::kNone;
    config.worker.backoff_initial = std::chrono::milliseconds(1);
    config.worker.backoff_max = std::chrono::milliseconds(2);
    config.lr = 0.1f;
    config.poll_seconds = 0.01;
    config.test_secagg_dump_dir = dir.string();
    run.channels.push_back(std::make_unique<SubsetRoundServer::Channel>(server, run.names[w]));
    run.workers.push_back(
        std::make_unique<runtime::RoundWorker>(config, data, *run.channels.back(), server.stop));
  }
  std::vector<std::thread> threads;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (auto& worker : run.workers)
    threads.emplace_back([&server, &worker, give_up] {
      while (!server.stop && std::chrono::steady_clock::now() < give_up) worker->run_once();
    });
  for (auto& thread : threads) thread.join();
}

TEST(SecureRoundSubset, RealWorkersSendTheAnnouncedEntriesAndKeepTheRest) {
  Fixture f;
  server::SecureRoundOptions o;  // the workers' rounds run on the real clock
  o.threshold_fraction = 0.6;
  o.step_seconds = 5;
  o.clip_norm = 100;
  o.min_devices = 3;
  o.model_id = 0x5eed;
  o.subset_fraction = 0.1;
  o.now = [] { return std::chrono::steady_clock::now(); };
  SubsetRoundServer server(std::make_unique<SecureRound>(o, f.dir / "secagg_attempt.json"));
  ThreeRoundWorkers run;
  run_three_round_workers(server, f.dir, run);
  const std::vector<std::string>& names = run.names;
  const auto& workers = run.workers;
  ASSERT_EQ(server.closed.size(), 2u);

  const std::uint32_t length = server.length();
  EXPECT_NE(server.closed[0].subset.seed, server.closed[1].subset.seed);
  for (const auto& closed : server.closed) {
    EXPECT_EQ(closed.subset.length, privacy::subset_length(0.1, length));
    const auto indices = privacy::subset_indices(closed.subset.seed, length, closed.subset.length);
    ASSERT_EQ(closed.sum.survivors, 3u);
    std::vector<std::uint32_t> plain_sum(closed.subset.length, 0);
    for (const auto& name : names) {
      const auto stem = f.dir / (name + ".r" + std::to_string(closed.round));
      const auto quantized = read_bytes(stem.string() + ".quantized.u32");
      ASSERT_EQ(quantized.size(), 4 * closed.subset.length) << stem;
      for (std::uint32_t k = 0; k < closed.subset.length; ++k) {
        std::uint32_t value;
        std::memcpy(&value, quantized.data() + 4 * k, 4);
        plain_sum[k] += value;
      }
    }
    const auto expected = privacy::dequantize(plain_sum, 100, 3);
    std::size_t k = 0;
    for (std::uint32_t i = 0; i < length; ++i) {
      if (k < indices.size() && indices[k] == i) {
        ASSERT_EQ(closed.sum.values[i], expected[k]) << i;
        ++k;
      } else {
        ASSERT_EQ(closed.sum.values[i], 0.0) << i;
      }
    }
    EXPECT_GT(std::abs(expected[0]) + std::abs(expected[1]), 0.0) << "the workers trained";
  }
  // (rounds_trained is not checked: the unmasking closes at t = 2 answers, and the third
  // device's comes after the close, 4.09.)
  // After the second round each worker holds back its delta (with the first round's
  // remainder) outside the second subset: the worker's own count of it agrees.
  const auto second = privacy::subset_indices(server.closed[1].subset.seed, length, server.closed[1].subset.length);
  for (std::uint32_t w = 0; w < names.size(); ++w) {
    const auto bytes = read_bytes(f.dir / (names[w] + ".r" + std::to_string(server.closed[1].round) + ".delta.f32"));
    ASSERT_EQ(bytes.size(), 4 * length);
    double held = 0;
    std::size_t k = 0;
    for (std::uint32_t i = 0; i < length; ++i) {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      if (k < second.size() && second[k] == i) {
        ++k;
        continue;
      }
      held += double{v} * v;
    }
    EXPECT_GT(held, 0.0);
    EXPECT_NEAR(workers[w]->stats().secagg_unsent_norm, std::sqrt(held), 1e-5 * std::sqrt(held)) << names[w];
  }
}

// The workers' delta.f32 (clipped) and quantized.u32 of one round, read back as values.
struct DumpedRound {
  std::vector<float> clipped;
  std::vector<double> quantized;
};
DumpedRound read_dump(const std::filesystem::path& dir, const std::string& name, std::uint64_t round,
                      double bound, std::uint32_t devices) {
  const auto stem = dir / (name + ".r" + std::to_string(round));
  const auto delta = read_bytes(stem.string() + ".delta.f32");
  const auto ring = read_bytes(stem.string() + ".quantized.u32");
  DumpedRound out;
  out.clipped.resize(delta.size() / 4);
  std::memcpy(out.clipped.data(), delta.data(), delta.size());
  std::vector<std::uint32_t> values(ring.size() / 4);
  std::memcpy(values.data(), ring.data(), ring.size());
  out.quantized = privacy::dequantize(values, bound, devices);
  return out;
}

// SecAgg+ with the worker's own code: six RoundWorkers, k = 2 neighbours each (GET /round
// announces it; each worker gets its neighbourhood's directory), two rounds: each worker
// quantized for N = |U1| = 6 (not its directory's 3 entries), and the unmasked sum is the ring
// sum of what they quantized, within quantization of the sum of their clipped deltas.
TEST(SecureRound, RealWorkersFollowTheAnnouncedNeighbours) {
  Fixture f;
  server::SecureRoundOptions o;
  o.threshold_fraction = 0.6;
  o.step_seconds = 5;
  o.clip_norm = 100;
  o.min_devices = 6;
  o.model_id = 0x5eed;
  o.neighbours = 2;
  o.now = [] { return std::chrono::steady_clock::now(); };
  SubsetRoundServer server(std::make_unique<SecureRound>(o, f.dir / "secagg_attempt.json"));
  server.expected_devices = 6;
  server.announced = {{"secagg_neighbours", 2}};
  ThreeRoundWorkers run;
  run.names = {"w0", "w1", "w2", "w3", "w4", "w5"};
  run_three_round_workers(server, f.dir, run);
  ASSERT_EQ(server.closed.size(), 2u);
  for (const auto& closed : server.closed) {
    ASSERT_EQ(closed.sum.key_holders, 6u);
    ASSERT_EQ(closed.sum.survivors, 6u);
    std::vector<std::uint32_t> plain_sum(server.length(), 0);
    std::vector<double> clipped_sum(server.length(), 0);
    for (const auto& name : run.names) {
      const auto stem = f.dir / (name + ".r" + std::to_string(closed.round));
      const auto meta = nlohmann::json::parse(read_bytes(stem.string() + ".json"));
      EXPECT_EQ(meta["devices"], 6) << stem << ": quantized for |U1|";
      const auto quantized = read_bytes(stem.string() + ".quantized.u32");
      const auto delta = read_bytes(stem.string() + ".delta.f32");
      ASSERT_EQ(quantized.size(), 4 * server.length());
      for (std::uint32_t k = 0; k < server.length(); ++k) {
        std::uint32_t value;
        float d;
        std::memcpy(&value, quantized.data() + 4 * k, 4);
        std::memcpy(&d, delta.data() + 4 * k, 4);
        plain_sum[k] += value;
        clipped_sum[k] += d;
      }
    }
    const auto expected = privacy::dequantize(plain_sum, 100, 6);
    const double step = 100.0 / static_cast<double>(privacy::quantization_limit(6));
    for (std::uint32_t k = 0; k < server.length(); ++k) {
      ASSERT_EQ(closed.sum.values[k], expected[k]) << k;
      ASSERT_NEAR(closed.sum.values[k], clipped_sum[k], 6 * 0.5 * step + 1e-6) << k;
    }
  }
  // (deltas_refused is not checked: the unmasking closes once every secret has t shares,
  // and a later device's GET of the survivors then meets the next session, 4.09.)
}

TEST(SecureRound, RealWorkersAddTheAnnouncedNoiseBeforeTheyQuantize) {
  Fixture f;
  constexpr double kZ = 1.0, kClip = 1.0;
  constexpr std::uint32_t kSurvivors = 3;
  const double stddev = privacy::device_noise_stddev(kZ, kClip, kSurvivors);
  const double bound = privacy::noised_value_bound(kClip, stddev);
  server::SecureRoundOptions o;
  o.threshold_fraction = 0.6;
  o.step_seconds = 5;
  o.clip_norm = kClip;
  o.value_bound = bound;
  o.min_survivors = kSurvivors;
  o.min_devices = 3;
  o.model_id = 0x5eed;
  o.now = [] { return std::chrono::steady_clock::now(); };
  SubsetRoundServer server(std::make_unique<SecureRound>(o, f.dir / "secagg_attempt.json"));
  server.clip_norm = kClip;
  server.announced = {{"dp_device_noise_stddev", stddev}, {"secagg_value_bound", bound}};
  ThreeRoundWorkers run;
  run_three_round_workers(server, f.dir, run);
  const std::vector<std::string>& names = run.names;
  ASSERT_EQ(server.closed.size(), 2u);

  // Over both rounds: each device's own noise (its quantized values less its clipped delta),
  // and the sum's (the unmasked sum less the three clipped deltas).
  double own_squares = 0, sum_squares = 0, signal = 0;
  std::size_t own_count = 0, sum_count = 0;
  for (const auto& closed : server.closed) {
    ASSERT_EQ(closed.sum.survivors, kSurvivors);
    std::vector<double> clean(server.length(), 0.0), ring_sum(server.length(), 0.0);
    for (const auto& name : names) {
      const DumpedRound dumped = read_dump(f.dir, name, closed.round, bound, kSurvivors);
      ASSERT_EQ(dumped.clipped.size(), server.length());
      ASSERT_EQ(dumped.quantized.size(), server.length());
      double norm = 0;
      for (std::uint32_t i = 0; i < server.length(); ++i) {
        clean[i] += dumped.clipped[i];
        ring_sum[i] += dumped.quantized[i];
        const double noise = dumped.quantized[i] - dumped.clipped[i];
        own_squares += noise * noise;
        norm += double{dumped.clipped[i]} * dumped.clipped[i];
        ++own_count;
      }
      EXPECT_LE(std::sqrt(norm), kClip * (1 + 1e-6)) << name << ": clipped before the noise";
      signal += norm;
    }
    for (std::uint32_t i = 0; i < server.length(); ++i) {
      EXPECT_NEAR(closed.sum.values[i], ring_sum[i], 1e-9) << i << ": the sum is the noised inputs'";
      const double noise = closed.sum.values[i] - clean[i];
      sum_squares += noise * noise;
      ++sum_count;
    }
  }
  EXPECT_GT(signal, 0.0) << "the workers trained";
  // 3,900 and 1,300 values: within 6 standard errors (√(2/n) relative) of σ_d² and 3·σ_d² = z²S².
  const double own = own_squares / static_cast<double>(own_count);
  const double total = sum_squares / static_cast<double>(sum_count);
  EXPECT_NEAR(own, stddev * stddev, 6 * stddev * stddev * std::sqrt(2.0 / own_count));
  EXPECT_NEAR(total, kZ * kZ * kClip * kClip, 6 * kZ * kZ * kClip * kClip * std::sqrt(2.0 / sum_count));
}

// The discrete noise (privacy/skellam.h) with three real RoundWorkers: each sends integers of
// the announced scale γ, its own noise (its ring values less γ·its clipped delta) has the
// variance v_d plus the rounding's (< 1/4), the unmasked sum is exactly the ring sum of the
// three inputs over γ, and its noise is z²S² in the clip's units: c = 3 shares of v_d.
TEST(SecureRound, RealWorkersAddTheAnnouncedSkellamNoiseToTheirRoundedDeltas) {
  Fixture f;
  constexpr double kZ = 1.0, kClip = 1.0;
  constexpr std::uint32_t kSurvivors = 3;
  server::SecureRoundOptions o;
  o.threshold_fraction = 0.6;
  o.step_seconds = 5;
  o.clip_norm = kClip;
  o.min_survivors = kSurvivors;
  o.min_devices = 3;
  o.model_id = 0x5eed;
  o.now = [] { return std::chrono::steady_clock::now(); };
  constexpr std::uint32_t kModelLength = 8 * 8 * 10 + 10;  // SubsetRoundServer's model
  const privacy::SkellamPlan plan = privacy::skellam_plan(kZ, kClip, kSurvivors, kModelLength);
  o.skellam_scale = plan.scale;
  SubsetRoundServer server(std::make_unique<SecureRound>(o, f.dir / "secagg_attempt.json"));
  ASSERT_EQ(server.length(), kModelLength);
  server.clip_norm = kClip;
  server.announced = {{"dp_noise", "skellam"},
                      {"secagg_skellam_scale", plan.scale},
                      {"secagg_skellam_variance", plan.device_variance},
                      {"secagg_skellam_l2_bound", plan.l2_bound}};
  ThreeRoundWorkers run;
  run_three_round_workers(server, f.dir, run);
  ASSERT_EQ(server.closed.size(), 2u);
  double own_squares = 0, sum_squares = 0, signal = 0;
  std::size_t own_count = 0, sum_count = 0;
  for (const auto& closed : server.closed) {
    ASSERT_EQ(closed.sum.survivors, kSurvivors);
    std::vector<double> clean(server.length(), 0.0);
    std::vector<std::int64_t> integers(server.length(), 0);
    for (const auto& name : run.names) {
      const auto stem = f.dir / (name + ".r" + std::to_string(closed.round));
      const auto delta_bytes = read_bytes(stem.string() + ".delta.f32");
      const auto ring_bytes = read_bytes(stem.string() + ".quantized.u32");
      std::vector<float> clipped(delta_bytes.size() / 4);
      std::memcpy(clipped.data(), delta_bytes.data(), delta_bytes.size());
      std::vector<std::uint32_t> ring(ring_bytes.size() / 4);
      std::memcpy(ring.data(), ring_bytes.data(), ring_bytes.size());
      ASSERT_EQ(ring.size(), server.length());
      double norm = 0;
      for (std::uint32_t i = 0; i < server.length(); ++i) {
        clean[i] += clipped[i];
        integers[i] += static_cast<std::int32_t>(ring[i]);
        const double noise = static_cast<std::int32_t>(ring[i]) - plan.scale * clipped[i];
        own_squares += noise * noise;
        norm += double{clipped[i]} * clipped[i];
        ++own_count;
      }
      EXPECT_LE(std::sqrt(norm), kClip * (1 + 1e-6)) << name << ": clipped before the noise";
      signal += norm;
    }
    for (std::uint32_t i = 0; i < server.length(); ++i) {
      EXPECT_EQ(closed.sum.values[i], static_cast<double>(integers[i]) / plan.scale) << i << ": exact in the ring";
      const double noise = closed.sum.values[i] - clean[i];
      sum_squares += noise * noise;
      ++sum_count;
    }
  }
  EXPECT_GT(signal, 0.0) << "the workers trained";
  const double own = own_squares / static_cast<double>(own_count);
  const double total = sum_squares / static_cast<double>(sum_count);
  EXPECT_NEAR(own, plan.device_variance, 6 * plan.device_variance * std::sqrt(2.0 / own_count) + 0.25);
  EXPECT_NEAR(total, kZ * kZ * kClip * kClip, 6 * kZ * kZ * kClip * kClip * std::sqrt(2.0 / sum_count));
}

// Adaptive clipping's count over the ring with three real RoundWorkers: each appends its
// unclipped bit (here without noise: σ_b = 0, range 1) after its delta, the sum's last value
// is read back in the count's own range and is the number of devices whose delta was within
// the announced clip: all three at a clip of 100, none at 1e-9. The values before it are the
// deltas' (the vector is one longer than the model).
TEST(SecureRound, RealWorkersAppendTheirUnclippedBitAndTheSumCountsThem) {
  for (const double clip : {100.0, 1e-9}) {
    Fixture f;
    server::SecureRoundOptions o;
    o.threshold_fraction = 0.6;
    o.step_seconds = 5;
    o.clip_norm = clip;
    o.min_devices = 3;
    o.model_id = 0x5eed;
    o.count_value_bound = 1;
    o.now = [] { return std::chrono::steady_clock::now(); };
    SubsetRoundServer server(std::make_unique<SecureRound>(o, f.dir / "secagg_attempt.json"), 1);
    server.clip_norm = clip;
    server.announced = {{"dp_clip_count_device_stddev", 0.0}, {"secagg_count_value_bound", 1.0}};
    ThreeRoundWorkers run;
    run_three_round_workers(server, f.dir, run);
    ASSERT_EQ(server.closed.size(), 2u) << clip;
    for (const auto& closed : server.closed) {
      ASSERT_EQ(closed.sum.values.size(), server.length() + 1u);
      EXPECT_NEAR(closed.sum.values.back(), clip > 1 ? 3.0 : 0.0, 1e-6) << clip;
      double squares = 0;
      for (std::uint32_t i = 0; i < server.length(); ++i) squares += closed.sum.values[i] * closed.sum.values[i];
      EXPECT_GT(squares, 0.0) << "the deltas' sum is there too";
      EXPECT_LE(std::sqrt(squares), 3 * clip * (1 + 1e-3) + 1e-6);
    }
  }
}

TEST(SecureRound, WithDistributedNoiseTheKeysStepWaitsForCAndTheThresholdIsAtLeastC) {
  Fixture f;
  server::SecureRoundOptions o;
  o.threshold_fraction = 0.6;
  o.step_seconds = 5;
  o.clip_norm = kClip;
  o.value_bound = 2 * kClip;
  o.min_survivors = 4;
  o.min_devices = 2;
  o.now = [&f] { return f.now; };
  SecureRound round(o, f.dir / "secagg_attempt.json");
  round.begin(3, kLength);
  privacy::SecureRandom random;
  std::vector<std::unique_ptr<privacy::SecAggDevice>> devices;
  for (const std::string name : {"a", "b", "c", "d"}) {
    devices.push_back(std::make_unique<privacy::SecAggDevice>(name, round.session(), random));
    ASSERT_EQ(call(round, Method::kPost, "keys", name, privacy::serialize(devices.back()->advertise_keys())).code,
              CoapCode::kChanged);
    if (name == "c") {
      f.now += std::chrono::seconds(6);  // past the deadline with 3 keys: fewer than c = 4
      EXPECT_FALSE(round.poll(4));
      EXPECT_EQ(round.step(), SecureRound::Step::kKeys);
    }
  }
  EXPECT_FALSE(round.poll(4));
  EXPECT_EQ(round.step(), SecureRound::Step::kShares);
  EXPECT_EQ(round.threshold(), 4u) << "max(⌊4/2⌋ + 1, ⌈0.6 · 4⌉, c) = c: every survivor set has c devices";
  o.value_bound = 0.5 * kClip;  // a range short of the clip
  EXPECT_THROW(SecureRound(o, f.dir / "b.json"), std::invalid_argument);
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
  o.clip_norm = 1;
  o.subset_fraction = 1.5;
  EXPECT_THROW(SecureRound(o, f.dir / "a.json"), std::invalid_argument);
}

}  // namespace
