// runtime::GaussianSampler: standard normal moments over many draws, the same sequence for a
// seed and another for another seed, never a non-finite value.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/splitmix64.h"

namespace {

TEST(GaussianSampler, StandardNormalMoments) {
  edgetrain::runtime::GaussianSampler z(7);
  const int n = 200000;
  double sum = 0, sum2 = 0, sum4 = 0;
  int beyond_two = 0;
  for (int i = 0; i < n; i++) {
    const double x = z.next();
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sum2 += x * x;
    sum4 += x * x * x * x;
    beyond_two += std::fabs(x) > 2;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0, 0.01);
  EXPECT_NEAR(sum4 / n, 3.0, 0.06);  // the normal's kurtosis
  EXPECT_NEAR(static_cast<double>(beyond_two) / n, 0.0455, 0.003);
}

TEST(GaussianSampler, SameSeedSameSequence) {
  std::vector<float> a(101), b(101), c(101);
  edgetrain::runtime::GaussianSampler(3).fill(a.data(), a.size());
  edgetrain::runtime::GaussianSampler(3).fill(b.data(), b.size());
  edgetrain::runtime::GaussianSampler(4).fill(c.data(), c.size());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

}  // namespace
