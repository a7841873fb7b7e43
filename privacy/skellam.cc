#include "privacy/skellam.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "privacy/quantize.h"
#include "privacy/secagg_crypto.h"

namespace edgetrain::privacy {

std::uint64_t SecureBits::operator()() {
  constexpr std::size_t kBlockBytes = 4096;
  if (used_ + 8 > block_.size()) {
    block_.resize(kBlockBytes);
    random_.fill(block_);
    used_ = 0;
  }
  std::uint64_t word = 0;
  for (int b = 0; b < 8; ++b) word |= std::uint64_t{block_[used_ + b]} << (8 * b);
  used_ += 8;
  return word;
}

namespace {

// In (0, 1): never 0 (a logarithm takes it) nor 1.
double open_uniform(const RandomBits& bits) {
  return (static_cast<double>(bits() >> 11) + 0.5) * 0x1.0p-53;
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

}  // namespace

std::int64_t sample_poisson(double mean, const RandomBits& bits) {
  if (!(mean >= 0) || !(mean <= 1e15))
    throw std::invalid_argument("Poisson draw: the mean " + number(mean) + " is not in [0, 1e15]");
  if (mean == 0) return 0;
  if (mean < 10) {
    // Inversion: walk the cumulative distribution from 0 (at most a few dozen steps).
    double u = open_uniform(bits);
    double p = std::exp(-mean);
    std::int64_t k = 0;
    while (u > p && k < 1000) {
      u -= p;
      ++k;
      p *= mean / static_cast<double>(k);
    }
    return k;
  }
  // PTRS: Hörmann, "The transformed rejection method for generating Poisson random
  // variables", Insurance: Mathematics and Economics 12 (1993), with his constants.
  const double root = std::sqrt(mean), log_mean = std::log(mean);
  const double b = 0.931 + 2.53 * root;
  const double a = -0.059 + 0.02483 * b;
  const double inverse_alpha = 1.1239 + 1.1328 / (b - 3.4);
  const double v_r = 0.9277 - 3.6224 / (b - 2);
  for (;;) {
    const double u = open_uniform(bits) - 0.5;
    const double v = open_uniform(bits);
    const double us = 0.5 - std::fabs(u);
    const double k = std::floor((2 * a / us + b) * u + mean + 0.43);
    if (us >= 0.07 && v <= v_r) return static_cast<std::int64_t>(k);
    if (k < 0 || (us < 0.013 && v > us)) continue;
    if (std::log(v) + std::log(inverse_alpha) - std::log(a / (us * us) + b) <=
        -mean + k * log_mean - std::lgamma(k + 1))
      return static_cast<std::int64_t>(k);
  }
}

std::int64_t sample_skellam(double variance, const RandomBits& bits) {
  if (!(variance >= 0) || !std::isfinite(variance))
    throw std::invalid_argument("Skellam draw: the variance " + number(variance) + " is not finite and >= 0");
  return sample_poisson(variance / 2, bits) - sample_poisson(variance / 2, bits);
}

double rounded_l2_bound(double scaled_clip, std::uint64_t dimension) {
  const double d = static_cast<double>(dimension);
  const double squared = scaled_clip * scaled_clip + d / 4 +
                         std::sqrt(2 * std::log(1 / kRoundingBeta)) * (scaled_clip + std::sqrt(d) / 2);
  return std::sqrt(squared);
}

SkellamPlan skellam_plan(double noise_multiplier, double clip_norm, std::uint32_t calibrated_survivors,
                         std::uint64_t dimension) {
  if (!(noise_multiplier > 0) || !std::isfinite(noise_multiplier))
    throw std::invalid_argument("Skellam noise: the noise multiplier " + number(noise_multiplier) +
                                " must be positive and finite");
  if (!(clip_norm > 0) || !std::isfinite(clip_norm))
    throw std::invalid_argument("Skellam noise: the clip norm " + number(clip_norm) + " must be positive and finite");
  if (calibrated_survivors == 0) throw std::invalid_argument("Skellam noise: the noise is shared by at least one device");
  if (dimension == 0) throw std::invalid_argument("Skellam noise: the vector has no values");
  SkellamPlan plan;
  plan.calibrated_survivors = calibrated_survivors;
  plan.device_variance = kSkellamDeviceStddev * kSkellamDeviceStddev;
  plan.scale = kSkellamDeviceStddev * std::sqrt(static_cast<double>(calibrated_survivors)) /
               (noise_multiplier * clip_norm);
  plan.l2_bound = rounded_l2_bound(plan.scale * clip_norm, dimension);
  // Integers: |v| ≤ v², so ‖v‖₁ ≤ ‖v‖₂²; and ‖v‖₁ ≤ √d·‖v‖₂ for any vector.
  plan.l1_bound = std::min(plan.l2_bound * plan.l2_bound, std::sqrt(static_cast<double>(dimension)) * plan.l2_bound);
  return plan;
}

std::string skellam_ring_problem(double scale, double clip_norm, double device_variance, std::uint32_t max_summands) {
  if (max_summands == 0) return "a ring sum of no devices";
  const double reach = scale * clip_norm + 1 + kSkellamTailStddevs * std::sqrt(device_variance);
  const double limit = quantization_limit(max_summands);
  if (!(reach <= limit))
    return "a device's values reach " + number(reach) + " integer units (γS + 1 + 10 noise standard deviations), " +
           "past the " + number(limit) + " a ring sum of " + std::to_string(max_summands) +
           " devices allows: a larger noise multiplier or fewer --min-clients would fit";
  return {};
}

std::string skellam_announcement_problem(double scale, double device_variance, double l2_bound, double clip_norm) {
  if (!(scale > 0) || !std::isfinite(scale)) return "the Skellam scale " + number(scale) + " is not positive and finite";
  if (!(device_variance > 0) || !(device_variance <= 2e15))
    return "the Skellam variance " + number(device_variance) + " is not in (0, 2e15]";
  if (!(l2_bound >= scale * clip_norm) || !std::isfinite(l2_bound))
    return "the rounding bound " + number(l2_bound) + " is short of the scaled clip " + number(scale * clip_norm);
  return {};
}

std::vector<std::uint32_t> skellam_encode(std::span<const float> clipped, double scale, double device_variance,
                                          double l2_bound, std::uint32_t max_summands, const RandomBits& bits) {
  const double limit = quantization_limit(max_summands);
  std::vector<double> scaled(clipped.size());
  for (std::size_t i = 0; i < clipped.size(); ++i) {
    if (!std::isfinite(clipped[i]))
      throw std::invalid_argument("Skellam encoding: value " + std::to_string(i) + " is not finite");
    scaled[i] = static_cast<double>(clipped[i]) * scale;
  }
  // Conditional randomized rounding: the whole vector again until its norm is within Δ2.
  std::vector<std::int64_t> rounded(clipped.size());
  const double bound_squared = l2_bound * l2_bound;
  for (int attempt = 0;; ++attempt) {
    if (attempt == kMaxRoundingAttempts)
      throw std::invalid_argument("Skellam encoding: no rounding of the delta within the L2 bound " +
                                  number(l2_bound) + " in " + std::to_string(kMaxRoundingAttempts) +
                                  " attempts (is it clipped to the round's norm?)");
    double squares = 0;
    for (std::size_t i = 0; i < scaled.size(); ++i) {
      const double floor = std::floor(scaled[i]);
      rounded[i] = static_cast<std::int64_t>(floor) + (open_uniform(bits) < scaled[i] - floor ? 1 : 0);
      squares += static_cast<double>(rounded[i]) * static_cast<double>(rounded[i]);
    }
    if (squares <= bound_squared) break;
  }
  std::vector<std::uint32_t> out(clipped.size());
  for (std::size_t i = 0; i < rounded.size(); ++i) {
    const std::int64_t value = rounded[i] + sample_skellam(device_variance, bits);
    if (std::fabs(static_cast<double>(value)) > limit)
      throw std::invalid_argument("Skellam encoding: value " + std::to_string(i) + " is " + std::to_string(value) +
                                  " integer units with its noise, past the " + number(limit) + " a sum of " +
                                  std::to_string(max_summands) + " devices allows (it could wrap)");
    out[i] = static_cast<std::uint32_t>(value);  // mod 2^32: two's complement
  }
  return out;
}

std::vector<double> skellam_decode(std::span<const std::uint32_t> sum, double scale) {
  if (!(scale > 0) || !std::isfinite(scale))
    throw std::invalid_argument("Skellam decoding: the scale " + number(scale) + " is not positive and finite");
  std::vector<double> out(sum.size());
  for (std::size_t i = 0; i < sum.size(); ++i) out[i] = static_cast<std::int32_t>(sum[i]) / scale;
  return out;
}

}  // namespace edgetrain::privacy
