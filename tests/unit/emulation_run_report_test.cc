// The report of server runs on made-up run directories: the checks of a run
// (emulation/run_checks.h), its summary (run_summary.h), runs side by side and the target
// rule (run_comparison.h), and a sharded run's timeline rows (shard_report.h).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "emulation/report_files.h"
#include "emulation/run_checks.h"
#include "emulation/run_comparison.h"
#include "emulation/run_summary.h"
#include "emulation/shard_report.h"
#include "tests/support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using namespace edgetrain::emulation;
using edgetrain::testing::TempDir;
using nlohmann::json;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string stats(int steps, int bytes, int retries, int accepted, int refused,
                  const std::string& versions, const std::string& extra = "") {
  return "{\"steps\": " + std::to_string(steps) + ", \"bytes_sent\": " + std::to_string(bytes) +
         ", \"retries\": " + std::to_string(retries) +
         ", \"updates_accepted\": " + std::to_string(accepted) +
         ", \"updates_refused\": " + std::to_string(refused) + ", \"acknowledged_versions\": [" +
         versions + "]" + extra + "}";
}

// Two workers; worker 0 restarted once (two incarnations), worker 1 never; one server restart.
void make_run(const fs::path& run) {
  write(run / "plan.csv",
        "worker,address,listen,delay_ms,jitter_ms,loss,bandwidth_kbps,slowdown,link_seed\n"
        "0,10.100.0.2,10.100.0.1:5684,5,1,0.01,1000,1.5,100003\n"
        "1,10.100.0.6,10.100.0.5:5684,0,0,0,0,0.5,100004\n");
  write(run / "logs" / "worker-0.0.stats.json",
        stats(20, 1000, 1, 18, 2, "1, 5, 9", R"(, "shard_versions": [4, 7])"));
  write(run / "logs" / "worker-0.1.stats.json", stats(10, 500, 0, 9, 1, "12, 15"));
  write(run / "logs" / "worker-1.0.stats.json",
        stats(7, 300, 2, 6, 1, "3, 8, 30",
              R"(, "shard_versions": [11, 2], "offline_seconds": 61.75, "offline_steps": 400, )"
              R"("offline_updates_accepted": 2, "offline_updates_refused": 1, )"
              R"("offline_steps_refused": 90, "buffered_steps": 12)"));
  write(run / "timeline.csv",
        "elapsed_s,version,test_accuracy,ingress_payload_bytes,ingress_socket_bytes\n"
        "2,10,0.5,1000,1500\n4,20,0.8,2000,3100\n6,30,0.91,3000,4600\n8,40,0.93,4000,6000\n");
  write(run / "links.csv",
        "link,to_server_bytes_in,to_server_bytes_out,to_worker_bytes_in,to_server_dropped_loss,"
        "to_server_dropped_queue_full,to_worker_dropped_loss,to_worker_dropped_queue_full,"
        "to_server_dropped_down,to_worker_dropped_down,down_s\n"
        "w0,100,90,5000,1,0,2,0,3,1,60.25\nw1,200,190,7000,0,3,0,0,0,0,0\n");
  write(run / "restarts.csv", "elapsed_s,highest_acknowledged,recovered_version\n30,15,17\n");
  write(run / "run.label", "ASGD (MLP, 10)\n");
  write(run / "settings.md", "- settings of the launcher\n");
}

TEST(RunChecks, TheHighestAcknowledgedVersionOverWorkersAndIncarnations) {
  TempDir dir("edgetrain-run-checks");
  make_run(dir.path());
  EXPECT_EQ(highest_acknowledged(dir.path(), 2), 30u);  // worker 1's last
  EXPECT_EQ(highest_acknowledged(dir.path(), 1), 15u);  // worker 0's second incarnation
  // Per shard: worker 0 saw shard 0 at 4 and shard 1 at 7, worker 1 at 11 and 2; a worker
  // without shard_versions (worker 0's second incarnation) counts nothing.
  EXPECT_EQ(highest_acknowledged(dir.path(), 2, 0u), 11u);
  EXPECT_EQ(highest_acknowledged(dir.path(), 2, 1u), 7u);
  EXPECT_EQ(highest_acknowledged(dir.path(), 2, 2u), 0u);
  // The run's plan says how many workers there are.
  write(dir.path() / "plan.csv", "worker,address\n0,x\n");
  EXPECT_EQ(highest_acknowledged_in_run(dir.path()), 15u);
}

TEST(RunChecks, AWorkersTotalsSumItsIncarnations) {
  TempDir dir("edgetrain-run-checks");
  make_run(dir.path());
  const WorkerTotals t = worker_totals(dir.path(), 0);
  EXPECT_EQ(t.incarnations, 2u);
  EXPECT_EQ(t.steps, 30u);
  EXPECT_EQ(t.accepted, 27u);
  EXPECT_EQ(t.refused, 3u);
  EXPECT_EQ(t.bytes_sent, 1500u);
  EXPECT_EQ(t.retries, 1u);
  EXPECT_TRUE(t.versions_increase);  // 1 5 9, then 12 15
  EXPECT_EQ(worker_totals(dir.path(), 7).incarnations, 0u);
}

TEST(RunChecks, AVersionThatRepeatsOrGoesBackIsCaught) {
  TempDir dir("edgetrain-run-checks");
  make_run(dir.path());
  // Across a restart: the new incarnation starts at 9, which the old one already had.
  write(dir.path() / "logs" / "worker-0.1.stats.json", stats(10, 500, 0, 9, 1, "9, 15"));
  EXPECT_FALSE(worker_totals(dir.path(), 0).versions_increase);
  // Within one incarnation.
  write(dir.path() / "logs" / "worker-1.0.stats.json", stats(7, 300, 2, 6, 1, "3, 8, 8"));
  EXPECT_FALSE(worker_totals(dir.path(), 1).versions_increase);
}

// A worker of this release keeps only the last versions (AcknowledgedVersions): the checks
// read its summary, not its shortened list.
TEST(RunChecks, TheBoundedSummaryIsReadBeforeTheList) {
  TempDir dir("edgetrain-run-checks");
  auto summary = [](int count, int first, int highest, bool increasing) {
    return ", \"acknowledged_count\": " + std::to_string(count) +
           ", \"acknowledged_first\": " + std::to_string(first) +
           ", \"acknowledged_highest\": " + std::to_string(highest) +
           ", \"acknowledged_increasing\": " + (increasing ? "true" : "false");
  };
  write(dir.path() / "plan.csv", "worker\n0\n");
  // The list holds the last two of 2,000; the highest is the summary's.
  write(dir.path() / "logs" / "worker-0.0.stats.json",
        stats(2000, 1, 0, 2000, 0, "1999, 2000", summary(2000, 1, 2000, true)));
  write(dir.path() / "logs" / "worker-0.1.stats.json",
        stats(10, 1, 0, 10, 0, "2009, 2010", summary(10, 2001, 2010, true)));
  EXPECT_TRUE(worker_totals(dir.path(), 0).versions_increase);
  EXPECT_EQ(highest_acknowledged_in_run(dir.path(), std::nullopt), 2010u);
  // The second incarnation began at or below the first's highest: something went back.
  write(dir.path() / "logs" / "worker-0.1.stats.json",
        stats(10, 1, 0, 10, 0, "2009, 2010", summary(10, 2000, 2010, true)));
  EXPECT_FALSE(worker_totals(dir.path(), 0).versions_increase);
  // One incarnation saw a version not above the one before, outside its list.
  write(dir.path() / "logs" / "worker-0.1.stats.json",
        stats(10, 1, 0, 10, 0, "2009, 2010", summary(10, 2001, 2010, false)));
  EXPECT_FALSE(worker_totals(dir.path(), 0).versions_increase);
}

TEST(RunChecks, ARoundWorkerCountsItsRounds) {
  TempDir dir("edgetrain-run-checks");
  write(dir.path() / "logs" / "worker-0.0.stats.json",
        R"({"mode": "rounds", "steps": 40, "bytes_sent": 9, "retries": 0, "rounds_trained": 4,
            "deltas_refused": 1, "acknowledged_versions": [1, 2, 4, 5]})");
  const WorkerTotals t = worker_totals(dir.path(), 0);
  EXPECT_EQ(t.accepted, 4u);
  EXPECT_EQ(t.refused, 1u);
  EXPECT_TRUE(t.versions_increase);
}

TEST(RunChecks, ARestartLosesWhatItRecoversBelowTheAcknowledged) {
  TempDir dir("edgetrain-run-checks");
  EXPECT_TRUE(restart_checks(dir.path()).empty());  // no restarts.csv
  write(dir.path() / "restarts.csv",
        "elapsed_s,highest_acknowledged,recovered_version\n30,15,17\n60,20,20\n90,25,24\n");
  const json checks = restart_checks(dir.path());
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_FALSE(checks[0]["lost"].get<bool>());
  EXPECT_FALSE(checks[1]["lost"].get<bool>());  // equal: nothing lost
  EXPECT_TRUE(checks[2]["lost"].get<bool>());
  EXPECT_EQ(checks[2]["recovered_version"].get<int>(), 24);
  EXPECT_DOUBLE_EQ(checks[2]["elapsed_s"].get<double>(), 90);
}

TEST(RunSummary, AFinishedRunsFilesAndItsVerdict) {
  TempDir dir("edgetrain-run-summary");
  const fs::path run = dir.path();
  make_run(run);
  SummarizeOptions o;
  o.run = run.string();
  o.stop_kind = "target";
  o.stopped = "target accuracy 0.9 reached";
  o.network = "netns";
  o.reached = "6,30,0.91,3000,4600";
  o.target = 0.9;
  EXPECT_EQ(summarize(o), 0);
  const CsvTable workers = read_csv(run / "workers.csv");
  ASSERT_EQ(workers.rows.size(), 2u);
  // The plan's columns, then worker 0's sums over its two incarnations and one restart.
  // Then offline time, steps, updates accepted and refused, refused steps, steps buffered.
  EXPECT_EQ(workers.rows[0], (std::vector<std::string>{"0", "10.100.0.2", "5", "1", "0.01", "1000",
                                                       "1.5", "30", "27", "3", "1500", "1", "1",
                                                       "0", "0", "0", "0", "0", "0"}));
  EXPECT_EQ(workers.rows[1][workers.column("restarts")], "0");
  EXPECT_EQ(std::vector<std::string>(workers.rows[1].end() - 6, workers.rows[1].end()),
            (std::vector<std::string>{"62", "400", "2", "1", "90", "12"}));
  const json outcome = read_json(run / "outcome.json");
  EXPECT_EQ(outcome["stop"], "target");
  EXPECT_EQ(outcome["target_reached"]["version"].get<int>(), 30);
  EXPECT_FALSE(outcome["lost_acknowledged_updates"].get<bool>());
  EXPECT_EQ(outcome["acknowledged_versions_increase"], json::array({true, true}));
  const std::string summary = read_text(run / "summary.md");
  EXPECT_EQ(summary.rfind("# ASGD (MLP, 10)\n\n- settings of the launcher\n- stopped: target", 0),
            0u);
  EXPECT_NE(summary.find("none (1 server restarts checked"), std::string::npos);
  // 27 + 6 accepted; the last timeline row; links.csv's sums: relayed 90 + 190, egress
  // 5000 + 7000, dropped 1 + 2 + 3; payload sent 1500 + 300.
  EXPECT_NE(summary.find("updates accepted (workers' count): 33; the server's last evaluated "
                         "version: 40"),
            std::string::npos);
  EXPECT_NE(summary.find("socket ingress 6000 "), std::string::npos);
  EXPECT_NE(summary.find("by the impairer 280,"), std::string::npos);
  EXPECT_NE(summary.find("impairer received it) 12000,"), std::string::npos);
  EXPECT_NE(summary.find("accepted by the server 4000, update payload sent by the workers 1800;"),
            std::string::npos);
  EXPECT_NE(summary.find("datagrams dropped by the impairer 10\n"), std::string::npos);  // 4 down
  EXPECT_NE(summary.find("- offline: links down 60 s in all (links.csv down_s; datagrams dropped "
                         "while down 4), workers offline 62 s, 400 offline steps, offline "
                         "updates accepted 2 / refused 1 (90 steps), 12 steps buffered at the "
                         "end\n"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("| ASGD (MLP, 10) | 93.00% |"), std::string::npos);  // the table
  EXPECT_TRUE(fs::exists(run / "accuracy-vs-ingress.svg"));
}

TEST(RunSummary, ALostUpdateIsExitStatus3) {
  TempDir dir("edgetrain-run-summary");
  make_run(dir.path());
  SummarizeOptions o;
  o.run = dir.path().string();
  o.stop_kind = "time";
  write(dir.path() / "logs" / "worker-0.1.stats.json", stats(10, 500, 0, 9, 1, "9, 15"));
  testing::internal::CaptureStdout();
  EXPECT_EQ(summarize(o), 3);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("LOST ACKNOWLEDGED UPDATES: worker 0 "),
            std::string::npos);
  EXPECT_TRUE(read_json(dir.path() / "outcome.json")["lost_acknowledged_updates"].get<bool>());
  EXPECT_NE(read_text(dir.path() / "summary.md").find("acknowledged updates lost: YES"),
            std::string::npos);
  // A restart that recovered less than was acknowledged, every worker's versions fine.
  make_run(dir.path());
  write(dir.path() / "restarts.csv",
        "elapsed_s,highest_acknowledged,recovered_version\n30,15,14\n");
  testing::internal::CaptureStdout();
  EXPECT_EQ(summarize(o), 3);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  fs::remove(dir.path() / "plan.csv");
  EXPECT_THROW(summarize(o), std::invalid_argument);
}

TEST(RunSummary, ARunWithoutATimelineGetsNoTable) {
  TempDir dir("edgetrain-run-summary");
  make_run(dir.path());
  fs::remove(dir.path() / "timeline.csv");
  SummarizeOptions o;
  o.run = dir.path().string();
  EXPECT_EQ(summarize(o), 0);
  EXPECT_NE(read_text(dir.path() / "summary.md").find("(no table: no timeline.csv in "),
            std::string::npos);
}

std::string timeline(const std::vector<std::string>& rows) {
  std::string text = "elapsed_s,version,test_accuracy,ingress_payload_bytes,ingress_socket_bytes\n";
  for (const auto& r : rows) text += r + "\n";
  return text;
}

TEST(RunComparison, ReadsARunsTimelineAndLabel) {
  TempDir dir("edgetrain-run-comparison");
  const fs::path run = dir.path() / "asgd-run";
  write(run / "timeline.csv", timeline({"10,100,0.8,1000,2000", "20,200,0.9,2000,4000"}));
  ComparedRun r = read_compared_run(run.string());
  EXPECT_EQ(r.label, "asgd-run");  // no run.label: the directory's name
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[1].version, 200u);
  EXPECT_EQ(r.rows[1].socket_bytes, 4000u);
  EXPECT_EQ(r.egress_bytes, 0);
  write(run / "run.label", "ASGD (paper)\nsecond line\n");
  write(run / "links.csv", "link,to_worker_bytes_in\nw0,1000\nw1,2500\n");
  r = read_compared_run(run.string());
  EXPECT_EQ(r.label, "ASGD (paper)");
  EXPECT_EQ(r.egress_bytes, 3500);
  write(run / "timeline.csv", timeline({"10,100,0.8,1000,2000", "20,200,x,2000,4000"}));
  try {
    read_compared_run(run.string());
    ADD_FAILURE() << "a malformed line was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("timeline.csv line 3 is malformed"), std::string::npos);
  }
  write(run / "timeline.csv", "elapsed_s,accuracy\n1,0.5\n");
  EXPECT_THROW(read_compared_run(run.string()), std::invalid_argument);
  EXPECT_THROW(read_compared_run((dir.path() / "absent").string()), std::invalid_argument);
}

ComparedRun run_of(const std::string& label, std::vector<TimelineRow> rows, double egress = 0) {
  return ComparedRun{"dir-" + label, label, std::move(rows), egress};
}

// The target rule: half a point below the lowest best accuracy, rounded down to a tenth of
// a point. Bests 0.95 and 0.9123: 0.9073, so 90.7%.
TEST(RunComparison, TheDefaultTargetIsHalfAPointBelowTheLowestBest) {
  const ComparedRun a = run_of("a", {{1, 1, 0.93, 0, 0}, {2, 2, 0.95, 0, 0}, {3, 3, 0.94, 0, 0}});
  const ComparedRun b = run_of("b", {{1, 1, 0.9123, 0, 0}, {2, 2, 0.91, 0, 0}});
  EXPECT_DOUBLE_EQ(best_accuracy(a), 0.95);
  EXPECT_NEAR(default_target({a, b}), 0.907, 1e-12);
  EXPECT_NEAR(default_target({b, a}), 0.907, 1e-12);
  EXPECT_EQ(first_reaching(a, 0.94), &a.rows[1]);  // the first row at or above, not the last
  EXPECT_EQ(first_reaching(a, 0.96), nullptr);
}

// A (the reference) reaches 90% at 20 s with 4 MB at the socket, B at 10 s with 0.5 MB: B
// needs 8x fewer bytes and is 2x faster; C never gets there.
TEST(RunComparison, TheTableComparesEveryRunWithTheFirstAtTheTarget) {
  const ComparedRun a = run_of("ASGD",
                               {{10, 100, 0.80, 1000000, 2000000},
                                {20, 200, 0.91, 2000000, 4000000},
                                {30, 300, 0.92, 3000000, 6000000}},
                               3500);
  const ComparedRun b = run_of("AdaComp", {{5, 50, 0.85, 100000, 200000},
                                           {10, 100, 0.9, 200000, 500000},
                                           {40, 400, 0.95, 800000, 1200000}});
  const ComparedRun c = run_of("slow", {{50, 10, 0.5, 1000, 1100}});
  const std::string table = comparison_table({a, b, c}, 0.9);
  EXPECT_EQ(
      table.rfind("| run | best test acc | final | updates | socket ingress | payload ingress "
                  "| transport overhead | time to 90.0% | time ratio ASGD / this | socket "
                  "bytes to 90.0% | ratio ASGD / this | socket egress (whole run) |\n",
                  0),
      0u);
  EXPECT_NE(table.find("| ASGD | 92.00% | 92.00% | 300 | 6.00 MB | 3.00 MB | +100% | 20 s | "
                       "1.0x | 4.00 MB | **1.0x** | 3.5 kB |\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| AdaComp | 95.00% | 95.00% | 400 | 1.20 MB | 800.0 kB | +50% | 10 s | "
                       "2.0x | 500.0 kB | **8.0x** | — |\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| slow | 50.00% | 50.00% | 10 | 1.1 kB | 1.0 kB | +10% | not reached | "
                       "— | — | — | — |\n"),
            std::string::npos)
      << table;
  // A reference that never reaches the target leaves every ratio out.
  const std::string no_reference = comparison_table({c, b}, 0.9);
  EXPECT_NE(no_reference.find("| AdaComp | 95.00% | 95.00% | 400 | 1.20 MB | 800.0 kB | +50% | "
                              "10 s | — | 500.0 kB | — | — |\n"),
            std::string::npos)
      << no_reference;
}

TEST(RunComparison, CompareRunsWritesPlotsAndTheTable) {
  TempDir dir("edgetrain-run-comparison");
  const fs::path a = dir.path() / "a", b = dir.path() / "an-adacomp-run";
  write(a / "timeline.csv", timeline({"10,100,0.95,1000,2000"}));
  write(a / "run.label", "ASGD (MLP, 10)\n");
  write(b / "timeline.csv", timeline({"10,100,0.9123,1000,3000"}));
  write(b / "run.label", "AdaComp c=0.01, error feedback (MLP)\n");
  const fs::path out = dir.path() / "out";
  const std::string table = compare_runs({a.string(), b.string()}, out.string(), -1, true);
  EXPECT_NE(table.find("time to 90.7%"), std::string::npos);  // the default target
  EXPECT_EQ(read_text(out / "summary.md"), table);
  const std::string svg = read_text(out / "accuracy-vs-ingress.svg");
  // Legends: the label without its parenthesized setting, or (too long) the directory's name.
  EXPECT_NE(svg.find(">ASGD</text>"), std::string::npos);
  EXPECT_NE(svg.find(">an-adacomp-run</text>"), std::string::npos);
  EXPECT_TRUE(fs::exists(out / "accuracy-vs-time.svg"));
  EXPECT_NE(compare_runs({a.string()}, (dir.path() / "o2").string(), 0.5, false).find("50.0%"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir.path() / "o2" / "summary.md"));
  EXPECT_THROW(compare_runs({}, out.string(), -1, true), std::invalid_argument);
}

TEST(ShardReport, IngressOverEveryShardAndIncarnation) {
  TempDir dir("edgetrain-shard-report");
  const fs::path logs = dir.path() / "logs";
  write(logs / "shard-0-0.stats.json",
        R"({"ingress_payload_bytes": 100, "ingress_socket_bytes": 150})");
  write(logs / "shard-0-1.stats.json",
        R"({"ingress_payload_bytes": 40, "ingress_socket_bytes": 60})");
  write(logs / "shard-1-0.stats.json", R"({"ingress_payload_bytes": 200})");
  write(logs / "shard-1.stats.json", R"({"ingress_payload_bytes": 9999})");  // not a shard's
  write(logs / "worker-0.0.stats.json", R"({"ingress_payload_bytes": 9999})");
  const auto [payload, socket] = shard_ingress(dir.path());
  EXPECT_EQ(payload, 340);
  EXPECT_EQ(socket, 210);
  // The mean of the shards' versions (10 and 14: 12 updates applied), accuracy to 4 decimals.
  write(dir.path() / "eval.json", R"({"shard_versions": [10, 14], "accuracy": 0.75})");
  EXPECT_EQ(append_shard_row(dir.path(), 12.4, dir.path() / "eval.json"), "12,12,0.7500,340,210");
  EXPECT_EQ(append_shard_row(dir.path(), 20, dir.path() / "eval.json"), "20,12,0.7500,340,210");
  EXPECT_EQ(read_text(dir.path() / "timeline.csv"),
            "elapsed_s,version,test_accuracy,ingress_payload_bytes,ingress_socket_bytes\n"
            "12,12,0.7500,340,210\n20,12,0.7500,340,210\n");
  write(dir.path() / "eval.json", R"({"shard_versions": [], "accuracy": 0.75})");
  EXPECT_THROW(append_shard_row(dir.path(), 30, dir.path() / "eval.json"), std::invalid_argument);
  // The timeline reads back as a compared run.
  EXPECT_EQ(read_compared_run(dir.path().string()).rows.size(), 2u);
}

}  // namespace
