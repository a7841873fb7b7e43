// Discrete distributed noise for DP-FedAvg under secure aggregation: the distributed Skellam
// mechanism (Agarwal, Kairouz, Liu, "The Skellam Mechanism for Differentially Private
// Federated Learning", NeurIPS 2021; issue 39; docs/privacy.md, "Discrete noise"). The
// continuous version (distributed_noise.h) adds Gaussian noise and then rounds it to the
// ring, so the unmasked sum's noise is only approximately Gaussian. Here every device scales
// its clipped delta to integers, rounds it at random, and adds integer Skellam noise: the
// ring sums integers exactly, and a sum of Skellams is a Skellam, so the noise the server
// unmasks is exactly Skellam and the paper's Rényi DP bound applies to it as it stands.
//
// What we take from the paper: Sk(v) = Poisson(v/2) − Poisson(v/2), variance v, closed under
// sums; each device adds Sk(v_d), a sum over u ≥ c devices is Sk(u·v_d); conditional
// randomized rounding (resample until the rounded vector's L2 norm is within Δ2, so the
// sensitivity holds by construction), its bound Δ2² = (γS)² + d/4 + √(2 ln(1/β))·(γS + √d/2)
// and Δ1 = min(Δ2², √d·Δ2); the RDP bound of the sum (server/dp_accountant.h).
// What we leave, and what is ours:
// - No random rotation and no modular clipping: the paper rotates (Walsh–Hadamard) so that a
//   narrow ring (16–20 bits) rarely wraps. We keep the 32-bit ring and choose the scale so
//   that it never wraps (below), as the continuous mode does.
// - The scale (ours): each device's noise has a fixed standard deviation of
//   kSkellamDeviceStddev = 4096 integer units, and γ = 4096·√c/(z·S), so that the sum over c
//   devices has variance c·4096² = (z·γS)²: z is the noise multiplier of the Gaussian the
//   Skellam replaces. The rounding adds at most 1/4 of a unit's variance per value and
//   device, 1.5e-8 of the noise's. The same γ for any number of devices, so the accountant's
//   bound does not change with who is selected.
// - The ring: a device's value |round(γx) + Sk| must stay within K = ⌊(2^31 − 1)/N⌋ (N the
//   session's devices), so that a sum of N never wraps; the server refuses at start-up a
//   setting where γS + 1 + 10·4096 passes K for the most devices a session may hold, and a
//   device leaves a session rather than send a value past K (a Skellam of that variance
//   passes 10 standard deviations with probability about 1e-23).
// - β = 1e-6 (the rounding's resampling bound); ≤ kMaxRoundingAttempts attempts, then the
//   device refuses (a norm that far past its mean means a bug, not bad luck).
// - Poisson draws: inversion below a mean of 10, Hörmann's transformed rejection (PTRS,
//   1993) above it, on 53-bit uniforms from the device's CTR_DRBG (SecureBits).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace edgetrain::privacy {

class SecureRandom;

// 64 random bits per call.
using RandomBits = std::function<std::uint64_t()>;

// RandomBits from a SecureRandom, drawn 4 KiB at a time. Keeps a reference: `random` must
// outlive it.
class SecureBits {
 public:
  explicit SecureBits(SecureRandom& random) : random_(random) {}
  std::uint64_t operator()();

 private:
  SecureRandom& random_;
  std::vector<std::uint8_t> block_;
  std::size_t used_ = 0;
};

// A draw of Poisson(mean), mean in [0, 1e15]. Throws std::invalid_argument outside it.
std::int64_t sample_poisson(double mean, const RandomBits& bits);
// A draw of Sk(variance) = Poisson(variance/2) − Poisson(variance/2).
std::int64_t sample_skellam(double variance, const RandomBits& bits);

// Each device's noise standard deviation in integer units (ours, above).
inline constexpr double kSkellamDeviceStddev = 4096;
// β of the conditional rounding's bound (ours).
inline constexpr double kRoundingBeta = 1e-6;
inline constexpr int kMaxRoundingAttempts = 1000;
// How far past γS a device's value may go, in its noise's standard deviations.
inline constexpr double kSkellamTailStddevs = 10;

// What the server announces and the accountant counts (integer units).
struct SkellamPlan {
  double scale = 0;            // γ: a value x becomes round(γx)
  double device_variance = 0;  // v_d: each device adds Sk(v_d) to every value
  double l2_bound = 0;         // Δ2: the rounded vector's L2 norm, enforced by resampling
  double l1_bound = 0;         // Δ1 = min(Δ2², √d·Δ2)
  std::uint32_t calibrated_survivors = 0;  // c: the sum has at least c devices' noise
  // The variance of the noise of a sum of c devices: c·v_d.
  double central_variance() const { return calibrated_survivors * device_variance; }
};

// The plan for noise multiplier z > 0, clip S > 0, c ≥ 1 survivors and d ≥ 1 values per
// vector. Throws std::invalid_argument naming the value that is out of range.
SkellamPlan skellam_plan(double noise_multiplier, double clip_norm, std::uint32_t calibrated_survivors,
                         std::uint64_t dimension);
// Δ2 for rounding a vector of L2 norm ≤ γS with d values (the formula above).
double rounded_l2_bound(double scaled_clip, std::uint64_t dimension);
// Why vectors of this plan could wrap a ring summing `max_summands` of them, or empty.
std::string skellam_ring_problem(double scale, double clip_norm, double device_variance, std::uint32_t max_summands);
// Why a device cannot honour an announced plan, or empty: a value not finite or not
// positive, or Δ2 short of γS (no rounding could meet it).
std::string skellam_announcement_problem(double scale, double device_variance, double l2_bound, double clip_norm);

// A device's ring vector: `clipped` (L2 norm ≤ S) scaled by γ, rounded at random until the
// rounded vector's norm is within Δ2, plus Sk(v_d) per value, as ring elements (two's
// complement). Throws std::invalid_argument for a value not finite, a value whose noised
// integer passes K = ⌊(2^31 − 1)/max_summands⌋ (naming its index), or no rounding within Δ2
// in kMaxRoundingAttempts.
std::vector<std::uint32_t> skellam_encode(std::span<const float> clipped, double scale, double device_variance,
                                          double l2_bound, std::uint32_t max_summands, const RandomBits& bits);
// A ring sum back to values: int32(sum)/γ.
std::vector<double> skellam_decode(std::span<const std::uint32_t> sum, double scale);

}  // namespace edgetrain::privacy
