// The steps of GAN training on model/gan_network.h's networks, shaped after MD-GAN's split
// (issue 16) so that one code path serves every place a step runs:
//   discriminator_step   a worker's L discriminator steps on a real batch and a generated one
//   generator_feedback   a worker's error feedback F = ∂(generator loss)/∂x for generated samples
//   generator_step       the server's step: F back-propagated through G, then Adam
// GanStandalone is the baseline of the issue: G and D on one machine with all the data.
// Images are the generator's scale, [-1, 1]; pixels_to_gan / gan_to_pixels convert.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/gan_ops.h"
#include "model/dataset.h"
#include "model/gan_network.h"
#include "model/shard_sampler.h"
#include "common/splitmix64.h"
#include "model/trainer.h"

namespace edgetrain::runtime {

void pixels_to_gan(float* out, const std::uint8_t* pixels, std::size_t n);
void gan_to_pixels(std::uint8_t* out, const float* values, std::size_t n);

// Adam's moments for one arena, and the step count of its bias correction.
struct AdamState {
  std::vector<float> m, v;
  std::uint64_t steps = 0;
  explicit AdamState(std::size_t n = 0) : m(n, 0.0f), v(n, 0.0f) {}
  void apply(std::span<float> params, std::span<const float> grad,
             const kernels::AdamSettings& settings);
};

// A network (either architecture) with its parameters, gradient scratch and optimiser state.
struct GanPart {
  std::unique_ptr<GanNetwork> network;
  std::vector<float> params, grad, grad_scratch;
  std::vector<float> dout;  // [max_batch][outputs]: the loss gradient at the network's output
  AdamState adam;
  kernels::AdamSettings settings;
  // Owns `network`; the parameters are initialised from `seed` (Model::initialize).
  GanPart(std::unique_ptr<GanNetwork> network, std::uint64_t seed,
          kernels::AdamSettings adam_settings);
  // The tensors' names and layout (checkpoints, the codec); the values are in `params`.
  Model& model() { return network->model(); }
  const Model& model() const { return network->model(); }
};

struct DiscriminatorStepStats {
  DiscriminatorLoss real, fake;
};

// One discriminator step: the loss on `real` (B images, their labels) plus the loss on `fake`
// (B generated images, the labels they were conditioned on), then Adam.
DiscriminatorStepStats discriminator_step(GanPart& d, const float* real,
                                          const std::int32_t* real_labels, const float* fake,
                                          const std::int32_t* fake_labels, int batch);

// F [B][784]: the gradient of the generator's loss (as D sees it) with respect to each
// generated sample. Returns that loss.
float generator_feedback(GanPart& d, const float* fake, const std::int32_t* labels, int batch,
                         float* feedback);

// G's inputs [B][110] for the noise and labels; `fake` receives G's output [B][784].
void generate(GanPart& g, const float* inputs, int batch, float* fake);

// The server's step: `feedback` [B][784] (already the gradient of the mean loss over
// everything it averages) back-propagated through G at `inputs`, then Adam on G.
void generator_step(GanPart& g, const float* inputs, const float* feedback, int batch);

// `count` samples of classes 0, 1, ..., 9, 0, ... from `g` as pixels (count × 784), from noise
// of `seed`: the same samples for a seed and a generator. Runs in batches of at most the
// network's max_batch.
void sample_generator(GanPart& g, int count, std::uint64_t seed, std::uint8_t* pixels,
                      std::int32_t* labels);

struct GanSettings {
  GanArchitecture architecture = GanArchitecture::kMlp;  // of both networks (gan_network.h)
  int batch = 32;
  int discriminator_steps = 1;  // L
  std::uint64_t seed = 1;
  kernels::AdamSettings adam;  // for both networks
  KernelBackend backend = KernelBackend::kXnnpack;
};

struct GanIterationStats {
  DiscriminatorStepStats discriminator;
  float generator_loss = 0;
};

// The standalone baseline: one machine, all the data, L discriminator steps then one
// generator step per iteration.
// The generator and discriminator of `settings` (architecture, batch as the largest batch,
// Adam, kernels), initialised from `seed`: what every place that runs a GAN part builds.
std::unique_ptr<GanPart> make_generator(const GanSettings& settings, std::uint64_t seed);
std::unique_ptr<GanPart> make_discriminator(const GanSettings& settings, std::uint64_t seed);

class GanStandalone {
 public:
  GanStandalone(const GanSettings& settings, const Dataset& train);
  GanIterationStats iterate();
  // `count` samples of classes 0, 1, ..., 9, 0, ... as pixels (count × 784), from noise of
  // `seed` (the same samples for a seed and a generator).
  void sample(int count, std::uint64_t seed, std::uint8_t* pixels, std::int32_t* labels);
  GanPart& generator() { return *g_; }
  GanPart& discriminator() { return *d_; }
  std::uint64_t iterations() const { return iterations_; }

 private:
  void draw_generator_batch();
  GanSettings settings_;
  std::unique_ptr<GanPart> g_, d_;
  ShardSampler real_sampler_;
  GaussianSampler noise_;
  SplitMix64 label_draw_;
  std::vector<std::uint8_t> real_pixels_;
  std::vector<std::int32_t> real_labels_, fake_labels_;
  std::vector<float> real_, noise_values_, inputs_, fake_, feedback_;
  std::uint64_t iterations_ = 0;
};

// The yardstick this code base has for generated digits until the shipped paper-CNN
// classifier (issue 16) exists: an MLP classifier trained with SGD (lr 0.1, batch 32) for
// `steps` minibatches of `train`, which reads class-conditioned samples; the share it reads
// as the class they were conditioned on is the "conditional accuracy" (ours).
class SampleClassifier {
 public:
  SampleClassifier(const Dataset& train, int steps, std::uint64_t seed);
  ~SampleClassifier();
  double accuracy(const std::uint8_t* pixels, const std::int32_t* labels, int count);
  const Model& model() const { return model_; }  // with its trained parameters

 private:
  Model model_;
  std::unique_ptr<Trainer> evaluator_;
};

}  // namespace edgetrain::runtime
