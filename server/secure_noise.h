// Gaussian noise from the kernel's cryptographically secure generator (getrandom(2)), for
// DP-FedAvg's central noise (issue 39): a seeded generator's noise could be recomputed, and
// subtracted, by anyone who learns its seed. Box–Muller on 53-bit uniforms, in double, then
// added to floats. The noise is not recorded anywhere: the round's close, noise included, is
// one update in the WAL, which is what makes recovery bit-exact (server/README.md,
// "Differential privacy").
#pragma once

#include <span>

namespace edgetrain::server {

// Adds N(0, stddev²) to every value. Throws std::runtime_error when getrandom fails.
void add_secure_gaussian_noise(std::span<float> values, double stddev);

}  // namespace edgetrain::server
