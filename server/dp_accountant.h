// Privacy accounting for client-level differential privacy in federated rounds (DP-FedAvg,
// McMahan et al. 2018; issue 39): each round is a sampled Gaussian mechanism, every device
// taking part with probability q, its clipped delta's sensitivity covered by Gaussian noise
// of standard deviation z times it. Rényi DP (Mironov 2017) of that mechanism at integer
// orders α ≥ 2 is the exact expression of Mironov, Talwar and Zhang (2019, "Rényi
// Differential Privacy of the Sampled Gaussian Mechanism", section 3.3):
//   A_α = Σ_{k=0..α} C(α,k) (1−q)^(α−k) q^k exp((k² − k) / (2z²)),  RDP(α) = log(A_α)/(α − 1),
// summed in log space; rounds compose by adding RDP. (ε, δ) comes from the conversion of
// Balle et al. (2020) / Canonne, Kamath and Steinke (2020):
//   ε = min_α  RDP(α) + log((α − 1)/α) − (log δ + log α)/(α − 1).
// Only integer orders (ours: 2..64 and a few larger), which costs a little tightness
// against libraries that also use fractional ones; the neighbouring relation is add or
// remove one device. Pure functions and a small class: no I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace edgetrain::server {

// RDP of one sampled Gaussian mechanism at integer order `alpha` ≥ 2 (q in [0, 1], z ≥ 0;
// z = 0 with q > 0: infinity). Throws std::invalid_argument for values out of range.
double sampled_gaussian_rdp(double q, double noise_multiplier, int alpha);

// RDP at integer order α ≥ 2 of the Skellam mechanism (privacy/skellam.h) releasing a sum
// with integer L1 and L2 sensitivities Δ1, Δ2 and Skellam noise of variance μ (Agarwal,
// Kairouz, Liu 2021, their Theorem 3.5 / Corollary 3.6):
//   αΔ2²/(2μ) + min(((2α − 1)Δ2² + 6Δ1)/(4μ²), 3Δ1/(2μ)).
// Throws std::invalid_argument for Δ2 < 0, Δ1 < 0 or μ ≤ 0.
double skellam_rdp(double l1_sensitivity, double l2_sensitivity, double variance, int alpha);

// An upper bound on the RDP at integer order α ≥ 2 of a mechanism run on a Poisson sample of
// rate q, from the mechanism's RDP ε(ℓ) at orders 2..α (Zhu and Wang 2019, "Poisson
// Subsampled Rényi Differential Privacy", Theorem 6, the general upper bound):
//   1/(α−1) · log[ (1−q)^(α−1)(αq − q + 1) + C(α,2) q² (1−q)^(α−2) e^ε(2)
//                  + 3 Σ_{ℓ=3..α} C(α,ℓ) (1−q)^(α−ℓ) q^ℓ e^((ℓ−1)ε(ℓ)) ],
// and no more than ε(α) (sampling never costs privacy). For the Gaussian it lies above the
// exact value of sampled_gaussian_rdp (test: DpAccountant.SubsampledBoundAboveTheExactGaussian).
double subsampled_rdp_bound(double q, int alpha, const std::function<double(int)>& rdp);

struct EpsilonAtDelta {
  double epsilon = 0;
  int order = 0;  // the α that gave it
};
// The smallest ε over `orders` for RDP values `rdp` (same length) at `delta` in (0, 1).
EpsilonAtDelta epsilon_from_rdp(std::span<const int> orders, std::span<const double> rdp,
                                double delta);

// The orders the accountant uses.
const std::vector<int>& default_rdp_orders();

// Rounds of one (q, z) composed.
class DpAccountant {
 public:
  DpAccountant(double sampling_rate, double noise_multiplier);
  // Rounds of the distributed Skellam mechanism on a Poisson sample of rate q: its RDP
  // (skellam_rdp) amplified by subsampled_rdp_bound. The sampled Gaussian's exact expression
  // does not apply to the Skellam, and Zhu and Wang's bound does for any mechanism (ours: the
  // conservative choice; docs/privacy.md, "Discrete noise").
  static DpAccountant skellam(double sampling_rate, double l1_sensitivity, double l2_sensitivity, double variance);
  void add_rounds(std::uint64_t rounds) { rounds_ += rounds; }
  std::uint64_t rounds() const { return rounds_; }
  EpsilonAtDelta epsilon(double delta) const;

 private:
  DpAccountant() = default;
  std::vector<double> rdp_per_round_;  // at default_rdp_orders()
  std::uint64_t rounds_ = 0;
};

}  // namespace edgetrain::server
