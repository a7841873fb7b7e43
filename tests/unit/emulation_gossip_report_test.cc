// The gossip side of the report library (emulation/gossip_report.h) on made-up runs: the
// wiring of a fleet behind the impairer (a link per directed edge, on the dialling peer's
// side and with its profile), the peers' topologies through the impairer, the timeline rows
// of a fleet evaluation, the restart check of summarize and the comparison of runs.
#include "emulation/gossip_report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "emulation/plan_draws.h"
#include "emulation/report_files.h"
#include "emulation/run_summary.h"
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

// A ring of N peers w0..wN-1, as edgetrain-topology writes it (the report reads the names
// and the edges).
void write_ring(const fs::path& run, unsigned n) {
  json topology = {{"kind", "ring"}, {"peers", json::array()}, {"edges", json::array()}};
  for (unsigned i = 0; i < n; i++) {
    topology["peers"].push_back({{"name", "w" + std::to_string(i)}, {"address", ""}});
    topology["edges"].push_back({i, (i + 1) % n});
  }
  write(run / "topology.json", topology.dump());
}

void write_plan(const fs::path& run, unsigned workers, const std::string& network) {
  PlanOptions plan;
  plan.seed = 3;
  plan.workers = workers;
  plan.network = network;
  plan.subnet = 150;
  plan.link = "delay=7";
  plan.impaired = 1;  // only w0's links are impaired
  write(run / "plan.csv", plan_csv(plan));
}

// The [[link]] block named NAME in links.toml, up to the next one.
std::string link_block(const std::string& toml, const std::string& name) {
  const auto at = toml.find("name = \"" + name + "\"");
  if (at == std::string::npos) return "";
  return toml.substr(at, toml.find("[[link]]", at) - at);
}

TEST(GossipReport, WiringGivesEveryDirectedEdgeALinkOnTheDiallersSide) {
  TempDir dir("edgetrain-gossip-report");
  const fs::path run = dir.path();
  write_ring(run, 4);
  write_plan(run, 4, "netns");
  write_gossip_wiring(run, "netns", 150);
  // In namespaces a peer listens on its own address (worker i: 10.150.0.(4i+2)).
  EXPECT_EQ(read_text(run / "peers.csv"),
            "peer,name,listen,neighbours,attack\n0,w0,10.150.0.2:5684,1;3,\n"
            "1,w1,10.150.0.6:5684,0;2,\n2,w2,10.150.0.10:5684,1;3,\n3,w3,10.150.0.14:5684,0;2,\n");
  EXPECT_TRUE(gossip_attackers(run).empty());
  EXPECT_EQ(read_json(run / "topology.json")["peers"][3]["address"], "10.150.0.14:5684");
  const std::string links = read_text(run / "links.toml");
  std::size_t blocks = 0;
  for (auto at = links.find("[[link]]"); at != std::string::npos;
       at = links.find("[[link]]", at + 1))
    blocks++;
  EXPECT_EQ(blocks, 8u);  // 4 edges, both directions
  // w0 dials w3: the link listens on w0's side of its veth (10.150.0.1), forwards to w3, has
  // w0's profile and the seed link_seed(w0)·4099 + 3, link_seed(w0) = 3·100003.
  const std::string w0_w3 = link_block(links, "w0-w3");
  EXPECT_NE(w0_w3.find("listen = \"10.150.0.1:0\"\nupstream = \"10.150.0.14:5684\"\n"),
            std::string::npos)
      << w0_w3;
  EXPECT_NE(w0_w3.find("delay_ms = 7\n"), std::string::npos) << w0_w3;
  EXPECT_NE(w0_w3.find("seed = " + std::to_string(300009ull * 4099 + 3) + "\n"), std::string::npos)
      << w0_w3;
  // w3 dials w0 over a link of its own, with w3's (unimpaired) profile.
  const std::string w3_w0 = link_block(links, "w3-w0");
  EXPECT_NE(w3_w0.find("listen = \"10.150.0.13:0\"\nupstream = \"10.150.0.2:5684\"\n"),
            std::string::npos)
      << w3_w0;
  EXPECT_NE(w3_w0.find("delay_ms = 0\n"), std::string::npos) << w3_w0;
  EXPECT_EQ(link_block(links, "w0-w2"), "");  // not neighbours on the ring
}

// On loopback every peer gets its own 127.150.(i/200).(i%200 + 10), all on the CoAPs port.
TEST(GossipReport, LoopbackPeersGetAnAddressOfTheirOwn) {
  TempDir dir("edgetrain-gossip-report");
  write_ring(dir.path(), 202);
  write_plan(dir.path(), 202, "loopback");
  write_gossip_wiring(dir.path(), "loopback", 150);
  const CsvTable peers = read_csv(dir.path() / "peers.csv");
  ASSERT_EQ(peers.rows.size(), 202u);
  EXPECT_EQ(peers.rows[3][2], "127.150.0.13:5684");
  EXPECT_EQ(peers.rows[199][2], "127.150.0.209:5684");
  EXPECT_EQ(peers.rows[201][2], "127.150.1.11:5684");
  EXPECT_EQ(peers.rows[201][3], "0;200");
  // The link listens on the impairer's loopback address, any port.
  EXPECT_NE(
      link_block(read_text(dir.path() / "links.toml"), "w1-w2").find("listen = \"127.0.0.1:0\""),
      std::string::npos);
}

TEST(GossipReport, WiringRefusesAPlanAndTopologyThatDisagree) {
  TempDir dir("edgetrain-gossip-report");
  write_ring(dir.path(), 4);
  write_plan(dir.path(), 3, "netns");
  EXPECT_THROW(write_gossip_wiring(dir.path(), "netns", 150), std::invalid_argument);
  write_plan(dir.path(), 4, "netns");
  for (const char* edges : {"[[0, 1], [1, 9]]", "[[0, 1], [2, 2]]"}) {
    json topology = read_json(dir.path() / "topology.json");
    topology["edges"] = json::parse(edges);
    write(dir.path() / "topology.json", topology.dump());
    EXPECT_THROW(write_gossip_wiring(dir.path(), "netns", 150), std::invalid_argument) << edges;
  }
}

TEST(GossipReport, EveryPeerReachesItsNeighboursThroughTheImpairer) {
  TempDir dir("edgetrain-gossip-report");
  const fs::path run = dir.path();
  write_ring(run, 4);
  write_plan(run, 4, "netns");
  write_gossip_wiring(run, "netns", 150);
  json ports = {{"links", json::object()}};
  int port = 4000;
  for (int i = 0; i < 4; i++)
    for (int j : {(i + 1) % 4, (i + 3) % 4})
      ports["links"]["w" + std::to_string(i) + "-w" + std::to_string(j)] =
          "127.0.0.1:" + std::to_string(port++);
  write(run / "logs" / "impairer.ports.json", ports.dump());
  write_peer_topologies(run);
  const json w0 = read_json(run / "peers" / "w0.topology.json");
  EXPECT_EQ(w0["peers"][1]["address"], ports["links"]["w0-w1"]);
  EXPECT_EQ(w0["peers"][3]["address"], ports["links"]["w0-w3"]);
  EXPECT_EQ(w0["peers"][0]["address"], "10.150.0.2:5684");   // itself
  EXPECT_EQ(w0["peers"][2]["address"], "10.150.0.10:5684");  // no neighbour: untouched
  const json w1 = read_json(run / "peers" / "w1.topology.json");
  EXPECT_EQ(w1["peers"][0]["address"], ports["links"]["w1-w0"]);  // w1's own link to w0
  ports["links"].erase("w2-w3");
  write(run / "logs" / "impairer.ports.json", ports.dump());
  EXPECT_THROW(write_peer_topologies(run), std::invalid_argument);
}

std::string peer_stats(int iteration, int resumed, int bytes_sent) {
  return "{\"mode\": \"gossip\", \"iteration\": " + std::to_string(iteration) +
         ", \"resumed_iteration\": " + std::to_string(resumed) +
         ", \"steps\": 5, \"exchanges\": 9, \"bytes_sent\": " + std::to_string(bytes_sent) +
         ", \"bytes_received\": 7, \"neighbours_skipped\": 1, \"models_refused\": 0, "
         "\"requests_refused\": 0, \"batch\": 10}";
}

// Two peers: w0 restarted once (bytes of both incarnations count), w1's second stats file
// torn (skipped). The eval: iterations 10 and 20 (mean 15), links 300 + 700 bytes.
void make_gossip_run(const fs::path& run) {
  write_ring(run, 2);
  write_plan(run, 2, "loopback");
  write(run / "logs" / "worker-0.0.stats.json", peer_stats(47, 0, 1000));
  write(run / "logs" / "worker-0.1.stats.json", peer_stats(58, 40, 500));
  write(run / "logs" / "worker-1.0.stats.json", peer_stats(59, 0, 300));
  write(run / "logs" / "worker-1.1.stats.json", "{\"mode\": \"gos");
  write(run / "links.csv",
        "link,listen,to_server_bytes_in,to_worker_bytes_in\nw0-w1,x,100,200\nw1-w0,x,300,400\n");
  write(run / "eval.json",
        R"({"peers": [{"iteration": 10}, {"iteration": 20}], "mean_accuracy": 0.8,
            "min_accuracy": 0.7, "max_accuracy": 0.9, "consensus_accuracy": 0.85})");
  write(run / "run.label", "gossip ring\n");
  write(run / "settings.md", "");
}

TEST(GossipReport, AFleetEvaluationBecomesTimelineRows) {
  TempDir dir("edgetrain-gossip-report");
  const fs::path run = dir.path();
  make_gossip_run(run);
  // timeline.csv: version = mean iteration, accuracy = mean peer's, payload = 1500 + 300
  // bytes the peers sent, socket = 1000 bytes the links carried both ways.
  EXPECT_EQ(append_gossip_row(run, 7.4, run / "eval.json"), "7,15,0.8000,1800,1000");
  EXPECT_EQ(append_gossip_row(run, 9, run / "eval.json"), "9,15,0.8000,1800,1000");
  const CsvTable timeline = read_csv(run / "timeline.csv");
  EXPECT_EQ(timeline.rows.size(), 2u);  // one header
  const CsvTable gossip = read_csv(run / "gossip-timeline.csv");
  ASSERT_EQ(gossip.rows.size(), 2u);
  // Per peer: 1800 / 2 sent, 1000 / 2 carried; min and max iteration of the evaluation.
  // No attackers: both peers honest, nothing refused or clipped.
  EXPECT_EQ(gossip.rows[0],
            (std::vector<std::string>{"7.4", "15.0", "10", "20", "0.8000", "0.7000", "0.9000",
                                      "0.8500", "900", "500", "2", "0", "0"}));
}

// Peers 0..N-1 marked as attackers in peers.csv, with their attack; the wiring refuses a
// fleet of attackers only and an attack that is not one.
TEST(GossipReport, WiringMarksTheAttackers) {
  TempDir dir("edgetrain-gossip-report");
  const fs::path run = dir.path();
  write_ring(run, 4);
  write_plan(run, 4, "netns");
  write_gossip_wiring(run, "netns", 150, 2, "scale:-4");
  const CsvTable peers = read_csv(run / "peers.csv");
  EXPECT_EQ(peers.rows[1].at(peers.column("attack")), "scale:-4");
  EXPECT_EQ(peers.rows[2].size(), 4u);  // an honest peer's empty attack ends its row
  EXPECT_EQ(gossip_attackers(run), (std::vector<std::pair<std::string, std::string>>{
                                       {"w0", "scale:-4"}, {"w1", "scale:-4"}}));
  EXPECT_THROW(write_gossip_wiring(run, "netns", 150, 4, "bias:1e30"), std::invalid_argument);
  EXPECT_THROW(write_gossip_wiring(run, "netns", 150, 1, "bias"), std::invalid_argument);
  EXPECT_THROW(write_gossip_wiring(run, "netns", 150, 0, "bias:1e30"), std::invalid_argument);
  // A run wired before the column existed has no attackers.
  write(run / "peers.csv", "peer,name,listen,neighbours\n0,w0,x,1;3\n");
  EXPECT_TRUE(gossip_attackers(run).empty());
}

// A gossip peer's stats file with what it took of each neighbour.
std::string stats_with_neighbours(int iteration, int resumed, const json& neighbours) {
  json stats = json::parse(peer_stats(iteration, resumed, 100));
  stats["neighbours"] = neighbours;
  return stats.dump();
}

// A ring of 3 whose w0 attacks: the evaluations are of w1 and w2 only (one that holds w0 is
// refused), and the rows, outcome.json, workers.csv and summary.md count what w1 and w2
// refused, clipped and mixed of w0, over w1's two incarnations.
TEST(GossipReport, TheHonestPeersAccuracyAndWhatTheyRefusedOfTheAttackers) {
  TempDir dir("edgetrain-gossip-report");
  const fs::path run = dir.path();
  write_ring(run, 3);
  write_plan(run, 3, "loopback");
  write_gossip_wiring(run, "loopback", 150, 1, "bias:1e30");
  const json none = {{"mixed", 0}, {"refused", 0}, {"clipped", 0}};
  write(run / "logs" / "worker-0.0.stats.json",
        stats_with_neighbours(30, 0, {{"w1", none}, {"w2", none}}));
  write(run / "logs" / "worker-1.0.stats.json",
        stats_with_neighbours(20, 0, {{"w0", {{"mixed", 1}, {"refused", 4}, {"clipped", 1}}},
                                   {"w2", {{"mixed", 20}, {"refused", 0}, {"clipped", 2}}}}));
  write(run / "logs" / "worker-1.1.stats.json",
        stats_with_neighbours(28, 20, {{"w0", {{"mixed", 0}, {"refused", 3}, {"clipped", 0}}},
                                   {"w2", {{"mixed", 8}, {"refused", 0}, {"clipped", 0}}}}));
  write(run / "logs" / "worker-2.0.stats.json",
        stats_with_neighbours(29, 0, {{"w0", {{"mixed", 0}, {"refused", 5}, {"clipped", 0}}},
                                   {"w1", {{"mixed", 29}, {"refused", 1}, {"clipped", 0}}}}));
  write(run / "links.csv", "link,listen,to_server_bytes_in,to_worker_bytes_in\n");
  write(run / "all.json",
        R"({"peers": [{"peer": "w0", "iteration": 30}, {"peer": "w1", "iteration": 28},
                      {"peer": "w2", "iteration": 29}], "mean_accuracy": 0.6,
            "min_accuracy": 0.2, "max_accuracy": 0.9, "consensus_accuracy": 0.5,
            "test_examples": 1000})");
  EXPECT_THROW(append_gossip_row(run, 5, run / "all.json"), std::invalid_argument);
  write(run / "honest.json",
        R"({"peers": [{"peer": "w1", "iteration": 28}, {"peer": "w2", "iteration": 29}],
            "mean_accuracy": 0.85, "min_accuracy": 0.8, "max_accuracy": 0.9,
            "consensus_accuracy": 0.88, "test_examples": 1000})");
  EXPECT_EQ(append_gossip_row(run, 5, run / "honest.json"), "5,29,0.8500,400,0");
  const CsvTable gossip = read_csv(run / "gossip-timeline.csv");
  // Refused: w1 4 + 3, w2 5; clipped: w1's 1 (its honest neighbour's 2 are not the attacker's).
  EXPECT_EQ(gossip.rows.at(0).at(gossip.column("honest_peers")), "2");
  EXPECT_EQ(gossip.rows[0].at(gossip.column("attacker_models_refused")), "12");
  EXPECT_EQ(gossip.rows[0].at(gossip.column("attacker_terms_clipped")), "1");
  EXPECT_EQ(gossip.rows[0].at(gossip.column("min_accuracy")), "0.8000");

  fs::copy_file(run / "honest.json", run / "logs" / "final-eval.json");
  write(run / "run.label", "gossip ring, 1 attacker\n");
  write(run / "settings.md", "");
  GossipSummaryOptions o{run, "time", "time limit", "loopback", "", -1, 10};
  testing::internal::CaptureStdout();
  EXPECT_EQ(summarize_gossip(o), 0);
  testing::internal::GetCapturedStdout();
  const json outcome = read_json(run / "outcome.json");
  EXPECT_EQ(outcome["final"]["peers_evaluated"], 2);
  EXPECT_EQ(outcome["final"]["mean_accuracy"], 0.85);
  const json& attack = outcome["attack"];
  EXPECT_EQ(attack["attackers"], json::array({"w0"}));
  EXPECT_EQ(attack["attack"], "bias:1e30");
  EXPECT_EQ(attack["honest_peers"], 2);
  EXPECT_EQ(attack["attacker_models_refused"], 12);
  EXPECT_EQ(attack["attacker_terms_clipped"], 1);
  EXPECT_EQ(attack["attacker_models_mixed"], 1);
  EXPECT_EQ(attack["honest_neighbours_refused"], 1);
  EXPECT_EQ(attack["honest_terms_clipped"], 2);
  const CsvTable workers = read_csv(run / "workers.csv");
  EXPECT_EQ(workers.rows[0].at(workers.column("attack")), "bias:1e30");
  EXPECT_EQ(workers.rows[1].at(workers.column("attack")), "");
  EXPECT_EQ(workers.rows[1].at(workers.column("attacker_models_refused")), "7");
  EXPECT_EQ(workers.rows[1].at(workers.column("attacker_terms_clipped")), "1");
  EXPECT_EQ(workers.rows[1].at(workers.column("attacker_models_mixed")), "1");
  EXPECT_EQ(workers.rows[1].at(workers.column("terms_clipped")), "3");
  const std::string summary = read_text(run / "summary.md");
  EXPECT_NE(summary.find("mean honest peer 85.00% (80.00%-90.00%)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("attackers: w0 (edgetrain-gossip-attacker --attack bias:1e30); the "
                         "accuracies are the 2 honest peers', which refused the attackers' "
                         "models 12 times"),
            std::string::npos)
      << summary;

  // Without attackers outcome.json says so.
  write_gossip_wiring(run, "loopback", 150);
  write(run / "logs" / "final-eval.json", read_text(run / "all.json"));
  testing::internal::CaptureStdout();
  EXPECT_EQ(summarize_gossip(o), 0);
  testing::internal::GetCapturedStdout();
  EXPECT_TRUE(read_json(run / "outcome.json")["attack"].is_null());
}

// A restarted peer must resume from its last checkpoint: with checkpoints every 10 and 47
// the last iteration seen, that is 40. 40 the last seen asks only 30: the stats file may
// show an iteration whose checkpoint was still being written.
TEST(GossipReport, SummarizeChecksEveryRestartedPeerResumedItsLastCheckpoint) {
  TempDir dir("edgetrain-gossip-report");
  const fs::path run = dir.path();
  make_gossip_run(run);
  append_gossip_row(run, 7, run / "eval.json");
  GossipSummaryOptions o{run, "time", "time limit", "loopback", "", 0.8, 10};
  testing::internal::CaptureStdout();
  EXPECT_EQ(summarize_gossip(o), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  json outcome = read_json(run / "outcome.json");
  ASSERT_EQ(outcome["peer_restarts"].size(), 1u);
  EXPECT_EQ(outcome["peer_restarts"][0]["required"].get<int>(), 40);
  EXPECT_EQ(outcome["mean_peer_at_target"]["elapsed_s"].get<double>(), 7);
  EXPECT_TRUE(outcome["consensus_at_target"].is_object());
  EXPECT_EQ(outcome["bytes_sent_per_peer"].get<double>(), 900);
  const CsvTable workers = read_csv(run / "workers.csv");
  EXPECT_EQ(workers.rows[0].at(workers.column("restarts")), "1");
  EXPECT_EQ(workers.rows[0].at(workers.column("resumed_iterations")), "40");
  EXPECT_EQ(workers.rows[0].at(workers.column("bytes_sent")), "1500");
  EXPECT_NE(read_text(run / "summary.md").find("each resumed from its last checkpoint"),
            std::string::npos);

  write(run / "logs" / "worker-0.1.stats.json", peer_stats(58, 39, 500));
  testing::internal::CaptureStdout();
  EXPECT_EQ(summarize_gossip(o), 3);
  EXPECT_NE(testing::internal::GetCapturedStdout().find(
                "CHECKPOINT NOT RESUMED: peer 0 resumed at iteration 39, its checkpoint of "
                "iteration 40 was due"),
            std::string::npos);
  EXPECT_FALSE(read_json(run / "outcome.json")["checkpoints_resumed"].get<bool>());

  write(run / "logs" / "worker-0.0.stats.json", peer_stats(40, 0, 1000));
  write(run / "logs" / "worker-0.1.stats.json", peer_stats(58, 30, 500));
  EXPECT_EQ(summarize_gossip(o), 0);

  // summarize (run_summary.h) hands a gossip run over.
  SummarizeOptions s;
  s.run = run.string();
  s.mode = "gossip";
  s.checkpoint_every = 20;  // 40 seen: 20 due, 30 resumed
  EXPECT_EQ(summarize(s), 0);
  EXPECT_EQ(read_json(run / "outcome.json")["mode"], "gossip");
}

// A gossip run beside a server run: the first run is the reference of the speed-up.
TEST(GossipReport, CompareGossipAndServerRuns) {
  TempDir dir("edgetrain-gossip-report");
  const fs::path gossip = dir.path() / "gossip", server = dir.path() / "server";
  write(gossip / "run.label", "gossip ring\n");
  write(gossip / "outcome.json",
        R"({"mode": "gossip", "bytes_sent_per_peer": 3000, "mean_iteration": 40,
            "final": {"mean_accuracy": 0.93, "min_accuracy": 0.9, "max_accuracy": 0.95,
                      "consensus_accuracy": 0.94}})");
  write(gossip / "gossip-timeline.csv",
        "elapsed_s,mean_accuracy,consensus_accuracy,bytes_sent_per_peer\n10,0.8,0.85,1000\n"
        "20,0.9,0.92,2000\n");
  write(server / "run.label", "ASGD\n");
  write(server / "outcome.json", R"({"stop": "time"})");
  write(server / "timeline.csv",
        "elapsed_s,version,test_accuracy,ingress_payload_bytes,ingress_socket_bytes\n"
        "20,10,0.85,4000,5000\n40,20,0.91,8000,9000\n");
  write(server / "workers.csv", "worker,steps,payload_bytes_sent\n0,30,5000\n1,10,5000\n");
  const std::string table = compare_gossip_runs({gossip, server}, dir.path() / "out", 0.9);
  // gossip: 0.9 at 20 s (consensus at 20 s too); server: at 40 s, 20 / 40 = 0.50x, bytes per
  // device 8000 / 2 workers, 5000 per worker over the run, 20 steps per worker.
  EXPECT_NE(table.find("| gossip ring | 93.00% | 90.00%-95.00% | 94.00% | 20 s | 1.00x | 20 s | "
                       "2.0 kB | 3.0 kB | 40 |\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| ASGD | 91.00% | (server model) | — | 40 s | 0.50x | — | 4.0 kB | "
                       "5.0 kB | 20 |\n"),
            std::string::npos)
      << table;
  EXPECT_EQ(read_text(dir.path() / "out" / "summary.md"), table);
  EXPECT_TRUE(fs::exists(dir.path() / "out" / "accuracy-vs-bytes.svg"));
  EXPECT_THROW(compare_gossip_runs({}, dir.path() / "out", 0.9), std::invalid_argument);
}

}  // namespace
