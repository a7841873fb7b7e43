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
#include <span>
#include <vector>

namespace edgetrain::server {

// RDP of one sampled Gaussian mechanism at integer order `alpha` ≥ 2 (q in [0, 1], z ≥ 0;
// z = 0 with q > 0: infinity). Throws std::invalid_argument for values out of range.
double sampled_gaussian_rdp(double q, double noise_multiplier, int alpha);

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
  void add_rounds(std::uint64_t rounds) { rounds_ += rounds; }
  std::uint64_t rounds() const { return rounds_; }
  EpsilonAtDelta epsilon(double delta) const;

 private:
  std::vector<double> rdp_per_round_;  // at default_rdp_orders()
  std::uint64_t rounds_ = 0;
};

}  // namespace edgetrain::server
