// A clipped model delta (floats) to elements of the ring Z_2^32 that secure aggregation sums,
// and the ring sum back to floats.
//
// The bound (ours; Bonawitz et al. leave the encoding to the application): the delta's L2
// norm is at most S (the round's clip), so every value lies in [−S, S]. Values are scaled by
//   scale = K / S,  K = ⌊(2^31 − 1) / N⌋,
// N the most devices whose vectors a sum can hold (the round's selected devices), so each
// quantized value is an integer in [−K, K] and a sum of up to N of them lies in
// [−(2^31 − 1), 2^31 − 1]: read as a two's-complement int32 it is the exact integer sum, with
// no wrap. The error per value is at most 0.5 / scale (deterministic rounding to nearest) or
// below 1 / scale and zero on average (stochastic rounding), so a sum of m values is within
// m·0.5/scale (or m/scale) of the float sum. For N = 20 and S = 1, 1/scale ≈ 9.3e-9.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace edgetrain::privacy {

class SecureRandom;

enum class Rounding {
  kNearest,     // to the nearest integer, halves away from zero: reproducible
  kStochastic,  // up with probability equal to the fraction: unbiased (Bonawitz et al. §7)
};

// K = ⌊(2^31 − 1) / N⌋: the largest magnitude of a quantized value.
std::uint32_t quantization_limit(std::uint32_t max_summands);
// scale = K / S. Throws std::invalid_argument for S ≤ 0 or not finite, or N = 0.
double quantization_scale(double clip_norm, std::uint32_t max_summands);

// Throws std::invalid_argument for a value that is not finite or a delta whose L2 norm
// exceeds S by more than a float's rounding (1e-6 relative): it was not clipped, and its
// values could make the sum wrap. A value scaled a rounding past ±K is held at ±K.
// `random` is used only, and required, for stochastic rounding.
std::vector<std::uint32_t> quantize(std::span<const float> delta, double clip_norm, std::uint32_t max_summands,
                                    Rounding rounding, SecureRandom* random = nullptr);

// As quantize() for values bounded one by one instead of by their norm (a clipped delta with
// distributed noise added, privacy/distributed_noise.h): scale = K/B for the per-value bound
// B. Throws std::invalid_argument for a value that is not finite or whose magnitude passes B
// by more than 1e-6 relative (the sum of N could wrap), naming the value's index.
std::vector<std::uint32_t> quantize_bounded(std::span<const float> values, double value_bound,
                                            std::uint32_t max_summands, Rounding rounding,
                                            SecureRandom* random = nullptr);

// The sum of at most N quantized vectors back to values (double: a float would add its own
// rounding, 6e-8 relative, far above 1/scale). `clip_norm` is the bound the values were
// quantized with: S for quantize(), B for quantize_bounded().
std::vector<double> dequantize(std::span<const std::uint32_t> sum, double clip_norm, std::uint32_t max_summands);

}  // namespace edgetrain::privacy
