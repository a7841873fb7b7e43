// edgetrain-sim as a library (sim/sim_program.h, sim/sim_reports.h): the registry of modes
// behind --mode, each mode's refusal of another mode's settings before any data loads, and
// the summary tables and sim.csv from small made-up results (no data set, no simulation).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/settings.h"
#include "sim/sim_program.h"
#include "sim/sim_reports.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace edgetrain;

// The table of edgetrain-sim, parsed from `args` (without the program's name).
struct ParsedSettings {
  sim::SimSettings settings;
  settings::Table table{"edgetrain-sim", "test"};

  explicit ParsedSettings(std::vector<const char*> args) {
    sim::declare_sim_settings(table, settings);
    args.insert(args.begin(), "edgetrain-sim");
    const auto status = table.parse(static_cast<int>(args.size()), args.data());
    EXPECT_FALSE(status.has_value()) << "the table refused the arguments";
  }
};

// Whether `text` holds `part`; the text is printed when not.
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "no \"" << part << "\" in:\n" << text;
}

// What the mode's checks throw, or "" when they pass.
std::string refusal(ParsedSettings& parsed) {
  const sim::SimModeEntry* mode = sim::find_sim_mode(parsed.settings.mode);
  if (!mode) return "no mode " + parsed.settings.mode;
  try {
    if (!mode->prepare(parsed.settings, parsed.table)) return "no run";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(SimModes, EveryModeOfTheTableIsRegisteredOnceAndOnlyThose) {
  ParsedSettings parsed({});
  const settings::Setting* mode = nullptr;
  for (const auto& setting : parsed.table.settings())
    if (setting->flag() == "mode") mode = setting.get();
  ASSERT_NE(mode, nullptr);
  std::vector<std::string> registered;
  for (const sim::SimModeEntry& m : sim::sim_modes()) {
    registered.emplace_back(m.name);
    EXPECT_NE(m.prepare, nullptr) << m.name;
    EXPECT_EQ(sim::find_sim_mode(m.name), &m);
    EXPECT_EQ(m.group.empty(), m.declare == nullptr) << m.name << ": a group needs its rows";
  }
  EXPECT_EQ(registered, mode->allowed()) << "--help lists the modes in the registry's order";
  EXPECT_EQ(std::set<std::string>(registered.begin(), registered.end()).size(), registered.size());
  EXPECT_EQ(sim::find_sim_mode("federated"), nullptr);
}

TEST(SimModes, EachModesRowsAreInItsOwnGroup) {
  ParsedSettings parsed({});
  auto group_of = [&](const std::string& flag) {
    for (const auto& setting : parsed.table.settings())
      if (setting->flag() == flag) return setting->group();
    return std::string("(none)");
  };
  EXPECT_EQ(group_of("local-steps"), sim::find_sim_mode("rounds")->group);
  EXPECT_EQ(group_of("topology"), sim::find_sim_mode("gossip")->group);
  EXPECT_EQ(group_of("updates"), "Run and output");
}

TEST(SimModes, TheDefaultsOfEveryModePassTheirChecksWithoutData) {
  for (const sim::SimModeEntry& mode : sim::sim_modes()) {
    ParsedSettings parsed({"--mode", mode.name.data()});
    EXPECT_EQ(refusal(parsed), "") << mode.name;
  }
}

TEST(SimModes, ASettingOfGossipIsRefusedByNameInTheOtherModes) {
  ParsedSettings async({"--topology", "full"});
  EXPECT_EQ(refusal(async), "--topology is a setting of --mode gossip");
  ParsedSettings rounds({"--mode", "rounds", "--iterations", "10"});
  EXPECT_EQ(refusal(rounds), "--iterations is a setting of --mode gossip");
}

TEST(SimModes, ASettingThatNeedsAServerIsRefusedByNameInGossip) {
  for (const char* flag :
       {"--rounds", "--staleness", "--updates", "--drop-rates", "--compressor", "--reachable",
        "--offline-steps"}) {
    const char* value = std::string(flag) == "--staleness"    ? "delay"
                        : std::string(flag) == "--drop-rates" ? "0.5"
                        : std::string(flag) == "--compressor" ? "none"
                        : std::string(flag) == "--reachable"  ? "0.5"
                                                              : "3";
    ParsedSettings gossip({"--mode", "gossip", flag, value});
    EXPECT_EQ(refusal(gossip),
              std::string(flag) + " is not a setting of --mode gossip (no server there)");
  }
  // A rounds setting is no async setting, but async has always ignored it (no refusal).
  ParsedSettings async({"--local-steps", "3"});
  EXPECT_EQ(refusal(async), "");
}

TEST(SimModes, SettingsWrongTogetherAreRefusedBeforeAnyData) {
  ParsedSettings rounds({"--mode", "rounds", "--delta-pulls"});
  EXPECT_TRUE(Contains(refusal(rounds),
                       "--delta-pulls, --publish-every and --pull-fraction are for --mode async"));
  ParsedSettings rounds_cheap({"--mode", "rounds", "--pull-fraction", "0.02"});
  EXPECT_TRUE(Contains(refusal(rounds_cheap), "are for --mode async"));
  ParsedSettings both_cuts({"--pull-fraction", "0.02", "--publish-every", "10"});
  EXPECT_TRUE(Contains(refusal(both_cuts), "--pull-fraction and --publish-every are two ways"));
  ParsedSettings gossip_cheap({"--mode", "gossip", "--pull-fraction", "0.02"});
  EXPECT_EQ(refusal(gossip_cheap), "--pull-fraction is not a setting of --mode gossip (no server there)");
  // The learning-rate schedule is the staleness-aware server's: async only, checked.
  ParsedSettings rounds_decay({"--mode", "rounds", "--lr-decay-at", "100"});
  EXPECT_TRUE(Contains(refusal(rounds_decay), "--lr-decay-at is the staleness-aware server's"));
  ParsedSettings gossip_decay({"--mode", "gossip", "--lr-decay-at", "100"});
  EXPECT_EQ(refusal(gossip_decay), "--lr-decay-at is not a setting of --mode gossip (no server there)");
  ParsedSettings factor_alone({"--lr-decay-factor", "0.5"});
  EXPECT_TRUE(Contains(refusal(factor_alone), "--lr-decay-factor needs --lr-decay-at"));
  ParsedSettings unordered({"--lr-decay-at", "200,100"});
  EXPECT_TRUE(Contains(refusal(unordered), "--lr-decay-at '200,100'"));
  ParsedSettings decay({"--lr-decay-at", "100,200", "--lr-decay-factor", "0.5"});
  EXPECT_EQ(refusal(decay), "");
  ParsedSettings gossip({"--mode", "gossip", "--gossip", "ad-psgd", "--publish-fraction", "0.1"});
  EXPECT_TRUE(Contains(refusal(gossip), "--publish-fraction below 1 is for d-psgd"));
}

// Two made-up runs: ASGD reaches 90% after 200 updates and 80 MB, AdaComp after 300 updates
// and 2 MB; their pulls (1,000 and 1,500 bytes so far) make the downloads.
std::vector<sim::SimResult> two_runs() {
  sim::SimResult asgd, adacomp;
  asgd.label = "ASGD";
  asgd.curve = {{0, 0, 0, 0, 0.1, 2.3},
                {200, 40, 80'000'000, 1000, 0.9, 0.4},
                {300, 60, 120'000'000, 1500, 0.92, 0.3}};
  asgd.updates_applied = 300;
  asgd.ingress_bytes = 120'000'000;
  asgd.pull_bytes = 1'500;
  asgd.mean_update_bytes = 400'000;
  asgd.mean_pull_bytes = 400'000;
  asgd.mean_delay = 3;
  adacomp = asgd;
  adacomp.label = "AdaComp c=0.01";
  adacomp.curve = {{0, 0, 0, 0, 0.1, 2.3},
                   {200, 40, 1'000'000, 1000, 0.85, 0.5},
                   {300, 60, 2'000'000, 1500, 0.91, 0.35}};
  adacomp.ingress_bytes = 2'000'000;
  adacomp.mean_update_bytes = 5'000;
  adacomp.updates_refused = 7;
  return {asgd, adacomp};
}

TEST(SimReports, HumanBytesAndTimes) {
  EXPECT_EQ(sim::human_bytes(512), "512 B");
  EXPECT_EQ(sim::human_bytes(407'170), "407.17 kB");
  EXPECT_EQ(sim::human_bytes(1.56e6), "1.56 MB");
  EXPECT_EQ(sim::time_text(std::nullopt), "never");
  EXPECT_EQ(sim::time_text(42.4), "42");
}

TEST(SimReports, TheAsyncTableHasARowPerRunTheTargetAndTheTrafficRatio) {
  const std::string table = sim::async_summary_table(two_runs(), 0.9);
  EXPECT_TRUE(Contains(table, "| method | final acc | best acc | updates | ingress |"));
  EXPECT_TRUE(Contains(table,
                       "| ASGD | 92.00% | 92.00% | 300 | 120.00 MB | 1.50 kB | 400.00 kB | 3.0 | 0 "
                       "| 0 | 0 | 200 | 80.00 MB | 80.00 MB | 400.00 kB |\n"));
  EXPECT_TRUE(Contains(table,
                       "| AdaComp c=0.01 | 91.00% | 91.00% | 300 | 2.00 MB | 1.50 kB | 5.00 kB | "
                       "3.0 | 7 | 0 | 0 | 300 | 2.00 MB | 2.00 MB | 400.00 kB |\n"));
  EXPECT_TRUE(Contains(table, "\ntarget accuracy: 90%\n"));
  EXPECT_TRUE(Contains(table,
                       "traffic ratio ASGD / AdaComp to 90.0%: 40.0x (80.00 MB vs 2.00 "
                       "MB); per update: 80.0x; accuracy gap (best): -1.00 points\n"));
  // Upload + download: 80,001,000 bytes against 2,001,500.
  EXPECT_TRUE(Contains(table,
                       "both directions (upload + download) to 90.0%: 40.0x (80.00 MB vs 2.00 MB)\n"));
}

TEST(SimReports, ARunThatNeverReachesTheTargetSaysNeverAndStalledRunsSaySo) {
  std::vector<sim::SimResult> runs = two_runs();
  runs[1].stalled = true;
  const std::string table = sim::async_summary_table(runs, 0.915);
  EXPECT_TRUE(Contains(table, "| 7 | 0 | 0 | never | never | never | 400.00 kB |\n"));
  EXPECT_TRUE(Contains(table, "AdaComp c=0.01: stopped after 300 applied updates"));
  EXPECT_TRUE(Contains(table, "traffic ratio: not available (a run never reached the target)\n"));
  // One run: no ratio at all.
  runs.pop_back();
  EXPECT_FALSE(Contains(sim::async_summary_table(runs, 0.9), "traffic ratio"));
}

TEST(SimReports, TheRoundsTableCountsRoundsStragglersAndTheDenseToAdaCompRatio) {
  std::vector<sim::SimResult> runs = two_runs();
  runs[0].label = "FedAvg dense";
  runs[1].label = "FedAvg AdaComp c=0.01";
  runs[1].round_stragglers = 4;
  runs[1].empty_rounds = 1;
  runs[1].mean_round_deltas = 9.5;
  runs[1].virtual_time = 61;
  const std::string table = sim::rounds_summary_table(runs, 0.9);
  EXPECT_TRUE(Contains(table, "| method | final acc | best acc | rounds | virtual time |"));
  EXPECT_TRUE(Contains(table,
                       "| FedAvg AdaComp c=0.01 | 91.00% | 91.00% | 300 | 61 | 2.00 MB | "
                       "1.50 kB | 5.00 kB | 9.5 | 4 | 0 | 0 | 1 | 300 | 60 | 2.00 MB | 2.00 MB | "
                       "400.00 kB |\n"));
  EXPECT_TRUE(Contains(table, "target accuracy: 90%\n"));
  EXPECT_TRUE(Contains(table, "traffic ratio dense / AdaComp deltas to 90.0%: 40.0x"));
}

TEST(SimReports, TheGossipTableHasTheRunItsSpeedClassesAndTheConsensus) {
  sim::GossipResult r;
  r.label = "D-PSGD, ring";
  r.topology = "ring, 4 peers, 4 edges";
  r.curve = {{0, 0, 0, 0.1, 0.1, 0.1, 0.1, 2.3, 2.3, 0},
             {20, 20, 4'000'000, 0.8, 0.75, 0.85, 0.86, 0.6, 0.5, 80}};
  r.virtual_time = 20;
  r.mean_iterations = 20;
  r.local_steps = 80;
  r.bytes_per_peer = 4'000'000;
  r.classes = {{1, 4, 0.99, 1, 0.08, 10}};
  r.consensus_distance = 0.05;
  const std::string table = sim::gossip_summary_table(r, 0.8);
  EXPECT_TRUE(Contains(table,
                       "| D-PSGD, ring | ring, 4 peers, 4 edges | 80.00% | 75.00-85.00% | "
                       "86.00% | 20 | 20 | 80 | 0 | 4.00 MB | 20 | 4.00 MB | 20 | 0 |\n"));
  EXPECT_TRUE(Contains(table, "| 1 | 4 | 0.99 | 1.00 | 0.08 | 10.0 |\n"));
  EXPECT_TRUE(Contains(table, "target accuracy (mean peer): 80%"));
  EXPECT_TRUE(
      Contains(table, "consensus distance at the end (mean |x_i - mean| / |mean|): 0.05\n"));
  EXPECT_FALSE(Contains(table, "accuracy-aware"));
  EXPECT_TRUE(Contains(sim::gossip_summary_table(r, 0.9), "| never | never | never | 0 |\n"));
}

TEST(SimReports, SimCsvHasARowPerEvaluationAndTheThreePlots) {
  edgetrain::testing::TempDir dir("sim-program-test");
  std::filesystem::create_directories(dir.path());
  sim::write_sim_curves(dir.path().string(), {"mnist-small", "mlp", 4}, false, two_runs(), 0.9);
  EXPECT_EQ(edgetrain::testing::file_bytes(dir.path() / "sim.csv"),
            "method,updates,virtual_time,ingress_bytes,pull_bytes,test_accuracy,test_loss\n"
            "\"ASGD\",0,0,0,0,0.1,2.3\n"
            "\"ASGD\",200,40,80000000,1000,0.9,0.4\n"
            "\"ASGD\",300,60,120000000,1500,0.92,0.3\n"
            "\"AdaComp c=0.01\",0,0,0,0,0.1,2.3\n"
            "\"AdaComp c=0.01\",200,40,1000000,1000,0.85,0.5\n"
            "\"AdaComp c=0.01\",300,60,2000000,1500,0.91,0.35\n");
  for (const std::string& file : sim::sim_plot_files(false))
    EXPECT_TRUE(std::filesystem::file_size(dir.path() / file) > 0) << file;
  EXPECT_EQ(sim::sim_plot_files(true)[1], "accuracy-vs-rounds.svg");
}

}  // namespace
