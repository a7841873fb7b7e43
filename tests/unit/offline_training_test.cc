// OfflineAccumulator (worker/offline_training.h): the local SGD an asynchronous worker runs
// while its server is away, against a plain reference (the same sums and steps in doubles,
// which float results must match to rounding), and what it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "worker/offline_training.h"

namespace {

using edgetrain::runtime::OfflineAccumulator;

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(OfflineAccumulator, KeepsTheSumOfTheGradientsAndTheLocalSgdTrajectory) {
  std::mt19937 rng(7);
  const std::size_t n = 1000;
  const float lr = 0.05f;
  const std::vector<float> start = random_vector(n, rng, 1.0f);
  OfflineAccumulator acc(lr);
  acc.begin(start, 42);
  EXPECT_TRUE(acc.started());
  EXPECT_EQ(acc.from_version(), 42u);
  EXPECT_EQ(acc.steps(), 0u);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(acc.local_parameters()[i], start[i]);
    ASSERT_EQ(acc.sum()[i], 0.0f);
  }

  std::vector<double> sum(n, 0.0), local(start.begin(), start.end());
  for (int step = 0; step < 20; ++step) {
    const std::vector<float> g = random_vector(n, rng, 0.1f);
    ASSERT_TRUE(acc.add_step(g));
    for (std::size_t i = 0; i < n; ++i) {
      sum[i] += g[i];
      local[i] -= lr * static_cast<double>(g[i]);
    }
  }
  EXPECT_EQ(acc.steps(), 20u);
  EXPECT_EQ(acc.from_version(), 42u) << "the version the steps started from, whatever they did";
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(acc.sum()[i], sum[i], 1e-5) << i;
    ASSERT_NEAR(acc.local_parameters()[i], local[i], 1e-5) << i;
    // The update the server applies at its learning rate brings it to the local trajectory:
    // start − lr·S = local.
    ASSERT_NEAR(start[i] - lr * acc.sum()[i], acc.local_parameters()[i], 1e-5) << i;
  }
}

TEST(OfflineAccumulator, ANonFiniteStepIsRefusedAndChangesNothing) {
  OfflineAccumulator acc(0.1f);
  acc.begin(std::vector<float>{1.0f, 2.0f, 3.0f}, 5);
  ASSERT_TRUE(acc.add_step(std::vector<float>{0.5f, -0.5f, 1.0f}));
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  auto refused_unchanged = [&](const std::vector<float>& bad) {
    const std::vector<float> sum(acc.sum().begin(), acc.sum().end());
    const std::vector<float> local(acc.local_parameters().begin(), acc.local_parameters().end());
    const std::uint64_t steps = acc.steps();
    EXPECT_FALSE(acc.add_step(bad));
    EXPECT_EQ(acc.steps(), steps);
    EXPECT_EQ(std::vector<float>(acc.sum().begin(), acc.sum().end()), sum);
    EXPECT_EQ(std::vector<float>(acc.local_parameters().begin(), acc.local_parameters().end()),
              local);
  };
  refused_unchanged({0.0f, nan, 0.0f});
  refused_unchanged({inf, 0.0f, 0.0f});
  ASSERT_TRUE(acc.add_step(std::vector<float>{0.0f, 0.0f, big}));
  refused_unchanged({0.0f, 0.0f, big});  // each value finite, but the sum would overflow
  EXPECT_EQ(acc.steps(), 2u);
}

TEST(OfflineAccumulator, BuffersAreNotDroppedByANewBeginAndClearStartsAgain) {
  OfflineAccumulator acc(0.1f);
  EXPECT_THROW(acc.add_step(std::vector<float>{1.0f}), std::logic_error) << "before begin()";
  acc.begin(std::vector<float>{1.0f, 1.0f}, 3);
  EXPECT_THROW(acc.add_step(std::vector<float>{1.0f}), std::invalid_argument) << "wrong length";
  ASSERT_TRUE(acc.add_step(std::vector<float>{1.0f, 2.0f}));
  EXPECT_THROW(acc.begin(std::vector<float>{0.0f, 0.0f}, 9), std::logic_error)
      << "one step buffered would be lost";
  EXPECT_EQ(acc.from_version(), 3u);
  acc.clear();
  EXPECT_FALSE(acc.started());
  EXPECT_EQ(acc.steps(), 0u);
  acc.begin(std::vector<float>{0.0f, 0.0f}, 9);
  EXPECT_EQ(acc.from_version(), 9u);
  EXPECT_EQ(acc.sum()[0], 0.0f) << "a new accumulation starts from zero";
  EXPECT_EQ(acc.sum()[1], 0.0f);
}

TEST(OfflineAccumulator, RefusesALearningRateThatIsNotPositive) {
  EXPECT_THROW(OfflineAccumulator(0.0f), std::invalid_argument);
  EXPECT_THROW(OfflineAccumulator(-0.1f), std::invalid_argument);
  EXPECT_THROW(OfflineAccumulator(std::numeric_limits<float>::quiet_NaN()), std::invalid_argument);
}

}  // namespace
