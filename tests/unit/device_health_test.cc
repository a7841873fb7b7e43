// server/device_health.h with an injected clock: last seen, silent after the setting,
// workers apart from monitors, mean staleness, the recent step rate, and the bound on
// identities (the one heard from longest ago goes first, and its owner is told).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/device_health.h"

namespace {

using edgetrain::server::DeviceHealth;
using edgetrain::server::DeviceHealthOptions;
using namespace std::chrono_literals;

struct FakeClock {
  std::chrono::steady_clock::time_point now = std::chrono::steady_clock::time_point{} + 1000s;
};

DeviceHealthOptions options_with(FakeClock& clock, std::size_t max_devices = 100) {
  DeviceHealthOptions o;
  o.silent_after_seconds = 30;
  o.max_devices = max_devices;
  o.rate_window_seconds = 10;
  o.now = [&clock] { return clock.now; };
  return o;
}

TEST(DeviceHealth, LastSeenAndSilentAfterTheSetting) {
  FakeClock clock;
  DeviceHealth health(options_with(clock));
  EXPECT_TRUE(health.note_request("w1", true, 100));
  EXPECT_FALSE(health.note_request("w1", true, 50));
  clock.now += 30s;
  const auto* w1 = health.find("w1");
  ASSERT_NE(w1, nullptr);
  EXPECT_DOUBLE_EQ(health.view(*w1).last_seen_seconds_ago, 30.0);
  EXPECT_FALSE(health.view(*w1).silent);  // silent only after more than 30 s
  EXPECT_EQ(health.silent_workers(), 0u);
  clock.now += 1s;
  EXPECT_TRUE(health.view(*w1).silent);
  EXPECT_EQ(health.silent_workers(), 1u);
  health.note_request("w1", true, 0);  // heard from again
  EXPECT_FALSE(health.view(*health.find("w1")).silent);
  EXPECT_EQ(health.find("w1")->requests, 3u);
  EXPECT_EQ(health.find("w1")->request_payload_bytes, 150u);
  EXPECT_EQ(health.find("nobody"), nullptr);
}

TEST(DeviceHealth, MonitorsAreNotWorkersUntilTheyTrain) {
  FakeClock clock;
  DeviceHealth health(options_with(clock));
  health.note_request("monitor", false, 0);
  health.note_request("w1", true, 0);
  EXPECT_EQ(health.workers(), 1u);
  EXPECT_FALSE(health.find("monitor")->worker);
  health.note_request("monitor", true, 0);  // it pulled the model: a worker from now on
  EXPECT_EQ(health.workers(), 2u);
  health.note_request("monitor", false, 0);
  EXPECT_TRUE(health.find("monitor")->worker);
}

TEST(DeviceHealth, MeanStalenessAndStepRate) {
  FakeClock clock;
  DeviceHealth health(options_with(clock));
  health.note_request("w1", true, 0);
  for (int i = 0; i < 20; ++i) {  // 20 updates in 10 s, staleness 0..3
    health.note_accepted("w1", static_cast<std::uint64_t>(i % 4));
    clock.now += 500ms;
  }
  auto view = health.view(*health.find("w1"));
  EXPECT_DOUBLE_EQ(view.mean_staleness, 1.5);
  EXPECT_NEAR(view.step_rate, 2.0, 0.01);
  clock.now += 5s;  // half the last window has passed without updates
  view = health.view(*health.find("w1"));
  EXPECT_NEAR(view.step_rate, 1.0, 0.01);
  clock.now += 60s;  // long silent: no recent steps
  EXPECT_DOUBLE_EQ(health.view(*health.find("w1")).step_rate, 0.0);
  EXPECT_EQ(health.find("w1")->updates_accepted, 20u);
  health.note_accepted("unknown", 1);  // not tracked: ignored
  EXPECT_EQ(health.devices().size(), 1u);
}

TEST(DeviceHealth, AFloodOfIdentitiesStaysBoundedAndTheOldestGoesFirst) {
  FakeClock clock;
  std::vector<std::string> forgotten;
  DeviceHealthOptions o = options_with(clock, 5);
  o.on_forget = [&](const std::string& identity) { forgotten.push_back(identity); };
  DeviceHealth health(o);
  for (int i = 0; i < 5; ++i) {
    health.note_request("d" + std::to_string(i), true, 0);
    clock.now += 1s;
  }
  health.note_request("d0", true, 0);  // d0 is now the most recent; d1 the oldest
  clock.now += 1s;
  for (int i = 0; i < 1000; ++i) {
    health.note_request("flood-" + std::to_string(i), false, 0);
    EXPECT_LE(health.devices().size(), 5u);
  }
  ASSERT_GE(forgotten.size(), 2u);
  EXPECT_EQ(forgotten[0], "d1");
  EXPECT_EQ(forgotten[1], "d2");
  EXPECT_EQ(health.forgotten(), 1000u);   // the five first ones, then 995 of the flood
  EXPECT_EQ(health.find("d0"), nullptr);  // pushed out in time, too
  EXPECT_NE(health.find("flood-999"), nullptr);
}

}  // namespace
