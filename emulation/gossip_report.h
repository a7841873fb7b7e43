// The gossip side of edgetrain-emulation-report (edgetrain-emulate --mode gossip): how a
// fleet of peers is wired behind the link impairer, the timeline rows of its evaluations,
// and the summary of a finished run. No server: every peer serves its model and pulls its
// neighbours' (worker/README.md, "Gossip"); emulation/README.md, "Gossip runs", says what
// each file means.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace edgetrain::emulation {

// Reads RUN/plan.csv (a peer's address and its link profile) and RUN/topology.json
// (edgetrain-topology's file; its addresses are replaced). Writes:
//   topology.json  every peer's listen address: in namespaces its own address, port 5684;
//                  on loopback 127.S.(i/200).(i%200+10):5684, one address per peer;
//   peers.csv      peer,name,listen,neighbours (';'-separated indices), for the launcher;
//   links.toml     one impairer link per directed edge, "NAME_I-NAME_J" for peer I dialling
//                  peer J: it listens on I's side (any port) and forwards to J's address,
//                  with I's link profile (ours: a peer's access link shapes the exchanges it
//                  starts, requests and answers) and a seed of its own.
// NETWORK is "netns" or "loopback"; SUBNET the S of the run's addresses.
void write_gossip_wiring(const std::filesystem::path& run, const std::string& network, int subnet);

// Once the impairer listens (RUN/logs/impairer.ports.json): RUN/peers/NAME.topology.json for
// every peer, the fleet's topology in which each neighbour's address is the impairer's end
// of the link to it, so that every exchange goes through the impairer.
void write_peer_topologies(const std::filesystem::path& run);

// One evaluation of the fleet (EVAL: edgetrain-fleet-eval's JSON of every peer's checkpoint)
// made at ELAPSED seconds, appended to RUN/gossip-timeline.csv
//   elapsed_s,mean_iteration,min_iteration,max_iteration,mean_accuracy,min_accuracy,
//   max_accuracy,consensus_accuracy,bytes_sent_per_peer,link_bytes_per_peer
// and to RUN/timeline.csv in the server runs' columns, so that `compare` puts server and
// gossip runs side by side: version = the peers' mean iteration, test_accuracy = their mean
// accuracy, ingress_payload_bytes = model bytes all peers sent, ingress_socket_bytes = UDP
// bytes all links carried (the impairer's bytes in, both directions). Byte counts are
// summed over every incarnation of a restarted peer. Returns the row of timeline.csv.
std::string append_gossip_row(const std::filesystem::path& run, double elapsed,
                              const std::filesystem::path& eval);

struct GossipSummaryOptions {
  std::filesystem::path run;
  std::string stop_kind, stopped, network;
  std::string reached;                  // the timeline.csv row that met the target, if one did
  double target = -1;                   // the tables' target accuracy (-1: none)
  std::uint32_t checkpoint_every = 20;  // the peers' --checkpoint-every, for the restart check
};

// workers.csv (one row per peer, counters over its incarnations), outcome.json, the plots
// and summary.md of a finished gossip run. A peer killed and restarted must resume from its
// last checkpoint: at least the last multiple of checkpoint_every below the last iteration
// its stats file showed. Returns 3 when one did not, else 0.
int summarize_gossip(const GossipSummaryOptions& options);

// Gossip runs next to each other and next to server runs of the same fleet: OUT/summary.md
// (a markdown table, also returned) and OUT/accuracy-vs-time.svg, accuracy-vs-bytes.svg. A
// gossip run's accuracy is its mean peer's (and its consensus model's), a server run's its
// server model's; bytes are model bytes sent per device (a peer's answers and posts; a
// worker's update payload). TARGET: the accuracy whose first time is compared (the first
// run is the reference of the speed-up).
std::string compare_gossip_runs(const std::vector<std::filesystem::path>& runs,
                                const std::filesystem::path& out, double target);

}  // namespace edgetrain::emulation
