// runtime::DropoutSelector (model/dropout_selector.h): fed a step time that changes as a
// background load comes and goes, it moves to thinner sub-networks and back, picks the
// most accurate point that fits the budget (the fastest when none fits), and does not
// flap on jitter.
#include "model/dropout_selector.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace {

using edgetrain::runtime::DropoutChoice;
using edgetrain::runtime::DropoutSelector;

std::vector<DropoutChoice> table() {
  return {{{0.5f, 0.5f}, 0.6, 0.90}, {{0.0f, 0.0f}, 1.0, 0.92}, {{0.75f, 0.75f}, 0.3, 0.85}};
}

// Runs `steps` steps whose full-model time is `full_seconds`; the measured time is that
// scaled by the current point's relative time (what a device with that spare CPU sees).
void run(DropoutSelector& s, double full_seconds, int steps, double jitter = 0) {
  for (int i = 0; i < steps; i++) {
    const double wobble = 1 + ((i % 2) ? jitter : -jitter);
    s.record_step(full_seconds * s.current_choice().relative_time * wobble);
  }
}

TEST(DropoutSelector, FollowsAChangingStepTime) {
  DropoutSelector s(table(), /*budget_seconds=*/0.010);
  EXPECT_EQ(s.current(), 1u);  // most accurate before any measurement
  run(s, 0.008, 20);
  EXPECT_EQ(s.current(), 1u) << "the full model fits 10 ms at 8 ms";
  EXPECT_NEAR(s.full_step_estimate(), 0.008, 1e-6);
  run(s, 0.015, 40);  // a background load: the full model would take 15 ms
  EXPECT_EQ(s.current(), 0u) << "0.6 x 15 ms = 9 ms fits";
  EXPECT_NEAR(s.full_step_estimate(), 0.015, 0.0015);
  run(s, 0.040, 40);  // heavier: nothing fits
  EXPECT_EQ(s.current(), 2u) << "the fastest point when none fits";
  run(s, 0.008, 60);  // the load leaves
  EXPECT_EQ(s.current(), 1u);
  // full -> 0.6 -> 0.3, and back through 0.6 while the smoothed estimate falls: four changes.
  EXPECT_EQ(s.selections(), 4u);
}

TEST(DropoutSelector, DoesNotFlapOnJitter) {
  DropoutSelector s(table(), 0.010);
  run(s, 0.015, 40);
  ASSERT_EQ(s.current(), 0u);
  const auto before = s.selections();
  run(s, 0.015, 200, 0.08);  // +-8% per step
  EXPECT_EQ(s.selections(), before);
  EXPECT_EQ(s.current(), 0u);
}

TEST(DropoutSelector, PicksTheMostAccurateThatFits) {
  DropoutSelector s(table(), 0.010);
  EXPECT_EQ(s.best_for(0.005), 1u);
  EXPECT_EQ(s.best_for(0.016), 0u);
  EXPECT_EQ(s.best_for(0.030), 2u);
  EXPECT_EQ(s.best_for(0.100), 2u);
}

TEST(DropoutSelector, RefusesBadInput) {
  EXPECT_THROW(DropoutSelector({}, 0.01), std::invalid_argument);
  EXPECT_THROW(DropoutSelector(table(), 0), std::invalid_argument);
  auto bad = table();
  bad[0].relative_time = 0;
  EXPECT_THROW(DropoutSelector(bad, 0.01), std::invalid_argument);
  DropoutSelector s(table(), 0.01);
  EXPECT_FALSE(s.record_step(-1));  // ignored
  EXPECT_EQ(s.full_step_estimate(), 0);
}

}  // namespace
