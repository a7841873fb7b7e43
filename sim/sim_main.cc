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
#include <sstream>

#include "common/settings.h"
#include "common/svg_plot.h"
#include "runtime/compression_settings.h"
#include "runtime/dataset.h"
#include "server/checkpoint_file.h"
#include "server/durable_file.h"
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
  double target_accuracy = 0;
  bool bin_local = false, quiet = false;
};

void declare_settings(settings::Table& t, SimSettings& s) {
  sim::SimConfig& c = s.config;
  t.group("Data and model");
  t.add("data", s.data, "mnist (full MNIST, 60k + 10k), mnist-small (its 8k + 2k subset), fashion-mnist (Debian's 60k + 10k) or a directory");
  t.add("train-images", s.train_images, "IDX file (raw or .gz); overrides --data");
  t.add("train-labels", s.train_labels, "IDX file");
  t.add("test-images", s.test_images, "IDX file");
  t.add("test-labels", s.test_labels, "IDX file");
  t.add("model", c.model, "paper-cnn, mlp, or a spec such as 'input 28x28x1; fc 64 relu; fc 10'");
  t.group("Workers and server");
  t.add("workers", c.workers, "virtual workers").range(1, 10000);
  t.add("batch", c.batch, "minibatch per step").range(1, 4096);
  t.add("lr", c.learning_rate, "server learning rate");
  t.add("staleness", s.staleness, "sigma (the paper: per parameter), delay (Zhang et al.: lr/delay) or none "
        "(plain lr whatever the delay: what the staleness rule buys)")
      .choices({"sigma", "delay", "none"});
  t.add("max-staleness", c.max_staleness, "updates older than this are refused").unit("updates");
  t.add("label-skew", c.label_skewed, "label-skewed shards instead of i.i.d.");
  t.add("classes-per-worker", c.skew.classes_per_worker, "with --label-skew");
  t.add("preferred-fraction", c.skew.preferred_fraction, "with --label-skew").range(0, 1);
  t.add("speed-spread", c.speed_spread, "log-normal sigma of worker speeds (0: all equal)").range(0, 1e9);
  t.add("failure-probability", c.failure_probability, "per step: worker crashes, loses the update").range(0, 1);
  t.add("failing-fraction", c.failing_fraction, "share of the workers that can fail (a seeded choice; the others never do)")
      .range(0, 1);
  t.add("downtime", c.downtime_steps, "mean time a failed worker stays away").range(0, 1e9).unit("step times");
  t.add("leave-for-good", c.failures_permanent, "a failed worker never comes back (default: it rejoins after --downtime)");
  t.add("threads", c.threads, "compute threads").range(1, 64);
  t.add("delta-pulls", c.delta_pulls, "count each pull as the model delta since the worker's copy (GET "
        "/model?since=V, the worker's default) instead of the dense model (--dense-pull, the paper's)");
  t.add("publish-every", c.publish.every, "workers compute on a published model that follows the server's every "
        "this many applied updates (edgetrain-server --publish-every; implies --delta-pulls); 0: the exact model")
      .range(0, 1000000).unit("updates");
  t.add("publish-fraction", c.publish.fraction, "with --publish-every: share of each tensor's entries a publish step "
        "copies").range(1e-6, 1);
  t.add("publish-min-entries", c.publish.min_entries, "with --publish-every: entries a step copies at least per "
        "tensor").range(1, 1u << 30);
  t.add("kernels", s.kernels, "xnnpack (fast; same seed, same bits on one machine) or reference (plain loops, "
        "slow; the same bits on every x86-64 machine)").choices({"xnnpack", "reference"});
  t.add("seed", c.seed, "same seed, same run");
  t.group("Federated rounds (--mode rounds)");
  t.add("mode", s.mode, "async (asynchronous SGD with the staleness rule) or rounds (federated rounds, FedAvg: "
        "selected workers train local steps and send model deltas)").choices({"async", "rounds"});
  t.add("rounds", c.rounds.max_rounds, "stop after this many closed rounds").range(1, 1e9).unit("rounds");
  t.add("local-steps", c.rounds.local_steps, "minibatches a selected worker trains per round").range(1, 1000000);
  t.add("local-epochs", c.rounds.local_epochs, "passes over the worker's shard per round instead of --local-steps "
        "(0: use --local-steps)").range(0, 1000);
  t.add("local-lr", c.rounds.local_lr, "the worker's plain SGD learning rate").range(1e-9, 1e9);
  t.add("server-lr", c.rounds.server_lr, "the round's model moves by this times the aggregated delta").range(1e-9, 1e9);
  t.add("client-fraction", c.rounds.client_fraction, "share of the workers selected per round (a seeded draw, at "
        "least one)").range(1e-9, 1);
  t.add("aggregation", s.aggregation, "masked (each entry averaged over the deltas that have it) or fedavg (the "
        "plain weighted mean, a missing entry counts as zero)").choices({"masked", "fedavg"});
  t.add("round-policy", s.round_policy, "drop-stragglers (a round closes at its deadline; later deltas are "
        "dropped) or wait-all (it waits for every selected worker)").choices({"drop-stragglers", "wait-all"});
  t.add("round-deadline", c.rounds.deadline_steps, "a round's deadline (0: 1.5 x the local steps; wait-all: "
        "a safety limit of 4 x this for a crashed worker)").range(0, 1e12).unit("step times");
  t.group("Filter dropout (DISTREAL)");
  t.add("drop-rates", s.drop_rates, "one drop rate per conv layer, e.g. 0.5,0.25 (each in [0, 1); empty: none); "
        "every worker's step trains a random sub-network");
  t.add("dropout-rescale", s.dropout_rescale, "inverted (ours: kept filters' outputs times 1/keep) or none")
      .choices({"inverted", "none"});
  t.group("Compression");
  runtime::declare_compression_settings(t, c.compressor, s.compression, {"none", "adacomp", "both"});
  t.add("bin-local", s.bin_local, "option: IBM's bin-local selection (Chen et al. 2018) instead of top-k");
  t.add("bin-size", c.compressor.bin_size, "entries per bin for --bin-local").range(1, 1e9);
  t.group("Run and output");
  t.add("updates", c.max_updates, "stop after this many applied updates (async mode)").unit("updates");
  t.add("eval-every", s.eval_every, "applied updates (closed rounds with --mode rounds) between test evaluations "
        "(0: 100 updates, or every round)").range(0, 1e12);
  t.add("eval-examples", c.eval_examples, "test examples per evaluation (0: all)");
  t.add("target-accuracy", s.target_accuracy, "accuracy for the traffic ratio (0: auto, half a point below the "
        "lower best)").range(0, 1);
  t.add("out", s.out_dir, "directory for sim.csv, plots and summary.md");
  t.add("save-model", s.save_model, "write the last run's final model here (safetensors, with its accuracy in the "
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
    throw std::invalid_argument("--train-images needs --train-labels, --test-images and --test-labels too");
  }
  return {runtime::load_dataset(train.images, train.labels), runtime::load_dataset(test.images, test.labels)};
}

// The runs to compare: dense ASGD, AdaComp with the options, or both (in that order); with
// --mode rounds, FedAvg with dense deltas, with AdaComp-compressed deltas, or both.
std::vector<std::pair<std::string, sim::SimConfig>> make_runs(const SimSettings& s) {
  sim::SimConfig config = s.config;
  config.mode = sim::parse_sim_mode(s.mode);
  const bool rounds = config.mode == sim::SimMode::kRounds;
  config.eval_every = s.eval_every ? s.eval_every : rounds ? 1 : 100;
  config.rounds.aggregation = server::parse_aggregation(s.aggregation);
  config.rounds.policy = sim::parse_round_policy(s.round_policy);
  if (rounds && (config.delta_pulls || config.publish.enabled()))
    throw std::invalid_argument("--delta-pulls and --publish-every are for --mode async (a round pulls the dense model)");
  config.kernels = s.kernels == "reference" ? runtime::KernelBackend::kReference : runtime::KernelBackend::kXnnpack;
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
    c.compressor.method = s.bin_local ? runtime::CompressionMethod::kBinLocal : runtime::CompressionMethod::kTopK;
    std::ostringstream label;
    label << (rounds ? "FedAvg AdaComp c=" : "AdaComp c=") << c.compressor.compression_rate << (s.bin_local ? " bin-local" : "")
          << (c.compressor.error_feedback ? " +ef" : "") << (s.compression.fp16 ? " fp16" : "") << (s.compression.sign_scale ? " sign-scale" : "");
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

std::vector<sim::SimResult> simulate(const SimSettings& s, const Runs& runs, const Data& data) {
  const bool tty = isatty(STDERR_FILENO);
  std::vector<sim::SimResult> results;
  for (const auto& [label, c] : runs) {
    std::uint64_t last_printed = 0;
    const bool rounds = c.mode == sim::SimMode::kRounds;
    auto progress = [&, label = label](const sim::Progress& p) {
      if (s.quiet) return;
      char line[200];
      const std::string accuracy = p.accuracy < 0 ? "  -  " : std::to_string(p.accuracy * 100).substr(0, 5) + "%";
      if (rounds) {
        std::snprintf(line, sizeof line, "[%s] round %llu/%llu  test acc %s  ingress %s  stragglers %llu", label.c_str(),
                      static_cast<unsigned long long>(p.updates), static_cast<unsigned long long>(p.max_updates),
                      accuracy.c_str(), human_bytes(static_cast<double>(p.ingress_bytes)).c_str(),
                      static_cast<unsigned long long>(p.round_stragglers));
      } else {
        std::snprintf(line, sizeof line, "[%s] update %llu/%llu  test acc %s  ingress %s  mean delay %.1f",
                      label.c_str(), static_cast<unsigned long long>(p.updates),
                      static_cast<unsigned long long>(p.max_updates), accuracy.c_str(),
                      human_bytes(static_cast<double>(p.ingress_bytes)).c_str(), p.mean_delay);
      }
      if (tty) {
        std::fprintf(stderr, "\r%-100s", line);
      } else if (p.updates >= last_printed + p.max_updates / 10 || p.updates == p.max_updates) {
        std::fprintf(stderr, "%s\n", line);
        last_printed = p.updates;
      }
    };
    results.push_back(sim::run_simulation(c, data.train, data.test, label, progress));
    if (tty && !s.quiet) std::fprintf(stderr, "\n");
  }
  return results;
}

// The files write_curves() writes besides sim.csv: in rounds mode the x axis of the
// second plot is rounds closed.
std::vector<std::string> plot_files(bool rounds) {
  return {"accuracy-vs-ingress.svg", rounds ? "accuracy-vs-rounds.svg" : "accuracy-vs-updates.svg",
          "accuracy-vs-time.svg"};
}

// sim.csv keeps its columns in both modes: with --mode rounds `updates` holds the rounds
// closed (each close is one model version, as on the server).
void write_curves(const SimSettings& s, bool rounds, const std::vector<sim::SimResult>& results, double target_accuracy) {
  std::ofstream csv(s.out_dir + "/sim.csv");
  csv << "method,updates,virtual_time,ingress_bytes,pull_bytes,test_accuracy,test_loss\n";
  std::vector<plot::PlotSeries> by_bytes, by_updates, by_time;
  for (const auto& r : results) {
    plot::PlotSeries b{r.label, {}, {}}, u{r.label, {}, {}}, t{r.label, {}, {}};
    for (const auto& p : r.curve) {
      csv << '"' << r.label << "\"," << p.updates << ',' << p.time << ',' << p.ingress_bytes << ',' << p.pull_bytes << ','
          << p.accuracy << ',' << p.loss << '\n';
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
  plot.title = std::string(rounds ? "Federated rounds: test" : "Test") + " accuracy against server ingress (" +
               s.data + ", " + s.config.model + ", " + std::to_string(s.config.workers) + " workers)";
  plot.x_label = "bytes ingested by the server";
  plot.y_label = "test accuracy";
  plot.log_x = true;
  plot.reference_y = target_accuracy;
  std::ofstream(s.out_dir + "/" + files[0]) << plot::render_svg_line_chart(by_bytes, plot);
  plot.title = rounds ? "Test accuracy against rounds closed" : "Test accuracy against applied updates";
  plot.x_label = rounds ? "rounds closed" : "updates applied";
  plot.log_x = false;
  std::ofstream(s.out_dir + "/" + files[1]) << plot::render_svg_line_chart(by_updates, plot);
  // The clock is virtual: a mean step time of a worker is its unit, so slow workers and
  // stragglers show here and not in the other two plots.
  plot.title = "Test accuracy against virtual time";
  plot.x_label = "virtual time (mean step times)";
  std::ofstream(s.out_dir + "/" + files[2]) << plot::render_svg_line_chart(by_time, plot);
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
std::string rounds_summary_table(const std::vector<sim::SimResult>& results, double target_accuracy) {
  std::ostringstream summary;
  summary << "| method | final acc | best acc | rounds | virtual time | ingress | bytes/delta | deltas/round | "
             "stragglers | lost | left | empty rounds | rounds to target | time to target | ingress to target | "
             "bytes/pull |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    auto to_bytes = r.ingress_bytes_to(target_accuracy);
    auto to_rounds = r.updates_to(target_accuracy);
    char row[500];
    std::snprintf(row, sizeof row,
                  "| %s | %.2f%% | %.2f%% | %llu | %.0f | %s | %s | %.1f | %llu | %llu | %llu | %llu | %s | %s | %s | %s |\n",
                  r.label.c_str(), r.final_accuracy() * 100, r.best_accuracy() * 100,
                  static_cast<unsigned long long>(r.updates_applied), r.virtual_time, human_bytes(r.ingress_bytes).c_str(),
                  human_bytes(r.mean_update_bytes).c_str(), r.mean_round_deltas,
                  static_cast<unsigned long long>(r.round_stragglers), static_cast<unsigned long long>(r.updates_lost),
                  static_cast<unsigned long long>(r.workers_left), static_cast<unsigned long long>(r.empty_rounds),
                  to_rounds ? std::to_string(*to_rounds).c_str() : "never", time_text(r.time_to(target_accuracy)).c_str(),
                  to_bytes ? human_bytes(static_cast<double>(*to_bytes)).c_str() : "never",
                  human_bytes(r.mean_pull_bytes).c_str());
    summary << row;
  }
  for (const auto& r : results) {
    if (r.stalled)
      summary << "\n" << r.label << ": stopped after " << r.updates_applied
              << " rounds: " << sim::kStallRounds
              << " rounds in a row left the model unchanged (every delta lost, or the server refused the close: a "
                 "diverged model beyond the parameter bound)\n";
  }
  summary << "\nrounds: `updates` in sim.csv; time in mean step times (virtual); ingress counts stragglers' deltas "
             "too, which the server receives but leaves out of the aggregate\n";
  summary << "target accuracy: " << target_accuracy * 100 << "%\n";
  if (results.size() != 2) return summary.str();
  auto a = results[0].ingress_bytes_to(target_accuracy), b = results[1].ingress_bytes_to(target_accuracy);
  if (!a || !b || *b == 0) return summary.str() + "traffic ratio: not available (a run never reached the target)\n";
  char line[240];
  std::snprintf(line, sizeof line,
                "traffic ratio dense / AdaComp deltas to %.1f%%: %.1fx (%s vs %s); per delta: %.1fx; accuracy gap "
                "(best): %+.2f points\n",
                target_accuracy * 100, static_cast<double>(*a) / static_cast<double>(*b),
                human_bytes(static_cast<double>(*a)).c_str(), human_bytes(static_cast<double>(*b)).c_str(),
                results[0].mean_update_bytes / results[1].mean_update_bytes,
                (results[1].best_accuracy() - results[0].best_accuracy()) * 100);
  return summary.str() + line;
}

std::string summary_table(const std::vector<sim::SimResult>& results, double target_accuracy) {
  std::ostringstream summary;
  summary << "| method | final acc | best acc | updates | ingress | bytes/update | mean delay | refused | lost | left | "
             "updates to target | ingress to target | bytes/pull |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    auto to_bytes = r.ingress_bytes_to(target_accuracy);
    auto to_updates = r.updates_to(target_accuracy);
    char row[400];
    std::snprintf(row, sizeof row, "| %s | %.2f%% | %.2f%% | %llu | %s | %s | %.1f | %llu | %llu | %llu | %s | %s | %s |\n",
                  r.label.c_str(), r.final_accuracy() * 100, r.best_accuracy() * 100,
                  static_cast<unsigned long long>(r.updates_applied), human_bytes(r.ingress_bytes).c_str(),
                  human_bytes(r.mean_update_bytes).c_str(), r.mean_delay,
                  static_cast<unsigned long long>(r.updates_refused), static_cast<unsigned long long>(r.updates_lost),
                  static_cast<unsigned long long>(r.workers_left),
                  to_updates ? std::to_string(*to_updates).c_str() : "never",
                  to_bytes ? human_bytes(static_cast<double>(*to_bytes)).c_str() : "never",
                  human_bytes(r.mean_pull_bytes).c_str());
    summary << row;
  }
  for (const auto& r : results) {
    if (r.stalled)
      summary << "\n" << r.label << ": stopped after " << r.updates_applied
              << " applied updates: the server refused every update for a long while (a diverged model at the "
                 "parameter bound, or every worker beyond the staleness bound)\n";
  }
  summary << "\ntarget accuracy: " << target_accuracy * 100 << "%\n";
  if (results.size() != 2) return summary.str();
  auto a = results[0].ingress_bytes_to(target_accuracy), b = results[1].ingress_bytes_to(target_accuracy);
  if (!a || !b || *b == 0) return summary.str() + "traffic ratio: not available (a run never reached the target)\n";
  char line[200];
  std::snprintf(line, sizeof line,
                "traffic ratio ASGD / AdaComp to %.1f%%: %.1fx (%s vs %s); per update: %.1fx; accuracy gap "
                "(best): %+.2f points\n",
                target_accuracy * 100, static_cast<double>(*a) / static_cast<double>(*b),
                human_bytes(static_cast<double>(*a)).c_str(), human_bytes(static_cast<double>(*b)).c_str(),
                results[0].mean_update_bytes / results[1].mean_update_bytes,
                (results[1].best_accuracy() - results[0].best_accuracy()) * 100);
  return summary.str() + line;
}

int run(const SimSettings& s) {
  // Settings that are wrong together (the table checks each alone) are refused before the
  // data loads, with the table's exit status.
  Runs runs;
  try {
    runs = make_runs(s);
    for (const auto& run : runs) sim::check_sim_config(run.second);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "edgetrain-sim: %s\n", e.what());
    return 2;
  }
  const bool rounds = runs.front().second.mode == sim::SimMode::kRounds;
  const Data data = load_data(s);
  if (rounds) {
    const sim::RoundsConfig& r = s.config.rounds;
    std::fprintf(stderr,
                 "edgetrain-sim: federated rounds, %s, %zu train / %zu test examples, model %s, %d workers, batch %d, "
                 "%u local %s, local lr %g, server lr %g, client fraction %g, %s, %s\n",
                 s.data.c_str(), data.train.size(), data.test.size(), s.config.model.c_str(), s.config.workers,
                 s.config.batch, r.local_epochs ? r.local_epochs : r.local_steps, r.local_epochs ? "epochs" : "steps",
                 r.local_lr, r.server_lr, r.client_fraction, s.aggregation.c_str(), s.round_policy.c_str());
  } else {
    std::fprintf(stderr, "edgetrain-sim: %s, %zu train / %zu test examples, model %s, %d workers, batch %d, lr %g\n",
                 s.data.c_str(), data.train.size(), data.test.size(), s.config.model.c_str(), s.config.workers,
                 s.config.batch, s.config.learning_rate);
  }
  const std::vector<sim::SimResult> results = simulate(s, runs, data);
  std::filesystem::create_directories(s.out_dir);
  double target_accuracy = s.target_accuracy;
  if (target_accuracy <= 0) {
    double lowest_best = 1;
    for (const auto& r : results) lowest_best = std::min(lowest_best, r.best_accuracy());
    target_accuracy = std::floor((lowest_best - 0.005) * 1000) / 1000;
  }
  write_curves(s, rounds, results, target_accuracy);
  const std::string summary =
      rounds ? rounds_summary_table(results, target_accuracy) : summary_table(results, target_accuracy);
  std::ofstream(s.out_dir + "/summary.md") << summary;
  if (!s.save_model.empty()) {
    runtime::Model model(runtime::model_spec_from_argument(s.config.model));
    const sim::SimResult& last = results.back();
    std::copy(last.final_parameters.begin(), last.final_parameters.end(), model.parameters().begin());
    // The server's checkpoint format (sealed, with its model keys): `edgetrain-server
    // evaluate`, --init-from and server/checkpoint_to_torch.py take the file as it is.
    const std::map<std::string, std::string> metadata = {
        {"edgetrain.model", model.spec().name},
        {"edgetrain.model_id", std::to_string(model.layout_id())},
        {"edgetrain.version", std::to_string(last.updates_applied)},
        {"edgetrain.sim.method", last.label},
        {"edgetrain.sim.data", s.data},
        {"edgetrain.sim.final_test_accuracy", std::to_string(last.final_accuracy())}};
    server::write_file_atomically(s.save_model, server::sealed_checkpoint_bytes(model, metadata));
    std::cout << "model: " << s.save_model << " (" << last.label << ", final test accuracy " << last.final_accuracy() * 100
              << "%)\n";
  }
  std::cout << summary << "written: " << s.out_dir << "/{sim.csv,summary.md";
  for (const std::string& file : plot_files(rounds)) std::cout << ',' << file;
  std::cout << "}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  SimSettings settings;
  settings::Table table(
      "edgetrain-sim",
      "edgetrain-sim: N virtual workers train a model asynchronously in one process, with the real trainer,\n"
      "compressor, codec and server staleness rule, and compare dense ASGD with AdaComp by test accuracy\n"
      "against the bytes the server ingests; or, with --mode rounds, in federated rounds (FedAvg) with dense\n"
      "against AdaComp-compressed deltas. Writes a CSV, SVG plots and a summary to --out.");
  declare_settings(table, settings);
  return table.run_program(argc, argv, [&] { return run(settings); });
}
