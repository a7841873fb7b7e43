#include "privacy/distributed_noise.h"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "privacy/quantize.h"
#include "privacy/secagg_crypto.h"

namespace edgetrain::privacy {

double device_noise_stddev(double noise_multiplier, double clip_norm, std::uint32_t calibrated_survivors) {
  if (!(noise_multiplier >= 0) || !std::isfinite(noise_multiplier))
    throw std::invalid_argument("distributed noise: the noise multiplier must be finite and >= 0");
  if (!(clip_norm > 0) || !std::isfinite(clip_norm))
    throw std::invalid_argument("distributed noise: the clip norm must be positive and finite");
  if (calibrated_survivors == 0)
    throw std::invalid_argument("distributed noise: the noise is shared by at least one device");
  return noise_multiplier * clip_norm / std::sqrt(static_cast<double>(calibrated_survivors));
}

double noised_value_bound(double clip_norm, double device_stddev) {
  return clip_norm + kNoiseTailStddevs * device_stddev;
}

std::string device_noise_problem(double clip_norm, double device_stddev, double value_bound) {
  if (!(device_stddev >= 0) || !std::isfinite(device_stddev))
    return "the device noise's standard deviation " + std::to_string(device_stddev) + " is not a finite value >= 0";
  if (!(value_bound > 0) || !std::isfinite(value_bound))
    return "the ring's value bound " + std::to_string(value_bound) + " is not a positive finite value";
  const double needed = noised_value_bound(clip_norm, device_stddev);
  if (value_bound < needed * (1 - 1e-12))
    return "the ring's value bound " + std::to_string(value_bound) + " is short of the clip " +
           std::to_string(clip_norm) + " plus " + std::to_string(static_cast<int>(kNoiseTailStddevs)) +
           " noise standard deviations (" + std::to_string(needed) + "): noised values could wrap the sum";
  return {};
}

double count_value_bound(double count_device_stddev) {
  return 1 + kNoiseTailStddevs * count_device_stddev;
}

std::uint32_t quantized_count_value(bool unclipped, double count_device_stddev, double count_bound,
                                    std::uint32_t max_summands, SecureRandom& random) {
  float value[2] = {unclipped ? 1.0f : 0.0f, 0.0f};  // a pair: Box–Muller draws two
  add_device_noise(value, count_device_stddev, random);
  return quantize_bounded(std::span<const float>(value, 1), count_bound, max_summands, Rounding::kNearest)[0];
}

void add_device_noise(std::span<float> values, double device_stddev, SecureRandom& random) {
  if (!(device_stddev >= 0) || !std::isfinite(device_stddev))
    throw std::invalid_argument("distributed noise: the standard deviation must be finite and >= 0");
  if (device_stddev == 0) return;
  constexpr std::size_t kPairsPerDraw = 512;  // random bytes drawn in blocks: 16 per pair
  std::vector<std::uint8_t> bytes;
  auto uniform_at = [&bytes](std::size_t at) {  // in (0, 1): never 0 (log) nor 1
    std::uint64_t bits = 0;
    for (int b = 0; b < 8; ++b) bits |= std::uint64_t{bytes[at + b]} << (8 * b);
    return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
  };
  for (std::size_t i = 0; i < values.size(); i += 2) {
    const std::size_t pair = i / 2;
    if (pair % kPairsPerDraw == 0) {
      bytes.resize(16 * std::min(kPairsPerDraw, (values.size() - i + 1) / 2));
      random.fill(bytes);
    }
    const std::size_t at = 16 * (pair % kPairsPerDraw);
    const double radius = std::sqrt(-2 * std::log(uniform_at(at)));
    const double angle = 2 * M_PI * uniform_at(at + 8);
    values[i] = static_cast<float>(values[i] + device_stddev * radius * std::cos(angle));
    if (i + 1 < values.size())
      values[i + 1] = static_cast<float>(values[i + 1] + device_stddev * radius * std::sin(angle));
  }
}

}  // namespace edgetrain::privacy
