// edgetrain-sim: dense ASGD against AdaComp with N virtual workers in one process.
// See sim/README.md and `edgetrain-sim --help`.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "sim/simulator.h"
#include "common/svg_plot.h"

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

struct DataPaths {
  std::string train_images, train_labels, test_images, test_labels;
};

DataPaths data_paths(const std::string& name, const std::string& deps) {
  if (name == "mnist") {
    const std::string d = deps + "/mnist/";
    return {d + "train-images-idx3-ubyte", d + "train-labels-idx1-ubyte", d + "t10k-images-idx3-ubyte",
            d + "t10k-labels-idx1-ubyte"};
  }
  if (name == "fashion-mnist") {
    const std::string d = "/usr/share/datasets/fashion-mnist/";
    return {d + "train-images-idx3-ubyte.gz", d + "train-labels-idx1-ubyte.gz", d + "t10k-images-idx3-ubyte.gz",
            d + "t10k-labels-idx1-ubyte.gz"};
  }
  throw std::invalid_argument("unknown data set '" + name + "' (mnist, fashion-mnist, or give --train-images etc.)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "edgetrain-sim: N virtual workers train a model asynchronously in one process, with the real trainer,\n"
      "compressor, codec and server staleness rule, and compare dense ASGD with AdaComp by test accuracy\n"
      "against the bytes the server ingests. Writes a CSV, SVG plots and a summary to --out."};
  sim::SimConfig config;
  std::string data = "mnist", method = "both", staleness = "sigma", out_dir = "sim-results";
  DataPaths paths;
  const char* deps_env = std::getenv("EDGETRAIN_DEPS");
  std::string deps = deps_env ? deps_env : "/var/cache/edgetrain";
  double rate = 0.01, target = 0;
  bool error_feedback = false, bin_local = false, fp16 = false, sign_scale = false, quiet = false;
  std::uint32_t bin_size = 50;

  app.add_option("--data", data, "mnist (10k digits converted at set-up) or fashion-mnist (Debian's 70k)")
      ->capture_default_str();
  app.add_option("--train-images", paths.train_images, "IDX file (raw or .gz); overrides --data");
  app.add_option("--train-labels", paths.train_labels, "IDX file");
  app.add_option("--test-images", paths.test_images, "IDX file");
  app.add_option("--test-labels", paths.test_labels, "IDX file");
  app.add_option("--model", config.model, "paper-cnn, mlp, or a spec such as 'input 28x28x1; fc 64 relu; fc 10'")
      ->capture_default_str();
  app.add_option("--workers", config.workers, "virtual workers")->capture_default_str()->check(CLI::Range(1, 10000));
  app.add_option("--batch", config.batch, "minibatch per step")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--lr", config.learning_rate, "server learning rate")->capture_default_str();
  app.add_option("--method", method, "asgd, adacomp, or both (compare)")
      ->capture_default_str()
      ->check(CLI::IsMember({"asgd", "adacomp", "both"}));
  app.add_option("--rate", rate, "AdaComp compression rate c: k = max(1, floor(n*c)) per tensor")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  app.add_flag("--error-feedback", error_feedback, "option: keep unsent gradient values and add them next step");
  app.add_flag("--bin-local", bin_local, "option: IBM's bin-local selection (Chen et al. 2018) instead of top-k");
  app.add_option("--bin-size", bin_size, "entries per bin for --bin-local")->capture_default_str();
  auto* fp16_flag = app.add_flag("--fp16", fp16, "option: send values as fp16");
  app.add_flag("--sign-scale", sign_scale,
               "option: send each tensor's values as one fp32 scale (mean |v|) and one sign bit per entry")
      ->excludes(fp16_flag);
  app.add_option("--staleness", staleness, "sigma (the paper: per parameter) or delay (Zhang et al.: lr/delay)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sigma", "delay"}));
  app.add_option("--max-staleness", config.max_staleness, "updates older than this are refused")->capture_default_str();
  app.add_flag("--label-skew", config.label_skewed, "label-skewed shards instead of i.i.d.");
  app.add_option("--classes-per-worker", config.skew.classes_per_worker, "with --label-skew")->capture_default_str();
  app.add_option("--preferred-fraction", config.skew.preferred_fraction, "with --label-skew")->capture_default_str();
  app.add_option("--speed-spread", config.speed_spread, "log-normal sigma of worker speeds (0: all equal)")
      ->capture_default_str();
  app.add_option("--failure-probability", config.failure_probability, "per step: worker crashes, loses the update")
      ->capture_default_str();
  app.add_option("--updates", config.max_updates, "stop after this many applied updates")->capture_default_str();
  app.add_option("--eval-every", config.eval_every, "applied updates between test evaluations")->capture_default_str();
  app.add_option("--eval-examples", config.eval_examples, "test examples per evaluation (0: all)")->capture_default_str();
  app.add_option("--target", target, "accuracy for the traffic ratio (0: auto, half a point below the lower best)")
      ->capture_default_str();
  app.add_option("--threads", config.threads, "compute threads")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--seed", config.seed, "same seed, same run")->capture_default_str();
  app.add_option("--out", out_dir, "directory for sim.csv, plots and summary.md")->capture_default_str();
  app.add_flag("--quiet", quiet, "no progress line");
  CLI11_PARSE(app, argc, argv);

  try {
    if (paths.train_images.empty()) {
      DataPaths d = data_paths(data, deps);
      paths = d;
    } else if (paths.train_labels.empty() || paths.test_images.empty() || paths.test_labels.empty()) {
      throw std::invalid_argument("--train-images needs --train-labels, --test-images and --test-labels too");
    }
    runtime::Dataset train = runtime::load_dataset(paths.train_images, paths.train_labels);
    runtime::Dataset test = runtime::load_dataset(paths.test_images, paths.test_labels);
    config.staleness_rule =
        staleness == "sigma" ? server::StalenessRule::kPerParameterSigma : server::StalenessRule::kPerUpdateDelay;
    std::fprintf(stderr, "edgetrain-sim: %s, %zu train / %zu test examples, model %s, %d workers, batch %d, lr %g\n",
                 data.c_str(), train.size(), test.size(), config.model.c_str(), config.workers, config.batch,
                 config.learning_rate);

    std::vector<std::pair<std::string, sim::SimConfig>> runs;
    if (method == "asgd" || method == "both") {
      sim::SimConfig c = config;
      c.compressor.method = runtime::CompressionMethod::kNone;
      runs.push_back({"ASGD", c});
    }
    if (method == "adacomp" || method == "both") {
      sim::SimConfig c = config;
      c.compressor.method = bin_local ? runtime::CompressionMethod::kBinLocal : runtime::CompressionMethod::kTopK;
      c.compressor.compression_rate = rate;
      c.compressor.error_feedback = error_feedback;
      c.compressor.bin_size = bin_size;
      c.compressor.fp16_values = fp16;
      c.compressor.sign_scale_values = sign_scale;
      c.value_encoding = fp16         ? transport::ValueEncoding::kFp16
                         : sign_scale ? transport::ValueEncoding::kSignScale
                                      : transport::ValueEncoding::kFp32;
      std::ostringstream label;
      label << "AdaComp c=" << rate << (bin_local ? " bin-local" : "") << (error_feedback ? " +ef" : "")
            << (fp16 ? " fp16" : "") << (sign_scale ? " sign-scale" : "");
      runs.push_back({label.str(), c});
    }

    const bool tty = isatty(STDERR_FILENO);
    std::vector<sim::SimResult> results;
    for (auto& [label, c] : runs) {
      std::uint64_t last_printed = 0;
      auto progress = [&, label = label](const sim::Progress& p) {
        if (quiet) return;
        char line[200];
        std::snprintf(line, sizeof line, "[%s] update %llu/%llu  test acc %s  ingress %s  mean delay %.1f", label.c_str(),
                      static_cast<unsigned long long>(p.updates), static_cast<unsigned long long>(p.max_updates),
                      p.accuracy < 0 ? "  -  " : (std::to_string(p.accuracy * 100).substr(0, 5) + "%").c_str(),
                      human_bytes(static_cast<double>(p.ingress_bytes)).c_str(), p.mean_delay);
        if (tty) {
          std::fprintf(stderr, "\r%-100s", line);
        } else if (p.updates >= last_printed + p.max_updates / 10 || p.updates == p.max_updates) {
          std::fprintf(stderr, "%s\n", line);
          last_printed = p.updates;
        }
      };
      results.push_back(sim::run_simulation(c, train, test, label, progress));
      if (tty && !quiet) std::fprintf(stderr, "\n");
    }

    std::filesystem::create_directories(out_dir);
    {
      std::ofstream csv(out_dir + "/sim.csv");
      csv << "method,updates,virtual_time,ingress_bytes,pull_bytes,test_accuracy,test_loss\n";
      for (const auto& r : results) {
        for (const auto& p : r.curve) {
          csv << '"' << r.label << "\"," << p.updates << ',' << p.time << ',' << p.ingress_bytes << ',' << p.pull_bytes
              << ',' << p.accuracy << ',' << p.loss << '\n';
        }
      }
    }
    double target_accuracy = target;
    if (target_accuracy <= 0) {
      double lowest_best = 1;
      for (const auto& r : results) lowest_best = std::min(lowest_best, r.best_accuracy());
      target_accuracy = std::floor((lowest_best - 0.005) * 1000) / 1000;
    }
    std::vector<plot::PlotSeries> by_bytes, by_updates;
    for (const auto& r : results) {
      plot::PlotSeries b{r.label, {}, {}}, u{r.label, {}, {}};
      for (const auto& p : r.curve) {
        b.x.push_back(static_cast<double>(p.ingress_bytes));
        b.y.push_back(p.accuracy);
        u.x.push_back(static_cast<double>(p.updates));
        u.y.push_back(p.accuracy);
      }
      by_bytes.push_back(b);
      by_updates.push_back(u);
    }
    plot::PlotOptions plot;
    plot.title = "Test accuracy against server ingress (" + data + ", " + config.model + ", " +
                 std::to_string(config.workers) + " workers)";
    plot.x_label = "bytes ingested by the server";
    plot.y_label = "test accuracy";
    plot.log_x = true;
    plot.reference_y = target_accuracy;
    std::ofstream(out_dir + "/accuracy-vs-ingress.svg") << plot::render_svg_line_chart(by_bytes, plot);
    plot.title = "Test accuracy against applied updates";
    plot.x_label = "updates applied";
    plot.log_x = false;
    std::ofstream(out_dir + "/accuracy-vs-updates.svg") << plot::render_svg_line_chart(by_updates, plot);

    std::ostringstream summary;
    summary << "| method | final acc | best acc | updates | ingress | bytes/update | mean delay | refused | lost | "
               "updates to target | ingress to target |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& r : results) {
      auto to_bytes = r.ingress_bytes_to(target_accuracy);
      auto to_updates = r.updates_to(target_accuracy);
      char row[400];
      std::snprintf(row, sizeof row, "| %s | %.2f%% | %.2f%% | %llu | %s | %s | %.1f | %llu | %llu | %s | %s |\n",
                    r.label.c_str(), r.final_accuracy() * 100, r.best_accuracy() * 100,
                    static_cast<unsigned long long>(r.updates_applied), human_bytes(r.ingress_bytes).c_str(),
                    human_bytes(r.mean_update_bytes).c_str(), r.mean_delay,
                    static_cast<unsigned long long>(r.updates_refused), static_cast<unsigned long long>(r.updates_lost),
                    to_updates ? std::to_string(*to_updates).c_str() : "never",
                    to_bytes ? human_bytes(static_cast<double>(*to_bytes)).c_str() : "never");
      summary << row;
    }
    summary << "\ntarget accuracy: " << target_accuracy * 100 << "%\n";
    if (results.size() == 2) {
      auto a = results[0].ingress_bytes_to(target_accuracy), b = results[1].ingress_bytes_to(target_accuracy);
      if (a && b && *b > 0) {
        char line[200];
        std::snprintf(line, sizeof line,
                      "traffic ratio ASGD / AdaComp to %.1f%%: %.1fx (%s vs %s); per update: %.1fx; accuracy gap "
                      "(best): %+.2f points\n",
                      target_accuracy * 100, static_cast<double>(*a) / static_cast<double>(*b),
                      human_bytes(static_cast<double>(*a)).c_str(), human_bytes(static_cast<double>(*b)).c_str(),
                      results[0].mean_update_bytes / results[1].mean_update_bytes,
                      (results[1].best_accuracy() - results[0].best_accuracy()) * 100);
        summary << line;
      } else {
        summary << "traffic ratio: not available (a run never reached the target)\n";
      }
    }
    std::ofstream(out_dir + "/summary.md") << summary.str();
    std::cout << summary.str() << "written: " << out_dir << "/{sim.csv,summary.md,accuracy-vs-ingress.svg,accuracy-vs-updates.svg}\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgetrain-sim: %s\n", e.what());
    return 1;
  }
}
