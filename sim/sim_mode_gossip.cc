// --mode gossip of edgetrain-sim: peers with no server (sim/gossip_simulation.h), D-PSGD or
// AD-PSGD on a topology; settings that only a server-based run has are refused by name.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "common/target_accuracy.h"
#include "sim/sim_program.h"
#include "sim/sim_program_support.h"
#include "sim/sim_reports.h"
#include "worker/gossip.h"

namespace edgetrain::sim {

namespace {

void declare_gossip(settings::Table& t, SimSettings& s) {
  t.add("gossip", s.gossip_algorithm,
        "d-psgd (each iteration: a local step, then a weighted average with the "
        "neighbours' models of the same iteration; a local barrier) or ad-psgd (no barrier: after "
        "each local step, "
        "the midpoint with one random neighbour)")
      .choices({"d-psgd", "ad-psgd"});
  t.add("topology", s.topology,
        "ring, random-regular (every peer has --degree neighbours, seeded) or full")
      .choices({"ring", "random-regular", "full"});
  t.add("degree", s.gossip.degree, "neighbours per peer with --topology random-regular")
      .range(1, 10000);
  t.add("topology-file", s.topology_file,
        "the graph from a topology file (worker/README.md \"Gossip\"; its peer "
        "count must equal --workers); overrides --topology");
  t.add("consensus-step", s.consensus_step,
        "gamma: x_i += gamma * sum_j w_ij (published_j - published_i) (0: 1 for "
        "dense gossip, 0.1 with --publish-fraction below 1)")
      .range(0, 1);
  t.add("speed-classes", s.speed_classes,
        "relative CPU budgets, e.g. 0.12,0.08,0.05,0.03; peer i is in class i mod "
        "count; a step of the base batch takes fastest/its budget step times (empty: all equal)");
  t.add("speed-schedule", s.speed_schedule,
        "TIME:CLASS:FACTOR,...: from virtual TIME on, class CLASS runs at FACTOR "
        "times its budget (e.g. 200:0:0.25,400:0:1)");
  t.add("balance-target", s.gossip.balance_target,
        "workload balancing: each peer sizes its batch for this compute "
        "time per iteration, lr scaled with the batch (0: off)")
      .range(0, 1e9)
      .unit("step times");
  t.add("min-batch", s.gossip.balance_min_batch, "smallest batch balancing picks").range(1, 4096);
  t.add("max-batch", s.gossip.balance_max_batch, "largest batch balancing picks").range(1, 4096);
  t.add("wait-steps", s.gossip.wait_steps,
        "d-psgd: while waiting for a neighbour at the barrier, a peer takes up to "
        "this many more local steps (0: off; the worker's --wait-steps)")
      .range(0, 1000);
  t.add("max-lr-factor", s.gossip.balance_max_lr_factor,
        "with --balance-target: the lr follows the batch linearly up "
        "to this many times --lr")
      .range(1, 64);
  t.add("plateau-patience", s.gossip.plateau_patience,
        "accuracy-aware training: validations without improvement "
        "before a peer halves its lr, and after --plateau-decays halvings stops training (0: off)")
      .range(0, 100000);
  t.add("validate-every", s.gossip.validate_every,
        "a peer's iterations between validations on its held-out "
        "--validation-fraction of its shard (accuracy-aware training)")
      .range(1, 1e9);
  t.add("validation-fraction", s.gossip.validation_fraction,
        "share of each peer's shard held out of training for "
        "its validations (only with --plateau-patience)")
      .range(1e-6, 0.5);
  t.add("plateau-decays", s.gossip.plateau_max_decays, "lr halvings before a plateau stops a peer")
      .range(0, 100);
  t.add("max-neighbour-magnitude", s.gossip.max_neighbour_magnitude,
        "an honest peer refuses a neighbour's model with a value of larger magnitude (and "
        "always a non-finite one): the worker's rule and default (0: no bound)")
      .range(0, 1e30);
  t.add("neighbour-clip", s.gossip.neighbour_clip,
        "d-psgd: an honest peer clips each neighbour's difference to this L2 norm before the "
        "mix (the worker's --neighbour-clip; 0: off)")
      .range(0, 1e30);
  t.add("iterations", s.gossip.max_iterations, "stop when the peers' mean iterations reach this")
      .range(1, 1e12);
  t.add("time-budget", s.gossip.time_budget, "stop at this virtual time (0: no limit)")
      .range(0, 1e15)
      .unit("step times");
}

// Settings of a server-based run that mean nothing without a server: refused with --mode
// gossip when given, rather than silently ignored.
bool server_only_setting(const settings::Setting& setting) {
  static const std::set<std::string> flags = {
      "staleness",        "max-staleness", "speed-spread",   "failure-probability",
      "failing-fraction", "downtime",      "leave-for-good", "delta-pulls",
      "publish-every",    "updates",       "bin-local",      "bin-size",
      "local-dp-clip",    "local-dp-noise-multiplier", "pull-fraction", "pull-min-entries",
      "entry-staleness",  "pull-values",   "first-pull",     "reachable",
      "outage-period",    "outage-start",  "offline-steps",  "offline-max-rate",
      "offline-step-credit", "offline-average", "lr-decay-at",      "lr-decay-factor",
      "pull-selection",   "pull-age-versions"};
  const std::string& group = setting.group();
  return flags.contains(setting.flag()) || group.starts_with("Federated rounds") ||
         group.starts_with("Filter dropout") || group.starts_with("Compression");
}

void refuse_server_settings(const settings::Table& table) {
  for (const auto& setting : table.settings())
    if (table.was_set(setting->flag()) && server_only_setting(*setting))
      throw std::invalid_argument("--" + setting->flag() +
                                  " is not a setting of --mode gossip (no server there)");
}

GossipConfig make_gossip_config(const SimSettings& s, const settings::Table& table) {
  const SimConfig& c = s.config;
  GossipConfig g = s.gossip;  // the table filled its balance, plateau and stop settings
  g.model = c.model;
  g.peers = c.workers;
  g.batch = c.batch;
  g.learning_rate = c.learning_rate;
  g.algorithm = parse_gossip_algorithm(s.gossip_algorithm);
  if (!s.topology_file.empty()) {
    try {
      g.topology = runtime::read_topology_file(s.topology_file);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--topology-file: ") + e.what());
    }
  } else {
    g.topology_kind = runtime::parse_topology_kind(s.topology);
  }
  // The async default (0.01) is for the server's published model; gossip is dense unless asked.
  g.publish_fraction = table.was_set("publish-fraction") ? c.publish.fraction : 1.0;
  g.publish_min_entries = c.publish.min_entries;
  if (s.consensus_step > 0) g.consensus_step = s.consensus_step;
  g.label_skewed = c.label_skewed;
  g.skew = c.skew;
  g.speed_classes = parse_speed_classes(s.speed_classes);
  g.speed_schedule = parse_speed_schedule(s.speed_schedule);
  g.step_jitter = c.step_jitter;
  g.eval_every = s.eval_every ? s.eval_every : 20;
  // Evaluating every peer is most of a run's wall time: 1000 test examples unless asked.
  g.eval_examples = table.was_set("eval-examples") ? c.eval_examples : 1000;
  if (s.stop_at_accuracy > 0) g.stop_at_accuracy = s.stop_at_accuracy;
  g.seed = c.seed;
  g.threads = c.threads;
  g.kernels = kernel_backend(s);
  g.malicious_peers = s.malicious_peers;
  g.attack = parse_model_attack(s.attack);
  check_gossip_config(g);
  return g;
}

// "D-PSGD, ring, publish 0.01 (gamma 0.5), balance 2, accuracy-aware 5": what sets a run apart.
std::string gossip_label(const SimSettings& s, const GossipConfig& g) {
  std::ostringstream label;
  label << (g.algorithm == GossipAlgorithm::kDpsgd ? "D-PSGD" : "AD-PSGD") << ", ";
  if (g.topology) {
    label << s.topology_file;
  } else {
    label << s.topology;
    if (g.topology_kind == runtime::TopologyKind::kRandomRegular) label << ' ' << g.degree;
  }
  if (g.publish_fraction < 1)
    label << ", publish " << g.publish_fraction << " (gamma " << g.effective_consensus_step()
          << ')';
  else if (g.consensus_step && *g.consensus_step != 1)
    label << ", gamma " << *g.consensus_step;
  if (g.balance_target > 0) label << ", balance " << g.balance_target;
  if (g.plateau_patience > 0) label << ", accuracy-aware " << g.plateau_patience;
  if (g.label_skewed) label << ", label skew";
  if (g.malicious_peers > 0)
    label << ", " << g.malicious_peers << " malicious (" << s.attack << ')';
  if (g.max_neighbour_magnitude != runtime::kDefaultMaxNeighbourMagnitude)
    label << ", bound " << g.max_neighbour_magnitude;
  if (g.neighbour_clip > 0) label << ", clip " << g.neighbour_clip;
  return label.str();
}

class GossipSimRun : public SimModeRun {
 public:
  GossipSimRun(const SimSettings& s, GossipConfig config) : s_(s), config_(std::move(config)) {}
  int run(const SimData& data) override;

 private:
  const SimSettings& s_;
  GossipConfig config_;
};

int GossipSimRun::run(const SimData& data) {
  const SimSettings& s = s_;
  const GossipConfig& config = config_;
  const std::string label = gossip_label(s, config);
  std::fprintf(stderr,
               "edgetrain-sim: gossip, %s, %zu train / %zu test examples, model %s, %d peers, "
               "batch %d, lr %g: %s\n",
               s.data.c_str(), data.train.size(), data.test.size(), config.model.c_str(),
               config.peers, config.batch, config.learning_rate, label.c_str());
  GossipResult result;
  {
    ProgressLine progress_line(s.quiet);
    auto progress = [&](const GossipProgress& p) {
      char line[200];
      std::snprintf(
          line, sizeof line,
          "[%s] iteration %.0f  time %.0f  mean acc %s  consensus %s  sent/peer %s", label.c_str(),
          p.mean_iterations, p.time, accuracy_text(p.mean_accuracy).c_str(),
          accuracy_text(p.consensus_accuracy).c_str(), human_bytes(p.bytes_per_peer).c_str());
      // Whichever budget ends the run first says how far it is.
      const double by_iterations = p.mean_iterations / static_cast<double>(p.max_iterations);
      const double by_time = config.time_budget > 0 ? p.time / config.time_budget : 0;
      progress_line.show(line, std::max(by_iterations, by_time), 1.0);
    };
    result = run_gossip_simulation(config, data.train, data.test, label, progress);
  }
  std::filesystem::create_directories(s.out_dir);
  const double target_accuracy = s.target_accuracy > 0
                                     ? s.target_accuracy
                                     : default_target_accuracy(result.best_mean_accuracy());
  write_gossip_curves(s.out_dir, {s.data, s.config.model, s.config.workers}, result,
                      target_accuracy);
  const std::string summary = gossip_summary_table(result, target_accuracy);
  std::ofstream(s.out_dir + "/summary.md") << summary;
  if (!s.save_model.empty())
    save_model(s, result.consensus_parameters, static_cast<std::uint64_t>(result.mean_iterations),
               result.label + " (consensus)", result.curve.back().consensus_accuracy);
  std::cout << summary << "written: " << s.out_dir
            << "/{sim.csv,summary.md,accuracy-vs-time.svg,accuracy-vs-bytes.svg}\n";
  return 0;
}

std::unique_ptr<SimModeRun> prepare_gossip(const SimSettings& s, const settings::Table& table) {
  refuse_server_settings(table);
  if (table.was_set("init-from"))  // every peer starts from its own seed's model there
    throw std::invalid_argument("--init-from is not supported with --mode gossip yet (async and rounds)");
  return std::make_unique<GossipSimRun>(s, make_gossip_config(s, table));
}

}  // namespace

extern const SimModeEntry kSimGossipMode{
    "gossip", "Gossip (--mode gossip; sim/README.md \"Gossip\")", declare_gossip, prepare_gossip};

}  // namespace edgetrain::sim
