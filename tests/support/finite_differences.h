// Gradient checks shared by the op and network tests: random inputs, a probe dot product as
// the scalar loss L = sum(out * probe), and central finite differences of that loss.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace edgetrain::testing {

inline std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float lo = -1,
                                        float hi = 1) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Σ a[i]·b[i] over b's length, in double.
inline double dot(const float* a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < b.size(); i++) s += static_cast<double>(a[i]) * b[i];
  return s;
}
inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  return dot(a.data(), b);
}

// Checks analytic[i] against (loss(x+eps) - loss(x-eps)) / 2eps at up to `samples` indices of x.
inline void expect_matches_finite_differences(std::vector<float>& x,
                                              const std::vector<float>& analytic,
                                              const std::function<double()>& loss, float eps,
                                              std::size_t samples, double tolerance,
                                              const char* what) {
  ASSERT_EQ(x.size(), analytic.size());
  const std::size_t step = std::max<std::size_t>(1, x.size() / samples);
  for (std::size_t i = 0; i < x.size(); i += step) {
    const float saved = x[i];
    x[i] = saved + eps;
    const double up = loss();
    x[i] = saved - eps;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * eps);
    EXPECT_NEAR(analytic[i], numeric, tolerance * (1.0 + std::fabs(numeric)))
        << what << " at " << i;
  }
}

}  // namespace edgetrain::testing
