#include "privacy/quantize.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "privacy/secagg_crypto.h"

namespace edgetrain::privacy {

std::uint32_t quantization_limit(std::uint32_t max_summands) {
  if (max_summands == 0) throw std::invalid_argument("quantization: at least one summand");
  return 0x7fffffffu / max_summands;
}

double quantization_scale(double clip_norm, std::uint32_t max_summands) {
  if (!(clip_norm > 0) || !std::isfinite(clip_norm)) {
    throw std::invalid_argument("quantization: the clip norm must be positive and finite");
  }
  return quantization_limit(max_summands) / clip_norm;
}

namespace {

// Values in [−bound, bound] (checked by the callers) to the ring at scale K/bound.
std::vector<std::uint32_t> quantize_checked(std::span<const float> values, double bound, std::uint32_t max_summands,
                                            Rounding rounding, SecureRandom* random) {
  const double scale = quantization_scale(bound, max_summands);
  const double limit = quantization_limit(max_summands);
  std::vector<std::uint32_t> out(values.size());
  std::vector<std::uint8_t> coins;
  constexpr std::size_t kCoinsPerDraw = 1024;  // random bytes drawn in blocks, 4 per value
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double scaled = std::fmin(limit, std::fmax(-limit, values[i] * scale));
    double rounded;
    if (rounding == Rounding::kNearest) {
      rounded = std::round(scaled);
    } else {
      if (i % kCoinsPerDraw == 0) {
        coins.resize(4 * std::min(kCoinsPerDraw, values.size() - i));
        random->fill(coins);
      }
      const std::uint8_t* c = &coins[4 * (i % kCoinsPerDraw)];
      const double uniform = (std::uint32_t{c[0]} | std::uint32_t{c[1]} << 8 | std::uint32_t{c[2]} << 16 |
                              std::uint32_t{c[3]} << 24) * 0x1p-32;  // in [0, 1)
      const double floor = std::floor(scaled);
      rounded = floor + (uniform < scaled - floor ? 1 : 0);
    }
    // |rounded| ≤ K < 2^31: the int64 holds it, and its conversion to uint32 is mod 2^32.
    out[i] = static_cast<std::uint32_t>(static_cast<std::int64_t>(rounded));
  }
  return out;
}

void check_rounding(Rounding rounding, const SecureRandom* random) {
  if (rounding == Rounding::kStochastic && random == nullptr) {
    throw std::invalid_argument("quantization: stochastic rounding needs a random source");
  }
}

}  // namespace

std::vector<std::uint32_t> quantize(std::span<const float> delta, double clip_norm, std::uint32_t max_summands,
                                    Rounding rounding, SecureRandom* random) {
  quantization_scale(clip_norm, max_summands);  // throws for a bad S or N
  check_rounding(rounding, random);
  double squares = 0;
  for (float value : delta) {
    if (!std::isfinite(value)) throw std::invalid_argument("quantization: a value is not finite");
    squares += double{value} * value;
  }
  if (std::sqrt(squares) > clip_norm * (1 + 1e-6)) {
    throw std::invalid_argument("quantization: the delta's norm " + std::to_string(std::sqrt(squares)) +
                                " exceeds the clip norm " + std::to_string(clip_norm) + ": clip it first");
  }
  return quantize_checked(delta, clip_norm, max_summands, rounding, random);
}

std::vector<std::uint32_t> quantize_bounded(std::span<const float> values, double value_bound,
                                            std::uint32_t max_summands, Rounding rounding, SecureRandom* random) {
  quantization_scale(value_bound, max_summands);  // throws for a bad B or N
  check_rounding(rounding, random);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]))
      throw std::invalid_argument("quantization: value " + std::to_string(i) + " is not finite");
    if (std::fabs(values[i]) > value_bound * (1 + 1e-6))
      throw std::invalid_argument("quantization: value " + std::to_string(i) + " is " + std::to_string(values[i]) +
                                  ", past the ring's bound " + std::to_string(value_bound) +
                                  ": the sum of " + std::to_string(max_summands) + " could wrap");
  }
  return quantize_checked(values, value_bound, max_summands, rounding, random);
}

std::vector<double> dequantize(std::span<const std::uint32_t> sum, double clip_norm, std::uint32_t max_summands) {
  const double scale = quantization_scale(clip_norm, max_summands);
  std::vector<double> out(sum.size());
  for (std::size_t i = 0; i < sum.size(); ++i) out[i] = static_cast<std::int32_t>(sum[i]) / scale;
  return out;
}

}  // namespace edgetrain::privacy
