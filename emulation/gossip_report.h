// The gossip side of edgetrain-emulation-report (edgetrain-emulate --mode gossip): how a
// fleet of peers is wired behind the link impairer, the timeline rows of its evaluations,
// and the summary of a finished run. No server: every peer serves its model and pulls its
// neighbours' (worker/README.md, "Gossip"); emulation/README.md, "Gossip runs", says what
// each file means.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/settings.h"

namespace edgetrain::emulation {

// What `gossip-wiring` needs: the run, its network ("netns" or "loopback"), the S of its
// addresses, and its attackers: peers 0..malicious_peers-1 run edgetrain-gossip-attacker with
// `attack` (bias:V or scale:F; edgetrain-emulate --malicious-peers, --attack).
struct GossipWiringOptions {
  std::string run, network;
  int subnet = 0;
  std::uint32_t malicious_peers = 0;
  std::string attack;
};
// gossip-wiring's flags (RUN is its positional argument, declared by the caller).
void declare_gossip_wiring_settings(settings::Table& table, GossipWiringOptions& options);

// Reads RUN/plan.csv (a peer's address and its link profile) and RUN/topology.json
// (edgetrain-topology's file; its addresses are replaced). Writes:
//   topology.json  every peer's listen address: in namespaces its own address, port 5684;
//                  on loopback 127.S.(i/200).(i%200+10):5684, one address per peer;
//   peers.csv      peer,name,listen,neighbours (';'-separated indices),attack (empty for an
//                  honest peer, the attack for peers 0..MALICIOUS-1), for the launcher and
//                  the reports (which tell the honest peers from the attackers by it);
//   links.toml     one impairer link per directed edge, "NAME_I-NAME_J" for peer I dialling
//                  peer J: it listens on I's side (any port) and forwards to J's address,
//                  with I's link profile (ours: a peer's access link shapes the exchanges it
//                  starts, requests and answers) and a seed of its own.
// NETWORK is "netns" or "loopback"; SUBNET the S of the run's addresses. Throws
// std::invalid_argument when MALICIOUS leaves no honest peer or ATTACK is not one attack.
void write_gossip_wiring(const std::filesystem::path& run, const std::string& network, int subnet,
                         std::uint32_t malicious = 0, const std::string& attack = "");

// The run's attackers (peers.csv's attack column): peer name -> its attack. Empty for a run
// without them, or one wired before the column existed.
std::vector<std::pair<std::string, std::string>> gossip_attackers(const std::filesystem::path& run);

// Once the impairer listens (RUN/logs/impairer.ports.json): RUN/peers/NAME.topology.json for
// every peer, the fleet's topology in which each neighbour's address is the impairer's end
// of the link to it, so that every exchange goes through the impairer.
void write_peer_topologies(const std::filesystem::path& run);

// One evaluation of the fleet (EVAL: edgetrain-fleet-eval's JSON of every honest peer's
// checkpoint: the launcher leaves the attackers' out, and an EVAL that holds one is refused,
// since its consensus model would hold it too) made at ELAPSED seconds, appended to
// RUN/gossip-timeline.csv
//   elapsed_s,mean_iteration,min_iteration,max_iteration,mean_accuracy,min_accuracy,
//   max_accuracy,consensus_accuracy,bytes_sent_per_peer,link_bytes_per_peer,honest_peers,
//   attacker_models_refused,attacker_terms_clipped
// (iterations and accuracies are the honest peers'; bytes per peer over all peers; the
// last two: how often, so far, the honest peers refused an attacker's model and clipped its
// difference, from their stats files' "neighbours", over every incarnation)
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
// and summary.md of a finished gossip run. With attackers, the accuracies are the honest
// peers' (the evaluations hold only theirs) and outcome.json's "attack" says who attacked
// how and what the honest peers refused, clipped and mixed of them (null without). A peer killed and restarted must resume from its
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
