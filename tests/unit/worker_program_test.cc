// The worker program as a library (worker/worker_program.h): the registry of modes behind
// --mode, and each mode's stats file schema, which the emulator, the report program and the
// process-level tests read by key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>

#include "common/settings.h"
#include "worker/worker_program.h"

namespace {

using namespace edgetrain;
using nlohmann::json;

TEST(WorkerModes, EveryModeOfTheTableIsRegisteredOnceAndOnlyThose) {
  runtime::WorkerSettings settings;
  settings::Table table("edgetrain-worker", "test");
  runtime::declare_worker_settings(table, settings);
  const settings::Setting* mode = nullptr;
  for (const auto& setting : table.settings())
    if (setting->flag() == "mode") mode = setting.get();
  ASSERT_NE(mode, nullptr);
  std::set<std::string> registered;
  for (const runtime::WorkerMode& m : runtime::worker_modes()) {
    EXPECT_TRUE(registered.insert(std::string(m.name)).second) << m.name << " twice";
    EXPECT_NE(m.prepare, nullptr) << m.name;
    EXPECT_EQ(runtime::find_worker_mode(m.name), &m);
  }
  const std::set<std::string> choices(mode->allowed().begin(), mode->allowed().end());
  EXPECT_EQ(registered, choices);
  EXPECT_EQ(runtime::find_worker_mode("federated"), nullptr);
}

// The program loads the images of the shard a mode reports (WorkerModeRun::shard); that
// must be the shard the mode's loop samples: worker_shard() for the modes with a server,
// the peer's index in the topology for gossip.
TEST(WorkerModes, EachModeReportsTheShardItsLoopSamples) {
  runtime::Dataset labels_only;
  labels_only.height = labels_only.width = 28;
  labels_only.channels = 1;
  labels_only.num_classes = 10;
  std::mt19937 rng(4);
  for (int i = 0; i < 1000; ++i) labels_only.labels.push_back(static_cast<std::int32_t>(rng() % 10));
  const std::filesystem::path topology =
      std::filesystem::temp_directory_path() /
      ("edgetrain-worker-program-test-" + std::to_string(::getpid()) + ".json");
  std::ofstream(topology) << R"({"kind": "ring", "peers": [{"name": "p0", "address": "127.0.0.1:6000"},
    {"name": "p1", "address": "127.0.0.1:6001"}, {"name": "p2", "address": "127.0.0.1:6002"}],
    "edges": [[0, 1], [1, 2], [2, 0]]})";
  for (bool skewed : {false, true}) {
    for (const char* name : {"async", "rounds", "gan", "gossip"}) {
      runtime::WorkerSettings s;
      s.mode = name;
      s.server = "coap://127.0.0.1:5683";
      s.insecure = true;
      s.identity = "p1";
      s.config.worker_id = 2;
      s.config.worker_count = 5;
      s.config.seed = 17;
      s.config.label_skewed = skewed;
      if (s.mode == "gossip") s.topology_file = topology.string();
      const auto run = runtime::find_worker_mode(name)->prepare(s);
      const runtime::ShardSpec spec =
          s.mode == "gossip" ? runtime::ShardSpec{1, 3, 17} : runtime::ShardSpec{2, 5, 17};
      EXPECT_EQ(run->shard(labels_only), runtime::shard_of(labels_only, spec, skewed))
          << name << (skewed ? " label-skewed" : " i.i.d.");
      if (s.mode != "gossip") {
        EXPECT_EQ(run->shard(labels_only), runtime::worker_shard(s.config, labels_only)) << name;
      }
    }
  }
  std::filesystem::remove(topology);
}

TEST(WorkerModes, AModeThatNeedsATopologySaysSoBeforeAnyDataIsLoaded) {
  runtime::WorkerSettings settings;
  settings.mode = "gossip";
  EXPECT_THROW(runtime::find_worker_mode("gossip")->prepare(settings), std::invalid_argument);
  settings.mode = "gan";
  settings.topology_file = "/nonexistent/topology.json";
  settings.peer_name = "gan-0";
  settings.insecure = true;
  settings.server = "coap://127.0.0.1:5683";
  settings.identity = "gan-0";
  EXPECT_THROW(runtime::find_worker_mode("gan")->prepare(settings), std::invalid_argument);
}

void expect_common_keys(const json& j, const std::string& state) {
  EXPECT_EQ(j.at("state"), state);
  EXPECT_TRUE(j.contains("bytes_sent"));
  EXPECT_TRUE(j.contains("bytes_received"));
  EXPECT_GT(j.at("peak_rss_bytes").get<std::uint64_t>(), 0u);  // this test process's VmHWM
}

TEST(WorkerStatsFiles, AsyncCarriesEveryCounterAndTheAcknowledgedVersionsInOrder) {
  runtime::WorkerStats stats;
  stats.steps = 12;
  stats.updates_accepted = 3;
  stats.bytes_sent = 4096;
  stats.dropout.drop_rates = "0.25";
  runtime::AcknowledgedVersions acknowledged;
  for (const std::uint64_t v : {7, 9, 11}) acknowledged.add(v);
  const json j = json::parse(runtime::async_stats_json(stats, acknowledged, true));
  expect_common_keys(j, "running");
  EXPECT_EQ(j.at("steps"), 12);
  EXPECT_EQ(j.at("updates_accepted"), 3);
  EXPECT_EQ(j.at("bytes_sent"), 4096);
  EXPECT_EQ(j.at("acknowledged_versions"), json({7, 9, 11}));
  EXPECT_EQ(j.at("acknowledged_count"), 3);
  EXPECT_EQ(j.at("acknowledged_first"), 7);
  EXPECT_EQ(j.at("acknowledged_highest"), 11);
  EXPECT_EQ(j.at("acknowledged_increasing"), true);
  EXPECT_EQ(j.at("dropout").at("drop_rates"), "0.25");
  // The seeded first pull's outcome (issue 38), read by e2e_train_cheap_pull and the emulator.
  for (const char* key : {"first_pull", "first_pull_bytes", "seeded_first_pull_fallbacks"})
    EXPECT_TRUE(j.contains(key)) << key;
  // Offline training's counters (issue 38), read by e2e_worker_offline and the emulator.
  for (const char* key :
       {"offline", "offline_seconds", "offline_steps", "buffered_steps", "offline_updates_accepted",
        "offline_updates_refused", "offline_steps_refused", "last_offline_from_version",
        "last_offline_acknowledged_version", "last_offline_steps"})
    EXPECT_TRUE(j.contains(key)) << key;
  // Compression that follows the link (issue 38 part 2), read by e2e_worker_link_adaptation.
  for (const char* key :
       {"compression_rate", "uplink_bytes_per_second", "uplink_fixed_seconds", "step_seconds",
        "turn_seconds_without_send", "budget_spent_bytes", "budget_counted_bytes", "budget_waiting",
        "budget_waits", "budget_wait_seconds"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_FALSE(j.contains("shard_versions"));  // only a sharded worker has them
  stats.shard_versions = {4, 5};
  EXPECT_EQ(json::parse(runtime::async_stats_json(stats, {}, false)).at("shard_versions"),
            json({4, 5}));
}

// A board's worker runs for weeks: the stats file keeps the last kRecent versions and a
// summary, so neither its memory nor the file grows with the run.
TEST(WorkerStatsFiles, AsyncAcknowledgementsStayBoundedWithTheirSummary) {
  runtime::AcknowledgedVersions acknowledged;
  const std::uint64_t n = 3 * runtime::AcknowledgedVersions::kRecent;
  for (std::uint64_t v = 1; v <= n; ++v) acknowledged.add(v);
  const json j = json::parse(runtime::async_stats_json({}, acknowledged, true));
  ASSERT_EQ(j.at("acknowledged_versions").size(), runtime::AcknowledgedVersions::kRecent);
  EXPECT_EQ(j.at("acknowledged_versions").back(), n);
  EXPECT_EQ(j.at("acknowledged_versions").front(), n - runtime::AcknowledgedVersions::kRecent + 1);
  EXPECT_EQ(j.at("acknowledged_count"), n);
  EXPECT_EQ(j.at("acknowledged_first"), 1);
  EXPECT_EQ(j.at("acknowledged_highest"), n);
  EXPECT_EQ(j.at("acknowledged_increasing"), true);
  acknowledged.add(5);  // the server went back
  EXPECT_FALSE(acknowledged.increasing);
  EXPECT_EQ(acknowledged.highest, n);
}

TEST(WorkerStatsFiles, RoundsNamesItsModeAndItsAcknowledgedRoundsAsVersions) {
  runtime::RoundWorkerStats stats;
  stats.rounds_trained = 2;
  stats.acknowledged_rounds = {0, 3};
  const json j = json::parse(runtime::rounds_stats_json(stats, false));
  expect_common_keys(j, "stopped");
  EXPECT_EQ(j.at("mode"), "rounds");
  EXPECT_EQ(j.at("rounds_trained"), 2);
  EXPECT_EQ(j.at("acknowledged_versions"), json({0, 3}));
}

TEST(WorkerStatsFiles, GossipAndGanNameTheirModeAndTheirProgress) {
  runtime::GossipPeerStats gossip;
  gossip.iteration = 40;
  gossip.exchanges = 80;
  const json g = json::parse(runtime::gossip_stats_json(gossip, "peer-1", true));
  expect_common_keys(g, "running");
  EXPECT_EQ(g.at("mode"), "gossip");
  EXPECT_EQ(g.at("peer"), "peer-1");
  EXPECT_EQ(g.at("iteration"), 40);
  EXPECT_EQ(g.at("exchanges"), 80);
  EXPECT_TRUE(g.contains("resumed_iteration"));
  runtime::GanWorkerStats gan;
  gan.iterations = 5;
  const json a = json::parse(runtime::gan_stats_json(gan, false));
  expect_common_keys(a, "stopped");
  EXPECT_EQ(a.at("mode"), "gan");
  EXPECT_EQ(a.at("iterations"), 5);
  EXPECT_TRUE(a.contains("peer_bytes_sent"));
}

}  // namespace
