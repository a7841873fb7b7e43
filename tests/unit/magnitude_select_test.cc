// worker/magnitude_select.h against the rule it replaces: the k-th largest |v| by
// std::nth_element over all the magnitudes, and the count strictly above it.
#include "worker/magnitude_select.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

namespace {

using edgetrain::runtime::MagnitudeRank;
using edgetrain::runtime::MagnitudeSelector;

MagnitudeRank by_nth_element(const std::vector<float>& values, std::size_t k) {
  std::vector<float> magnitudes(values.size());
  std::transform(values.begin(), values.end(), magnitudes.begin(),
                 [](float v) { return std::fabs(v); });
  std::nth_element(magnitudes.begin(), magnitudes.begin() + static_cast<std::ptrdiff_t>(k - 1),
                   magnitudes.end(), std::greater<float>());
  const float threshold = magnitudes[k - 1];
  return {threshold,
          static_cast<std::size_t>(std::count_if(
              values.begin(), values.end(), [&](float v) { return std::fabs(v) > threshold; }))};
}

void expect_same(MagnitudeSelector& selector, const std::vector<float>& values, std::size_t k) {
  const MagnitudeRank expected = by_nth_element(values, k);
  const MagnitudeRank got = selector.select(values, k);
  EXPECT_EQ(got.threshold, expected.threshold) << "n " << values.size() << " k " << k;
  EXPECT_EQ(got.above, expected.above) << "n " << values.size() << " k " << k;
}

TEST(MagnitudeSelect, MatchesNthElementOnGradientLikeValues) {
  std::mt19937 rng(7);
  MagnitudeSelector selector(401'408);
  for (std::size_t n : {1u, 2u, 10u, 288u, 18'432u, 401'408u}) {
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    std::vector<float> values(n);
    for (float& v : values) v = normal(rng);
    for (std::size_t k :
         {std::size_t{1}, std::max<std::size_t>(1, n / 100), std::max<std::size_t>(1, n / 2), n})
      expect_same(selector, values, k);
  }
}

TEST(MagnitudeSelect, TiesZerosSignsAndTinyValues) {
  MagnitudeSelector selector;
  // Many entries equal to the threshold, both signs, and zeros of both signs.
  std::vector<float> ties = {0.5f, -0.5f, 0.25f, 0.5f, -0.0f, 0.0f, -0.25f, 0.5f, 1.0f, -1.0f};
  for (std::size_t k = 1; k <= ties.size(); ++k) expect_same(selector, ties, k);
  // All equal: every entry is the threshold, none above.
  std::vector<float> equal(1000, -3.0f);
  expect_same(selector, equal, 10);
  EXPECT_EQ(selector.select(equal, 10).above, 0u);
  // Subnormals, the largest finite and infinities sort with the rest.
  std::vector<float> extremes = {
      std::numeric_limits<float>::denorm_min(), 1e-40f, -1e-38f, std::numeric_limits<float>::max(),
      -std::numeric_limits<float>::infinity(),  1.0f};
  for (std::size_t k = 1; k <= extremes.size(); ++k) expect_same(selector, extremes, k);
  // Values spread over every exponent (each bucket holds a few).
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x7f7fffffu);
  std::vector<float> spread(5000);
  for (float& v : spread) {
    std::uint32_t b = bits(rng);
    std::memcpy(&v, &b, sizeof v);
  }
  for (std::size_t k : {1u, 50u, 2500u, 4999u, 5000u}) expect_same(selector, spread, k);
}

// Buckets larger than the candidate buffer (4,096 entries here) are narrowed by the next
// bits: values that share their top bits, and equal values, which only the last level
// tells apart from nothing.
TEST(MagnitudeSelect, NarrowsBucketsTooLargeToGather) {
  MagnitudeSelector selector;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> close(1.0f, 1.0001f);  // one top-11-bit bucket
  std::vector<float> values(100'000);
  for (float& v : values) v = (rng() & 1 ? -1.0f : 1.0f) * close(rng);
  for (std::size_t k : {1u, 100u, 5'000u, 50'000u, 99'999u, 100'000u})
    expect_same(selector, values, k);
  std::uniform_real_distribution<float> wide(1.0f, 2.0f);  // one second-level bucket at most
  for (float& v : values) v = wide(rng);
  for (std::size_t k : {1u, 1'000u, 50'000u}) expect_same(selector, values, k);
  std::vector<float> equal(100'000, 0.125f);
  equal[7] = 0.5f;
  expect_same(selector, equal, 1);
  expect_same(selector, equal, 2);
  EXPECT_EQ(selector.select(equal, 50'000).above, 1u);
  std::vector<float> zeros(20'000, 0.0f);
  expect_same(selector, zeros, 200);
}

TEST(MagnitudeSelect, RefusesARankOutsideTheTensor) {
  MagnitudeSelector selector;
  std::vector<float> values = {1.0f, 2.0f};
  EXPECT_THROW(selector.select(values, 0), std::invalid_argument);
  EXPECT_THROW(selector.select(values, 3), std::invalid_argument);
}

}  // namespace
