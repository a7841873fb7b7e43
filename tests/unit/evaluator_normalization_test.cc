// The server's evaluator (server/evaluator.h) on a model with batchnorm: the running
// statistics never reach the server, so evaluate_parameters recomputes them for the
// parameters it scores (model/README.md, "Normalization state"). A model trained by a
// Trainer elsewhere, handed over as its parameters alone, scores as well there as in the
// Trainer that trained it, and far better than with the statistics' starting values.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "model/dataset.h"
#include "model/model.h"
#include "model/trainer.h"
#include "server/evaluator.h"

namespace {

using namespace edgetrain::runtime;

// Grey 12x12 images whose class (0..3) is the brightest quadrant.
void quadrant_images(std::mt19937& rng, int count, std::vector<std::uint8_t>& pixels,
                     std::vector<std::int32_t>& labels) {
  pixels.resize(static_cast<std::size_t>(count) * 144);
  labels.resize(count);
  std::uniform_int_distribution<int> noise(0, 60), klass(0, 3);
  for (int n = 0; n < count; n++) {
    labels[n] = klass(rng);
    for (int h = 0; h < 12; h++)
      for (int w = 0; w < 12; w++)
        pixels[static_cast<std::size_t>(n) * 144 + h * 12 + w] = static_cast<std::uint8_t>(
            noise(rng) + ((h >= 6) * 2 + (w >= 6) == labels[n] ? 150 : 0));
  }
}

TEST(ServerEvaluator, RecomputesBatchNormStatisticsForTheParametersItScores) {
  Model model(parse_model_spec(
      "input 12x12x1; conv 8 3x3 same; batchnorm relu; maxpool 2; conv 8 3x3 same; "
      "batchnorm relu; maxpool 2; fc 4"));
  model.initialize(2);
  Trainer trainer(model, 16);
  std::mt19937 rng(9);
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;
  std::vector<float> grad(model.parameter_count());
  auto params = model.parameters();
  for (int step = 0; step < 60; step++) {
    quadrant_images(rng, 16, pixels, labels);
    trainer.compute_gradient(params, pixels.data(), labels.data(), 16, grad);
    for (std::size_t i = 0; i < params.size(); i++) params[i] -= 0.1f * grad[i];
  }
  Dataset test;
  test.height = test.width = 12;
  test.channels = 1;
  test.num_classes = 4;
  quadrant_images(rng, 250, test.pixels, test.labels);  // not a multiple of the batch of 100

  const edgetrain::server::EvaluationResult result =
      edgetrain::server::evaluate_parameters(model, params, test);
  int trainer_correct = 0;
  for (int start = 0; start < 250; start += 10)
    trainer_correct +=
        trainer.evaluate(params, test.pixels.data() + start * 144, test.labels.data() + start, 10)
            .correct;
  const double trainer_accuracy = trainer_correct / 250.0;
  EXPECT_GE(trainer_accuracy, 0.9);
  EXPECT_NEAR(result.accuracy, trainer_accuracy, 0.04);

  // Without the calibration: running statistics at their start (mean 0, variance 1).
  Trainer uncalibrated(model, 50);
  int uncalibrated_correct = 0;
  for (int start = 0; start < 250; start += 50)
    uncalibrated_correct +=
        uncalibrated
            .evaluate(params, test.pixels.data() + start * 144, test.labels.data() + start, 50)
            .correct;
  EXPECT_LT(uncalibrated_correct / 250.0, result.accuracy - 0.1)
      << "the test would not notice an evaluator that skipped the calibration";
}

}  // namespace
