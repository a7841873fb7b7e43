// edgetrain-gan: a generative adversarial network on the digits, the MD-GAN issue's
// standalone baseline (generator and discriminator on one machine with all the data;
// runtime/gan_training.h). Every --eval-every iterations it writes a grid of generated digits
// (one column per class) and the conditional accuracy of 500 samples (how many a yardstick
// classifier reads as the class they were conditioned on), with a plot of it, so a person sees
// what the generator draws. Settings: one table (common/settings.h), flags or --config TOML.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/png_image.h"
#include "common/settings.h"
#include "common/svg_plot.h"
#include "runtime/dataset.h"
#include "runtime/gan_training.h"

namespace {

using namespace edgetrain;

struct GanProgramSettings {
  runtime::GanSettings gan;
  std::string data = "mnist", out_dir = "gan-results", kernels = "xnnpack";
  std::uint64_t iterations = 3000, eval_every = 500;
  int classifier_steps = 3000, samples = 500;
  double lr = 2e-4, beta1 = 0.5, beta2 = 0.999;  // double: --help shows them as typed
  bool quiet = false;
};

void declare_settings(settings::Table& t, GanProgramSettings& s) {
  t.group("Data and model");
  t.add("data", s.data, "mnist (full MNIST), mnist-small (its 8k subset), fashion-mnist, or a directory of IDX files");
  t.add("kernels", s.kernels, "xnnpack or reference").choices({"xnnpack", "reference"});
  t.group("Training (MLP generator and discriminator, runtime/gan_network.h)");
  t.add("iterations", s.iterations, "generator steps").range(1, 1e9);
  t.add("batch", s.gan.batch, "real and generated images per step").range(1, 4096);
  t.add("discriminator-steps", s.gan.discriminator_steps, "L: discriminator steps per generator step").range(1, 100);
  t.add("lr", s.lr, "Adam's learning rate, both networks").range(1e-7, 1);
  t.add("beta1", s.beta1, "Adam's beta1 (0.5: DCGAN's choice for GANs)").range(0, 0.9999);
  t.add("beta2", s.beta2, "Adam's beta2").range(0, 0.99999);
  t.add("seed", s.gan.seed, "initial weights, noise, labels and batches");
  t.group("Evaluation and output");
  t.add("eval-every", s.eval_every, "iterations between image grids and conditional accuracy").range(1, 1e9);
  t.add("samples", s.samples, "class-conditioned samples per evaluation").range(10, 100000);
  t.add("classifier-steps", s.classifier_steps, "SGD steps of the yardstick MLP classifier (batch 32)").range(1, 1e7);
  t.add("out", s.out_dir, "directory for metrics.csv, samples-ITERATION.png, samples.png and the plot");
  t.add("quiet", s.quiet, "no progress lines");
}

int run(const GanProgramSettings& s) {
  runtime::GanSettings gan = s.gan;
  gan.adam.lr = static_cast<float>(s.lr);
  gan.adam.beta1 = static_cast<float>(s.beta1);
  gan.adam.beta2 = static_cast<float>(s.beta2);
  gan.backend = s.kernels == "reference" ? runtime::KernelBackend::kReference : runtime::KernelBackend::kXnnpack;
  const auto files = runtime::dataset_files(s.data, runtime::DataSplit::kTrain);
  const runtime::Dataset train = runtime::load_dataset(files.images, files.labels);
  std::filesystem::create_directories(s.out_dir);
  const auto started = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
  if (!s.quiet) std::fprintf(stderr, "edgetrain-gan: %s, %zu training images; training the yardstick classifier\n", s.data.c_str(), train.size());
  runtime::SampleClassifier classifier(train, s.classifier_steps, s.gan.seed);
  runtime::GanStandalone standalone(gan, train);

  std::ofstream csv(s.out_dir + "/metrics.csv");
  csv << "iteration,seconds,d_loss_real,d_loss_fake,d_class_loss_real,g_loss,conditional_accuracy\n";
  plot::PlotSeries curve{"standalone GAN", {}, {}};
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(s.samples) * runtime::kGanImageSize);
  std::vector<std::int32_t> labels(s.samples);
  runtime::GanIterationStats stats;
  auto evaluate = [&](std::uint64_t iteration) {
    standalone.sample(s.samples, s.gan.seed + 7777, pixels.data(), labels.data());  // the same noise every time
    const double accuracy = classifier.accuracy(pixels.data(), labels.data(), s.samples);
    // 10 columns (one per class: samples cycle through the classes), up to 10 rows.
    const auto grid = image::tile_images(pixels, std::min(s.samples, 100), 28, 10);
    char name[64];
    std::snprintf(name, sizeof name, "/samples-%06llu.png", static_cast<unsigned long long>(iteration));
    image::write_png_grid(s.out_dir + name, grid);
    image::write_png_grid(s.out_dir + "/samples.png", grid);
    csv << iteration << ',' << seconds() << ',' << stats.discriminator.real.adversarial << ','
        << stats.discriminator.fake.adversarial << ',' << stats.discriminator.real.classes << ',' << stats.generator_loss
        << ',' << accuracy << '\n';
    csv.flush();
    curve.x.push_back(static_cast<double>(iteration));
    curve.y.push_back(accuracy);
    if (!s.quiet)
      std::fprintf(stderr, "[%.0f s] iteration %llu: conditional accuracy %.3f, D loss %.3f real / %.3f fake, G loss %.3f\n",
                   seconds(), static_cast<unsigned long long>(iteration), accuracy, stats.discriminator.real.adversarial,
                   stats.discriminator.fake.adversarial, stats.generator_loss);
  };
  evaluate(0);
  for (std::uint64_t i = 1; i <= s.iterations; i++) {
    stats = standalone.iterate();
    if (i % s.eval_every == 0 || i == s.iterations) evaluate(i);
  }
  plot::PlotOptions options;
  options.title = "Generated digits read as their class (" + s.data + ", standalone GAN)";
  options.x_label = "generator iterations";
  options.y_label = "conditional accuracy";
  std::ofstream(s.out_dir + "/conditional-accuracy.svg") << plot::render_svg_line_chart({curve}, options);
  std::printf("conditional accuracy %.3f after %llu iterations; written: %s/{metrics.csv,samples.png,conditional-accuracy.svg}\n",
              curve.y.back(), static_cast<unsigned long long>(s.iterations), s.out_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  GanProgramSettings settings;
  settings::Table table("edgetrain-gan",
                        "edgetrain-gan: a class-conditioned GAN (MLP generator and discriminator, MD-GAN's architecture)\n"
                        "trained on one machine with all the data: MD-GAN's standalone baseline. Writes image grids of\n"
                        "generated digits, metrics.csv and a plot to --out.");
  declare_settings(table, settings);
  return table.run_program(argc, argv, [&] { return run(settings); });
}
