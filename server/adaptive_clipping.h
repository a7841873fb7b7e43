// Adaptive clipping for DP-FedAvg (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially
// Private Learning with Adaptive Clipping", NeurIPS 2021; issue 39): instead of a fixed clip
// norm S, the server moves S each round towards a chosen quantile γ of the devices' delta
// norms, privately:
//
//   b_d   = 1 when device d's delta had norm ≤ S_r (it was not clipped), else 0;
//   b̃     = (Σ_d b_d + N(0, σ_b²)) / m        (m: the expected devices per round);
//   S_r+1 = S_r · exp(−η · (b̃ − γ))            (their geometric update).
//
// The count is a second Gaussian query on the same devices, so the budget is split: with a
// total noise multiplier z (what the accountant counts, server/dp_accountant.h) the deltas'
// sum gets z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) (their Theorem 1: the count's sensitivity is 1/2 once
// b_d − 1/2 is summed, so the pair is one Gaussian mechanism of multiplier z). Their defaults:
// γ = 0.5, η = 0.2, σ_b = m/20.
//
// Shared by the server (server/round_coordinator.h: the count's noise from getrandom) and the
// simulator (seeded noise), so both move S alike.
#pragma once

#include <cstddef>

namespace edgetrain::server {

struct AdaptiveClipping {
  double target_quantile = 0;      // γ in (0, 1); 0: the clip norm stays fixed
  double learning_rate = 0.2;      // η
  double count_noise_stddev = 0;   // σ_b; 0: m/20 (their default)
  bool enabled() const { return target_quantile > 0; }
};

// σ_b as used: `clipping.count_noise_stddev`, or m/20 when it is 0.
double count_noise_stddev(const AdaptiveClipping& clipping, double expected_devices);

// z_Δ for the deltas' sum given the total z and the count's σ_b. Throws std::invalid_argument
// when σ_b ≤ z/2: the count alone (multiplier 2σ_b) would then spend the whole budget.
double delta_noise_multiplier(double total_noise_multiplier, double count_stddev);

// S_r+1 from S_r, the devices whose delta was not clipped, and the count's noise draw
// (N(0, σ_b²), drawn by the caller).
double next_clip_norm(double clip_norm, std::size_t unclipped, double count_noise,
                      double expected_devices, const AdaptiveClipping& clipping);

// Whether a delta whose L2 norm is `norm` counts as not clipped at `clip_norm`. For a delta
// reloaded from the round log (already clipped, so its norm is S up to rounding) the server
// passes the logged norm: one within a relative 1e-5 below S counts as clipped (ours: an
// honest delta that close to S is counted as clipped after a restart).
bool counts_as_unclipped(double norm, double clip_norm, bool reloaded);

// Throws std::invalid_argument naming the setting for γ outside (0, 1), η ≤ 0 or σ_b < 0.
void check_adaptive_clipping(const AdaptiveClipping& clipping);

}  // namespace edgetrain::server
