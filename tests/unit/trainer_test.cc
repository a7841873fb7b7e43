// The trainer's gradient against central finite differences of its own loss, and
// learning on synthetic data.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/model.h"
#include "runtime/trainer.h"

namespace {

using namespace edgetrain::runtime;

// Random grey images whose class is encoded by which quadrant is brightest.
void synthetic_batch(std::mt19937& rng, const ExampleShape& shape, int count, std::vector<std::uint8_t>& pixels,
                     std::vector<std::int32_t>& labels) {
  pixels.resize(static_cast<std::size_t>(count) * shape.size());
  labels.resize(count);
  std::uniform_int_distribution<int> noise(0, 60), klass(0, 3);
  for (int n = 0; n < count; n++) {
    labels[n] = klass(rng);
    for (int h = 0; h < shape.H; h++) {
      for (int w = 0; w < shape.W; w++) {
        const int quadrant = (h >= shape.H / 2) * 2 + (w >= shape.W / 2);
        for (int c = 0; c < shape.C; c++) {
          pixels[((static_cast<std::size_t>(n) * shape.H + h) * shape.W + w) * shape.C + c] =
              static_cast<std::uint8_t>(noise(rng) + (quadrant == labels[n] ? 150 : 0));
        }
      }
    }
  }
}

TEST(Trainer, GradientMatchesFiniteDifferences) {
  // Every layer kind; odd sizes so pooling floors.
  Model model(parse_model_spec("input 9x9x2; conv 3 3x3 same relu; maxpool 2; conv 4 3x3 valid; relu; fc 6 relu; fc 4"));
  model.initialize(11);
  std::vector<double> params(model.parameters().begin(), model.parameters().end());
  std::mt19937 rng(5);
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;
  synthetic_batch(rng, model.input_shape(), 3, pixels, labels);
  Trainer trainer(model, 3);
  std::vector<float> grad(model.parameter_count());
  trainer.compute_gradient(model.parameters(), pixels.data(), labels.data(), 3, grad);

  std::vector<float> probe(model.parameters().begin(), model.parameters().end());
  auto loss_at = [&](std::size_t i, float value) {
    const float saved = probe[i];
    probe[i] = value;
    const float loss = trainer.evaluate(probe, pixels.data(), labels.data(), 3).loss;
    probe[i] = saved;
    return loss;
  };
  int checked = 0;
  for (std::size_t i = 0; i < probe.size(); i += 7) {
    const float h = 1e-2f;
    const double numeric = (static_cast<double>(loss_at(i, probe[i] + h)) - loss_at(i, probe[i] - h)) / (2.0 * h);
    // float32 forward passes: allow a small absolute floor plus a relative part. A probe
    // that crosses a ReLU kink or flips a max-pool choice is rare at this step size.
    EXPECT_NEAR(grad[i], numeric, 2e-3 + 0.05 * std::fabs(numeric)) << "parameter " << i;
    checked++;
  }
  EXPECT_GT(checked, 40);
}

TEST(Trainer, SgdOnSyntheticDataDrivesTheLossDown) {
  Model model(parse_model_spec("input 12x12x1; conv 4 3x3 same relu; maxpool 2; fc 16 relu; fc 4"));
  model.initialize(2);
  Trainer trainer(model, 16);
  std::mt19937 rng(9);
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;
  std::vector<float> grad(model.parameter_count());
  auto params = model.parameters();
  float first = 0, last = 0;
  for (int step = 0; step < 60; step++) {
    synthetic_batch(rng, model.input_shape(), 16, pixels, labels);
    BatchResult r = trainer.compute_gradient(params, pixels.data(), labels.data(), 16, grad);
    for (std::size_t i = 0; i < params.size(); i++) params[i] -= 0.1f * grad[i];
    if (step == 0) first = r.loss;
    last = r.loss;
  }
  EXPECT_LT(last, 0.3f * first) << "first " << first << " last " << last;
  synthetic_batch(rng, model.input_shape(), 16, pixels, labels);
  EXPECT_GE(trainer.evaluate(params, pixels.data(), labels.data(), 16).correct, 14);
}

TEST(Trainer, RefusesBadBatchSizes) {
  Model model(builtin_model_spec("mlp"));
  Trainer trainer(model, 4);
  std::vector<std::uint8_t> pixels(5 * 784);
  std::vector<std::int32_t> labels(5);
  EXPECT_THROW(trainer.evaluate(model.parameters(), pixels.data(), labels.data(), 5), std::invalid_argument);
  EXPECT_THROW(trainer.evaluate(model.parameters(), pixels.data(), labels.data(), 0), std::invalid_argument);
  EXPECT_THROW(Trainer(model, 0), std::invalid_argument);
}

}  // namespace
