// common/logging.h: level names, and RepeatLimiter driven by an injected clock: a burst of a
// kind goes out as it is, the rest becomes one summary line per interval with its count,
// kinds are independent, and the table of kinds stays bounded.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/logging.h"

namespace {

using edgetrain::logging::Level;
using edgetrain::logging::RepeatLimiter;
using namespace std::chrono_literals;

RepeatLimiter::Options options(std::size_t burst, std::size_t max_kinds = 1024) {
  RepeatLimiter::Options o;
  o.burst = burst;
  o.interval = 10s;
  o.max_kinds = max_kinds;
  return o;
}

TEST(LogLevels, NamesRoundTripAndUnknownNamesAreRefused) {
  for (Level l : {Level::kError, Level::kWarn, Level::kInfo, Level::kDebug})
    EXPECT_EQ(edgetrain::logging::parse_level(edgetrain::logging::level_name(l)), l);
  EXPECT_FALSE(edgetrain::logging::parse_level("verbose"));
  EXPECT_FALSE(edgetrain::logging::parse_level("INFO"));
  edgetrain::logging::set_level(Level::kWarn);
  EXPECT_TRUE(edgetrain::logging::enabled(Level::kError));
  EXPECT_TRUE(edgetrain::logging::enabled(Level::kWarn));
  EXPECT_FALSE(edgetrain::logging::enabled(Level::kInfo));
  edgetrain::logging::set_level(Level::kInfo);
}

TEST(LogLevels, ThousandsSeparators) {
  EXPECT_EQ(edgetrain::logging::with_thousands(0), "0");
  EXPECT_EQ(edgetrain::logging::with_thousands(999), "999");
  EXPECT_EQ(edgetrain::logging::with_thousands(1435), "1,435");
  EXPECT_EQ(edgetrain::logging::with_thousands(12345678), "12,345,678");
}

TEST(RepeatLimiter, AFloodBecomesItsBurstAndOneCountedLinePerInterval) {
  RepeatLimiter limiter(options(3));
  const auto t0 = RepeatLimiter::Clock::time_point{} + 1000s;
  std::vector<std::string> shown;
  for (int i = 0; i < 1436; ++i) {  // 1,436 lines in 6 s, as in issue 12
    for (auto& line :
         limiter.admit("too stale from w1", "refused " + std::to_string(i), t0 + i * 4ms))
      shown.push_back(line);
  }
  EXPECT_EQ(shown, (std::vector<std::string>{"refused 0", "refused 1", "refused 2"}));
  EXPECT_EQ(limiter.suppressed(), 1433u);
  EXPECT_TRUE(limiter.flush(t0 + 9s).empty());  // the interval has not ended
  const auto summary = limiter.flush(t0 + 10s);
  ASSERT_EQ(summary.size(), 1u);
  EXPECT_EQ(summary[0], "refused 1435 (1,433 more in the last 10 s)");
  EXPECT_EQ(limiter.suppressed(), 0u);
  EXPECT_EQ(limiter.kinds(), 0u);  // flushed kinds are forgotten
  EXPECT_TRUE(limiter.flush(t0 + 30s).empty());
}

TEST(RepeatLimiter, FlushAllSumsUpIntervalsThatHaveNotEnded) {
  RepeatLimiter limiter(options(1));
  const auto t0 = RepeatLimiter::Clock::time_point{} + 1000s;
  limiter.admit("k", "a", t0);
  limiter.admit("k", "b", t0 + 1s);
  EXPECT_TRUE(limiter.flush(t0 + 3s).empty());
  EXPECT_EQ(limiter.flush_all(t0 + 3s), (std::vector<std::string>{"b (1 more in the last 3 s)"}));
  EXPECT_EQ(limiter.kinds(), 0u);
}

TEST(RepeatLimiter, TheNextLineAfterAnIntervalCarriesTheSummaryAndStartsAfresh) {
  RepeatLimiter limiter(options(1));
  const auto t0 = RepeatLimiter::Clock::time_point{} + 1000s;
  EXPECT_EQ(limiter.admit("k", "a", t0).size(), 1u);
  EXPECT_TRUE(limiter.admit("k", "b", t0 + 1s).empty());
  EXPECT_TRUE(limiter.admit("k", "c", t0 + 2s).empty());
  const auto lines = limiter.admit("k", "d", t0 + 11s);
  EXPECT_EQ(lines, (std::vector<std::string>{"c (2 more in the last 11 s)", "d"}));
  EXPECT_TRUE(limiter.admit("k", "e", t0 + 12s).empty());
}

TEST(RepeatLimiter, KindsAreCountedApart) {
  RepeatLimiter limiter(options(1));
  const auto t0 = RepeatLimiter::Clock::time_point{} + 1000s;
  EXPECT_EQ(limiter.admit("stale from a", "a1", t0).size(), 1u);
  EXPECT_EQ(limiter.admit("stale from b", "b1", t0).size(), 1u);
  EXPECT_TRUE(limiter.admit("stale from a", "a2", t0).empty());
  EXPECT_TRUE(limiter.admit("stale from b", "b2", t0).empty());
  EXPECT_TRUE(limiter.admit("stale from b", "b3", t0).empty());
  auto summaries = limiter.flush(t0 + 10s);
  std::sort(summaries.begin(), summaries.end());
  EXPECT_EQ(summaries, (std::vector<std::string>{"a2 (1 more in the last 10 s)",
                                                 "b3 (2 more in the last 10 s)"}));
}

TEST(RepeatLimiter, ManyDistinctKindsStayBoundedAndNothingCountedIsLost) {
  RepeatLimiter limiter(options(0, 8));  // burst 0: every line is counted
  const auto t0 = RepeatLimiter::Clock::time_point{} + 1000s;
  std::vector<std::string> summaries;
  for (int i = 0; i < 1000; ++i) {
    for (auto& line :
         limiter.admit("kind " + std::to_string(i), "line " + std::to_string(i), t0 + i * 1ms))
      summaries.push_back(line);
    EXPECT_LE(limiter.kinds(), 8u);
  }
  for (auto& line : limiter.flush(t0 + 1h)) summaries.push_back(line);
  EXPECT_EQ(summaries.size(), 1000u);  // each evicted kind was summed up, none dropped silently
  EXPECT_EQ(summaries[0], "line 0 (1 more in the last 1 s)");
}

}  // namespace
