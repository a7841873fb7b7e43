// Distributed noise for DP-FedAvg under secure aggregation (issue 39; docs/privacy.md,
// "Distributed noise"): the server never sees a sum without noise, so each device adds its
// share of the Gaussian noise to its clipped delta before it quantizes and masks it, and the
// unmasked sum carries noise of standard deviation ≥ z·S however many devices survive.
//
// The calibration (ours): each device adds N(0, σ_d²) per value with σ_d = z·S/√c, c the
// fewest survivors (U3) a round may close with (the server's --min-clients, at least 2: the
// secure round raises its threshold t to c, so |U3| ≥ t ≥ c). A round closing with |U3| = u
// survivors carries noise of variance u·σ_d² = (u/c)·z²S² ≥ z²S²: more survivors than c give
// more noise than the privacy needs (√(u/c) times its standard deviation), the price of a
// per-device amount fixed before anyone knows who stays. A device's own share counts towards
// the total, as the server's own noise does in the central mode; devices colluding with the
// server can subtract theirs (secure aggregation's threshold bounds how many may, not the
// noise that is left: calibrating to c minus the colluders is not done).
//
// The ring (ours): a noised value is no longer within [−S, S], so the quantization range is
// B = S + kNoiseTailStddevs·σ_d per value: a Gaussian passes 10 standard deviations with
// probability 1.5e-23, and a device that draws one anyway refuses to send (quantize_bounded
// refuses it) rather than let the sum wrap. B/K is then the quantization step
// (privacy/quantize.h), at z = 1, S = 1, c = 10 and N = 20 devices 3.9e-8, far below σ_d.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace edgetrain::privacy {

class SecureRandom;

// How far past the clip the ring's range reaches, in the device noise's standard deviations.
inline constexpr double kNoiseTailStddevs = 10;

// σ_d = z·S/√c. Throws std::invalid_argument for z < 0, S ≤ 0, either not finite, or c < 1.
double device_noise_stddev(double noise_multiplier, double clip_norm, std::uint32_t calibrated_survivors);
// B = S + kNoiseTailStddevs·σ_d: the per-value range a noised clipped delta is quantized in.
double noised_value_bound(double clip_norm, double device_stddev);
// Why a device cannot honour a round announcing noise σ_d and range B for deltas clipped to
// S, or empty: σ_d negative or not finite, B not finite, or B short of S + 10·σ_d (a noised
// value could pass it and wrap the ring's sum).
std::string device_noise_problem(double clip_norm, double device_stddev, double value_bound);
// Adaptive clipping under secure aggregation (Andrew et al. 2021; docs/privacy.md, "Adaptive
// clipping under secure aggregation"): the count. Each device appends one value to its masked
// vector, b + N(0, σ_b²/c) with b = 1 when its delta's norm was at most the round's clip (not
// clipped), else 0, so the server unmasks only the noisy count Σb + N(0, |U3|·σ_b²/c) and moves
// the clip norm with it as the central version does. The value has its own range (ours):
// [−B_b, B_b], B_b = 1 + kNoiseTailStddevs·σ_b/√c, read back with it.
double count_value_bound(double count_device_stddev);
// The appended value, quantized in [−B_b, B_b] for N summands: b plus the device's share of
// the count noise from `random`. Throws std::invalid_argument when the draw passes B_b.
std::uint32_t quantized_count_value(bool unclipped, double count_device_stddev, double count_bound,
                                    std::uint32_t max_summands, SecureRandom& random);

// Adds N(0, σ_d²) to every value, Box–Muller on 53-bit uniforms from `random` (the device's
// CTR_DRBG: noise a seed could recompute could be subtracted). Throws std::invalid_argument
// for σ_d negative or not finite.
void add_device_noise(std::span<float> values, double device_stddev, SecureRandom& random);

}  // namespace edgetrain::privacy
