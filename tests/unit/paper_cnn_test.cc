// The paper CNN composed from the kernels (tests/support/paper_cnn.h): its size, the fast
// path's gradients against the reference path's, the reference gradients against central
// finite differences on sampled parameters of every tensor, and a short training run on
// separable synthetic data that must drive the loss down.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "tests/support/paper_cnn.h"

using edgetrain::testing::PaperCnn;
using edgetrain::testing::SyntheticDigits;

namespace {

TEST(PaperCnn, HasThePapersParameterCountInOneContiguousArena) {
  std::size_t next = 0;
  for (const auto& t : PaperCnn::kTensors) {
    EXPECT_EQ(t.offset, next);
    next += t.size;
  }
  EXPECT_EQ(next, 421642u);
  EXPECT_EQ(PaperCnn::kParameterCount, 421642u);
}

TEST(PaperCnn, FastGradientsMatchReferenceGradients) {
  for (int B : {1, 3}) {
    SyntheticDigits data(7);
    std::vector<float> images(B * 784);
    std::vector<std::int32_t> labels(B);
    data.batch(images.data(), labels.data(), B);
    PaperCnn reference(B, PaperCnn::Path::reference, nullptr),
        fast(B, PaperCnn::Path::fast, nullptr);
    reference.init_parameters(11);
    fast.params = reference.params;
    const float loss_ref = reference.forward_backward(images.data(), labels.data(), nullptr);
    const float loss_fast = fast.forward_backward(images.data(), labels.data(), nullptr);
    EXPECT_NEAR(loss_fast, loss_ref, 1e-4f * std::max(1.0f, loss_ref));
    for (const auto& t : PaperCnn::kTensors) {
      float scale = 0;
      for (std::size_t i = 0; i < t.size; i++)
        scale = std::max(scale, std::fabs(reference.grads[t.offset + i]));
      ASSERT_GT(scale, 0.0f) << "tensor at " << t.offset << " has an all-zero gradient";
      // Relative to the tensor's largest gradient: summation order differs, nothing else.
      for (std::size_t i = 0; i < t.size; i++) {
        ASSERT_NEAR(fast.grads[t.offset + i], reference.grads[t.offset + i], 1e-4f * scale)
            << "B=" << B << " tensor at " << t.offset << " index " << i;
      }
    }
  }
}

TEST(PaperCnn, ReferenceGradientsMatchFiniteDifferences) {
  const int B = 2;
  SyntheticDigits data(3);
  std::vector<float> images(B * 784);
  std::vector<std::int32_t> labels(B);
  data.batch(images.data(), labels.data(), B);
  PaperCnn model(B, PaperCnn::Path::reference, nullptr);
  model.init_parameters(5);
  // Non-zero biases so every bias gradient is exercised away from the init.
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> small(-0.05f, 0.05f);
  for (int t = 1; t < PaperCnn::kTensorCount; t += 2)
    for (std::size_t i = 0; i < PaperCnn::kTensors[t].size; i++)
      model.params[PaperCnn::kTensors[t].offset + i] = small(rng);
  model.forward_backward(images.data(), labels.data(), nullptr);
  const std::vector<float> analytic = model.grads;

  // Per tensor: the two largest gradients (where a wrong one would show) and two random entries.
  const float eps = 3e-3f;
  int checked = 0;
  for (const auto& t : PaperCnn::kTensors) {
    std::vector<std::size_t> order(t.size);
    std::iota(order.begin(), order.end(), t.offset);
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](std::size_t a, std::size_t b) {
                        return std::fabs(analytic[a]) > std::fabs(analytic[b]);
                      });
    std::uniform_int_distribution<std::size_t> pick(t.offset, t.offset + t.size - 1);
    for (std::size_t i : {order[0], order[1], pick(rng), pick(rng)}) {
      const float saved = model.params[i];
      model.params[i] = saved + eps;
      const double up = model.loss(images.data(), labels.data());
      model.params[i] = saved - eps;
      const double down = model.loss(images.data(), labels.data());
      model.params[i] = saved;
      const double numeric = (up - down) / (2.0 * eps);
      // Float loss (~2.3, rounding ~3e-7) over 2*eps bounds the absolute noise near 1e-4.
      EXPECT_NEAR(analytic[i], numeric, 3e-4 + 3e-2 * std::fabs(numeric)) << "parameter " << i;
      checked++;
    }
  }
  EXPECT_EQ(checked, 4 * PaperCnn::kTensorCount);
}

TEST(PaperCnn, TrainingOnSeparableDataDrivesLossDown) {
  // lr 0.05 rather than the paper's 0.1: these synthetic images carry far more signal per
  // pixel than MNIST, and 0.1 oscillates for the first steps.
  const int B = 10, steps = 30;
  SyntheticDigits data(21);
  PaperCnn model(B, PaperCnn::Path::fast, nullptr);
  model.init_parameters(2);
  std::vector<float> images(B * 784);
  std::vector<std::int32_t> labels(B);
  std::vector<float> losses;
  int correct_at_end = 0;
  for (int step = 0; step < steps; step++) {
    data.batch(images.data(), labels.data(), B);
    int correct = 0;
    losses.push_back(model.forward_backward(images.data(), labels.data(), &correct));
    ASSERT_TRUE(std::isfinite(losses.back())) << "step " << step;
    model.sgd_step(0.05f);
    if (std::getenv("EDGETRAIN_VERBOSE"))
      std::printf("step %d loss %.4f correct %d\n", step, losses.back(), correct);
    if (step >= steps - 5) correct_at_end += correct;
  }
  const double first = std::accumulate(losses.begin(), losses.begin() + 5, 0.0) / 5;
  const double last = std::accumulate(losses.end() - 5, losses.end(), 0.0) / 5;
  // The initial loss is near ln 10 (no blow-up that would make "down" easy), and ends far below it.
  EXPECT_LT(losses[0], 4.0f);
  EXPECT_LT(last, 0.25 * first) << "first five steps " << first << ", last five " << last;
  EXPECT_LT(last, 0.5) << "first five steps " << first << ", last five " << last;
  EXPECT_GE(correct_at_end, 40) << "of the last 50 training examples";
}

}  // namespace
