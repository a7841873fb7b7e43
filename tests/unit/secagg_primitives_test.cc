// Secure aggregation's building blocks (privacy/secagg_crypto.h, privacy/shamir.h,
// privacy/quantize.h, privacy/distributed_noise.h): known answers where a standard defines
// them, and the properties the protocol relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "privacy/distributed_noise.h"
#include "privacy/quantize.h"
#include "privacy/secagg_crypto.h"
#include "privacy/shamir.h"

namespace edgetrain::privacy {
namespace {

Key32 hex_key(const char* hex) {
  Key32 key{};
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::uint8_t>(std::stoul(std::string(hex + 2 * i, 2), nullptr, 16));
  return key;
}

// RFC 7748 §6.1: Alice's and Bob's keys and their shared secret.
TEST(X25519, MatchesRfc7748Vectors) {
  SecureRandom random;
  const Key32 alice = hex_key("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
  const Key32 bob = hex_key("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb");
  const Key32 alice_public = hex_key("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
  const Key32 bob_public = hex_key("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
  const Key32 shared = hex_key("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
  EXPECT_EQ(x25519_public_key(alice, random), alice_public);
  EXPECT_EQ(x25519_public_key(bob, random), bob_public);
  EXPECT_EQ(x25519_shared_secret(alice, bob_public, random), shared);
  EXPECT_EQ(x25519_shared_secret(bob, alice_public, random), shared);
}

TEST(X25519, BothSidesDeriveTheSameSeedAndAnotherContextAnother) {
  SecureRandom random;
  const X25519KeyPair u = x25519_generate(random);
  const X25519KeyPair v = x25519_generate(random);
  EXPECT_NE(u.private_key, v.private_key);
  EXPECT_EQ(x25519_public_key(u.private_key, random), u.public_key);
  const Key32 at_u = x25519_shared_secret(u.private_key, v.public_key, random);
  const Key32 at_v = x25519_shared_secret(v.private_key, u.public_key, random);
  ASSERT_EQ(at_u, at_v);
  // Each side names the pair in its own order: the seed must not depend on it.
  const Key32 seed_u = derive_pair_seed(at_u, SeedPurpose::kPairwiseMask, 7, "u", "v");
  const Key32 seed_v = derive_pair_seed(at_v, SeedPurpose::kPairwiseMask, 7, "v", "u");
  EXPECT_EQ(seed_u, seed_v);
  EXPECT_NE(seed_u, derive_pair_seed(at_u, SeedPurpose::kPairwiseMask, 8, "u", "v"));      // another round
  EXPECT_NE(seed_u, derive_pair_seed(at_u, SeedPurpose::kShareEncryption, 7, "u", "v"));   // another purpose
  EXPECT_NE(seed_u, derive_pair_seed(at_u, SeedPurpose::kPairwiseMask, 7, "u", "w"));      // another pair
  // The length prefixes keep ("ab", "c") and ("a", "bc") apart.
  EXPECT_NE(derive_pair_seed(at_u, SeedPurpose::kPairwiseMask, 7, "ab", "c"),
            derive_pair_seed(at_u, SeedPurpose::kPairwiseMask, 7, "a", "bc"));
  // A third party's key agrees on another secret.
  const X25519KeyPair w = x25519_generate(random);
  EXPECT_NE(x25519_shared_secret(w.private_key, v.public_key, random), at_u);
}

// The HKDF context layout pinned (computed with Python's cryptography package, HKDF-SHA256,
// info = "edgetrain-secagg-v1" ‖ 0x01 ‖ round 7 ‖ len‖"alice" ‖ len‖"bob"): a later
// implementation of the device must derive the same bytes.
TEST(X25519, PairSeedLayoutIsPinned) {
  const Key32 shared = hex_key("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
  EXPECT_EQ(derive_pair_seed(shared, SeedPurpose::kPairwiseMask, 7, "bob", "alice"),
            hex_key("96c0c5b12d2fddc5b5709cda798d9e28dcf7dc6f51ba14d80bac157939160622"));
}

TEST(X25519, RefusesALowOrderPublicKey) {
  SecureRandom random;
  const X25519KeyPair u = x25519_generate(random);
  const Key32 zero{};  // u = 0: a point of order 4 whose every product is the all-zero secret
  EXPECT_THROW(x25519_shared_secret(u.private_key, zero, random), std::invalid_argument);
}

// The mask generator is ChaCha20 with a zero nonce from block 0 (values checked against
// Python's cryptography package), the same values however long the vector.
TEST(MaskGenerator, IsChaCha20KeyStreamAsLittleEndianWords) {
  Key32 seed{};
  std::iota(seed.begin(), seed.end(), 0);
  const std::vector<std::uint32_t> expected = {0x7d2bfd39, 0x6a19c5d9, 0x7703bd8d, 0x494adcb8,
                                               0x6fd8358a, 0xcc6adebc, 0x4c7dccb2, 0x9224ead8};
  EXPECT_EQ(expand_mask(seed, 8), expected);
  const std::vector<std::uint32_t> long_mask = expand_mask(seed, 3001);  // past several 4 KiB chunks
  const std::vector<std::uint32_t> short_mask = expand_mask(seed, 1500);
  EXPECT_TRUE(std::equal(short_mask.begin(), short_mask.end(), long_mask.begin()));
  std::vector<std::uint32_t> ring(3001, 12345);
  add_mask(ring, seed);
  EXPECT_NE(ring, std::vector<std::uint32_t>(3001, 12345));
  subtract_mask(ring, seed);
  EXPECT_EQ(ring, std::vector<std::uint32_t>(3001, 12345));
  Key32 other = seed;
  other[0] ^= 1;
  EXPECT_NE(expand_mask(other, 8), expected);
}

TEST(ShareEncryption, OpensWhatItSealedAndRefusesAnyChange) {
  SecureRandom random;
  const Key32 key = random.key();
  const Nonce12 nonce{1};
  const std::vector<std::uint8_t> aad = {'a', 'b'};
  const std::vector<std::uint8_t> plaintext(65, 0x5a);
  const std::vector<std::uint8_t> sealed = aead_seal(key, nonce, aad, plaintext);
  ASSERT_EQ(sealed.size(), plaintext.size() + kAeadTagBytes);
  EXPECT_EQ(aead_open(key, nonce, aad, sealed), plaintext);
  std::vector<std::uint8_t> damaged = sealed;
  damaged[3] ^= 1;
  EXPECT_THROW(aead_open(key, nonce, aad, damaged), std::invalid_argument);
  EXPECT_THROW(aead_open(key, nonce, std::vector<std::uint8_t>{'a', 'c'}, sealed), std::invalid_argument);
  EXPECT_THROW(aead_open(key, Nonce12{2}, aad, sealed), std::invalid_argument);
  EXPECT_THROW(aead_open(random.key(), nonce, aad, sealed), std::invalid_argument);
  EXPECT_THROW(aead_open(key, nonce, aad, std::vector<std::uint8_t>(5)), std::invalid_argument);
}

std::vector<ShamirShare> pick(const std::vector<ShamirShare>& shares, const std::vector<std::size_t>& which) {
  std::vector<ShamirShare> out;
  for (std::size_t i : which) out.push_back(shares[i]);
  return out;
}

TEST(Shamir, EveryTSharesReconstructAndTMinusOneDoNot) {
  SecureRandom random;
  const Key32 secret = random.key();
  const std::vector<std::uint8_t> points = {1, 2, 3, 4, 5, 6, 7};
  constexpr unsigned t = 4;
  const std::vector<ShamirShare> shares = shamir_split(secret, t, points, random);
  ASSERT_EQ(shares.size(), points.size());
  const std::vector<std::uint8_t> expected(secret.begin(), secret.end());
  // Every subset of the 7 shares, by bit mask: those of size ≥ t give the secret, those of
  // size t − 1 give something else.
  int tried_t = 0, tried_fewer = 0;
  for (unsigned mask = 1; mask < (1u << points.size()); ++mask) {
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < points.size(); ++i) {
      if (mask >> i & 1) which.push_back(i);
    }
    const std::vector<ShamirShare> subset = pick(shares, which);
    if (which.size() >= t) {
      EXPECT_EQ(shamir_reconstruct(subset, t), expected) << "mask " << mask;
      EXPECT_EQ(shamir_interpolate(subset), expected) << "mask " << mask;
      ++tried_t;
    } else if (which.size() == t - 1) {
      EXPECT_NE(shamir_interpolate(subset), expected) << "mask " << mask;
      EXPECT_THROW(shamir_reconstruct(subset, t), std::invalid_argument);
      ++tried_fewer;
    }
  }
  EXPECT_EQ(tried_t, 35 + 21 + 7 + 1);
  EXPECT_EQ(tried_fewer, 35);
  // A single share says nothing by itself: its bytes are not the secret's.
  EXPECT_NE(shares[0].y, expected);
}

TEST(Shamir, ElevenOfTwentyInAnyOrder) {
  SecureRandom random;
  const Key32 secret = random.key();
  std::vector<std::uint8_t> points(20);
  std::iota(points.begin(), points.end(), 1);
  std::vector<ShamirShare> shares = shamir_split(secret, 11, points, random);
  std::mt19937 shuffle(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(shares.begin(), shares.end(), shuffle);
    const std::vector<ShamirShare> subset(shares.begin(), shares.begin() + 11 + trial % 10);
    EXPECT_EQ(shamir_reconstruct(subset, 11), std::vector<std::uint8_t>(secret.begin(), secret.end()));
  }
}

TEST(Shamir, RefusesWrongOrRepeatedPoints) {
  SecureRandom random;
  const Key32 secret = random.key();
  const std::vector<std::uint8_t> points = {1, 2, 3};
  std::vector<ShamirShare> shares = shamir_split(secret, 2, points, random);
  EXPECT_THROW(shamir_split(secret, 2, std::vector<std::uint8_t>{1, 0, 3}, random), std::invalid_argument);
  EXPECT_THROW(shamir_split(secret, 2, std::vector<std::uint8_t>{1, 2, 2}, random), std::invalid_argument);
  EXPECT_THROW(shamir_split(secret, 4, points, random), std::invalid_argument);
  EXPECT_THROW(shamir_split(secret, 0, points, random), std::invalid_argument);
  std::vector<ShamirShare> repeated = {shares[0], shares[0], shares[1]};
  EXPECT_THROW(shamir_reconstruct(repeated, 2), std::invalid_argument);
  EXPECT_THROW(shamir_interpolate(repeated), std::invalid_argument);
  // Repeated beyond the first t is refused too: the set is wrong, not just its tail.
  std::vector<ShamirShare> tail = {shares[0], shares[1], shares[1]};
  EXPECT_THROW(shamir_reconstruct(tail, 2), std::invalid_argument);
  std::vector<ShamirShare> zero = {shares[0], shares[1]};
  zero[1].x = 0;
  EXPECT_THROW(shamir_interpolate(zero), std::invalid_argument);
  std::vector<ShamirShare> uneven = {shares[0], shares[1]};
  uneven[1].y.pop_back();
  EXPECT_THROW(shamir_interpolate(uneven), std::invalid_argument);
  EXPECT_THROW(shamir_interpolate(std::vector<ShamirShare>{}), std::invalid_argument);
}

// The documented bound: scale = ⌊(2^31 − 1)/N⌋ / S, error ≤ 0.5/scale to nearest.
TEST(Quantize, RoundTripWithinHalfAStep) {
  constexpr double kClip = 2.5;
  constexpr std::uint32_t kDevices = 20;
  const double scale = quantization_scale(kClip, kDevices);
  EXPECT_EQ(quantization_limit(kDevices), 107374182u);
  EXPECT_DOUBLE_EQ(scale, 107374182 / kClip);
  std::mt19937 draw(1);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> delta(5000);
  for (float& value : delta) value = normal(draw);
  const double norm = std::sqrt(std::inner_product(delta.begin(), delta.end(), delta.begin(), 0.0));
  for (float& value : delta) value = static_cast<float>(value * kClip / norm);  // norm = S (to a rounding)
  const std::vector<double> back = dequantize(quantize(delta, kClip, kDevices, Rounding::kNearest), kClip, kDevices);
  double worst = 0;
  for (std::size_t i = 0; i < delta.size(); ++i) worst = std::max(worst, std::abs(back[i] - delta[i]));
  EXPECT_LE(worst, 0.5 / scale * (1 + 1e-9));
  EXPECT_GT(worst, 0.1 / scale);  // the values were not all on the grid by chance
}

TEST(Quantize, StochasticRoundingIsUnbiasedAndWithinOneStep) {
  SecureRandom random;
  constexpr double kClip = 1;
  constexpr std::uint32_t kDevices = 20;
  const double scale = quantization_scale(kClip, kDevices);
  // 100,000 equal values 0.3 of a step above the grid point 1000: rounded up 30% of the time.
  const std::size_t n = 100000;
  // (Their norm, about 0.003, is well inside S.)
  const std::vector<float> delta(n, static_cast<float>((1000 + 0.3) / scale));
  const double target = double{delta[0]} * scale;  // 1000.3 to a float's rounding
  const std::vector<std::uint32_t> q = quantize(delta, kClip, kDevices, Rounding::kStochastic, &random);
  double mean = 0;
  for (std::uint32_t v : q) {
    const double integer = static_cast<std::int32_t>(v);
    EXPECT_LT(std::abs(integer - target), 1.0);
    mean += integer / n;
  }
  // The standard deviation of the mean of n Bernoulli(p) draws is sqrt(p(1 − p)/n) ≤ 0.0016.
  EXPECT_NEAR(mean, target, 5 * 0.0016);
  EXPECT_THROW(quantize(delta, kClip, kDevices, Rounding::kStochastic, nullptr), std::invalid_argument);
}

// N devices whose deltas have norm S, all of it on one coordinate, sum to ±N·S without
// wrapping; one more device would wrap: the bound is the one documented, not a looser one.
TEST(Quantize, NoWrapAtNDevicesOfNormS) {
  constexpr double kClip = 3;
  for (std::uint32_t devices : {1u, 2u, 20u, 1000u}) {
    const double scale = quantization_scale(kClip, devices);
    const std::vector<float> up = {static_cast<float>(kClip), 0};
    const std::vector<float> down = {static_cast<float>(-kClip), 0};
    const std::vector<std::uint32_t> q_up = quantize(up, kClip, devices, Rounding::kNearest);
    const std::vector<std::uint32_t> q_down = quantize(down, kClip, devices, Rounding::kNearest);
    std::vector<std::uint32_t> sum_up(2, 0), sum_down(2, 0);
    for (std::uint32_t d = 0; d < devices; ++d) {
      for (int i = 0; i < 2; ++i) {
        sum_up[i] += q_up[i];
        sum_down[i] += q_down[i];
      }
    }
    const std::vector<double> total_up = dequantize(sum_up, kClip, devices);
    const std::vector<double> total_down = dequantize(sum_down, kClip, devices);
    EXPECT_NEAR(total_up[0], devices * kClip, devices * 0.5 / scale) << devices;
    EXPECT_NEAR(total_down[0], -(devices * kClip), devices * 0.5 / scale) << devices;
    EXPECT_EQ(total_up[1], 0);
    if (devices >= 2) {
      sum_up[0] += q_up[0];  // device N + 1
      EXPECT_LT(dequantize(sum_up, kClip, devices)[0], 0) << "N + 1 devices should wrap at N = " << devices;
    }
  }
}

TEST(Quantize, RefusesWhatWasNotClipped) {
  EXPECT_THROW(quantize(std::vector<float>{0.8f, 0.8f}, 1, 10, Rounding::kNearest), std::invalid_argument);
  EXPECT_THROW(quantize(std::vector<float>{NAN}, 1, 10, Rounding::kNearest), std::invalid_argument);
  EXPECT_THROW(quantize(std::vector<float>{INFINITY}, 1, 10, Rounding::kNearest), std::invalid_argument);
  EXPECT_THROW(quantize(std::vector<float>{0.1f}, 0, 10, Rounding::kNearest), std::invalid_argument);
  EXPECT_THROW(quantize(std::vector<float>{0.1f}, 1, 0, Rounding::kNearest), std::invalid_argument);
  EXPECT_NO_THROW(quantize(std::vector<float>{0.6f, 0.8f}, 1, 10, Rounding::kNearest));  // norm 1 to a rounding
}

// DP-FedAvg's distributed noise: c devices' shares, each N(0, (z·S/√c)²) added to a clipped
// delta, quantized in [−B, B] and summed in the ring, read back as the clean sum plus noise
// of variance z²S² (u survivors: (u/c)·z²S², more than needed); over 20,000 values the
// sample variance is within 6 of its standard errors (√(2/20000) = 1%) of that.
TEST(DistributedNoise, TheSumOfTheSurvivorsSharesHasTheCalibratedVariance) {
  constexpr double kZ = 1.1, kClip = 0.5;
  constexpr std::uint32_t kCalibrated = 5;
  constexpr std::size_t kValues = 20000;
  const double stddev = device_noise_stddev(kZ, kClip, kCalibrated);
  EXPECT_DOUBLE_EQ(stddev, kZ * kClip / std::sqrt(5.0));
  const double bound = noised_value_bound(kClip, stddev);
  EXPECT_EQ(device_noise_problem(kClip, stddev, bound), "");
  SecureRandom random;
  std::mt19937 rng(3);
  for (const std::uint32_t survivors : {kCalibrated, 2 * kCalibrated}) {
    std::vector<std::uint32_t> ring(kValues, 0);
    std::vector<double> clean(kValues, 0);
    for (std::uint32_t d = 0; d < survivors; ++d) {
      std::vector<float> delta(kValues);
      std::normal_distribution<float> normal(0, 1);
      double squares = 0;
      for (float& v : delta) {
        v = normal(rng);
        squares += double{v} * v;
      }
      for (std::size_t i = 0; i < kValues; ++i) {
        delta[i] = static_cast<float>(delta[i] * kClip / std::sqrt(squares));
        clean[i] += delta[i];
      }
      add_device_noise(delta, stddev, random);
      const auto quantized = quantize_bounded(delta, bound, survivors, Rounding::kNearest);
      for (std::size_t i = 0; i < kValues; ++i) ring[i] += quantized[i];
    }
    const std::vector<double> sum = dequantize(ring, bound, survivors);
    double mean = 0, squares = 0;
    for (std::size_t i = 0; i < kValues; ++i) {
      const double noise = sum[i] - clean[i];
      mean += noise;
      squares += noise * noise;
    }
    mean /= kValues;
    const double variance = squares / kValues - mean * mean;
    const double expected = kZ * kZ * kClip * kClip * survivors / kCalibrated;
    EXPECT_NEAR(variance, expected, 6 * expected * std::sqrt(2.0 / kValues)) << survivors << " survivors";
    EXPECT_NEAR(mean, 0, 6 * std::sqrt(expected / kValues)) << survivors << " survivors";
  }
}

// The ring's range covers the clip and ten standard deviations of the noise: N devices at the
// bound sum without wrapping; a range short of it is a problem the device names; a value past
// the bound is refused rather than quantized (it could wrap the sum).
TEST(DistributedNoise, TheRingHoldsTheNoiseTailsAndRefusesAValuePastThem) {
  const double stddev = device_noise_stddev(1, 1, 4);  // 0.5
  const double bound = noised_value_bound(1, stddev);
  EXPECT_DOUBLE_EQ(bound, 1 + kNoiseTailStddevs * 0.5);
  EXPECT_NE(device_noise_problem(1, stddev, bound * 0.99).find("could wrap"), std::string::npos);
  EXPECT_NE(device_noise_problem(1, NAN, bound), "");
  EXPECT_NE(device_noise_problem(1, -0.1, bound), "");
  EXPECT_NE(device_noise_problem(1, stddev, INFINITY), "");
  EXPECT_THROW(device_noise_stddev(1, 1, 0), std::invalid_argument);
  EXPECT_THROW(device_noise_stddev(-1, 1, 4), std::invalid_argument);
  EXPECT_THROW(device_noise_stddev(1, 0, 4), std::invalid_argument);
  constexpr std::uint32_t kDevices = 20;
  const std::vector<float> at_bound = {static_cast<float>(bound), static_cast<float>(-bound)};
  const auto q = quantize_bounded(at_bound, bound, kDevices, Rounding::kNearest);
  std::vector<std::uint32_t> ring(2, 0);
  for (std::uint32_t d = 0; d < kDevices; ++d)
    for (int i = 0; i < 2; ++i) ring[i] += q[i];
  const auto sum = dequantize(ring, bound, kDevices);
  EXPECT_NEAR(sum[0], kDevices * bound, 1e-6);
  EXPECT_NEAR(sum[1], -(kDevices * bound), 1e-6);
  try {
    quantize_bounded(std::vector<float>{0.1f, static_cast<float>(1.01 * bound)}, bound, kDevices, Rounding::kNearest);
    ADD_FAILURE() << "a value past the bound was quantized";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("value 1 "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("could wrap"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_bounded(std::vector<float>{NAN}, bound, kDevices, Rounding::kNearest), std::invalid_argument);
  // Values past S (unlike quantize(), which bounds the norm) but within B are taken.
  EXPECT_NO_THROW(quantize_bounded(std::vector<float>{3.0f, -3.0f, 3.0f}, bound, kDevices, Rounding::kNearest));
}

}  // namespace
}  // namespace edgetrain::privacy
