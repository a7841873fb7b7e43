// The discrete distributed noise (privacy/skellam.h): the Poisson and Skellam draws against
// their distributions (mean, variance, and every probability of Poisson(20) against its pmf
// computed here from lgamma), the plan's scale and bounds, and the ring: c devices' encodings
// summed mod 2^32 and decoded carry noise of variance c·v_d/γ², exactly integer, unbiased
// rounding within Δ2, and refusals of what could wrap.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "privacy/quantize.h"
#include "privacy/secagg_crypto.h"
#include "privacy/skellam.h"

namespace edgetrain::privacy {
namespace {

struct Moments {
  double mean = 0, variance = 0;
};
template <typename Draw>
Moments moments(std::size_t n, Draw draw) {
  double sum = 0, squares = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(draw());
    sum += x;
    squares += x * x;
  }
  const double mean = sum / static_cast<double>(n);
  return {mean, squares / static_cast<double>(n) - mean * mean};
}

// Means on both sides of the switch from inversion to transformed rejection (10), and one as
// large as a device's share (4096²/2): the sample mean within 6 standard errors of λ, the
// sample variance within 6 of its own (√(2/n)·λ for a Poisson of large λ, and the excess
// kurtosis 1/λ added for the small ones).
TEST(Skellam, PoissonDrawsHaveTheirMeanAndVariance) {
  SecureRandom random;
  const RandomBits bits = SecureBits(random);
  constexpr std::size_t kDraws = 100000;
  for (const double lambda : {0.7, 3.0, 9.9, 10.0, 57.5, 8388608.0}) {
    const Moments m = moments(kDraws, [&] { return sample_poisson(lambda, bits); });
    const double n = kDraws;
    EXPECT_NEAR(m.mean, lambda, 6 * std::sqrt(lambda / n)) << lambda;
    const double variance_error = lambda * std::sqrt((2 + 1 / lambda) / n);
    EXPECT_NEAR(m.variance, lambda, 6 * variance_error) << lambda;
  }
  EXPECT_EQ(sample_poisson(0, bits), 0);
  EXPECT_THROW(sample_poisson(-1, bits), std::invalid_argument);
  EXPECT_THROW(sample_poisson(NAN, bits), std::invalid_argument);
}

// Every probability of Poisson(20) (transformed rejection) from 4 to 45 against the pmf,
// each count within 6 standard errors of n·p: a wrong constant of the rejection step bends the
// distribution without moving its first two moments much.
TEST(Skellam, PoissonDrawsFollowThePmf) {
  SecureRandom random;
  const RandomBits bits = SecureBits(random);
  constexpr double kLambda = 20;
  constexpr std::size_t kDraws = 200000;
  std::vector<double> counts(100, 0);
  for (std::size_t i = 0; i < kDraws; ++i) {
    const std::int64_t k = sample_poisson(kLambda, bits);
    ASSERT_GE(k, 0);
    if (k < 100) counts[static_cast<std::size_t>(k)] += 1;
  }
  for (int k = 4; k <= 45; ++k) {
    const double p = std::exp(-kLambda + k * std::log(kLambda) - std::lgamma(k + 1.0));
    const double expected = p * kDraws;
    EXPECT_NEAR(counts[k], expected, 6 * std::sqrt(expected * (1 - p)) + 1) << "k = " << k;
  }
}

TEST(Skellam, SkellamDrawsAreCentredWithTheirVariance) {
  SecureRandom random;
  const RandomBits bits = SecureBits(random);
  constexpr std::size_t kDraws = 100000;
  for (const double variance : {1.0, 40.0, kSkellamDeviceStddev * kSkellamDeviceStddev}) {
    const Moments m = moments(kDraws, [&] { return sample_skellam(variance, bits); });
    EXPECT_NEAR(m.mean, 0, 6 * std::sqrt(variance / kDraws)) << variance;
    // Excess kurtosis of Sk(v) is 1/v.
    EXPECT_NEAR(m.variance, variance, 6 * variance * std::sqrt((2 + 1 / variance) / kDraws)) << variance;
  }
}

// γ makes the sum over c devices a Skellam of variance (z·γS)²: the Gaussian of multiplier z
// it replaces. Δ2 is the paper's rounding bound, a little above γS; Δ1 = min(Δ2², √d·Δ2).
TEST(Skellam, ThePlanScalesToTheNoiseMultiplier) {
  const SkellamPlan plan = skellam_plan(0.8, 0.5, 10, 101770);
  EXPECT_NEAR(plan.central_variance(), std::pow(0.8 * plan.scale * 0.5, 2), 1e-6 * plan.central_variance());
  EXPECT_DOUBLE_EQ(plan.device_variance, kSkellamDeviceStddev * kSkellamDeviceStddev);
  const double scaled_clip = plan.scale * 0.5, d = 101770;
  EXPECT_DOUBLE_EQ(plan.l2_bound * plan.l2_bound,
                   scaled_clip * scaled_clip + d / 4 +
                       std::sqrt(2 * std::log(1 / kRoundingBeta)) * (scaled_clip + std::sqrt(d) / 2));
  EXPECT_GT(plan.l2_bound, scaled_clip);
  EXPECT_LT(plan.l2_bound, scaled_clip * 1.001);  // the rounding costs little at this scale
  EXPECT_DOUBLE_EQ(plan.l1_bound, std::sqrt(d) * plan.l2_bound);
  const SkellamPlan one_value = skellam_plan(1, 1, 2, 1);  // √d·Δ2 = Δ2 < Δ2²
  EXPECT_DOUBLE_EQ(one_value.l1_bound, one_value.l2_bound);
  EXPECT_THROW(skellam_plan(0, 1, 10, 5), std::invalid_argument);
  EXPECT_THROW(skellam_plan(1, -1, 10, 5), std::invalid_argument);
  EXPECT_THROW(skellam_plan(1, 1, 0, 5), std::invalid_argument);
  EXPECT_THROW(skellam_plan(1, 1, 10, 0), std::invalid_argument);
  EXPECT_EQ(skellam_ring_problem(plan.scale, 0.5, plan.device_variance, 255), "");
  // A tiny noise multiplier makes γS large: past what 255 devices may sum.
  const SkellamPlan quiet = skellam_plan(0.001, 1, 255, 1000);
  EXPECT_NE(skellam_ring_problem(quiet.scale, 1, quiet.device_variance, 255).find("past the"), std::string::npos);
  EXPECT_EQ(skellam_announcement_problem(plan.scale, plan.device_variance, plan.l2_bound, 0.5), "");
  EXPECT_NE(skellam_announcement_problem(plan.scale, plan.device_variance, scaled_clip * 0.9, 0.5), "");
  EXPECT_NE(skellam_announcement_problem(-plan.scale, plan.device_variance, plan.l2_bound, 0.5), "");
  EXPECT_NE(skellam_announcement_problem(plan.scale, NAN, plan.l2_bound, 0.5), "");
}

// c and 2c devices' clipped vectors encoded, summed in the ring and decoded: the sum minus the
// clean sum has mean 0 and variance (devices·v_d + the rounding's ≤ devices/4)/γ², within 6
// standard errors over 20,000 values; each rounded vector's norm is within Δ2.
TEST(Skellam, TheRingSumCarriesTheDevicesSkellamNoise) {
  constexpr double kZ = 1.1, kClip = 0.5;
  constexpr std::uint32_t kCalibrated = 5;
  constexpr std::size_t kValues = 20000;
  const SkellamPlan plan = skellam_plan(kZ, kClip, kCalibrated, kValues);
  SecureRandom random;
  const RandomBits bits = SecureBits(random);
  std::mt19937 rng(5);
  for (const std::uint32_t devices : {kCalibrated, 2 * kCalibrated}) {
    std::vector<std::uint32_t> ring(kValues, 0);
    std::vector<double> clean(kValues, 0);
    for (std::uint32_t d = 0; d < devices; ++d) {
      std::vector<float> delta(kValues);
      std::normal_distribution<float> normal(0, 1);
      double squares = 0;
      for (float& v : delta) {
        v = normal(rng);
        squares += double{v} * v;
      }
      for (std::size_t i = 0; i < kValues; ++i) {
        delta[i] = static_cast<float>(delta[i] * kClip / std::sqrt(squares) * (1 - 1e-6));
        clean[i] += delta[i];
      }
      const auto encoded = skellam_encode(delta, plan.scale, plan.device_variance, plan.l2_bound, devices, bits);
      // Without noise the same call gives the rounded vector: within Δ2, within 1 of γx.
      const auto rounded = skellam_encode(delta, plan.scale, 0, plan.l2_bound, devices, bits);
      double rounded_squares = 0;
      for (std::size_t i = 0; i < kValues; ++i) {
        const double r = static_cast<std::int32_t>(rounded[i]);
        ASSERT_LT(std::fabs(r - delta[i] * plan.scale), 1.0) << i;
        rounded_squares += r * r;
      }
      EXPECT_LE(std::sqrt(rounded_squares), plan.l2_bound);
      for (std::size_t i = 0; i < kValues; ++i) ring[i] += encoded[i];
    }
    const std::vector<double> sum = skellam_decode(ring, plan.scale);
    double mean = 0, squares = 0;
    for (std::size_t i = 0; i < kValues; ++i) {
      const double noise = (sum[i] - clean[i]) * plan.scale;  // in integer units
      mean += noise;
      squares += noise * noise;
    }
    mean /= kValues;
    const double variance = squares / kValues - mean * mean;
    const double expected = devices * plan.device_variance;  // + at most devices/4 of rounding
    EXPECT_NEAR(variance, expected, 6 * expected * std::sqrt(2.0 / kValues) + devices / 4.0) << devices;
    EXPECT_NEAR(mean, 0, 6 * std::sqrt(expected / kValues)) << devices;
    // In the clip's units: the sum's noise is z·S·√(devices/c), the Gaussian's it replaces.
    EXPECT_NEAR(std::sqrt(variance) / plan.scale, kZ * kClip * std::sqrt(double(devices) / kCalibrated),
                0.05 * kZ * kClip);
  }
}

// A delta not clipped to S cannot be rounded within Δ2 (refused, not sent); a value whose
// noised integer passes K = ⌊(2^31 − 1)/N⌋ is refused, naming its index; the ring sum of N
// values at +K and of N at −K decodes without wrapping.
TEST(Skellam, EncodingRefusesWhatCouldWrapOrBreakTheBound) {
  SecureRandom random;
  const RandomBits bits = SecureBits(random);
  const SkellamPlan plan = skellam_plan(1, 1, 4, 2);
  const std::vector<float> unclipped = {3.0f, 0.0f};
  EXPECT_THROW(skellam_encode(unclipped, plan.scale, plan.device_variance, plan.l2_bound, 4, bits),
               std::invalid_argument);
  const std::vector<float> not_finite = {NAN, 0.0f};
  EXPECT_THROW(skellam_encode(not_finite, plan.scale, plan.device_variance, plan.l2_bound, 4, bits),
               std::invalid_argument);
  constexpr std::uint32_t kDevices = 20;
  const double limit = quantization_limit(kDevices);
  const double scale_at_limit = limit / 1.0;  // γ·1 = K: no room left for noise
  const std::vector<float> at_clip = {1.0f, 0.0f};
  try {
    skellam_encode(at_clip, scale_at_limit * 1.01, 1e6, scale_at_limit * 2, kDevices, bits);
    ADD_FAILURE() << "a value past K was encoded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("value 0"), std::string::npos) << e.what();
  }
  const auto top = skellam_encode(at_clip, scale_at_limit, 0, scale_at_limit + 1, kDevices, bits);
  const std::vector<float> bottom_values = {-1.0f, 0.0f};
  const auto bottom = skellam_encode(bottom_values, scale_at_limit, 0, scale_at_limit + 1, kDevices, bits);
  std::vector<std::uint32_t> up(2, 0), down(2, 0);
  for (std::uint32_t d = 0; d < kDevices; ++d)
    for (int i = 0; i < 2; ++i) up[i] += top[i], down[i] += bottom[i];
  EXPECT_DOUBLE_EQ(skellam_decode(up, scale_at_limit)[0], kDevices * limit / scale_at_limit);
  EXPECT_DOUBLE_EQ(skellam_decode(down, scale_at_limit)[0], -(kDevices * limit / scale_at_limit));
  EXPECT_THROW(skellam_decode(up, 0), std::invalid_argument);
}

}  // namespace
}  // namespace edgetrain::privacy
