// --mode async (asynchronous SGD against the server's staleness rule) and --mode rounds
// (federated rounds, FedAvg) of edgetrain-sim: one simulation (sim/simulator.h) and the
// same runs, dense against AdaComp, so one file.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "common/target_accuracy.h"
#include "sim/sim_program.h"
#include "sim/sim_program_support.h"
#include "sim/sim_reports.h"

namespace edgetrain::sim {

namespace {

using Runs = std::vector<std::pair<std::string, SimConfig>>;

void declare_rounds(settings::Table& t, SimSettings& s) {
  SimConfig& c = s.config;
  t.add("rounds", c.rounds.max_rounds, "stop after this many closed rounds")
      .range(1, 1e9)
      .unit("rounds");
  t.add("local-steps", c.rounds.local_steps, "minibatches a selected worker trains per round")
      .range(1, 1000000);
  t.add("local-epochs", c.rounds.local_epochs,
        "passes over the worker's shard per round instead of --local-steps "
        "(0: use --local-steps)")
      .range(0, 1000);
  t.add("local-lr", c.rounds.local_lr, "the worker's plain SGD learning rate").range(1e-9, 1e9);
  t.add("server-lr", c.rounds.server_lr,
        "the round's model moves by this times the aggregated delta")
      .range(1e-9, 1e9);
  t.add("client-fraction", c.rounds.client_fraction,
        "share of the workers selected per round (a seeded draw, at "
        "least one)")
      .range(1e-9, 1);
  t.add("aggregation", s.aggregation,
        "masked (each entry averaged over the deltas that have it), fedavg (the "
        "plain weighted mean, a missing entry counts as zero), or the robust trimmed-mean and "
        "median (coordinate-wise over the deltas that have it, unweighted)")
      .choices({"masked", "fedavg", "trimmed-mean", "median", "dp-fedavg"});
  t.add("dp-noise-multiplier", c.rounds.dp_noise_multiplier,
        "dp-fedavg: the Gaussian noise per round, a multiple of --round-clip-norm over the "
        "workers a round selects")
      .range(0, 1e6);
  t.add("dp-noise-survivors", c.rounds.dp_noise_survivors,
        "dp-fedavg: distributed noise as under the server's --secure-aggregation: each worker adds "
        "its share, z x clip / sqrt(C), before quantizing, calibrated to C survivors (the server's "
        "--min-clients); 0: the server adds the noise (central)")
      .range(0, 255);
  t.add("dp-noise", s.dp_noise,
        "dp-fedavg with --dp-noise-survivors: the workers' noise; gaussian: each adds its Gaussian "
        "share and rounds it to the ring; skellam: each rounds its scaled delta and adds integer "
        "Skellam noise (the server's --dp-noise skellam, privacy/skellam.h), with its accountant")
      .choices({"gaussian", "skellam"});
  t.add("dp-delta", c.rounds.dp_delta, "dp-fedavg: the delta at which epsilon is reported")
      .range(1e-30, 0.999);
  t.add("dp-target-epsilon", c.rounds.dp_target_epsilon,
        "dp-fedavg: end the run before a round would take epsilon past this; 0: no limit")
      .range(0, 1e9);
  t.add("dp-adaptive-clip-quantile", c.rounds.adaptive_clipping.target_quantile,
        "dp-fedavg: move the clip norm each round towards this quantile of the deltas' norms "
        "(Andrew et al. 2021; --round-clip-norm is the first round's); 0: fixed")
      .range(0, 0.999);
  t.add("dp-clip-learning-rate", c.rounds.adaptive_clipping.learning_rate,
        "adaptive clipping: the clip norm's geometric step per round")
      .range(1e-6, 10);
  t.add("dp-clip-count-stddev", c.rounds.adaptive_clipping.count_noise_stddev,
        "adaptive clipping: the noise on the count of unclipped deltas; 0: selected workers / 20")
      .range(0, 1e9);
  t.add("trim-fraction", c.rounds.aggregation.trim_fraction,
        "trimmed-mean: the share of each entry's values dropped at each end")
      .range(0, 0.499);
  t.add("round-clip-norm", c.rounds.clip_norm,
        "scale each delta down to this L2 norm when it is above it (the server's "
        "--round-clip-norm); 0: no clipping")
      .range(0, 3.4e38);
  t.add("round-policy", s.round_policy,
        "drop-stragglers (a round closes at its deadline; later deltas are "
        "dropped) or wait-all (it waits for every selected worker)")
      .choices({"drop-stragglers", "wait-all"});
  t.add("round-deadline", c.rounds.deadline_steps,
        "a round's deadline (0: 1.5 x the local steps; wait-all: "
        "a safety limit of 4 x this for a crashed worker)")
      .range(0, 1e12)
      .unit("step times");
}

// The runs to compare: dense ASGD, AdaComp with the options, or both (in that order); with
// --mode rounds, FedAvg with dense deltas, with AdaComp-compressed deltas, or both.
Runs make_runs(const SimSettings& s, SimMode mode) {
  SimConfig config = s.config;
  config.mode = mode;
  const bool rounds = config.mode == SimMode::kRounds;
  config.eval_every = s.eval_every ? s.eval_every : rounds ? 1 : 100;
  if (s.stop_at_accuracy > 0) config.stop_at_accuracy = s.stop_at_accuracy;
  config.rounds.aggregation.kind = server::parse_aggregation(s.aggregation);
  config.rounds.dp_skellam = s.dp_noise == "skellam";
  if (!rounds && s.malicious_peers > 0)
    throw std::invalid_argument("--malicious-peers is for --mode rounds and gossip");
  if (rounds) {
    config.rounds.malicious_workers = s.malicious_peers;
    config.rounds.attack = parse_model_attack(s.attack);
  }
  config.rounds.policy = parse_round_policy(s.round_policy);
  if (rounds && (config.delta_pulls || config.publish.enabled() || config.replica_pull.enabled()))
    throw std::invalid_argument(
        "--delta-pulls, --publish-every and --pull-fraction are for --mode async (a round pulls "
        "the dense model)");
  if (s.pull_values == "fp16") config.replica_pull.values = transport::ValueEncoding::kFp16;
  if (s.pull_values == "fp16-increment")
    config.replica_pull.values = transport::ValueEncoding::kFp16Increment;
  config.replica_pull.selection = server::parse_pull_selection(s.pull_selection);
  config.seeded_first_pull = s.first_pull == "seeded";
  config.lr_schedule.decay_at = server::parse_lr_decay_at(s.lr_decay_at);
  config.kernels = kernel_backend(s);
  config.compressor = runtime::compressor_options(config.compressor, s.compression, s.bin_local);
  if (!s.drop_rates.empty()) config.conv_drop_rates = runtime::parse_drop_rates(s.drop_rates);
  config.dropout_rescale = runtime::parse_dropout_rescale(s.dropout_rescale);
  config.staleness_rule = s.staleness == "sigma"   ? server::StalenessRule::kPerParameterSigma
                          : s.staleness == "delay" ? server::StalenessRule::kPerUpdateDelay
                                                   : server::StalenessRule::kNone;
  Runs runs;
  if (s.compression.compressor == "none" || s.compression.compressor == "both") {
    SimConfig c = config;
    c.compressor = runtime::CompressorOptions{};
    c.compressor.method = runtime::CompressionMethod::kNone;
    runs.push_back({rounds ? "FedAvg dense" : "ASGD", c});
  }
  if (s.compression.compressor == "adacomp" || s.compression.compressor == "both") {
    SimConfig c = config;
    c.compressor.method =
        s.bin_local ? runtime::CompressionMethod::kBinLocal : runtime::CompressionMethod::kTopK;
    std::ostringstream label;
    label << (rounds ? "FedAvg AdaComp c=" : "AdaComp c=") << c.compressor.compression_rate
          << (s.bin_local ? " bin-local" : "") << (c.compressor.error_feedback ? " +ef" : "")
          << (s.compression.fp16 ? " fp16" : "") << (s.compression.sign_scale ? " sign-scale" : "");
    runs.push_back({label.str(), c});
  }
  if (rounds) {
    // What sets the runs of this command apart from the defaults' (the summary's rows).
    std::ostringstream suffix;
    if (config.rounds.aggregation.kind != server::Aggregation::kMasked)
      suffix << ", " << s.aggregation;
    if (config.rounds.clip_norm > 0) suffix << ", clip " << config.rounds.clip_norm;
    if (config.rounds.dp_noise_multiplier > 0)
      suffix << ", noise " << config.rounds.dp_noise_multiplier;
    if (config.rounds.dp_noise_survivors > 0)
      suffix << " distributed over " << config.rounds.dp_noise_survivors
             << (config.rounds.dp_skellam ? " (skellam)" : "");
    if (config.rounds.malicious_workers > 0)
      suffix << ", " << config.rounds.malicious_workers << " malicious (" << s.attack << ')';
    if (config.rounds.policy != RoundPolicy::kDropStragglers) suffix << ", " << s.round_policy;
    for (auto& run : runs) run.first += suffix.str();
  }
  if (config.replica_pull.enabled()) {
    std::ostringstream suffix;
    suffix << ", cheap pull " << config.replica_pull.fraction;
    if (config.replica_pull.min_entries != server::ReplicaPullOptions{}.min_entries)
      suffix << " (at least " << config.replica_pull.min_entries << " per tensor)";
    if (config.replica_pull.entry_staleness) suffix << ", sigma per entry";
    if (config.replica_pull.selection != server::ReplicaPullOptions::Selection::kLargestChange)
      suffix << ", " << server::pull_selection_name(config.replica_pull.selection) << " selection";
    if (config.replica_pull.selection == server::ReplicaPullOptions::Selection::kAgeWeighted)
      suffix << " (age " << config.replica_pull.age_versions << ')';
    if (config.replica_pull.values == transport::ValueEncoding::kFp16) suffix << ", fp16 values";
    if (config.replica_pull.values == transport::ValueEncoding::kFp16Increment)
      suffix << ", fp16 increments";
    for (auto& run : runs) run.first += suffix.str();
  }
  if (config.seeded_first_pull)
    for (auto& run : runs) run.first += ", seeded first pull";
  if (config.publish.enabled()) {
    std::ostringstream suffix;
    suffix << ", published every " << config.publish.every << " at " << config.publish.fraction;
    for (auto& run : runs) run.first += suffix.str();
  }
  return runs;
}

std::vector<SimResult> simulate(const SimSettings& s, const Runs& runs, const SimData& data) {
  std::vector<SimResult> results;
  for (const auto& [label, c] : runs) {
    ProgressLine progress_line(s.quiet);
    const bool rounds = c.mode == SimMode::kRounds;
    auto progress = [&, label = label](const Progress& p) {
      char line[200];
      const std::string accuracy = accuracy_text(p.accuracy);
      if (rounds) {
        std::snprintf(line, sizeof line,
                      "[%s] round %llu/%llu  test acc %s  ingress %s  stragglers %llu",
                      label.c_str(), static_cast<unsigned long long>(p.updates),
                      static_cast<unsigned long long>(p.max_updates), accuracy.c_str(),
                      human_bytes(static_cast<double>(p.ingress_bytes)).c_str(),
                      static_cast<unsigned long long>(p.round_stragglers));
      } else {
        std::snprintf(line, sizeof line,
                      "[%s] update %llu/%llu  test acc %s  ingress %s  mean delay %.1f",
                      label.c_str(), static_cast<unsigned long long>(p.updates),
                      static_cast<unsigned long long>(p.max_updates), accuracy.c_str(),
                      human_bytes(static_cast<double>(p.ingress_bytes)).c_str(), p.mean_delay);
      }
      progress_line.show(line, static_cast<double>(p.updates), static_cast<double>(p.max_updates));
    };
    results.push_back(run_simulation(c, data.train, data.test, label, progress));
  }
  return results;
}

class ServerSimRun : public SimModeRun {
 public:
  ServerSimRun(const SimSettings& s, Runs runs) : s_(s), runs_(std::move(runs)) {}
  int run(const SimData& data) override;

 private:
  const SimSettings& s_;
  Runs runs_;
};

int ServerSimRun::run(const SimData& data) {
  const SimSettings& s = s_;
  const bool rounds = runs_.front().second.mode == SimMode::kRounds;
  if (rounds) {
    const RoundsConfig& r = s.config.rounds;
    std::fprintf(stderr,
                 "edgetrain-sim: federated rounds, %s, %zu train / %zu test examples, model %s, %d "
                 "workers, batch %d, "
                 "%u local %s, local lr %g, server lr %g, client fraction %g, %s, %s\n",
                 s.data.c_str(), data.train.size(), data.test.size(), s.config.model.c_str(),
                 s.config.workers, s.config.batch, r.local_epochs ? r.local_epochs : r.local_steps,
                 r.local_epochs ? "epochs" : "steps", r.local_lr, r.server_lr, r.client_fraction,
                 s.aggregation.c_str(), s.round_policy.c_str());
  } else {
    std::fprintf(
        stderr,
        "edgetrain-sim: %s, %zu train / %zu test examples, model %s, %d workers, batch %d, lr %g\n",
        s.data.c_str(), data.train.size(), data.test.size(), s.config.model.c_str(),
        s.config.workers, s.config.batch, s.config.learning_rate);
    if (!s.lr_decay_at.empty())
      std::fprintf(stderr, "edgetrain-sim: the lr decays by x%g at versions %s\n",
                   static_cast<double>(s.config.lr_schedule.factor), s.lr_decay_at.c_str());
  }
  const std::vector<SimResult> results = simulate(s, runs_, data);
  std::filesystem::create_directories(s.out_dir);
  double target_accuracy = s.target_accuracy;
  if (target_accuracy <= 0) {
    double lowest_best = 1;
    for (const auto& r : results) lowest_best = std::min(lowest_best, r.best_accuracy());
    target_accuracy = default_target_accuracy(lowest_best);
  }
  write_sim_curves(s.out_dir, {s.data, s.config.model, s.config.workers}, rounds, results,
                   target_accuracy);
  const std::string summary = rounds ? rounds_summary_table(results, target_accuracy)
                                     : async_summary_table(results, target_accuracy);
  std::ofstream(s.out_dir + "/summary.md") << summary;
  std::ofstream(s.out_dir + "/summary.json") << runs_summary_json(results, target_accuracy);
  if (!s.save_model.empty()) {
    const SimResult& last = results.back();
    save_model(s, last.final_parameters, last.updates_applied, last.label, last.final_accuracy());
  }
  std::cout << summary << "written: " << s.out_dir << "/{sim.csv,summary.md,summary.json";
  for (const std::string& file : sim_plot_files(rounds)) std::cout << ',' << file;
  std::cout << "}\n";
  return 0;
}

// Settings of --mode gossip are refused; the runs' checks need no data.
template <SimMode kMode>
std::unique_ptr<SimModeRun> prepare(const SimSettings& s, const settings::Table& table) {
  refuse_settings_of_mode(table, "gossip");
  if (table.was_set("lr-decay-factor") && !table.was_set("lr-decay-at"))
    throw std::invalid_argument("--lr-decay-factor needs --lr-decay-at (the versions to decay at)");
  if (table.was_set("pull-age-versions") && s.pull_selection != "age")
    throw std::invalid_argument("--pull-age-versions is the age rule's τ: it needs --pull-selection age");
  Runs runs = make_runs(s, kMode);
  for (const auto& run : runs) check_sim_config(run.second);
  return std::make_unique<ServerSimRun>(s, std::move(runs));
}

}  // namespace

extern const SimModeEntry kSimAsyncMode{"async", "", nullptr, prepare<SimMode::kAsync>};
extern const SimModeEntry kSimRoundsMode{"rounds", "Federated rounds (--mode rounds)",
                                         declare_rounds, prepare<SimMode::kRounds>};

}  // namespace edgetrain::sim
