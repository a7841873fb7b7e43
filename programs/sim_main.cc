// edgetrain-sim: dense ASGD against AdaComp with N virtual workers in one process, or
// federated rounds (FedAvg, --mode rounds) with dense against AdaComp-compressed deltas.
// See sim/README.md and `edgetrain-sim --help`; its settings are one table
// (common/settings.h): flags, or the same names in a TOML file (--config).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "common/settings.h"
#include "common/svg_plot.h"
#include "worker/compression_settings.h"
#include "model/dataset.h"
#include "server/checkpoint_file.h"
#include "server/durable_file.h"
#include "worker/gossip.h"
#include "sim/gossip_simulation.h"
#include "sim/simulator.h"

namespace {

using namespace edgetrain;

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 4) bytes /= 1000, unit++;
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, unit ? "%.2f %s" : "%.0f %s", bytes, units[unit]);
  return buffer;
}

// What the settings table fills besides sim::SimConfig's own fields.
struct SimSettings {
  sim::SimConfig config;
  std::string drop_rates, dropout_rescale = "inverted";
  std::string data = "mnist", staleness = "sigma", out_dir = "sim-results", kernels = "xnnpack";
  std::string mode = "async", aggregation = "masked", round_policy = "drop-stragglers";
  std::uint64_t eval_every = 0;  // 0: 100 updates, or every round with --mode rounds
  runtime::CompressionSettings compression{"both"};
  std::string train_images, train_labels, test_images, test_labels, save_model;
  double target_accuracy = 0, stop_at_accuracy = 0;
  bool bin_local = false, quiet = false;
  // --mode gossip (sim/gossip_simulation.h): what the table fills besides GossipConfig's fields.
  sim::GossipConfig gossip;
  std::string topology = "ring", topology_file, gossip_algorithm = "d-psgd", speed_classes,
              speed_schedule;
  double consensus_step = 0;  // 0: the default for dense or compressed gossip
};

void declare_settings(settings::Table& t, SimSettings& s) {
  sim::SimConfig& c = s.config;
  t.group("Data and model");
  t.add("data", s.data,
        "mnist (full MNIST, 60k + 10k), mnist-small (its 8k + 2k subset), fashion-mnist (Debian's "
        "60k + 10k) or a directory");
  t.add("train-images", s.train_images, "IDX file (raw or .gz); overrides --data");
  t.add("train-labels", s.train_labels, "IDX file");
  t.add("test-images", s.test_images, "IDX file");
  t.add("test-labels", s.test_labels, "IDX file");
  t.add("model", c.model, "paper-cnn, mlp, or a spec such as 'input 28x28x1; fc 64 relu; fc 10'");
  t.group("Mode");
  t.add("mode", s.mode,
        "async (asynchronous SGD with the staleness rule), rounds (federated rounds, FedAvg: "
        "selected workers train local steps and send model deltas) or gossip (no server: peers "
        "train and average "
        "models with their neighbours, EdgeGossip)")
      .choices({"async", "rounds", "gossip"});
  t.group("Workers and server");
  t.add("workers", c.workers, "virtual workers (with --mode gossip: peers)").range(1, 10000);
  t.add("batch", c.batch, "minibatch per step (gossip: the base batch balancing starts from)")
      .range(1, 4096);
  t.add("lr", c.learning_rate, "server learning rate (gossip: the peers' plain SGD learning rate)")
      .range(0, 1e9);
  t.add("staleness", s.staleness,
        "sigma (the paper: per parameter), delay (Zhang et al.: lr/delay) or none "
        "(plain lr whatever the delay: what the staleness rule buys)")
      .choices({"sigma", "delay", "none"});
  t.add("max-staleness", c.max_staleness, "updates older than this are refused").unit("updates");
  t.add("label-skew", c.label_skewed, "label-skewed shards instead of i.i.d.");
  t.add("classes-per-worker", c.skew.classes_per_worker, "with --label-skew");
  t.add("preferred-fraction", c.skew.preferred_fraction, "with --label-skew").range(0, 1);
  t.add("speed-spread", c.speed_spread, "log-normal sigma of worker speeds (0: all equal)")
      .range(0, 1e9);
  t.add("step-jitter", c.step_jitter,
        "log-normal sigma of every step's time around its worker's mean (all modes)")
      .range(0, 10);
  t.add("failure-probability", c.failure_probability, "per step: worker crashes, loses the update")
      .range(0, 1);
  t.add("failing-fraction", c.failing_fraction,
        "share of the workers that can fail (a seeded choice; the others never do)")
      .range(0, 1);
  t.add("downtime", c.downtime_steps, "mean time a failed worker stays away")
      .range(0, 1e9)
      .unit("step times");
  t.add("leave-for-good", c.failures_permanent,
        "a failed worker never comes back (default: it rejoins after --downtime)");
  t.add("threads", c.threads, "compute threads").range(1, 64);
  t.add("delta-pulls", c.delta_pulls,
        "count each pull as the model delta since the worker's copy (GET "
        "/model?since=V, the worker's default) instead of the dense model (--dense-pull, the "
        "paper's)");
  t.add("publish-every", c.publish.every,
        "workers compute on a published model that follows the server's every "
        "this many applied updates (edgetrain-server --publish-every; implies --delta-pulls); 0: "
        "the exact model")
      .range(0, 1000000)
      .unit("updates");
  t.add("publish-fraction", c.publish.fraction,
        "with --publish-every: share of each tensor's entries a publish step "
        "copies; with --mode gossip: the same for each peer's published model, once per iteration "
        "(there the default "
        "is 1: dense gossip)")
      .range(1e-6, 1);
  t.add("publish-min-entries", c.publish.min_entries,
        "with --publish-every: entries a step copies at least per "
        "tensor")
      .range(1, 1u << 30);
  t.add("kernels", s.kernels,
        "xnnpack (fast; same seed, same bits on one machine) or reference (plain loops, "
        "slow; the same bits on every x86-64 machine)")
      .choices({"xnnpack", "reference"});
  t.add("seed", c.seed, "same seed, same run");
  t.group("Federated rounds (--mode rounds)");
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
        "masked (each entry averaged over the deltas that have it) or fedavg (the "
        "plain weighted mean, a missing entry counts as zero)")
      .choices({"masked", "fedavg"});
  t.add("round-policy", s.round_policy,
        "drop-stragglers (a round closes at its deadline; later deltas are "
        "dropped) or wait-all (it waits for every selected worker)")
      .choices({"drop-stragglers", "wait-all"});
  t.add("round-deadline", c.rounds.deadline_steps,
        "a round's deadline (0: 1.5 x the local steps; wait-all: "
        "a safety limit of 4 x this for a crashed worker)")
      .range(0, 1e12)
      .unit("step times");
  t.group("Gossip (--mode gossip; sim/README.md \"Gossip\")");
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
  t.add("iterations", s.gossip.max_iterations, "stop when the peers' mean iterations reach this")
      .range(1, 1e12);
  t.add("time-budget", s.gossip.time_budget, "stop at this virtual time (0: no limit)")
      .range(0, 1e15)
      .unit("step times");
  t.group("Filter dropout (DISTREAL)");
  t.add("drop-rates", s.drop_rates,
        "one drop rate per conv layer, e.g. 0.5,0.25 (each in [0, 1); empty: none); "
        "every worker's step trains a random sub-network");
  t.add("dropout-rescale", s.dropout_rescale,
        "inverted (ours: kept filters' outputs times 1/keep) or none")
      .choices({"inverted", "none"});
  t.group("Compression");
  runtime::declare_compression_settings(t, c.compressor, s.compression,
                                        {"none", "adacomp", "both"});
  t.add("bin-local", s.bin_local,
        "option: IBM's bin-local selection (Chen et al. 2018) instead of top-k");
  t.add("bin-size", c.compressor.bin_size, "entries per bin for --bin-local").range(1, 1e9);
  t.group("Run and output");
  t.add("updates", c.max_updates, "stop after this many applied updates (async mode)")
      .unit("updates");
  t.add("eval-every", s.eval_every,
        "applied updates (closed rounds with --mode rounds, mean peer iterations with "
        "--mode gossip) between test evaluations (0: 100 updates, every round, or 20 iterations)")
      .range(0, 1e12);
  t.add("eval-examples", c.eval_examples,
        "test examples per evaluation (0: all; with --mode gossip, per peer and "
        "for the consensus model, and the default there is 1000)");
  t.add("stop-at-accuracy", s.stop_at_accuracy,
        "stop once the test accuracy (gossip: the peers' mean) reaches this "
        "(0: never)")
      .range(0, 1);
  t.add("target-accuracy", s.target_accuracy,
        "accuracy for the traffic ratio (0: auto, half a point below the "
        "lower best)")
      .range(0, 1);
  t.add("out", s.out_dir, "directory for sim.csv, plots and summary.md");
  t.add("save-model", s.save_model,
        "write the last run's final model here (safetensors, with its accuracy in the "
        "metadata): e.g. a classifier for edgetrain-gan --classifier");
  t.add("quiet", s.quiet, "no progress line");
}

struct Data {
  runtime::Dataset train, test;
};

Data load_data(const SimSettings& s) {
  runtime::DatasetFiles train{s.train_images, s.train_labels}, test{s.test_images, s.test_labels};
  if (s.train_images.empty()) {
    train = runtime::dataset_files(s.data, runtime::DataSplit::kTrain);
    test = runtime::dataset_files(s.data, runtime::DataSplit::kTest);
  } else if (s.train_labels.empty() || s.test_images.empty() || s.test_labels.empty()) {
    throw std::invalid_argument(
        "--train-images needs --train-labels, --test-images and --test-labels too");
  }
  return {runtime::load_dataset(train.images, train.labels),
          runtime::load_dataset(test.images, test.labels)};
}

// The runs to compare: dense ASGD, AdaComp with the options, or both (in that order); with
// --mode rounds, FedAvg with dense deltas, with AdaComp-compressed deltas, or both.
std::vector<std::pair<std::string, sim::SimConfig>> make_runs(const SimSettings& s) {
  sim::SimConfig config = s.config;
  config.mode = sim::parse_sim_mode(s.mode);
  const bool rounds = config.mode == sim::SimMode::kRounds;
  config.eval_every = s.eval_every ? s.eval_every : rounds ? 1 : 100;
  if (s.stop_at_accuracy > 0) config.stop_at_accuracy = s.stop_at_accuracy;
  config.rounds.aggregation = server::parse_aggregation(s.aggregation);
  config.rounds.policy = sim::parse_round_policy(s.round_policy);
  if (rounds && (config.delta_pulls || config.publish.enabled()))
    throw std::invalid_argument(
        "--delta-pulls and --publish-every are for --mode async (a round pulls the dense model)");
  config.kernels = s.kernels == "reference" ? runtime::KernelBackend::kReference
                                            : runtime::KernelBackend::kXnnpack;
  config.compressor = runtime::compressor_options(config.compressor, s.compression, s.bin_local);
  if (!s.drop_rates.empty()) config.conv_drop_rates = runtime::parse_drop_rates(s.drop_rates);
  config.dropout_rescale = runtime::parse_dropout_rescale(s.dropout_rescale);
  config.staleness_rule = s.staleness == "sigma"   ? server::StalenessRule::kPerParameterSigma
                          : s.staleness == "delay" ? server::StalenessRule::kPerUpdateDelay
                                                   : server::StalenessRule::kNone;
  std::vector<std::pair<std::string, sim::SimConfig>> runs;
  if (s.compression.compressor == "none" || s.compression.compressor == "both") {
    sim::SimConfig c = config;
    c.compressor = runtime::CompressorOptions{};
    c.compressor.method = runtime::CompressionMethod::kNone;
    runs.push_back({rounds ? "FedAvg dense" : "ASGD", c});
  }
  if (s.compression.compressor == "adacomp" || s.compression.compressor == "both") {
    sim::SimConfig c = config;
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
    if (config.rounds.aggregation != server::Aggregation::kMasked) suffix << ", " << s.aggregation;
    if (config.rounds.policy != sim::RoundPolicy::kDropStragglers) suffix << ", " << s.round_policy;
    for (auto& run : runs) run.first += suffix.str();
  }
  if (config.publish.enabled()) {
    std::ostringstream suffix;
    suffix << ", published every " << config.publish.every << " at " << config.publish.fraction;
    for (auto& run : runs) run.first += suffix.str();
  }
  return runs;
}

using Runs = std::vector<std::pair<std::string, sim::SimConfig>>;

// One progress line per run on stderr: rewritten in place on a terminal, otherwise printed
// every tenth of the run (and at its end), so logs stay short.
class ProgressLine {
 public:
  explicit ProgressLine(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0) {}
  ~ProgressLine() {
    if (tty_ && shown_) std::fprintf(stderr, "\n");
  }
  void show(const char* line, double done, double total) {
    if (quiet_) return;
    shown_ = true;
    if (tty_) {
      std::fprintf(stderr, "\r%-100s", line);
    } else if (done >= last_printed_ + total / 10 || done >= total) {
      std::fprintf(stderr, "%s\n", line);
      last_printed_ = done;
    }
  }

 private:
  bool quiet_, tty_, shown_ = false;
  double last_printed_ = 0;
};

std::string accuracy_text(double accuracy) {
  return accuracy < 0 ? "  -  " : std::to_string(accuracy * 100).substr(0, 5) + "%";
}

std::vector<sim::SimResult> simulate(const SimSettings& s, const Runs& runs, const Data& data) {
  std::vector<sim::SimResult> results;
  for (const auto& [label, c] : runs) {
    ProgressLine progress_line(s.quiet);
    const bool rounds = c.mode == sim::SimMode::kRounds;
    auto progress = [&, label = label](const sim::Progress& p) {
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
    results.push_back(sim::run_simulation(c, data.train, data.test, label, progress));
  }
  return results;
}

// The files write_curves() writes besides sim.csv: in rounds mode the x axis of the
// second plot is rounds closed.
std::vector<std::string> plot_files(bool rounds) {
  return {"accuracy-vs-ingress.svg", rounds ? "accuracy-vs-rounds.svg" : "accuracy-vs-updates.svg",
          "accuracy-vs-time.svg"};
}

void write_chart(const std::string& path, const std::vector<plot::PlotSeries>& series,
                 const plot::PlotOptions& options) {
  std::ofstream(path) << plot::render_svg_line_chart(series, options);
}

// Half a point below the lowest best accuracy, rounded down to a tenth of a point: every
// run reaches it, so the time or traffic to it compares them all.
double automatic_target(double lowest_best) {
  return std::floor((lowest_best - 0.005) * 1000) / 1000;
}

// sim.csv keeps its columns in both modes: with --mode rounds `updates` holds the rounds
// closed (each close is one model version, as on the server).
void write_curves(const SimSettings& s, bool rounds, const std::vector<sim::SimResult>& results,
                  double target_accuracy) {
  std::ofstream csv(s.out_dir + "/sim.csv");
  csv << "method,updates,virtual_time,ingress_bytes,pull_bytes,test_accuracy,test_loss\n";
  std::vector<plot::PlotSeries> by_bytes, by_updates, by_time;
  for (const auto& r : results) {
    plot::PlotSeries b{r.label, {}, {}}, u{r.label, {}, {}}, t{r.label, {}, {}};
    for (const auto& p : r.curve) {
      csv << '"' << r.label << "\"," << p.updates << ',' << p.time << ',' << p.ingress_bytes << ','
          << p.pull_bytes << ',' << p.accuracy << ',' << p.loss << '\n';
      b.x.push_back(static_cast<double>(p.ingress_bytes));
      b.y.push_back(p.accuracy);
      u.x.push_back(static_cast<double>(p.updates));
      u.y.push_back(p.accuracy);
      t.x.push_back(p.time);
      t.y.push_back(p.accuracy);
    }
    by_bytes.push_back(b);
    by_updates.push_back(u);
    by_time.push_back(t);
  }
  const std::vector<std::string> files = plot_files(rounds);
  plot::PlotOptions plot;
  plot.title = std::string(rounds ? "Federated rounds: test" : "Test") +
               " accuracy against server ingress (" + s.data + ", " + s.config.model + ", " +
               std::to_string(s.config.workers) + " workers)";
  plot.x_label = "bytes ingested by the server";
  plot.y_label = "test accuracy";
  plot.log_x = true;
  plot.reference_y = target_accuracy;
  write_chart(s.out_dir + "/" + files[0], by_bytes, plot);
  plot.title =
      rounds ? "Test accuracy against rounds closed" : "Test accuracy against applied updates";
  plot.x_label = rounds ? "rounds closed" : "updates applied";
  plot.log_x = false;
  write_chart(s.out_dir + "/" + files[1], by_updates, plot);
  // The clock is virtual: a mean step time of a worker is its unit, so slow workers and
  // stragglers show here and not in the other two plots.
  plot.title = "Test accuracy against virtual time";
  plot.x_label = "virtual time (mean step times)";
  write_chart(s.out_dir + "/" + files[2], by_time, plot);
}

std::string time_text(std::optional<double> time) {
  if (!time) return "never";
  char text[32];
  std::snprintf(text, sizeof text, "%.0f", *time);
  return text;
}

// Rounds mode: what a round costs and brings. Ingress counts every delta that reached the
// server, stragglers' too (the server receives them and refuses them); the aggregate only
// those before the close.
std::string rounds_summary_table(const std::vector<sim::SimResult>& results,
                                 double target_accuracy) {
  std::ostringstream summary;
  summary << "| method | final acc | best acc | rounds | virtual time | ingress | bytes/delta | "
             "deltas/round | "
             "stragglers | lost | left | empty rounds | rounds to target | time to target | "
             "ingress to target | "
             "bytes/pull |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    auto to_bytes = r.ingress_bytes_to(target_accuracy);
    auto to_rounds = r.updates_to(target_accuracy);
    char row[500];
    std::snprintf(row, sizeof row,
                  "| %s | %.2f%% | %.2f%% | %llu | %.0f | %s | %s | %.1f | %llu | %llu | %llu | "
                  "%llu | %s | %s | %s | %s |\n",
                  r.label.c_str(), r.final_accuracy() * 100, r.best_accuracy() * 100,
                  static_cast<unsigned long long>(r.updates_applied), r.virtual_time,
                  human_bytes(r.ingress_bytes).c_str(), human_bytes(r.mean_update_bytes).c_str(),
                  r.mean_round_deltas, static_cast<unsigned long long>(r.round_stragglers),
                  static_cast<unsigned long long>(r.updates_lost),
                  static_cast<unsigned long long>(r.workers_left),
                  static_cast<unsigned long long>(r.empty_rounds),
                  to_rounds ? std::to_string(*to_rounds).c_str() : "never",
                  time_text(r.time_to(target_accuracy)).c_str(),
                  to_bytes ? human_bytes(static_cast<double>(*to_bytes)).c_str() : "never",
                  human_bytes(r.mean_pull_bytes).c_str());
    summary << row;
  }
  for (const auto& r : results) {
    if (r.stalled)
      summary << "\n"
              << r.label << ": stopped after " << r.updates_applied
              << " rounds: " << sim::kStallRounds
              << " rounds in a row left the model unchanged (every delta lost, or the server "
                 "refused the close: a "
                 "diverged model beyond the parameter bound)\n";
  }
  summary << "\nrounds: `updates` in sim.csv; time in mean step times (virtual); ingress counts "
             "stragglers' deltas "
             "too, which the server receives but leaves out of the aggregate\n";
  summary << "target accuracy: " << target_accuracy * 100 << "%\n";
  if (results.size() != 2) return summary.str();
  auto a = results[0].ingress_bytes_to(target_accuracy),
       b = results[1].ingress_bytes_to(target_accuracy);
  if (!a || !b || *b == 0)
    return summary.str() + "traffic ratio: not available (a run never reached the target)\n";
  char line[240];
  std::snprintf(line, sizeof line,
                "traffic ratio dense / AdaComp deltas to %.1f%%: %.1fx (%s vs %s); per delta: "
                "%.1fx; accuracy gap "
                "(best): %+.2f points\n",
                target_accuracy * 100, static_cast<double>(*a) / static_cast<double>(*b),
                human_bytes(static_cast<double>(*a)).c_str(),
                human_bytes(static_cast<double>(*b)).c_str(),
                results[0].mean_update_bytes / results[1].mean_update_bytes,
                (results[1].best_accuracy() - results[0].best_accuracy()) * 100);
  return summary.str() + line;
}

std::string summary_table(const std::vector<sim::SimResult>& results, double target_accuracy) {
  std::ostringstream summary;
  summary << "| method | final acc | best acc | updates | ingress | bytes/update | mean delay | "
             "refused | lost | left | "
             "updates to target | ingress to target | bytes/pull "
             "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    auto to_bytes = r.ingress_bytes_to(target_accuracy);
    auto to_updates = r.updates_to(target_accuracy);
    char row[400];
    std::snprintf(
        row, sizeof row,
        "| %s | %.2f%% | %.2f%% | %llu | %s | %s | %.1f | %llu | %llu | %llu | %s | %s | %s |\n",
        r.label.c_str(), r.final_accuracy() * 100, r.best_accuracy() * 100,
        static_cast<unsigned long long>(r.updates_applied), human_bytes(r.ingress_bytes).c_str(),
        human_bytes(r.mean_update_bytes).c_str(), r.mean_delay,
        static_cast<unsigned long long>(r.updates_refused),
        static_cast<unsigned long long>(r.updates_lost),
        static_cast<unsigned long long>(r.workers_left),
        to_updates ? std::to_string(*to_updates).c_str() : "never",
        to_bytes ? human_bytes(static_cast<double>(*to_bytes)).c_str() : "never",
        human_bytes(r.mean_pull_bytes).c_str());
    summary << row;
  }
  for (const auto& r : results) {
    if (r.stalled)
      summary << "\n"
              << r.label << ": stopped after " << r.updates_applied
              << " applied updates: the server refused every update for a long while (a diverged "
                 "model at the "
                 "parameter bound, or every worker beyond the staleness bound)\n";
  }
  summary << "\ntarget accuracy: " << target_accuracy * 100 << "%\n";
  if (results.size() != 2) return summary.str();
  auto a = results[0].ingress_bytes_to(target_accuracy),
       b = results[1].ingress_bytes_to(target_accuracy);
  if (!a || !b || *b == 0)
    return summary.str() + "traffic ratio: not available (a run never reached the target)\n";
  char line[200];
  std::snprintf(
      line, sizeof line,
      "traffic ratio ASGD / AdaComp to %.1f%%: %.1fx (%s vs %s); per update: %.1fx; accuracy gap "
      "(best): %+.2f points\n",
      target_accuracy * 100, static_cast<double>(*a) / static_cast<double>(*b),
      human_bytes(static_cast<double>(*a)).c_str(), human_bytes(static_cast<double>(*b)).c_str(),
      results[0].mean_update_bytes / results[1].mean_update_bytes,
      (results[1].best_accuracy() - results[0].best_accuracy()) * 100);
  return summary.str() + line;
}

// Writes `parameters` to --save-model in the server's checkpoint format (sealed, with its
// model keys): `edgetrain-server evaluate`, --init-from and server/checkpoint_to_torch.py
// take the file as it is.
void save_model(const SimSettings& s, const std::vector<float>& parameters, std::uint64_t version,
                const std::string& label, double final_accuracy) {
  runtime::Model model(runtime::model_spec_from_argument(s.config.model));
  std::copy(parameters.begin(), parameters.end(), model.parameters().begin());
  const std::map<std::string, std::string> metadata = {
      {"edgetrain.model", model.spec().name},
      {"edgetrain.model_id", std::to_string(model.layout_id())},
      {"edgetrain.version", std::to_string(version)},
      {"edgetrain.sim.method", label},
      {"edgetrain.sim.data", s.data},
      {"edgetrain.sim.final_test_accuracy", std::to_string(final_accuracy)}};
  server::write_file_atomically(s.save_model, server::sealed_checkpoint_bytes(model, metadata));
  std::cout << "model: " << s.save_model << " (" << label << ", final test accuracy "
            << final_accuracy * 100 << "%)\n";
}

// ---- --mode gossip -----------------------------------------------------------------------

// Settings of a server-based run that mean nothing without a server: refused with --mode
// gossip when given, rather than silently ignored.
bool server_only_setting(const settings::Setting& setting) {
  static const std::set<std::string> flags = {
      "staleness",        "max-staleness", "speed-spread",   "failure-probability",
      "failing-fraction", "downtime",      "leave-for-good", "delta-pulls",
      "publish-every",    "updates",       "bin-local",      "bin-size"};
  const std::string& group = setting.group();
  return flags.contains(setting.flag()) || group.starts_with("Federated rounds") ||
         group.starts_with("Filter dropout") || group.starts_with("Compression");
}

void refuse_settings_of_other_modes(const SimSettings& s, const settings::Table& table) {
  const bool gossip = s.mode == "gossip";
  for (const auto& setting : table.settings()) {
    if (!table.was_set(setting->flag())) continue;
    if (gossip && server_only_setting(*setting))
      throw std::invalid_argument("--" + setting->flag() +
                                  " is not a setting of --mode gossip (no server there)");
    if (!gossip && setting->group().starts_with("Gossip"))
      throw std::invalid_argument("--" + setting->flag() + " is a setting of --mode gossip");
  }
}

sim::GossipConfig make_gossip_config(const SimSettings& s, const settings::Table& table) {
  const sim::SimConfig& c = s.config;
  sim::GossipConfig g = s.gossip;  // the table filled its balance, plateau and stop settings
  g.model = c.model;
  g.peers = c.workers;
  g.batch = c.batch;
  g.learning_rate = c.learning_rate;
  g.algorithm = sim::parse_gossip_algorithm(s.gossip_algorithm);
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
  g.speed_classes = sim::parse_speed_classes(s.speed_classes);
  g.speed_schedule = sim::parse_speed_schedule(s.speed_schedule);
  g.step_jitter = c.step_jitter;
  g.eval_every = s.eval_every ? s.eval_every : 20;
  // Evaluating every peer is most of a run's wall time: 1000 test examples unless asked.
  g.eval_examples = table.was_set("eval-examples") ? c.eval_examples : 1000;
  if (s.stop_at_accuracy > 0) g.stop_at_accuracy = s.stop_at_accuracy;
  g.seed = c.seed;
  g.threads = c.threads;
  g.kernels = s.kernels == "reference" ? runtime::KernelBackend::kReference
                                       : runtime::KernelBackend::kXnnpack;
  sim::check_gossip_config(g);
  return g;
}

// "D-PSGD, ring, publish 0.01 (gamma 0.5), balance 2, accuracy-aware 5": what sets a run apart.
std::string gossip_label(const SimSettings& s, const sim::GossipConfig& g) {
  std::ostringstream label;
  label << (g.algorithm == sim::GossipAlgorithm::kDpsgd ? "D-PSGD" : "AD-PSGD") << ", ";
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
  return label.str();
}

std::string optional_time(const sim::GossipEvalPoint* point) {
  return point ? time_text(point->time) : "never";
}

void write_gossip_outputs(const SimSettings& s, const sim::GossipResult& r,
                          double target_accuracy) {
  std::ofstream csv(s.out_dir + "/sim.csv");
  csv << "method,virtual_time,mean_iterations,bytes_per_peer,mean_accuracy,min_accuracy,max_"
         "accuracy,"
         "consensus_accuracy,mean_loss,consensus_loss,local_steps\n";
  plot::PlotSeries mean{"mean peer", {}, {}}, lowest{"least accurate peer", {}, {}},
      consensus{"consensus (average model)", {}, {}};
  plot::PlotSeries mean_by_bytes = mean, consensus_by_bytes = consensus;
  for (const auto& p : r.curve) {
    csv << '"' << r.label << "\"," << p.time << ',' << p.mean_iterations << ',' << p.bytes_per_peer
        << ',' << p.mean_accuracy << ',' << p.min_accuracy << ',' << p.max_accuracy << ','
        << p.consensus_accuracy << ',' << p.mean_loss << ',' << p.consensus_loss << ','
        << p.local_steps << '\n';
    for (auto* series : {&mean, &lowest, &consensus}) series->x.push_back(p.time);
    mean.y.push_back(p.mean_accuracy);
    lowest.y.push_back(p.min_accuracy);
    consensus.y.push_back(p.consensus_accuracy);
    if (p.bytes_per_peer > 0) {  // log axis: the start (no bytes yet) has no place on it
      mean_by_bytes.x.push_back(p.bytes_per_peer);
      mean_by_bytes.y.push_back(p.mean_accuracy);
      consensus_by_bytes.x.push_back(p.bytes_per_peer);
      consensus_by_bytes.y.push_back(p.consensus_accuracy);
    }
  }
  plot::PlotOptions plot;
  plot.title = "Gossip (" + r.label + "): test accuracy against virtual time (" + s.data + ", " +
               s.config.model + ")";
  plot.x_label = "virtual time (mean step times of the fastest class)";
  plot.y_label = "test accuracy";
  plot.reference_y = target_accuracy;
  write_chart(s.out_dir + "/accuracy-vs-time.svg", {mean, lowest, consensus}, plot);
  plot.title = "Gossip (" + r.label + "): test accuracy against bytes sent per peer";
  plot.x_label = "bytes sent per peer (mean)";
  plot.log_x = true;
  write_chart(s.out_dir + "/accuracy-vs-bytes.svg", {mean_by_bytes, consensus_by_bytes}, plot);
}

std::string gossip_summary(const sim::GossipResult& r, double target_accuracy) {
  std::ostringstream out;
  const sim::GossipEvalPoint& last = r.curve.back();
  const sim::GossipEvalPoint* reached = r.first_reaching(target_accuracy);
  char row[700];
  out << "| run | topology | mean acc | peers min-max | consensus acc | mean iterations | virtual "
         "time | local steps | "
         "skipped steps | bytes/peer | time to target | bytes/peer to target | consensus time to "
         "target | wall s |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::snprintf(row, sizeof row,
                "| %s | %s | %.2f%% | %.2f-%.2f%% | %.2f%% | %.0f | %.0f | %llu | %llu | %s | %s | "
                "%s | %s | %.0f |\n",
                r.label.c_str(), r.topology.c_str(), last.mean_accuracy * 100,
                last.min_accuracy * 100, last.max_accuracy * 100, last.consensus_accuracy * 100,
                r.mean_iterations, r.virtual_time, static_cast<unsigned long long>(r.local_steps),
                static_cast<unsigned long long>(r.skipped_steps),
                human_bytes(r.bytes_per_peer).c_str(), optional_time(reached).c_str(),
                reached ? human_bytes(reached->bytes_per_peer).c_str() : "never",
                optional_time(r.consensus_first_reaching(target_accuracy)).c_str(), r.wall_seconds);
  out << row;
  out << "\n| speed class (budget) | peers | compute per step | steps per iteration | waiting per "
         "iteration | mean batch |\n"
         "|---|---|---|---|---|---|\n";
  for (const auto& c : r.classes) {
    std::snprintf(row, sizeof row, "| %g | %d | %.2f | %.2f | %.2f | %.1f |\n", c.budget, c.peers,
                  c.compute_per_step, c.steps_per_iteration, c.wait_per_iteration, c.mean_batch);
    out << row;
  }
  out << "\ntarget accuracy (mean peer): " << target_accuracy * 100
      << "%; time in mean step times of the fastest "
      << "class (virtual); bytes: sent per peer, mean over the peers\n";
  out << "consensus distance at the end (mean |x_i - mean| / |mean|): " << r.consensus_distance
      << "\n";
  if (r.validations > 0)
    out << "accuracy-aware: " << r.validations << " validations, " << r.lr_decays
        << " lr halvings, " << r.peers_stopped << " peers stopped, " << r.skipped_steps
        << " iterations without a local step\n";
  return out.str();
}

int run_gossip(const SimSettings& s, const sim::GossipConfig& config) {
  const Data data = load_data(s);
  const std::string label = gossip_label(s, config);
  std::fprintf(stderr,
               "edgetrain-sim: gossip, %s, %zu train / %zu test examples, model %s, %d peers, "
               "batch %d, lr %g: %s\n",
               s.data.c_str(), data.train.size(), data.test.size(), config.model.c_str(),
               config.peers, config.batch, config.learning_rate, label.c_str());
  sim::GossipResult result;
  {
    ProgressLine progress_line(s.quiet);
    auto progress = [&](const sim::GossipProgress& p) {
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
    result = sim::run_gossip_simulation(config, data.train, data.test, label, progress);
  }
  std::filesystem::create_directories(s.out_dir);
  const double target_accuracy =
      s.target_accuracy > 0 ? s.target_accuracy : automatic_target(result.best_mean_accuracy());
  write_gossip_outputs(s, result, target_accuracy);
  const std::string summary = gossip_summary(result, target_accuracy);
  std::ofstream(s.out_dir + "/summary.md") << summary;
  if (!s.save_model.empty())
    save_model(s, result.consensus_parameters, static_cast<std::uint64_t>(result.mean_iterations),
               result.label + " (consensus)", result.curve.back().consensus_accuracy);
  std::cout << summary << "written: " << s.out_dir
            << "/{sim.csv,summary.md,accuracy-vs-time.svg,accuracy-vs-bytes.svg}\n";
  return 0;
}

int run(const SimSettings& s, const settings::Table& table) {
  // Settings that are wrong together (the table checks each alone) are refused before the
  // data loads, with the table's exit status.
  Runs runs;
  sim::GossipConfig gossip;
  try {
    refuse_settings_of_other_modes(s, table);
    if (s.mode == "gossip") {
      gossip = make_gossip_config(s, table);
    } else {
      runs = make_runs(s);
    }
    for (const auto& run : runs) sim::check_sim_config(run.second);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "edgetrain-sim: %s\n", e.what());
    return 2;
  }
  if (s.mode == "gossip") return run_gossip(s, gossip);
  const bool rounds = runs.front().second.mode == sim::SimMode::kRounds;
  const Data data = load_data(s);
  if (rounds) {
    const sim::RoundsConfig& r = s.config.rounds;
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
  }
  const std::vector<sim::SimResult> results = simulate(s, runs, data);
  std::filesystem::create_directories(s.out_dir);
  double target_accuracy = s.target_accuracy;
  if (target_accuracy <= 0) {
    double lowest_best = 1;
    for (const auto& r : results) lowest_best = std::min(lowest_best, r.best_accuracy());
    target_accuracy = automatic_target(lowest_best);
  }
  write_curves(s, rounds, results, target_accuracy);
  const std::string summary = rounds ? rounds_summary_table(results, target_accuracy)
                                     : summary_table(results, target_accuracy);
  std::ofstream(s.out_dir + "/summary.md") << summary;
  if (!s.save_model.empty()) {
    const sim::SimResult& last = results.back();
    save_model(s, last.final_parameters, last.updates_applied, last.label, last.final_accuracy());
  }
  std::cout << summary << "written: " << s.out_dir << "/{sim.csv,summary.md";
  for (const std::string& file : plot_files(rounds)) std::cout << ',' << file;
  std::cout << "}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  SimSettings settings;
  settings::Table table("edgetrain-sim",
                        "edgetrain-sim: N virtual workers train a model asynchronously in one "
                        "process, with the real trainer,\n"
                        "compressor, codec and server staleness rule, and compare dense ASGD with "
                        "AdaComp by test accuracy\n"
                        "against the bytes the server ingests; or, with --mode rounds, in "
                        "federated rounds (FedAvg) with dense\n"
                        "against AdaComp-compressed deltas; or, with --mode gossip, with no "
                        "server: peers average models with their\n"
                        "neighbours (D-PSGD, AD-PSGD; compressed gossip, workload balancing, "
                        "accuracy-aware training).\n"
                        "Writes a CSV, SVG plots and a summary to --out.");
  declare_settings(table, settings);
  return table.run_program(argc, argv, [&] { return run(settings, table); });
}
