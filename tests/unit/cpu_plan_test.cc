// The emulator's CPU budgets (emulation/cpu_plan.h): classes and schedules are read strictly,
// and the plan gives every worker its class's quota at 0 s and changes exactly at the
// schedule's boundaries.
#include "emulation/cpu_plan.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace {

using namespace edgetrain::emulation;

TEST(CpuPlan, ReadsNamedAndPlainClasses) {
  const auto named = parse_cpu_classes("pi5=1,pi4=0.6,zero2w=0.2");
  ASSERT_EQ(named.size(), 3u);
  EXPECT_EQ(named[1].name, "pi4");
  EXPECT_DOUBLE_EQ(named[1].share, 0.6);
  const auto plain = parse_cpu_classes("1,0.25");
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[1].name, "c1");
  EXPECT_DOUBLE_EQ(plain[1].share, 0.25);
}

TEST(CpuPlan, RefusesBadClassesAndSchedules) {
  for (const char* bad :
       {"", "pi4=0", "pi4=-1", "pi4=65", "pi4=x", "pi4=0.5,pi4=0.2", "4pi=1", "pi4=0.5,"})
    EXPECT_THROW(parse_cpu_classes(bad), std::invalid_argument) << bad;
  const auto classes = parse_cpu_classes("a=1,b=0.5");
  for (const char* bad :
       {"60-30:0.5", "10-20", "10-20:0", "10-20:0.5@c", "x-20:0.5", "-5-20:0.5", "10-20:0.5,"})
    EXPECT_THROW(parse_cpu_schedule(bad, classes), std::invalid_argument) << bad;
  EXPECT_TRUE(parse_cpu_schedule("", classes).empty());
}

TEST(CpuPlan, QuotasAtStartAndAtEveryBoundary) {
  const auto classes = parse_cpu_classes("fast=1,slow=0.25");
  const auto schedule = parse_cpu_schedule("10-20:0.5,15-30:0.5@slow", classes);
  const auto changes = plan_cpu_changes(4, classes, schedule, 100000);
  // 0 s: everyone at its class's share; 10 s: all halved; 15 s: slow halved again;
  // 20 s: the first window ends; 30 s: the second ends.
  struct Expected {
    double t;
    unsigned worker;
    double share;
  };
  const std::vector<Expected> expected = {
      {0, 0, 1},    {0, 1, 0.25},   {0, 2, 1},       {0, 3, 0.25},    {10, 0, 0.5}, {10, 1, 0.125},
      {10, 2, 0.5}, {10, 3, 0.125}, {15, 1, 0.0625}, {15, 3, 0.0625}, {20, 0, 1},   {20, 1, 0.125},
      {20, 2, 1},   {20, 3, 0.125}, {30, 1, 0.25},   {30, 3, 0.25}};
  ASSERT_EQ(changes.size(), expected.size());
  for (std::size_t k = 0; k < expected.size(); ++k) {
    SCOPED_TRACE(k);
    EXPECT_DOUBLE_EQ(changes[k].elapsed, expected[k].t);
    EXPECT_EQ(changes[k].worker, expected[k].worker);
    EXPECT_DOUBLE_EQ(changes[k].share, expected[k].share);
    EXPECT_EQ(changes[k].quota_us, static_cast<std::uint64_t>(expected[k].share * 100000));
    EXPECT_EQ(changes[k].class_name, expected[k].worker % 2 ? "slow" : "fast");
  }
}

TEST(CpuPlan, QuotaNeverBelowTheKernelsMinimum) {
  const auto classes = parse_cpu_classes("tiny=0.001");
  const auto changes = plan_cpu_changes(1, classes, {}, 100000);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].quota_us, kMinimumQuotaMicros);
  EXPECT_THROW(plan_cpu_changes(1, classes, {}, 10), std::invalid_argument);
}

TEST(CpuPlan, CsvHasOneRowPerChange) {
  const auto classes = parse_cpu_classes("a=0.5");
  const std::string csv =
      cpu_changes_csv(plan_cpu_changes(2, classes, parse_cpu_schedule("5-6:2", classes), 50000));
  EXPECT_EQ(csv,
            "elapsed_s,worker,class,share,quota_us,period_us\n"
            "0,0,a,0.5,25000,50000\n0,1,a,0.5,25000,50000\n"
            "5,0,a,1,50000,50000\n5,1,a,1,50000,50000\n"
            "6,0,a,0.5,25000,50000\n6,1,a,0.5,25000,50000\n");
}

}  // namespace
