// edgetrain-gan: a generative adversarial network on the digits, the MD-GAN issue's
// standalone baseline (generator and discriminator on one machine with all the data;
// model/gan_training.h). Every --eval-every iterations it writes a grid of generated digits
// (one column per class) and the conditional accuracy of 500 samples (how many a yardstick
// classifier reads as the class they were conditioned on), with a plot of it, so a person sees
// what the generator draws. Settings: one table (common/settings.h), flags or --config TOML.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/png_image.h"
#include "common/settings.h"
#include "common/svg_plot.h"
#include "model/dataset.h"
#include "model/classifier_readout.h"
#include "model/gan_training.h"
#include "sim/gan_simulation.h"

namespace {

using namespace edgetrain;

struct GanProgramSettings {
  runtime::GanSettings gan;
  std::string mode = "standalone", data = "mnist", out_dir = "gan-results", kernels = "xnnpack",
              arch = "mlp";
  int workers = 10, k = 1;
  double epochs_between = 1;
  std::uint64_t iterations = 3000, eval_every = 500;
  int classifier_steps = 3000, samples = 500;
  std::string classifier, classifier_model = "paper-cnn";
  double lr = 2e-4, beta1 = 0.5, beta2 = 0.999;  // double: --help shows them as typed
  bool quiet = false;
};

// The built-in models --classifier-model can be: those of 28x28x1 images that the classifier
// readout runs (no residual graph, no batchnorm, an fc last), asked of the readout itself so
// that --help follows model.cc's list.
std::string classifier_model_choices() {
  std::string names;
  for (const std::string& name : runtime::builtin_model_names()) {
    try {
      const runtime::Model model(runtime::builtin_model_spec(name));
      if (model.spec().sequence || !(model.spec().input == runtime::ExampleShape{28, 28, 1})) continue;
      runtime::ClassifierReadout readout(model, 1);
      names += (names.empty() ? "" : ", ") + name;
    } catch (const std::exception&) {
      // not a classifier the readout runs: left out of the list
    }
  }
  return names;
}

void declare_settings(settings::Table& t, GanProgramSettings& s) {
  t.group("Data and model");
  t.add("data", s.data,
        "mnist (full MNIST), mnist-small (its 8k subset), fashion-mnist, or a directory of IDX "
        "files");
  t.add("kernels", s.kernels, "xnnpack or reference").choices({"xnnpack", "reference"});
  t.add("arch", s.arch,
        "mlp (generator 110 → 512 → 512 → 784, discriminator 784 → 512 → 512 → 11) or cnn "
        "(generator "
        "fc 7x7x128 then two 5x5 stride-2 deconvolutions, discriminator four 3x3 stride-2 "
        "convolutions of 16, 32, 64, "
        "128 channels then fc 11); model/gan_network.h")
      .choices({"mlp", "cnn"});
  t.group("Training (model/gan_training.h)");
  t.add(
       "mode", s.mode,
       "standalone (one machine, all the data), md-gan (G on the server, a D per worker, "
       "feedback and peer swaps) or fl-gan (every worker trains G and D, averaged every E epochs); "
       "md-gan and fl-gan run their workers in this process")
      .choices({"standalone", "md-gan", "fl-gan"});
  t.add("workers", s.workers, "N (md-gan, fl-gan)").range(1, 1000);
  t.add("k", s.k, "md-gan: generated batches per iteration (1, or 0 for ceil(log2 N))")
      .range(0, 1000);
  t.add("epochs-between", s.epochs_between,
        "E: epochs of a worker's shard between md-gan's swaps / fl-gan's averaging")
      .range(0.001, 1e6);
  t.add("iterations", s.iterations, "generator steps").range(1, 1e9);
  t.add("batch", s.gan.batch, "real and generated images per step").range(1, 4096);
  t.add("discriminator-steps", s.gan.discriminator_steps,
        "L: discriminator steps per generator step")
      .range(1, 100);
  t.add("lr", s.lr, "Adam's learning rate, both networks").range(1e-7, 1);
  t.add("beta1", s.beta1, "Adam's beta1 (0.5: DCGAN's choice for GANs)").range(0, 0.9999);
  t.add("beta2", s.beta2, "Adam's beta2").range(0, 0.99999);
  t.add("seed", s.gan.seed, "initial weights, noise, labels and batches");
  t.group("Evaluation and output");
  t.add("eval-every", s.eval_every, "iterations between image grids and conditional accuracy")
      .range(1, 1e9);
  t.add("samples", s.samples, "class-conditioned samples per evaluation").range(10, 100000);
  t.add("classifier-steps", s.classifier_steps,
        "SGD steps of the yardstick MLP classifier (batch 32)")
      .range(1, 1e7);
  t.add(
      "classifier", s.classifier,
      "a trained classifier (safetensors, e.g. from edgetrain-sim --save-model): adds the "
      "MNIST score of the samples and the Frechet distance of its features to as many test images");
  t.add("classifier-model", s.classifier_model,
        "the model of --classifier: " + classifier_model_choices() +
            " (the built-ins it can score with), or a spec or spec file of 28x28x1 images "
            "without residual connections or batchnorm");
  t.add("out", s.out_dir,
        "directory for metrics.csv, samples-ITERATION.png, samples.png and the plot");
  t.add("quiet", s.quiet, "no progress lines");
}

int run(const GanProgramSettings& s) {
  runtime::GanSettings gan = s.gan;
  gan.adam.lr = static_cast<float>(s.lr);
  gan.adam.beta1 = static_cast<float>(s.beta1);
  gan.adam.beta2 = static_cast<float>(s.beta2);
  gan.backend = s.kernels == "reference" ? runtime::KernelBackend::kReference
                                         : runtime::KernelBackend::kXnnpack;
  gan.architecture = runtime::parse_gan_architecture(s.arch);
  const auto files = runtime::dataset_files(s.data, runtime::DataSplit::kTrain);
  const runtime::Dataset train = runtime::load_dataset(files.images, files.labels);
  std::filesystem::create_directories(s.out_dir);
  const auto started = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  if (!s.quiet)
    std::fprintf(stderr,
                 "edgetrain-gan: %s architecture, %s, %zu training images; training the yardstick "
                 "classifier\n",
                 s.arch.c_str(), s.data.c_str(), train.size());
  runtime::SampleClassifier classifier(train, s.classifier_steps, s.gan.seed);
  // The scores of the paper, with a trained classifier: MNIST score and Fréchet distance.
  std::unique_ptr<runtime::GanJudge> judge;
  if (!s.classifier.empty()) {
    runtime::Model classifier_model(runtime::model_spec_from_argument(s.classifier_model));
    classifier_model.load_safetensors(s.classifier);
    const auto test_files = runtime::dataset_files(s.data, runtime::DataSplit::kTest);
    const runtime::Dataset test = runtime::load_dataset(test_files.images, test_files.labels);
    judge = std::make_unique<runtime::GanJudge>(
        classifier_model, test.pixels.data(),
        std::min<int>(s.samples, static_cast<int>(test.size())));
  }
  std::unique_ptr<runtime::GanStandalone> standalone;
  std::unique_ptr<sim::GanFleet> fleet;
  if (s.mode == "standalone") {
    standalone = std::make_unique<runtime::GanStandalone>(gan, train);
  } else {
    sim::GanFleetSettings f;
    f.mode = s.mode == "md-gan" ? sim::GanMode::kMdGan : sim::GanMode::kFlGan;
    f.workers = s.workers;
    f.k = s.k > 0
              ? s.k
              : std::max(1, static_cast<int>(std::ceil(std::log2(static_cast<double>(s.workers)))));
    f.epochs_between = s.epochs_between;
    f.gan = gan;
    fleet = std::make_unique<sim::GanFleet>(f, train);
  }
  std::ofstream csv(s.out_dir + "/metrics.csv");
  csv << "iteration,seconds,d_loss_real,d_loss_fake,d_class_loss_real,g_loss,conditional_accuracy,"
         "down_bytes,up_bytes,peer_bytes,worker_seconds_per_iteration,mnist_score,frechet_"
         "distance\n";
  plot::PlotSeries curve{s.mode, {}, {}};
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(s.samples) * runtime::kGanImageSize);
  std::vector<std::int32_t> labels(s.samples);
  runtime::GanIterationStats stats;
  auto evaluate = [&](std::uint64_t iteration) {
    // The same noise every time.
    if (standalone) standalone->sample(s.samples, s.gan.seed + 7777, pixels.data(), labels.data());
    if (fleet) fleet->sample(s.samples, s.gan.seed + 7777, pixels.data(), labels.data());
    const sim::GanFleetTraffic traffic = fleet ? fleet->traffic() : sim::GanFleetTraffic{};
    const double accuracy = classifier.accuracy(pixels.data(), labels.data(), s.samples);
    std::string score = "", distance = "";
    if (judge) {
      const runtime::GanScores scores = judge->score(pixels.data(), labels.data(), s.samples);
      score = std::to_string(scores.mnist_score);
      distance = std::to_string(scores.frechet_distance);
    }
    // 10 columns (one per class: samples cycle through the classes), up to 10 rows.
    const auto grid = image::tile_images(pixels, std::min(s.samples, 100), 28, 10);
    char name[64];
    std::snprintf(name, sizeof name, "/samples-%06llu.png",
                  static_cast<unsigned long long>(iteration));
    image::write_png_grid(s.out_dir + name, grid);
    image::write_png_grid(s.out_dir + "/samples.png", grid);
    csv << iteration << ',' << seconds() << ',' << stats.discriminator.real.adversarial << ','
        << stats.discriminator.fake.adversarial << ',' << stats.discriminator.real.classes << ','
        << stats.generator_loss << ',' << accuracy << ',' << traffic.down_bytes << ','
        << traffic.up_bytes << ',' << traffic.peer_bytes << ','
        << (fleet ? fleet->worker_seconds_per_iteration() : 0.0) << ',' << score << ',' << distance
        << '\n';
    csv.flush();
    curve.x.push_back(static_cast<double>(iteration));
    curve.y.push_back(accuracy);
    if (!s.quiet && standalone)
      std::fprintf(stderr,
                   "[%.0f s] iteration %llu: conditional accuracy %.3f%s%s%s%s, D loss %.3f real / "
                   "%.3f fake, G loss %.3f\n",
                   seconds(), static_cast<unsigned long long>(iteration), accuracy,
                   judge ? ", MNIST score " : "", score.c_str(), judge ? ", FID " : "",
                   distance.c_str(), stats.discriminator.real.adversarial,
                   stats.discriminator.fake.adversarial, stats.generator_loss);
    if (!s.quiet && fleet)
      std::fprintf(stderr,
                   "[%.0f s] iteration %llu: conditional accuracy %.3f, worker computation %.2f ms "
                   "per iteration\n",
                   seconds(), static_cast<unsigned long long>(iteration), accuracy,
                   fleet->worker_seconds_per_iteration() * 1e3);
  };
  evaluate(0);
  for (std::uint64_t i = 1; i <= s.iterations; i++) {
    if (standalone) stats = standalone->iterate();
    if (fleet) fleet->iterate();
    if (i % s.eval_every == 0 || i == s.iterations) evaluate(i);
  }
  plot::PlotOptions options;
  options.title =
      "Generated digits read as their class (" + s.data + ", " + s.mode + ", " + s.arch + ")";
  options.x_label = "generator iterations";
  options.y_label = "conditional accuracy";
  std::ofstream(s.out_dir + "/conditional-accuracy.svg")
      << plot::render_svg_line_chart({curve}, options);
  std::printf(
      "conditional accuracy %.3f after %llu iterations; written: "
      "%s/{metrics.csv,samples.png,conditional-accuracy.svg}\n",
      curve.y.back(), static_cast<unsigned long long>(s.iterations), s.out_dir.c_str());
  if (fleet) {
    const auto& t = fleet->traffic();
    std::printf(
        "%s, %d workers: per worker and iteration %.0f bytes down, %.0f up; %llu %s "
        "(%.0f peer bytes per worker); worker computation %.2f ms per iteration; |G| %zu, |D| %zu "
        "parameters\n",
        s.mode.c_str(), s.workers, static_cast<double>(t.down_bytes) / s.workers / s.iterations,
        static_cast<double>(t.up_bytes) / s.workers / s.iterations,
        static_cast<unsigned long long>(t.swaps + t.averagings),
        s.mode == "md-gan" ? "discriminator swaps" : "averagings",
        static_cast<double>(t.peer_bytes) / s.workers, fleet->worker_seconds_per_iteration() * 1e3,
        fleet->generator_parameters(), fleet->discriminator_parameters());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  GanProgramSettings settings;
  settings::Table table(
      "edgetrain-gan",
      "edgetrain-gan: a class-conditioned GAN (MD-GAN's MLP or CNN generator and discriminator, "
      "--arch)\n"
      "trained on one machine with all the data (MD-GAN's standalone baseline), or MD-GAN and "
      "FL-GAN\n"
      "with simulated workers in this process (--mode). Writes image grids of generated digits,\n"
      "metrics.csv and a plot to --out.");
  declare_settings(table, settings);
  return table.run_program(argc, argv, [&] { return run(settings); });
}
