// The computation of one MD-GAN worker per generator iteration (issue 16's goal: at most half
// of an FL-GAN worker's), measured side by side in one run, rounds alternating:
//   md-gan (feedback: input gradient only)   L discriminator steps + the feedback as the worker
//   runs them md-gan (feedback: full backward)         the same with D's weight gradients computed
//   and thrown away fl-gan                                   one local GAN iteration (L D steps,
//   then G's step)
// Prints ms per iteration (median of the rounds) and the ratios. Synthetic inputs: the time
// does not depend on the values.
//   gan_worker_bench [--arch mlp|cnn] [--batch B] [--rounds R] [--iterations I] [--kernels
//   xnnpack|reference]
#include "common/settings.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "model/gan_training.h"
#include "common/splitmix64.h"

namespace {

using namespace edgetrain::runtime;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  edgetrain::settings::Table table(
      "gan_worker_bench",
      "an MD-GAN worker's computation per iteration against an FL-GAN worker's");
  std::string arch = "mlp", kernels = "xnnpack";
  int batch = 10, rounds = 7, iterations = 50, steps = 1;
  table.add("arch", arch, "mlp or cnn").choices({"mlp", "cnn"});
  table.add("batch", batch, "b").range(1, 1024);
  table.add("rounds", rounds, "alternating rounds (the median is printed)").range(1, 1000);
  table.add("iterations", iterations, "iterations per round and variant").range(1, 100000);
  table.add("discriminator-steps", steps, "L").range(1, 100);
  table.add("kernels", kernels, "xnnpack or reference").choices({"xnnpack", "reference"});
  if (const auto status = table.parse(argc, argv)) return *status;

  GanSettings settings;
  settings.batch = batch;
  settings.discriminator_steps = steps;
  settings.architecture = parse_gan_architecture(arch);
  settings.backend = kernels == "reference" ? KernelBackend::kReference : KernelBackend::kXnnpack;
  auto d = make_discriminator(settings, 1);
  // A synthetic data set for the FL-GAN worker's real batches.
  Dataset data;
  data.height = data.width = 28;
  data.channels = 1;
  data.num_classes = 10;
  SplitMix64 bits{3};
  for (int i = 0; i < 1000; i++) {
    data.labels.push_back(i % 10);
    for (int p = 0; p < kGanImageSize; p++)
      data.pixels.push_back(static_cast<std::uint8_t>(bits.next()));
  }
  GanStandalone fl(settings, data);
  const std::size_t n = static_cast<std::size_t>(batch) * kGanImageSize;
  std::vector<float> real(n), fake(n), feedback(n);
  for (auto& v : real) v = static_cast<float>(bits.uniform_double() * 2 - 1);
  for (auto& v : fake) v = static_cast<float>(bits.uniform_double() * 2 - 1);
  std::vector<std::int32_t> labels(batch);
  for (int i = 0; i < batch; i++) labels[i] = i % 10;

  auto md = [&](bool full_backward) {
    for (int l = 0; l < steps; l++)
      discriminator_step(*d, real.data(), labels.data(), fake.data(), labels.data(), batch);
    if (full_backward) {  // what the feedback cost before: D's weight gradients too
      generator_loss(d->network->forward(d->params, fake.data(), batch), labels.data(), batch,
                     d->dout.data());
      d->network->backward(d->params, d->dout.data(), d->grad_scratch, feedback.data());
    } else {
      generator_feedback(*d, fake.data(), labels.data(), batch, feedback.data());
    }
  };
  auto time = [&](auto&& body) {
    const auto start = Clock::now();
    for (int i = 0; i < iterations; i++) body();
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count() / iterations;
  };
  std::vector<double> input_only, full, federated;
  md(false), md(true), fl.iterate();  // warm-up
  for (int r = 0; r < rounds; r++) {
    input_only.push_back(time([&] { md(false); }));
    full.push_back(time([&] { md(true); }));
    federated.push_back(time([&] { fl.iterate(); }));
  }
  const double a = median(input_only), b = median(full), c = median(federated);
  std::printf(
      "gan_worker_bench: %s, b = %d, L = %d, %s kernels, median of %d rounds of %d iterations\n",
      arch.c_str(), batch, steps, kernels.c_str(), rounds, iterations);
  std::printf("  md-gan worker, feedback as the input gradient only: %8.3f ms / iteration\n", a);
  std::printf(
      "  md-gan worker, feedback with D's weight gradients:  %8.3f ms / iteration (input-only is "
      "%.2fx of it)\n",
      b, a / b);
  std::printf("  fl-gan worker (a local GAN iteration):              %8.3f ms / iteration\n", c);
  std::printf("  md-gan / fl-gan: %.2f (input-only feedback), %.2f (full backward)\n", a / c,
              b / c);
  return 0;
}
