// Adaptive clipping's rules (server/adaptive_clipping.h; Andrew et al. 2021), against their
// formulas worked by hand.
#include "server/adaptive_clipping.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

using edgetrain::server::AdaptiveClipping;
using edgetrain::server::check_adaptive_clipping;
using edgetrain::server::count_noise_stddev;
using edgetrain::server::counts_as_unclipped;
using edgetrain::server::delta_noise_multiplier;
using edgetrain::server::next_clip_norm;

TEST(AdaptiveClipping, TheDeltasKeepWhatTheCountLeavesOfTheBudget) {
  // z = 1, σ_b = 5: z_Δ = (1 − 1/100)^(−1/2).
  EXPECT_NEAR(delta_noise_multiplier(1.0, 5.0), 1 / std::sqrt(0.99), 1e-12);
  // A large σ_b costs nearly nothing; σ_b at 1/(2z) would cost everything.
  EXPECT_NEAR(delta_noise_multiplier(2.0, 1e6), 2.0, 1e-6);
  EXPECT_THROW(delta_noise_multiplier(1.0, 0.5), std::invalid_argument);
  EXPECT_THROW(delta_noise_multiplier(1.0, 0.4), std::invalid_argument);
}

TEST(AdaptiveClipping, TheCountNoiseDefaultsToOneTwentiethOfTheDevices) {
  EXPECT_DOUBLE_EQ(count_noise_stddev({0.5, 0.2, 0}, 100), 5.0);
  EXPECT_DOUBLE_EQ(count_noise_stddev({0.5, 0.2, 3}, 100), 3.0);
}

TEST(AdaptiveClipping, TheClipNormMovesGeometricallyTowardsTheQuantile) {
  const AdaptiveClipping median{0.5, 0.2, 0};
  // Every one of 10 devices unclipped: b̃ = 1, S shrinks by e^(−0.2·0.5).
  EXPECT_NEAR(next_clip_norm(2.0, 10, 0, 10, median), 2.0 * std::exp(-0.1), 1e-12);
  // None unclipped: S grows by e^(0.1).
  EXPECT_NEAR(next_clip_norm(2.0, 0, 0, 10, median), 2.0 * std::exp(0.1), 1e-12);
  // Half of them, and the noise adds 1 to the count: b̃ = 0.6.
  EXPECT_NEAR(next_clip_norm(2.0, 5, 1.0, 10, median), 2.0 * std::exp(-0.02), 1e-12);
  // At the quantile it stays.
  EXPECT_DOUBLE_EQ(next_clip_norm(2.0, 5, 0, 10, median), 2.0);
}

TEST(AdaptiveClipping, AReloadedDeltaAtTheClipNormCountsAsClipped) {
  EXPECT_TRUE(counts_as_unclipped(1.0, 1.0, false));
  EXPECT_FALSE(counts_as_unclipped(1.0000001, 1.0, false));
  EXPECT_FALSE(counts_as_unclipped(1.0, 1.0, true));         // clipped, logged at S
  EXPECT_FALSE(counts_as_unclipped(0.9999999, 1.0, true));   // S up to a float rounding
  EXPECT_TRUE(counts_as_unclipped(0.99, 1.0, true));
}

TEST(AdaptiveClipping, SettingsOutOfRangeAreRefusedByName) {
  check_adaptive_clipping({0, 0, 0});  // off: nothing to check
  try {
    check_adaptive_clipping({1.0, 0.2, 0});
    FAIL() << "a quantile of 1 was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--dp-adaptive-clip-quantile"), std::string::npos);
  }
  EXPECT_THROW(check_adaptive_clipping({0.5, 0, 0}), std::invalid_argument);
  EXPECT_THROW(check_adaptive_clipping({0.5, 0.2, -1}), std::invalid_argument);
}
