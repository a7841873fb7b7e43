// Backoff between a worker's retries: exponential with full jitter, capped, reset after a
// success, and seeded so that two workers do not retry in lock step.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>

#include "worker/backoff.h"

namespace {

using edgetrain::runtime::Backoff;

TEST(Backoff, DelaysGrowToTheCapWithJitterAndReset) {
  Backoff backoff(std::chrono::milliseconds(100), std::chrono::milliseconds(5000), 7);
  long long caps[] = {100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000};
  bool below_cap = false;
  for (long long cap : caps) {
    const auto d = backoff.next_delay().count();
    EXPECT_GE(d, 0);
    EXPECT_LE(d, cap);
    below_cap |= d < cap;
  }
  EXPECT_TRUE(below_cap) << "full jitter draws below the cap";
  EXPECT_EQ(backoff.failures(), 9);
  backoff.reset();
  EXPECT_LE(backoff.next_delay().count(), 100);
  // Two workers with different seeds do not retry in lock step.
  Backoff a(std::chrono::milliseconds(1000), std::chrono::milliseconds(1000), 1),
      b(std::chrono::milliseconds(1000), std::chrono::milliseconds(1000), 2);
  int same = 0;
  for (int i = 0; i < 20; i++) same += a.next_delay() == b.next_delay();
  EXPECT_LT(same, 3);
  EXPECT_THROW(Backoff(std::chrono::milliseconds(0), std::chrono::milliseconds(1), 1),
               std::invalid_argument);
}

}  // namespace
