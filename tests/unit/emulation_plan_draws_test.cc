// The seeded plan of an emulated run (emulation/plan_draws.h): profiles and ranges read
// strictly, draws that stay in their range, spread evenly and repeat for a seed (and equal
// the bash draws the launcher made before), and the plan's addresses and link seeds.
#include "emulation/plan_draws.h"

#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/settings.h"
#include "emulation/down_schedule.h"
#include "emulation/report_files.h"

namespace {

using namespace edgetrain::emulation;

std::vector<std::vector<std::string>> csv_rows(const std::string& csv) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(csv);
  for (std::string line; std::getline(in, line);) rows.push_back(split_fields(line));
  return rows;
}

TEST(PlanDraws, ReadsANumberOrARange) {
  const Range fixed = parse_range("3", "--slowdown");
  EXPECT_DOUBLE_EQ(fixed.lo, 3);
  EXPECT_DOUBLE_EQ(fixed.hi, 3);
  const Range range = parse_range("1.5:40", "--slowdown");
  EXPECT_DOUBLE_EQ(range.lo, 1.5);
  EXPECT_DOUBLE_EQ(range.hi, 40);
  EXPECT_DOUBLE_EQ(parse_range(".5", "x").lo, 0.5);
  for (const char* bad : {"", "-1", "1:", ":2", "1:x", "fast", "1:2:3", "1e3"}) {
    try {
      parse_range(bad, "--slowdown");
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), "--slowdown must be a number or A:B");
    }
  }
}

TEST(PlanDraws, ReadsALinkProfile) {
  const LinkProfile p = parse_link_profile("delay=20:80,loss=0.01,delay=1");
  EXPECT_DOUBLE_EQ(p.delay.lo, 20);  // a key given twice: the first counts
  EXPECT_DOUBLE_EQ(p.delay.hi, 80);
  EXPECT_DOUBLE_EQ(p.loss.hi, 0.01);
  EXPECT_DOUBLE_EQ(p.jitter.hi, 0);  // not given: 0
  EXPECT_DOUBLE_EQ(p.bandwidth.hi, 0);
  const LinkProfile none = parse_link_profile("");
  EXPECT_DOUBLE_EQ(none.delay.hi + none.jitter.hi + none.loss.hi + none.bandwidth.hi, 0);
  for (const char* bad : {"speed=3", "delay", "delay=fast", "delay=5,loss", "jitter=-1"})
    EXPECT_THROW(parse_link_profile(bad), std::invalid_argument) << bad;
  try {
    parse_link_profile("delay=5,speed=3");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'speed=3'"), std::string::npos) << e.what();
  }
}

TEST(PlanDraws, DrawsStayInTheirRangeAndRepeatForASeed) {
  const Range range{5, 40};
  std::set<double> seen;
  for (std::uint64_t seed : {1u, 7u, 12345u}) {
    for (std::uint64_t worker = 0; worker < 50; worker++) {
      const double value = draw(range, seed, worker, "delay");
      EXPECT_GE(value, 5);
      EXPECT_LT(value, 40);
      EXPECT_EQ(value, draw(range, seed, worker, "delay"));
      seen.insert(value);
    }
  }
  EXPECT_EQ(seen.size(), 150u);  // another seed or worker, another draw
  EXPECT_NE(draw(range, 1, 0, "delay"), draw(range, 1, 0, "jitter"));
  EXPECT_EQ(draw({20, 20}, 3, 9, "delay"), 20);
}

// The numbers the launcher's bash splitmix64 drew before the draws moved into C++
// (tests/emulation/emulate_plan_draws.sh lists them, printed by that bash code with 6
// significant digits): an independent implementation, so a seed keeps its devices.
TEST(PlanDraws, DrawsEqualTheLaunchersFormerBashDraws) {
  EXPECT_NEAR(draw({5, 40}, 1, 0, "delay"), 30.8634, 5e-5);
  EXPECT_NEAR(draw({0, 5}, 1, 1, "jitter"), 3.46386, 5e-6);
  EXPECT_NEAR(draw({0.001, 0.01}, 7, 2, "loss"), 0.00740364, 5e-9);
  EXPECT_NEAR(draw({5000, 50000}, 7, 99, "bandwidth"), 30172.4, 0.05);
  EXPECT_NEAR(draw({0, 3}, 12345, 2, "slowdown"), 0.620738, 5e-7);
}

TEST(PlanDraws, DrawsSpreadEvenlyOverTheRange) {
  const int n = 20000;
  double sum = 0;
  int below_quarter = 0;
  for (int worker = 0; worker < n; worker++) {
    const double u = draw({0, 1}, 42, static_cast<std::uint64_t>(worker), "slowdown");
    sum += u;
    below_quarter += u < 0.25;
  }
  // A uniform draw: mean 1/2 (standard error 0.002 here), a quarter below 1/4 (0.003).
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_NEAR(static_cast<double>(below_quarter) / n, 0.25, 0.015);
}

TEST(PlanDraws, ThePlanImpairsTheFirstKWorkersAndSeedsEveryLink) {
  PlanOptions o;
  o.seed = 2;
  o.workers = 3;
  o.impaired = 1;
  o.link = "delay=5,jitter=1:1,loss=0.01";
  o.slowdown = "2";
  const auto rows = csv_rows(plan_csv(o));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0],
            (std::vector<std::string>{"worker", "address", "listen", "delay_ms", "jitter_ms",
                                      "loss", "bandwidth_kbps", "slowdown", "link_seed",
                                      "outage_period_s", "outage_s", "outage_phase_s",
                                      "outage_from_s"}));
  EXPECT_EQ(rows[1], (std::vector<std::string>{"0", "127.0.0.1", "127.0.0.1:0", "5", "1", "0.01",
                                               "0", "2", "200006", "0", "0", "0",
                                               "0"}));  // seed·100003 + worker; always up
  EXPECT_EQ(rows[2], (std::vector<std::string>{"1", "127.0.0.1", "127.0.0.1:0", "0", "0", "0", "0",
                                               "2", "200007", "0", "0", "0", "0"}));
  EXPECT_EQ(rows[3][8], "200008");
  o.impaired = std::numeric_limits<unsigned>::max();  // the default: every worker
  for (const auto& row : csv_rows(plan_csv(o))) EXPECT_NE(row[3], "0") << row[0];
}

// Reachable 60% of the time in windows of 100 s from 30 s on: each worker down 40 s of
// every 100, worker i's phase 30 + 100·i/N, so a share 0.4 of the fleet is down at any time.
TEST(PlanDraws, OutagePhasesAreSpreadOverTheFleet) {
  PlanOptions o;
  o.workers = 5;
  o.reachable = 0.6;
  o.outage_period = 100;
  o.outage_start = 30;
  const auto rows = csv_rows(plan_csv(o));
  ASSERT_EQ(rows.size(), 6u);
  for (unsigned i = 0; i < 5; i++) {
    SCOPED_TRACE("worker " + std::to_string(i));
    EXPECT_EQ(rows[i + 1][9], "100");
    EXPECT_EQ(rows[i + 1][10], "40");
    EXPECT_EQ(rows[i + 1][11], std::to_string(30 + 20 * i));
    EXPECT_EQ(rows[i + 1][12], "30");
  }
  // Through the impairer's schedule: 2 of the 5 down at any time after the start.
  for (double t = 30.35; t < 400; t += 0.7) {  // never on a window's edge
    int down = 0;
    for (unsigned i = 0; i < 5; i++) {
      DownSchedule s;
      s.period_s = std::stod(rows[i + 1][9]);
      s.down_s = std::stod(rows[i + 1][10]);
      s.phase_s = std::stod(rows[i + 1][11]);
      s.from_s = std::stod(rows[i + 1][12]);
      down += s.down_at(t) ? 1 : 0;
    }
    EXPECT_EQ(down, 2) << "t = " << t;
  }
}

// In namespaces a /30 per worker in 10.S.0.0/16: worker i has 10.S.(4i/256).(4i%256 + 2),
// the impairer's side of its veth .1 below it.
TEST(PlanDraws, NamespacesGiveEveryWorkerItsOwnSlash30) {
  PlanOptions o;
  o.workers = 65;
  o.network = "netns";
  o.subnet = 7;
  EXPECT_EQ(worker_addresses(o, 0),
            std::make_pair(std::string("10.7.0.2"), std::string("10.7.0.1:5684")));
  EXPECT_EQ(worker_addresses(o, 63),
            std::make_pair(std::string("10.7.0.254"), std::string("10.7.0.253:5684")));
  EXPECT_EQ(worker_addresses(o, 64),
            std::make_pair(std::string("10.7.1.2"), std::string("10.7.1.1:5684")));
  const auto rows = csv_rows(plan_csv(o));
  EXPECT_EQ(rows.back()[1], "10.7.1.2");
  o.link = "delay=fast";
  EXPECT_THROW(plan_csv(o), std::invalid_argument);
}

TEST(PlanDraws, TheSubcommandsFlags) {
  PlanOptions o;
  edgetrain::settings::Table table("plan-test", "plan flags");
  declare_plan_settings(table, o);
  const char* argv[] = {"plan-test", "--workers", "3",         "--impaired", "2",
                        "--seed",    "9",         "--network", "netns",      "--subnet",
                        "150",       "--link",    "delay=5:9", "--slowdown", "1:2"};
  ASSERT_EQ(table.parse(15, argv), std::nullopt);
  EXPECT_EQ(o.workers, 3u);
  EXPECT_EQ(o.impaired, 2u);
  EXPECT_EQ(o.seed, 9u);
  EXPECT_EQ(o.network, "netns");
  EXPECT_EQ(o.subnet, 150);
  EXPECT_EQ(o.link, "delay=5:9");
  EXPECT_EQ(o.slowdown, "1:2");
  for (const std::vector<const char*>& bad :
       {std::vector<const char*>{"plan-test"},  // --workers is required
        {"plan-test", "--workers", "0"},
        {"plan-test", "--workers", "2", "--network", "wifi"},
        {"plan-test", "--workers", "2", "--subnet", "256"}}) {
    PlanOptions fresh;
    edgetrain::settings::Table t("plan-test", "plan flags");
    declare_plan_settings(t, fresh);
    EXPECT_EQ(t.parse(static_cast<int>(bad.size()), bad.data()), 2) << bad.size();
  }
}

}  // namespace
