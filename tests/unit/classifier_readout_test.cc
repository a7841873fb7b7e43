// model/classifier_readout.h: the readout's probabilities equal the trainer's (the same
// model, the same parameters), its features are the last layer's input; the MNIST score of
// known probability tables; the Fréchet distance of known Gaussians; the Jacobi eigen solver.
#include "model/classifier_readout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/trainer.h"

namespace {

using namespace edgetrain::runtime;

TEST(ClassifierReadout, AgreesWithTheTrainerOnThePaperCnn) {
  Model model(builtin_model_spec("paper-cnn"));
  model.initialize(4);
  std::mt19937 rng(1);
  const int count = 7;
  std::vector<std::uint8_t> pixels(count * 784);
  for (auto& p : pixels) p = static_cast<std::uint8_t>(rng() % 256);
  std::vector<std::int32_t> labels(count);
  for (int i = 0; i < count; i++) labels[i] = i % 10;
  ClassifierReadout readout(model, 4);  // smaller than the count: two batches
  EXPECT_EQ(readout.feature_size(), 128);
  std::vector<float> probs(count * 10), features(count * 128);
  readout.read(model.parameters(), pixels.data(), count, probs.data(), features.data());
  // The trainer's mean loss is -mean(log p[label]).
  Trainer trainer(model, count, KernelBackend::kReference);
  const BatchResult result =
      trainer.evaluate(model.parameters(), pixels.data(), labels.data(), count);
  double loss = 0;
  int correct = 0;
  for (int i = 0; i < count; i++) {
    loss -= std::log(probs[i * 10 + labels[i]]) / count;
    const float* row = probs.data() + i * 10;
    correct += std::max_element(row, row + 10) - row == labels[i];
    double total = 0;
    for (int c = 0; c < 10; c++) total += row[c];
    EXPECT_NEAR(total, 1.0, 1e-5);
  }
  EXPECT_NEAR(loss, result.loss, 1e-4);
  EXPECT_EQ(correct, result.correct);
  for (float f : features) EXPECT_GE(f, 0.0f) << "features come after the ReLU of fc 128";
}

TEST(MnistScore, KnownTables) {
  std::vector<float> uniform(50 * 10, 0.1f);
  EXPECT_NEAR(mnist_score(uniform.data(), 50, 10), 1.0, 1e-6);
  std::vector<float> confident(50 * 10, 0.0f);
  for (int i = 0; i < 50; i++) confident[i * 10 + i % 10] = 1.0f;
  EXPECT_NEAR(mnist_score(confident.data(), 50, 10), 10.0, 1e-4);
  std::vector<float> one_class(50 * 10, 0.0f);
  for (int i = 0; i < 50; i++) one_class[i * 10 + 3] = 1.0f;
  EXPECT_NEAR(mnist_score(one_class.data(), 50, 10), 1.0, 1e-6)
      << "confident but all the same digit";
}

TEST(FrechetDistance, KnownGaussians) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const int n = 20000, dim = 3;
  std::vector<float> a(n * dim), b(n * dim);
  for (int i = 0; i < n; i++)
    for (int d = 0; d < dim; d++) {
      a[i * dim + d] = normal(rng);
      // b: mean (1, 0, 0), standard deviations (1, 2, 1): FID = 1 + (1 + 4 - 2·2) = 2.
      b[i * dim + d] = (d == 1 ? 2.0f : 1.0f) * normal(rng) + (d == 0 ? 1.0f : 0.0f);
    }
  EXPECT_NEAR(frechet_distance(a.data(), n, a.data(), n, dim), 0.0, 1e-6);
  EXPECT_NEAR(frechet_distance(a.data(), n, b.data(), n, dim), 2.0, 0.1);
  EXPECT_THROW(frechet_distance(a.data(), 1, b.data(), n, dim), std::invalid_argument);
}

TEST(SymmetricEigen, ReconstructsTheMatrix) {
  const int n = 5;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> m(n * n);
  for (int r = 0; r < n; r++)
    for (int c = r; c < n; c++) m[r * n + c] = m[c * n + r] = u(rng);
  std::vector<double> values, vectors;
  symmetric_eigen(m, n, values, vectors);
  for (int r = 0; r < n; r++)
    for (int c = 0; c < n; c++) {
      double x = 0;
      for (int j = 0; j < n; j++) x += vectors[r * n + j] * values[j] * vectors[c * n + j];
      EXPECT_NEAR(x, m[r * n + c], 1e-9);
    }
}

}  // namespace
