// Secure aggregation's protocol (privacy/secagg.h) between SecAggDevice and SecAggServer
// objects, every message through its bytes (privacy/secagg_messages.h) as the rounds mode
// will carry them: the unmasked sum against the plain ring sum with devices dropping at each
// step, and the refusals; the seeded subset of entries a subset round sends (subset.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "privacy/quantize.h"
#include "privacy/secagg.h"
#include "privacy/secagg_graph.h"
#include "privacy/secagg_messages.h"
#include "privacy/subset.h"

namespace edgetrain::privacy {
namespace {

constexpr std::uint64_t kRound = 42;
constexpr double kClip = 1;

std::string name(int i) {
  char text[16];
  std::snprintf(text, sizeof text, "device-%02d", i);
  return text;
}

// Runs one round of `devices` devices over their message bytes. Devices in drop_before_shares
// advertise keys and vanish; in drop_before_input they share keys and vanish; in
// drop_after_input they send their masked input and give no unmasking shares.
// With neighbours = k > 0 (SecAgg+, secagg_graph.h) each device gets the server's directory
// for it (itself and its neighbours) and the survivors among them, as the rounds mode sends.
struct Round {
  int devices = 20;
  std::uint32_t threshold = 11;
  std::uint32_t length = 1000;
  std::uint32_t neighbours = 0;
  std::uint64_t graph_seed = 0x5eca99;
  std::set<int> drop_before_shares, drop_before_input, drop_after_input;

  SecureRandom random;
  std::vector<std::unique_ptr<SecAggDevice>> device;
  std::vector<std::vector<float>> delta;
  std::vector<std::vector<std::uint32_t>> quantized;
  std::map<int, std::vector<std::uint32_t>> masked;  // what the server received, by device
  std::unique_ptr<SecAggServer> server;
  SurvivorList survivors;
  std::size_t directory_bytes = 0, shares_sent = 0;  // device 0's, for the cost checks

  void prepare() {
    std::mt19937 draw(7);
    std::normal_distribution<float> normal(0, 1);
    for (int i = 0; i < devices; ++i) {
      device.push_back(std::make_unique<SecAggDevice>(name(i), kRound, random));
      std::vector<float> d(length);
      for (float& v : d) v = normal(draw);
      double norm = 0;
      for (float v : d) norm += double{v} * v;
      const double shrink = std::min(1.0, kClip / std::sqrt(norm)) * (1 - 1e-6);
      for (float& v : d) v = static_cast<float>(v * shrink);  // clipped to S, as the worker does
      quantized.push_back(quantize(d, kClip, devices, Rounding::kNearest));
      delta.push_back(std::move(d));
    }
    server = std::make_unique<SecAggServer>(RoundConfig{kRound, threshold, length, neighbours, graph_seed});
  }

  // Rounds 0 to 2: keys, shares, masked inputs.
  void run_until_survivors() {
    prepare();
    for (int i = 0; i < devices; ++i) {
      server->receive_keys(name(i), parse_advertise_keys(serialize(device[i]->advertise_keys())));
    }
    const std::vector<std::uint8_t> directory = serialize(server->close_key_advertisement());
    for (int i = 0; i < devices; ++i) {
      const std::vector<std::uint8_t> mine = neighbours == 0 ? directory : serialize(server->directory_for(name(i)));
      const EncryptedShares shares = device[i]->share_keys(parse_key_directory(mine));
      if (i == 0) directory_bytes = mine.size(), shares_sent = shares.shares.size();
      if (drop_before_shares.count(i)) continue;
      server->receive_shares(name(i), parse_encrypted_shares(serialize(shares)));
    }
    server->close_share_keys();
    for (int i = 0; i < devices; ++i) {
      if (drop_before_shares.count(i) || drop_before_input.count(i)) continue;
      const EncryptedShares mine = parse_encrypted_shares(serialize(server->shares_for(name(i))));
      const MaskedInput input = device[i]->masked_input(mine, quantized[i]);
      masked[i] = input.masked;
      server->receive_masked_input(name(i), parse_masked_input(serialize(input)));
    }
    survivors = parse_survivor_list(serialize(server->close_masked_input()));
  }

  // Round 4, then the sum.
  std::vector<std::uint32_t> run() {
    run_until_survivors();
    for (int i = 0; i < devices; ++i) {
      if (drop_before_shares.count(i) || drop_before_input.count(i) || drop_after_input.count(i)) continue;
      const UnmaskingShares shares = device[i]->unmasking_shares(
          neighbours == 0 ? survivors : parse_survivor_list(serialize(server->survivors_for(name(i)))));
      server->receive_unmasking_shares(name(i), parse_unmasking_shares(serialize(shares)));
    }
    return server->unmask();
  }

  // The plain ring sum of the quantized deltas whose masked input arrived.
  std::vector<std::uint32_t> plain_sum() const {
    std::vector<std::uint32_t> sum(length, 0);
    for (const auto& [i, unused] : masked) {
      for (std::uint32_t k = 0; k < length; ++k) sum[k] += quantized[i][k];
    }
    return sum;
  }
};

TEST(SecureAggregation, ThirtyPercentDropAfterSendingTheirMaskedInputs) {
  Round round;
  round.drop_after_input = {1, 4, 7, 10, 13, 16};  // 6 of 20
  const std::vector<std::uint32_t> sum = round.run();
  EXPECT_EQ(round.masked.size(), 20u);
  EXPECT_EQ(round.server->survivors().size(), 20u);
  EXPECT_EQ(sum, round.plain_sum());  // bit for bit in the ring
  // And back to floats: within 20 half-steps of the float sum.
  const std::vector<double> values = dequantize(sum, kClip, 20);
  const double step = 1 / quantization_scale(kClip, 20);
  for (std::uint32_t k = 0; k < round.length; ++k) {
    double expected = 0;
    for (int i = 0; i < 20; ++i) expected += round.delta[i][k];
    ASSERT_NEAR(values[k], expected, 20 * 0.5 * step * (1 + 1e-9)) << k;
  }
}

TEST(SecureAggregation, ThirtyPercentDropBeforeSendingTheirMaskedInputs) {
  Round round;
  round.drop_before_input = {0, 3, 6, 9, 12, 19};  // their pairwise masks come off through s^SK
  const std::vector<std::uint32_t> sum = round.run();
  EXPECT_EQ(round.masked.size(), 14u);
  EXPECT_EQ(round.server->share_senders().size(), 20u);
  EXPECT_EQ(sum, round.plain_sum());
}

TEST(SecureAggregation, DropsAtEveryStepTogether) {
  Round round;
  round.drop_before_shares = {2, 17};      // never in anyone's masks
  round.drop_before_input = {5, 8, 11};    // pairwise masks removed with their s^SK
  round.drop_after_input = {0, 14, 19};    // self-masks removed with their b
  const std::vector<std::uint32_t> sum = round.run();
  EXPECT_EQ(round.server->key_holders().size(), 20u);
  EXPECT_EQ(round.server->share_senders().size(), 18u);
  EXPECT_EQ(round.masked.size(), 15u);
  EXPECT_EQ(sum, round.plain_sum());
  // The sum over all 20 is another vector: the dropped devices' inputs are not in it.
  std::vector<std::uint32_t> everyone(round.length, 0);
  for (int i = 0; i < 20; ++i) {
    for (std::uint32_t k = 0; k < round.length; ++k) everyone[k] += round.quantized[i][k];
  }
  EXPECT_NE(sum, everyone);
}

TEST(SecureAggregation, WithoutDropouts) {
  Round round;
  round.devices = 5;
  round.threshold = 3;
  const std::vector<std::uint32_t> sum = round.run();  // before plain_sum(), which needs the run
  EXPECT_EQ(sum, round.plain_sum());
}

// A sanity check, not a proof: a masked vector does not resemble the quantized delta. The
// plain values lie in [−K, K] (K = (2^31 − 1)/20, a tenth of the ring); uniform ones do with
// probability about 1/20.
TEST(SecureAggregation, AMaskedVectorLooksUnlikeItsInput) {
  Round round;
  round.length = 20000;
  round.run_until_survivors();
  const std::int64_t limit = quantization_limit(20);
  for (const auto& [i, y] : round.masked) {
    std::size_t equal = 0, in_range = 0, plain_in_range = 0;
    for (std::uint32_t k = 0; k < round.length; ++k) {
      equal += y[k] == round.quantized[i][k];
      in_range += std::abs(std::int64_t{static_cast<std::int32_t>(y[k])}) <= limit;
      plain_in_range += std::abs(std::int64_t{static_cast<std::int32_t>(round.quantized[i][k])}) <= limit;
    }
    EXPECT_LT(equal, round.length / 1000) << i;
    EXPECT_LT(in_range, round.length / 10) << i;  // about 5% expected
    EXPECT_EQ(plain_in_range, round.length);
  }
}

TEST(SecureAggregation, RefusesToUnmaskWithFewerThanTShares) {
  Round round;
  round.threshold = 11;
  // 9 of the 20 give no unmasking shares: 11 remain, enough...
  round.drop_after_input = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<std::uint32_t> sum = round.run();
  EXPECT_EQ(sum, round.plain_sum());
  // ...but with 10 silent, 10 shares per device are fewer than t = 11.
  Round short_round;
  short_round.drop_after_input = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  try {
    short_round.run();
    FAIL() << "unmasked with 10 shares for t = 11";
  } catch (const SecAggError& error) {
    EXPECT_NE(std::string(error.what()).find("fewer than t = 11"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("'device-00' (10)"), std::string::npos) << error.what();
  }
  EXPECT_THROW(short_round.server->reconstruct_secret(name(0), SecretKind::kSelfMaskSeed), SecAggError);
}

TEST(SecureAggregation, NeverReconstructsBothSecretsOfADevice) {
  Round round;
  round.drop_before_input = {3};
  round.run_until_survivors();
  for (int i = 0; i < round.devices; ++i) {
    if (i == 3) continue;
    round.server->receive_unmasking_shares(name(i), round.device[i]->unmasking_shares(round.survivors));
  }
  // Device 3 sent no input: its mask key may come back, never its self-mask seed; device 4
  // sent its input: the other way round.
  EXPECT_EQ(round.server->allowed_secret(name(3)), SecretKind::kMaskPrivateKey);
  EXPECT_EQ(round.server->allowed_secret(name(4)), SecretKind::kSelfMaskSeed);
  EXPECT_NO_THROW(round.server->reconstruct_secret(name(3), SecretKind::kMaskPrivateKey));
  EXPECT_NO_THROW(round.server->reconstruct_secret(name(4), SecretKind::kSelfMaskSeed));
  try {
    round.server->reconstruct_secret(name(3), SecretKind::kSelfMaskSeed);
    FAIL() << "reconstructed both secrets of device 3";
  } catch (const SecAggError& error) {
    EXPECT_NE(std::string(error.what()).find("never both"), std::string::npos) << error.what();
  }
  EXPECT_THROW(round.server->reconstruct_secret(name(4), SecretKind::kMaskPrivateKey), SecAggError);
  EXPECT_EQ(round.server->unmask(), round.plain_sum());
}

TEST(SecureAggregation, TheServerRefusesAShareOfTheForbiddenSecret) {
  Round round;
  round.drop_before_input = {3};
  round.run_until_survivors();
  UnmaskingShares shares = round.device[0]->unmasking_shares(round.survivors);
  for (RevealedShare& revealed : shares.shares) {
    if (revealed.owner == name(4)) revealed.kind = SecretKind::kMaskPrivateKey;  // 4 sent its input
  }
  EXPECT_THROW(round.server->receive_unmasking_shares(name(0), shares), SecAggError);
  // Shares at another device's point (device 0 holds point 1), or twice for one owner.
  UnmaskingShares honest = round.device[1]->unmasking_shares(round.survivors);
  UnmaskingShares wrong_point = honest;
  wrong_point.shares[5].share.x = 7;
  EXPECT_THROW(round.server->receive_unmasking_shares(name(1), wrong_point), SecAggError);
  UnmaskingShares twice = honest;
  twice.shares.push_back(twice.shares[0]);
  EXPECT_THROW(round.server->receive_unmasking_shares(name(1), twice), SecAggError);
  EXPECT_THROW(round.server->receive_unmasking_shares(name(2), honest), SecAggError);  // 1's shares from 2
  round.server->receive_unmasking_shares(name(1), honest);
  // Nothing of the refused messages was kept: the honest answers still unmask.
  for (int i = 2; i < round.devices; ++i) {
    if (i == 3) continue;
    round.server->receive_unmasking_shares(name(i), round.device[i]->unmasking_shares(round.survivors));
  }
  EXPECT_EQ(round.server->unmask(), round.plain_sum());
}

TEST(SecureAggregation, ADeviceAnswersOneSurvivorListAndOnlyOneThatHoldsIt) {
  Round round;
  round.devices = 6;
  round.threshold = 4;
  round.run_until_survivors();
  // A list without device 0, which sent its input: revealing its mask key would unmask it.
  SurvivorList without = round.survivors;
  without.survivors.erase(without.survivors.begin());
  EXPECT_THROW(round.device[0]->unmasking_shares(without), SecAggError);
  SurvivorList stranger = round.survivors;
  stranger.survivors.push_back("device-99");
  EXPECT_THROW(round.device[1]->unmasking_shares(stranger), SecAggError);
  SurvivorList repeated = round.survivors;
  repeated.survivors.push_back(name(2));
  EXPECT_THROW(round.device[1]->unmasking_shares(repeated), SecAggError);
  SurvivorList too_few = round.survivors;
  too_few.survivors.resize(3);
  EXPECT_THROW(round.device[1]->unmasking_shares(too_few), SecAggError);
  // One answer, then no second one whatever the list.
  EXPECT_NO_THROW(round.device[1]->unmasking_shares(round.survivors));
  SurvivorList fewer = round.survivors;
  fewer.survivors.erase(std::find(fewer.survivors.begin(), fewer.survivors.end(), name(5)));
  EXPECT_THROW(round.device[1]->unmasking_shares(fewer), SecAggError);
}

TEST(SecureAggregation, DevicesRefuseBadKeyDirectoriesAndShares) {
  SecureRandom random;
  SecAggDevice a("a", kRound, random), b("b", kRound, random), c("c", kRound, random);
  KeyDirectory directory{{kRound, 2, 4}, {a.advertise_keys(), b.advertise_keys(), c.advertise_keys()}};
  KeyDirectory other_round = directory;
  other_round.config.round = kRound + 1;
  EXPECT_THROW(a.share_keys(other_round), SecAggError);
  KeyDirectory without = directory;
  without.devices.erase(without.devices.begin());
  without.config.threshold = 2;
  EXPECT_THROW(a.share_keys(without), SecAggError);
  KeyDirectory substituted = directory;
  substituted.devices[0].mask_public_key = b.advertise_keys().mask_public_key;
  EXPECT_THROW(a.share_keys(substituted), SecAggError);
  KeyDirectory unordered = directory;
  std::swap(unordered.devices[1], unordered.devices[2]);
  EXPECT_THROW(a.share_keys(unordered), SecAggError);
  KeyDirectory minority = directory;
  minority.config.threshold = 1;  // not more than half of 3
  EXPECT_THROW(a.share_keys(minority), SecAggError);

  KeyDirectory low_order = directory;
  low_order.devices[1].cipher_public_key = Key32{};  // b's key replaced by u = 0
  try {
    a.share_keys(low_order);
    FAIL() << "shared keys with a low-order public key";
  } catch (const SecAggError& error) {
    EXPECT_NE(std::string(error.what()).find("public key of 'b'"), std::string::npos) << error.what();
  }

  const EncryptedShares from_a = a.share_keys(directory);
  const EncryptedShares from_b = b.share_keys(directory);
  c.share_keys(directory);
  EncryptedShares to_c{kRound, {}};
  for (const EncryptedShares* from : {&from_a, &from_b}) {
    for (const EncryptedShare& share : from->shares) {
      if (share.recipient == "c") to_c.shares.push_back(share);
    }
  }
  EncryptedShares damaged = to_c;
  damaged.shares[0].sealed[10] ^= 0x40;
  EXPECT_THROW(c.masked_input(damaged, std::vector<std::uint32_t>(4)), SecAggError);
  EncryptedShares misaddressed = to_c;
  misaddressed.shares[0].recipient = "b";
  EXPECT_THROW(c.masked_input(misaddressed, std::vector<std::uint32_t>(4)), SecAggError);
  EncryptedShares relabelled = to_c;  // a's share claimed to be b's: it fails authentication
  relabelled.shares[0].sender = "b";
  relabelled.shares.pop_back();
  EXPECT_THROW(c.masked_input(relabelled, std::vector<std::uint32_t>(4)), SecAggError);
  EncryptedShares repeated = to_c;
  repeated.shares.push_back(repeated.shares[0]);
  EXPECT_THROW(c.masked_input(repeated, std::vector<std::uint32_t>(4)), SecAggError);
  EXPECT_THROW(c.masked_input(to_c, std::vector<std::uint32_t>(5)), SecAggError);
  // The refusals left c able to take the honest message.
  EXPECT_NO_THROW(c.masked_input(to_c, std::vector<std::uint32_t>(4)));
  EXPECT_THROW(c.masked_input(to_c, std::vector<std::uint32_t>(4)), SecAggError);  // once only
}

TEST(SecureAggregation, TheServerRefusesMessagesOutOfTurnOrIdentity) {
  SecureRandom random;
  SecAggServer server({kRound, 2, 4});
  SecAggDevice a("a", kRound, random), b("b", kRound, random), c("c", kRound, random);
  EXPECT_THROW(server.receive_keys("b", a.advertise_keys()), SecAggError);  // another's keys
  server.receive_keys("a", a.advertise_keys());
  EXPECT_THROW(server.receive_keys("a", a.advertise_keys()), SecAggError);
  SecAggDevice late("d", kRound + 1, random);
  EXPECT_THROW(server.receive_keys("d", late.advertise_keys()), SecAggError);
  server.receive_keys("b", b.advertise_keys());
  EXPECT_THROW(server.close_share_keys(), SecAggError);
  server.receive_keys("c", c.advertise_keys());
  const KeyDirectory directory = server.close_key_advertisement();
  EXPECT_THROW(server.receive_keys("c", c.advertise_keys()), SecAggError);
  const EncryptedShares from_a = a.share_keys(directory);
  EXPECT_THROW(server.receive_shares("b", from_a), SecAggError);
  EncryptedShares partial = from_a;
  partial.shares.pop_back();
  EXPECT_THROW(server.receive_shares("a", partial), SecAggError);
  server.receive_shares("a", from_a);
  EXPECT_THROW(server.receive_shares("a", from_a), SecAggError);
  EXPECT_THROW(server.close_share_keys(), SecAggError);  // 1 of t = 2
  server.receive_shares("b", b.share_keys(directory));
  server.close_share_keys();
  const MaskedInput input = a.masked_input(server.shares_for("a"), std::vector<std::uint32_t>(4, 1));
  EXPECT_THROW(server.receive_masked_input("b", input), SecAggError);
  EXPECT_THROW(server.receive_masked_input("c", MaskedInput{kRound, "c", std::vector<std::uint32_t>(4)}),
               SecAggError);  // c shared no keys
  MaskedInput short_input = input;
  short_input.masked.pop_back();
  EXPECT_THROW(server.receive_masked_input("a", short_input), SecAggError);
  server.receive_masked_input("a", input);
  EXPECT_THROW(server.receive_masked_input("a", input), SecAggError);
  EXPECT_THROW(server.close_masked_input(), SecAggError);  // 1 of t = 2
  EXPECT_THROW(server.unmask(), SecAggError);
}

// The parsers take bytes from the network: flipped and cut bytes of every message kind give
// a message or a SecAggError, never anything else (ASan's tree checks the reads).
TEST(SecureAggregationMessages, DamagedBytesParseOrAreRefused) {
  Round round;
  round.devices = 4;
  round.threshold = 3;
  round.length = 6;
  round.run_until_survivors();
  const std::vector<std::vector<std::uint8_t>> messages = {
      serialize(round.device[0]->advertise_keys()),
      serialize(KeyDirectory{{kRound, 3, 6}, {round.device[0]->advertise_keys(), round.device[1]->advertise_keys()}}),
      serialize(round.server->shares_for(name(1))),
      serialize(MaskedInput{kRound, name(2), round.masked[2]}),
      serialize(round.survivors),
      serialize(round.device[3]->unmasking_shares(round.survivors)),
      serialize(KeyDirectory{{kRound, 3, 6, 2, 77},  // SecAgg+'s directory (type 7)
                             {round.device[0]->advertise_keys(), round.device[1]->advertise_keys()},
                             4,
                             {0, 3}}),
  };
  std::mt19937 draw(11);
  int parsed = 0, refused = 0;
  for (int trial = 0; trial < 7000; ++trial) {
    std::vector<std::uint8_t> bytes = messages[trial % messages.size()];
    const int flips = 1 + static_cast<int>(draw() % 3);
    for (int f = 0; f < flips; ++f) bytes[draw() % bytes.size()] ^= static_cast<std::uint8_t>(1 + draw() % 255);
    if (draw() % 4 == 0) bytes.resize(draw() % bytes.size());
    try {
      switch (trial % messages.size()) {
        case 0: parse_advertise_keys(bytes); break;
        case 1: parse_key_directory(bytes); break;
        case 2: parse_encrypted_shares(bytes); break;
        case 3: parse_masked_input(bytes); break;
        case 4: parse_survivor_list(bytes); break;
        case 5: parse_unmasking_shares(bytes); break;
        default: parse_key_directory(bytes); break;
      }
      ++parsed;
    } catch (const SecAggError&) {
      ++refused;
    }
  }
  EXPECT_EQ(parsed + refused, 7000);
  EXPECT_GT(parsed, 100);   // flips inside keys and values still parse...
  EXPECT_GT(refused, 100);  // ...flips in lengths, types and counts do not
}

TEST(SecureAggregation, ThresholdsAreMajorities) {
  EXPECT_THROW(check_threshold(10, 20), SecAggError);
  EXPECT_NO_THROW(check_threshold(11, 20));
  EXPECT_NO_THROW(check_threshold(20, 20));
  EXPECT_THROW(check_threshold(21, 20), SecAggError);
  EXPECT_THROW(check_threshold(1, 1), SecAggError);
  EXPECT_THROW(check_threshold(200, 256), SecAggError);
}

TEST(SecureAggregationMessages, RoundTripAndRefuseDamagedBytes) {
  Round round;
  round.devices = 4;
  round.threshold = 3;
  round.length = 10;
  round.run_until_survivors();
  const UnmaskingShares unmasking = round.device[0]->unmasking_shares(round.survivors);
  const std::vector<std::uint8_t> bytes = serialize(unmasking);
  const UnmaskingShares back = parse_unmasking_shares(bytes);
  EXPECT_EQ(back.round, unmasking.round);
  EXPECT_EQ(back.identity, unmasking.identity);
  EXPECT_EQ(back.shares, unmasking.shares);
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_THROW(parse_unmasking_shares(std::span(bytes).first(cut)), SecAggError) << cut;
  }
  std::vector<std::uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(parse_unmasking_shares(longer), SecAggError);
  EXPECT_THROW(parse_masked_input(bytes), SecAggError);  // another type
  std::vector<std::uint8_t> version = bytes;
  version[1] = 2;
  EXPECT_THROW(parse_unmasking_shares(version), SecAggError);
  std::vector<std::uint8_t> kind = bytes;
  kind[2 + 8 + 1 + unmasking.identity.size() + 4 + 1 + unmasking.shares[0].owner.size()] = 3;
  EXPECT_THROW(parse_unmasking_shares(kind), SecAggError);

  // A forged count may not make the parser reserve memory for it.
  MaskedInput input{kRound, "a", {1, 2, 3}};
  std::vector<std::uint8_t> forged = serialize(input);
  const std::size_t count_at = 2 + 8 + 1 + 1;
  forged[count_at + 3] = 0x0f;  // 251 million values announced, 3 present
  EXPECT_THROW(parse_masked_input(forged), SecAggError);
  const MaskedInput input_back = parse_masked_input(serialize(input));
  EXPECT_EQ(input_back.masked, input.masked);

  // The documented sizes (privacy/README.md): 2 + 8 header, identity 1 + its bytes.
  EXPECT_EQ(serialize(round.device[0]->advertise_keys()).size(), 2 + 8 + 1 + 9 + 64u);
  EXPECT_EQ(serialize(round.server->shares_for(name(0))).size(), 2 + 8 + 4 + 3 * (1 + 9 + 1 + 9 + 4 + 81u));
  EXPECT_EQ(bytes.size(), 2 + 8 + 1 + 9 + 4 + 4 * (1 + 9 + 1 + 1 + 32u));
  EXPECT_EQ(serialize(MaskedInput{kRound, name(0), std::vector<std::uint32_t>(10)}).size(), 2 + 8 + 1 + 9 + 4 + 40u);
}

// The subset every device and the server compute: exactly `length` distinct ascending
// indices, the same for the same seed, another for another session; values pinned so that an
// aarch64 worker (this test under QEMU in the aarch64 tree) agrees with an x86-64 server.
TEST(SecureAggregationSubset, TheGeneratorIsDeterministicExactAndSpreadOut) {
  EXPECT_EQ(subset_length(0.1, 1000), 100u);
  EXPECT_EQ(subset_length(1e-9, 1000), 1u);
  EXPECT_EQ(subset_length(1, 1000), 1000u);
  EXPECT_THROW(subset_length(0, 1000), std::invalid_argument);
  EXPECT_THROW(subset_length(1.5, 1000), std::invalid_argument);
  EXPECT_THROW(subset_indices(1, 10, 11), std::invalid_argument);
  EXPECT_THROW(subset_indices(1, 10, 0), std::invalid_argument);
  const std::uint64_t seed = subset_seed(0x5eed, std::uint64_t{3} << 16);
  EXPECT_NE(seed, subset_seed(0x5eed, (std::uint64_t{3} << 16) | 1));
  EXPECT_NE(seed, subset_seed(0x5eee, std::uint64_t{3} << 16));
  const auto indices = subset_indices(seed, 100000, 10000);
  ASSERT_EQ(indices.size(), 10000u);
  for (std::size_t k = 1; k < indices.size(); ++k) ASSERT_LT(indices[k - 1], indices[k]);
  EXPECT_LT(indices.back(), 100000u);
  EXPECT_EQ(indices, subset_indices(seed, 100000, 10000));
  EXPECT_NE(indices, subset_indices(seed + 1, 100000, 10000));
  // Spread: each tenth of the vector holds about a tenth of the subset (binomial σ ≈ 30).
  std::vector<int> per_tenth(10, 0);
  for (const auto i : indices) per_tenth[i / 10000]++;
  for (const int count : per_tenth) EXPECT_NEAR(count, 1000, 150);
  EXPECT_EQ(subset_indices(1, 5, 5), (std::vector<std::uint32_t>{0, 1, 2, 3, 4}));
  // As an independent Python SplitMix64 + Algorithm S computes them.
  EXPECT_EQ(subset_indices(42, 1000, 5), (std::vector<std::uint32_t>{171, 215, 564, 718, 808}));
}

// ---------------------------------------------------------------- SecAgg+: k neighbours

// The 20-device rounds above with k = 12 neighbours and t = 7 (a majority of a neighbourhood's
// 13 holders): with 6 of 20 gone, every neighbourhood keeps at least 12 − 5 = 7 of a dropped
// device's neighbours, and a surviving device at least 6 of its own and itself.
void use_neighbours(Round& round) {
  round.neighbours = 12;
  round.threshold = 7;
}

TEST(SecAggPlus, ThirtyPercentDropAfterSendingTheirMaskedInputs) {
  Round round;
  use_neighbours(round);
  round.drop_after_input = {1, 4, 7, 10, 13, 16};
  const std::vector<std::uint32_t> sum = round.run();
  EXPECT_EQ(round.server->survivors().size(), 20u);
  EXPECT_EQ(sum, round.plain_sum());
  // A device's work and bytes follow k, not n: its directory lists itself and 12 neighbours,
  // and it sealed 12 shares.
  EXPECT_EQ(round.shares_sent, 12u);
  EXPECT_EQ(round.directory_bytes, 2 + 8 + 4 + 4 + 4 + 8 + 4 + 4 + 13 * (4 + 1 + 9 + 64u));
}

TEST(SecAggPlus, ThirtyPercentDropBeforeSendingTheirMaskedInputs) {
  Round round;
  use_neighbours(round);
  round.drop_before_input = {0, 3, 6, 9, 12, 19};  // their masks come off through s^SK, per neighbour
  const std::vector<std::uint32_t> sum = round.run();
  EXPECT_EQ(round.masked.size(), 14u);
  EXPECT_EQ(round.server->share_senders().size(), 20u);
  EXPECT_EQ(sum, round.plain_sum());
}

TEST(SecAggPlus, DropsAtEveryStepTogether) {
  Round round;
  use_neighbours(round);
  round.drop_before_shares = {2, 17};
  round.drop_before_input = {5, 8};
  round.drop_after_input = {0, 14};
  const std::vector<std::uint32_t> sum = round.run();
  EXPECT_EQ(round.server->share_senders().size(), 18u);
  EXPECT_EQ(round.masked.size(), 16u);
  EXPECT_EQ(sum, round.plain_sum());
  std::vector<std::uint32_t> everyone(round.length, 0);
  for (int i = 0; i < 20; ++i) {
    for (std::uint32_t k = 0; k < round.length; ++k) everyone[k] += round.quantized[i][k];
  }
  EXPECT_NE(sum, everyone);
}

// Without a neighbour's self-mask or pairwise masks the sum is wrong: the masks really are
// pairwise on the graph (a sum that came out right with no unmasking would prove nothing).
TEST(SecAggPlus, TheMaskedSumIsNotTheSumBeforeUnmasking) {
  Round round;
  use_neighbours(round);
  round.run_until_survivors();
  std::vector<std::uint32_t> masked_sum(round.length, 0);
  for (const auto& [i, y] : round.masked) {
    for (std::uint32_t k = 0; k < round.length; ++k) masked_sum[k] += y[k];
  }
  EXPECT_NE(masked_sum, round.plain_sum());
}

// 100 devices, k = 40, t = 21 (the rule of secagg_graph.h would take everyone at 30%
// dropouts: see NeighbourParameters), 30 of them gone at the three steps together.
TEST(SecAggPlus, HundredDevicesWithThirtyPercentDroppingAtEveryStep) {
  Round round;
  round.devices = 100;
  round.neighbours = 40;
  round.threshold = 21;
  round.length = 200;
  for (int i = 0; i < 100; i += 10) round.drop_before_shares.insert(i + 3);  // 10
  for (int i = 0; i < 100; i += 10) round.drop_before_input.insert(i + 6);   // 10
  for (int i = 0; i < 100; i += 10) round.drop_after_input.insert(i + 9);    // 10
  const std::vector<std::uint32_t> sum = round.run();
  EXPECT_EQ(round.server->key_holders().size(), 100u);
  EXPECT_EQ(round.server->share_senders().size(), 90u);
  EXPECT_EQ(round.masked.size(), 80u);
  EXPECT_EQ(sum, round.plain_sum());
  EXPECT_EQ(round.shares_sent, 40u);
}

// The rule that the server never gets both secrets of a device holds per neighbourhood: a
// device answers only a list of its own neighbours (with itself), once; the server refuses a
// share of a secret of a device that is not the sender's neighbour; t must be a majority of
// the k + 1 holders, so two disjoint groups of them cannot both reach it.
// On a cycle (k = 2) two survivors missing at non-adjacent places split the others in two
// groups; unmasking would give the server each group's sum, so the input step refuses to
// close (before any secret is revealed).
TEST(SecAggPlus, SurvivorsInSeveralGroupsAreNotUnmasked) {
  Round round;
  round.devices = 10;
  round.neighbours = 2;
  round.threshold = 2;
  round.prepare();
  const NeighbourGraph cycle(10, 2, round.graph_seed);  // the graph the server will draw
  const std::vector<std::uint32_t> beside = cycle.neighbours(0);
  // Device 0's two neighbours leave before their input: 0 is cut off from the rest.
  round.drop_before_input = {static_cast<int>(beside[0]), static_cast<int>(beside[1])};
  try {
    round.run_until_survivors();
    FAIL() << "a split graph's survivors were unmasked";
  } catch (const SecAggError& error) {
    EXPECT_NE(std::string(error.what()).find("fall into 2 groups"), std::string::npos) << error.what();
  }
  EXPECT_EQ(cycle.components(std::vector<bool>(10, true)), 1u);
}

TEST(SecAggPlus, NeverBothSecretsPerNeighbourhood) {
  Round round;
  use_neighbours(round);
  round.drop_before_input = {3};
  round.run_until_survivors();
  const NeighbourGraph& graph = *round.server->graph();
  const std::vector<std::uint32_t> around = graph.neighbours(0);
  int stranger = 1;
  while (std::binary_search(around.begin(), around.end(), static_cast<std::uint32_t>(stranger))) ++stranger;
  // The whole U3 names devices that are not device 0's neighbours: refused.
  EXPECT_THROW(round.device[0]->unmasking_shares(round.survivors), SecAggError);
  const SurvivorList mine = round.server->survivors_for(name(0));
  EXPECT_LE(mine.survivors.size(), 13u);
  for (const std::string& survivor : mine.survivors) {
    const auto index = static_cast<std::uint32_t>(std::stoi(survivor.substr(7)));
    EXPECT_TRUE(index == 0 || graph.adjacent(0, index)) << survivor;
  }
  UnmaskingShares answer = round.device[0]->unmasking_shares(mine);
  EXPECT_THROW(round.device[0]->unmasking_shares(mine), SecAggError);  // once
  // Claiming a share of a non-neighbour's secret (at any point) is refused by the server.
  UnmaskingShares forged = answer;
  forged.shares[0].owner = name(stranger);
  EXPECT_THROW(round.server->receive_unmasking_shares(name(0), forged), SecAggError);
  round.server->receive_unmasking_shares(name(0), answer);
  // Thresholds: a majority of k + 1 = 13 holders, whatever n.
  EXPECT_THROW(check_round_threshold({kRound, 6, 10, 12, 1}, 20), SecAggError);
  EXPECT_NO_THROW(check_round_threshold({kRound, 7, 10, 12, 1}, 20));
  EXPECT_THROW(check_round_threshold({kRound, 7, 10, 11, 1}, 20), SecAggError);  // odd k
  EXPECT_NO_THROW(check_round_threshold({kRound, 7, 10, 12, 1}, 1000));  // above 255 devices
  EXPECT_THROW(check_round_threshold({kRound, 7, 10, 0, 1}, 1000), SecAggError);  // everyone: 255
  EXPECT_NO_THROW(check_round_threshold({kRound, 11, 10, 30, 1}, 20));  // k ≥ n − 1: everyone, t > n/2
}

TEST(SecAggPlus, DevicesRefuseADirectoryThatIsNotTheirNeighbourhood) {
  Round round;
  use_neighbours(round);
  round.prepare();
  for (int i = 0; i < round.devices; ++i) round.server->receive_keys(name(i), round.device[i]->advertise_keys());
  const KeyDirectory whole = round.server->close_key_advertisement();
  const KeyDirectory mine = round.server->directory_for(name(0));
  ASSERT_EQ(mine.devices.size(), 13u);
  ASSERT_EQ(mine.key_holders, 20u);
  KeyDirectory missing = mine;  // a neighbour left out
  missing.devices.erase(missing.devices.begin() + (mine.positions[0] == 0 ? 1 : 0));
  missing.positions.erase(missing.positions.begin() + (mine.positions[0] == 0 ? 1 : 0));
  try {
    round.device[0]->share_keys(missing);
    FAIL() << "a directory without a neighbour was taken";
  } catch (const SecAggError& error) {
    EXPECT_NE(std::string(error.what()).find("a neighbour of this device"), std::string::npos) << error.what();
  }
  KeyDirectory shifted = mine;  // positions that are not U1's order
  std::swap(shifted.positions[1], shifted.positions[2]);
  EXPECT_THROW(round.device[0]->share_keys(shifted), SecAggError);
  KeyDirectory unpositioned = mine;  // a part of U1 without positions
  unpositioned.positions.clear();
  EXPECT_THROW(round.device[0]->share_keys(unpositioned), SecAggError);
  KeyDirectory low = mine;
  low.config.threshold = 6;  // not a majority of 13
  EXPECT_THROW(round.device[0]->share_keys(low), SecAggError);
  // The whole of U1 (with k and the seed) is taken: the device picks its neighbours from it,
  // and seals the same number of shares.
  EXPECT_EQ(round.device[1]->share_keys(whole).shares.size(), 12u);
  const EncryptedShares shares = round.device[0]->share_keys(mine);
  EXPECT_EQ(shares.shares.size(), 12u);
  // The server refuses shares addressed to a device that is not the sender's neighbour.
  const NeighbourGraph& graph = *round.server->graph();
  EncryptedShares misaddressed = shares;
  std::uint32_t stranger = 1;
  while (graph.adjacent(0, stranger)) ++stranger;
  misaddressed.shares[0].recipient = name(static_cast<int>(stranger));
  EXPECT_THROW(round.server->receive_shares(name(0), misaddressed), SecAggError);
  EncryptedShares fewer = shares;
  fewer.shares.pop_back();
  EXPECT_THROW(round.server->receive_shares(name(0), fewer), SecAggError);
  EXPECT_NO_THROW(round.server->receive_shares(name(0), shares));
}

TEST(SecAggPlusMessages, TheNeighbourDirectoryRoundTripsAndRefusesDamage) {
  Round round;
  use_neighbours(round);
  round.prepare();
  for (int i = 0; i < round.devices; ++i) round.server->receive_keys(name(i), round.device[i]->advertise_keys());
  round.server->close_key_advertisement();
  const KeyDirectory mine = round.server->directory_for(name(5));
  const std::vector<std::uint8_t> bytes = serialize(mine);
  EXPECT_EQ(bytes[0], static_cast<std::uint8_t>(MessageType::kNeighbourKeyDirectory));
  const KeyDirectory back = parse_key_directory(bytes);
  EXPECT_EQ(back.config.neighbours, 12u);
  EXPECT_EQ(back.config.graph_seed, round.graph_seed);
  EXPECT_EQ(back.config.threshold, 7u);
  EXPECT_EQ(back.key_holders, 20u);
  EXPECT_EQ(back.positions, mine.positions);
  EXPECT_EQ(back.devices, mine.devices);
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_THROW(parse_key_directory(std::span(bytes).first(cut)), SecAggError) << cut;
  }
  std::vector<std::uint8_t> holders = bytes;  // |U1| of 1: no graph
  holders[2 + 8 + 4 + 4 + 4 + 8] = 1;
  EXPECT_THROW(parse_key_directory(holders), SecAggError);
  // Without neighbours the directory's bytes are today's (type 2).
  EXPECT_EQ(serialize(KeyDirectory{{kRound, 3, 6}, {round.device[0]->advertise_keys()}, 0, {}})[0],
            static_cast<std::uint8_t>(MessageType::kKeyDirectory));
}

}  // namespace
}  // namespace edgetrain::privacy
