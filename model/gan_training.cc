#include "model/gan_training.h"

#include "kernels/reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace edgetrain::runtime {

void pixels_to_gan(float* out, const std::uint8_t* pixels, std::size_t n) {
  for (std::size_t i = 0; i < n; i++)
    out[i] = static_cast<float>(pixels[i]) * (2.0f / 255.0f) - 1.0f;
}

void gan_to_pixels(std::uint8_t* out, const float* values, std::size_t n) {
  for (std::size_t i = 0; i < n; i++) {
    const float v = std::clamp((values[i] + 1.0f) * 127.5f, 0.0f, 255.0f);
    out[i] = static_cast<std::uint8_t>(std::lround(v));
  }
}

void AdamState::apply(std::span<float> params, std::span<const float> grad,
                      const kernels::AdamSettings& settings) {
  if (params.size() != m.size() || grad.size() != m.size())
    throw std::invalid_argument("Adam: sizes differ");
  kernels::adam_update(params.data(), m.data(), v.data(), grad.data(), params.size(), settings,
                       ++steps);
}

GanPart::GanPart(std::unique_ptr<GanNetwork> network_, std::uint64_t seed,
                 kernels::AdamSettings adam_settings)
    : network(std::move(network_)),
      adam(network->model().parameter_count()),
      settings(adam_settings) {
  network->model().initialize(seed);
  params.assign(network->model().parameters().begin(), network->model().parameters().end());
  grad.resize(params.size());
  grad_scratch.resize(params.size());
  dout.resize(static_cast<std::size_t>(network->max_batch()) * network->outputs());
}

std::unique_ptr<GanPart> make_generator(const GanSettings& settings, std::uint64_t seed) {
  return std::make_unique<GanPart>(
      make_generator_network(settings.architecture, settings.batch, settings.backend), seed,
      settings.adam);
}

std::unique_ptr<GanPart> make_discriminator(const GanSettings& settings, std::uint64_t seed) {
  return std::make_unique<GanPart>(
      make_discriminator_network(settings.architecture, settings.batch, settings.backend), seed,
      settings.adam);
}

DiscriminatorStepStats discriminator_step(GanPart& d, const float* real,
                                          const std::int32_t* real_labels, const float* fake,
                                          const std::int32_t* fake_labels, int batch) {
  float* dout = d.dout.data();
  DiscriminatorStepStats stats;
  stats.real =
      discriminator_loss(d.network->forward(d.params, real, batch), real_labels, batch, true, dout);
  d.network->backward(d.params, dout, d.grad, nullptr);
  stats.fake = discriminator_loss(d.network->forward(d.params, fake, batch), fake_labels, batch,
                                  false, dout);
  d.network->backward(d.params, dout, d.grad_scratch, nullptr);
  for (std::size_t i = 0; i < d.grad.size(); i++) d.grad[i] += d.grad_scratch[i];
  d.adam.apply(d.params, d.grad, d.settings);
  return stats;
}

float generator_feedback(GanPart& d, const float* fake, const std::int32_t* labels, int batch,
                         float* feedback) {
  const float loss =
      generator_loss(d.network->forward(d.params, fake, batch), labels, batch, d.dout.data());
  d.network->backward(d.params, d.dout.data(), {},
                      feedback);  // the input gradient alone: D's own is not used
  return loss;
}

void generate(GanPart& g, const float* inputs, int batch, float* fake) {
  const float* out = g.network->forward(g.params, inputs, batch);
  std::copy(out, out + static_cast<std::size_t>(batch) * g.network->outputs(), fake);
}

void generator_step(GanPart& g, const float* inputs, const float* feedback, int batch) {
  g.network->forward(g.params, inputs, batch);
  g.network->backward(g.params, feedback, g.grad, nullptr);
  g.adam.apply(g.params, g.grad, g.settings);
}

namespace {
std::vector<std::uint32_t> all_indices(std::size_t n) {
  std::vector<std::uint32_t> indices(n);
  std::iota(indices.begin(), indices.end(), 0u);
  return indices;
}
}  // namespace

GanStandalone::GanStandalone(const GanSettings& settings, const Dataset& train)
    : settings_(settings),
      g_(make_generator(settings, settings.seed)),
      d_(make_discriminator(settings, settings.seed + 1)),
      real_sampler_(train, all_indices(train.size()), settings.seed + 2),
      noise_(settings.seed + 3),
      label_draw_{settings.seed + 4} {
  if (train.image_bytes() != static_cast<std::size_t>(kGanImageSize) ||
      train.num_classes != kGanClasses)
    throw std::invalid_argument("gan: the GAN architectures need 28x28 grey images of 10 classes");
  if (settings.batch < 1 || settings.discriminator_steps < 1)
    throw std::invalid_argument("gan: batch and L must be at least 1");
  const std::size_t images = static_cast<std::size_t>(settings.batch) * kGanImageSize;
  real_pixels_.resize(images);
  real_.resize(images);
  fake_.resize(images);
  feedback_.resize(images);
  real_labels_.resize(settings.batch);
  fake_labels_.resize(settings.batch);
  noise_values_.resize(static_cast<std::size_t>(settings.batch) * kGanNoiseSize);
  inputs_.resize(static_cast<std::size_t>(settings.batch) * (kGanNoiseSize + kGanClasses));
}

void GanStandalone::draw_generator_batch() {
  noise_.fill(noise_values_.data(), noise_values_.size());
  for (auto& label : fake_labels_)
    label = static_cast<std::int32_t>(label_draw_.next() % kGanClasses);
  generator_inputs(inputs_.data(), noise_values_.data(), fake_labels_.data(), settings_.batch);
  generate(*g_, inputs_.data(), settings_.batch, fake_.data());
}

GanIterationStats GanStandalone::iterate() {
  GanIterationStats stats;
  const int b = settings_.batch;
  for (int l = 0; l < settings_.discriminator_steps; l++) {
    real_sampler_.next_batch(b, real_pixels_, real_labels_);
    pixels_to_gan(real_.data(), real_pixels_.data(), real_pixels_.size());
    draw_generator_batch();
    stats.discriminator = discriminator_step(*d_, real_.data(), real_labels_.data(), fake_.data(),
                                             fake_labels_.data(), b);
  }
  draw_generator_batch();
  stats.generator_loss =
      generator_feedback(*d_, fake_.data(), fake_labels_.data(), b, feedback_.data());
  generator_step(*g_, inputs_.data(), feedback_.data(), b);
  ++iterations_;
  return stats;
}

void GanStandalone::sample(int count, std::uint64_t seed, std::uint8_t* pixels,
                           std::int32_t* labels) {
  sample_generator(*g_, count, seed, pixels, labels);
}

void sample_generator(GanPart& g, int count, std::uint64_t seed, std::uint8_t* pixels,
                      std::int32_t* labels) {
  GaussianSampler noise(seed);
  const int batch = g.network->max_batch();
  std::vector<float> z(static_cast<std::size_t>(batch) * kGanNoiseSize);
  std::vector<float> inputs(static_cast<std::size_t>(batch) * (kGanNoiseSize + kGanClasses));
  std::vector<std::int32_t> batch_labels(batch);
  for (int i = 0; i < count; i += batch) {
    const int n = std::min(batch, count - i);
    noise.fill(z.data(), static_cast<std::size_t>(n) * kGanNoiseSize);
    for (int j = 0; j < n; j++) batch_labels[j] = (i + j) % kGanClasses;
    generator_inputs(inputs.data(), z.data(), batch_labels.data(), n);
    const float* images = g.network->forward(g.params, inputs.data(), n);
    gan_to_pixels(pixels + static_cast<std::size_t>(i) * kGanImageSize, images,
                  static_cast<std::size_t>(n) * kGanImageSize);
    std::copy(batch_labels.begin(), batch_labels.begin() + n, labels + i);
  }
}

SampleClassifier::SampleClassifier(const Dataset& train, int steps, std::uint64_t seed)
    : model_(builtin_model_spec("mlp")) {
  model_.initialize(seed);
  constexpr int kBatch = 32;
  Trainer trainer(model_, kBatch);
  ShardSampler sampler(train, all_indices(train.size()), seed + 1);
  std::vector<std::uint8_t> pixels(kBatch * train.image_bytes());
  std::vector<std::int32_t> labels(kBatch);
  std::vector<float> grad(model_.parameter_count());
  for (int step = 0; step < steps; step++) {
    sampler.next_batch(kBatch, pixels, labels);
    trainer.compute_gradient(model_.parameters(), pixels.data(), labels.data(), kBatch, grad);
    kernels::sgd_update(model_.parameters().data(), grad.data(), 0.1f, grad.size());
  }
  evaluator_ = std::make_unique<Trainer>(model_, 100);
}

SampleClassifier::~SampleClassifier() = default;

double SampleClassifier::accuracy(const std::uint8_t* pixels, const std::int32_t* labels,
                                  int count) {
  int correct = 0;
  for (int i = 0; i < count; i += 100) {
    const int n = std::min(100, count - i);
    correct += evaluator_
                   ->evaluate(model_.parameters(),
                              pixels + static_cast<std::size_t>(i) * kGanImageSize, labels + i, n)
                   .correct;
  }
  return count ? static_cast<double>(correct) / count : 0.0;
}

}  // namespace edgetrain::runtime
