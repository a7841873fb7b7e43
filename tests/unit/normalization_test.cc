// Group and batch normalization (kernels/normalization.h): the reference ops against their
// definition (per-group / per-channel mean 0 and variance 1 before the affine map, PyTorch's
// running-statistics rule) and their backward passes against central finite differences of
// L = sum(out * probe); the fast ops against the reference, including a zero-padded batch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/normalization.h"
#include "tests/support/finite_differences.h"

namespace ek = edgetrain::kernels;

namespace {

using edgetrain::testing::dot;
using edgetrain::testing::expect_matches_finite_differences;
using edgetrain::testing::random_vector;

struct NormShape {
  int B, HW, C, G;  // G: groupnorm's groups (batchnorm ignores it)
};

class NormalizationTest : public ::testing::TestWithParam<NormShape> {};

// Mean and (biased) variance of the values selected by `index(k)` for k < n.
template <typename Index>
std::pair<double, double> moments(const std::vector<float>& v, std::size_t n, Index index) {
  double sum = 0, squares = 0;
  for (std::size_t k = 0; k < n; k++) sum += v[index(k)];
  const double mean = sum / static_cast<double>(n);
  for (std::size_t k = 0; k < n; k++) squares += (v[index(k)] - mean) * (v[index(k)] - mean);
  return {mean, squares / static_cast<double>(n)};
}

TEST_P(NormalizationTest, GroupNormNormalizesEachGroupOfEachExample) {
  const NormShape s = GetParam();
  std::mt19937 rng(7 + s.C);
  // An offset and a scale far from 0 and 1, so a wrong statistic shows.
  auto inp = random_vector(static_cast<std::size_t>(s.B) * s.HW * s.C, rng, 2.0f, 5.0f);
  std::vector<float> gamma(s.C, 1.0f), beta(s.C, 0.0f), out(inp.size());
  std::vector<float> mean(s.B * s.G), invstd(s.B * s.G);
  ek::group_norm_forward_reference(out.data(), mean.data(), invstd.data(), inp.data(), gamma.data(),
                                   beta.data(), s.B, s.HW, s.C, s.G);
  const int Cg = s.C / s.G;
  for (int b = 0; b < s.B; b++)
    for (int g = 0; g < s.G; g++) {
      auto index = [&](std::size_t k) {
        const std::size_t p = k / Cg, c = g * Cg + k % Cg;
        return (static_cast<std::size_t>(b) * s.HW + p) * s.C + c;
      };
      const auto [m, v] = moments(out, static_cast<std::size_t>(s.HW) * Cg, index);
      const auto [in_mean, in_var] = moments(inp, static_cast<std::size_t>(s.HW) * Cg, index);
      EXPECT_NEAR(m, 0.0, 1e-5) << "example " << b << " group " << g;
      // var(x̂) = var/(var + eps): a hair under 1.
      EXPECT_NEAR(v, in_var / (in_var + ek::kNormalizationEps), 1e-4)
          << "example " << b << " group " << g;
      EXPECT_NEAR(mean[b * s.G + g], in_mean, 1e-5);
      EXPECT_NEAR(invstd[b * s.G + g], 1.0 / std::sqrt(in_var + ek::kNormalizationEps), 1e-4);
    }
}

TEST_P(NormalizationTest, GroupNormBackwardMatchesFiniteDifferences) {
  const NormShape s = GetParam();
  std::mt19937 rng(11 + s.C + s.G);
  auto inp = random_vector(static_cast<std::size_t>(s.B) * s.HW * s.C, rng);
  auto gamma = random_vector(s.C, rng, 0.5f, 1.5f);
  auto beta = random_vector(s.C, rng);
  auto probe = random_vector(inp.size(), rng);
  std::vector<float> out(inp.size()), mean(s.B * s.G), invstd(s.B * s.G);
  auto loss = [&] {
    ek::group_norm_forward_reference(out.data(), mean.data(), invstd.data(), inp.data(),
                                     gamma.data(), beta.data(), s.B, s.HW, s.C, s.G);
    return dot(out, probe);
  };
  loss();
  std::vector<float> dinp(inp.size(), 1e9f), dgamma(s.C, 1e9f), dbeta(s.C, 1e9f);
  ek::group_norm_backward_reference(dinp.data(), dgamma.data(), dbeta.data(), probe.data(),
                                    inp.data(), mean.data(), invstd.data(), gamma.data(), s.B, s.HW,
                                    s.C, s.G);
  // Not linear in the input: a small step, and the tolerance of its curvature.
  expect_matches_finite_differences(inp, dinp, loss, 2e-3f, 60, 1e-2, "groupnorm dinp");
  expect_matches_finite_differences(gamma, dgamma, loss, 1e-2f, 60, 2e-3, "groupnorm dgamma");
  expect_matches_finite_differences(beta, dbeta, loss, 1e-2f, 60, 2e-3, "groupnorm dbeta");
}

TEST_P(NormalizationTest, GroupNormFastMatchesReference) {
  const NormShape s = GetParam();
  std::mt19937 rng(13 + s.C);
  auto inp = random_vector(static_cast<std::size_t>(s.B) * s.HW * s.C, rng, -1.0f, 3.0f);
  auto gamma = random_vector(s.C, rng, 0.5f, 1.5f);
  auto beta = random_vector(s.C, rng);
  auto dout = random_vector(inp.size(), rng);
  std::vector<float> out_ref(inp.size()), mean(s.B * s.G), invstd(s.B * s.G);
  std::vector<float> dinp_ref(inp.size()), dgamma_ref(s.C), dbeta_ref(s.C);
  ek::group_norm_forward_reference(out_ref.data(), mean.data(), invstd.data(), inp.data(),
                                   gamma.data(), beta.data(), s.B, s.HW, s.C, s.G);
  ek::group_norm_backward_reference(dinp_ref.data(), dgamma_ref.data(), dbeta_ref.data(),
                                    dout.data(), inp.data(), mean.data(), invstd.data(),
                                    gamma.data(), s.B, s.HW, s.C, s.G);
  ek::GroupNormOp op(s.B, s.HW, s.C, s.G);
  std::vector<float> out(inp.size()), dinp(inp.size(), 1e9f), dgamma(s.C, 1e9f), dbeta(s.C, 1e9f);
  op.forward(out.data(), inp.data(), gamma.data(), beta.data());
  op.backward(dinp.data(), dgamma.data(), dbeta.data(), dout.data(), inp.data(), gamma.data());
  for (std::size_t i = 0; i < out.size(); i++) {
    ASSERT_NEAR(out[i], out_ref[i], 1e-4f) << "out " << i;
    ASSERT_NEAR(dinp[i], dinp_ref[i], 1e-4f * (1 + std::fabs(dinp_ref[i]))) << "dinp " << i;
  }
  for (int c = 0; c < s.C; c++) {
    EXPECT_NEAR(dgamma[c], dgamma_ref[c], 1e-3f * (1 + std::fabs(dgamma_ref[c]))) << c;
    EXPECT_NEAR(dbeta[c], dbeta_ref[c], 1e-3f * (1 + std::fabs(dbeta_ref[c]))) << c;
  }
  // A null dinp (a first layer) leaves the parameter gradients as they were.
  std::vector<float> dgamma2(s.C), dbeta2(s.C);
  op.backward(nullptr, dgamma2.data(), dbeta2.data(), dout.data(), inp.data(), gamma.data());
  EXPECT_EQ(dgamma, dgamma2);
  EXPECT_EQ(dbeta, dbeta2);
}

TEST_P(NormalizationTest, BatchNormNormalizesEachChannelOverTheBatch) {
  const NormShape s = GetParam();
  std::mt19937 rng(17 + s.C);
  auto inp = random_vector(static_cast<std::size_t>(s.B) * s.HW * s.C, rng, 2.0f, 5.0f);
  std::vector<float> gamma(s.C, 1.0f), beta(s.C, 0.0f), out(inp.size()), mean(s.C), invstd(s.C);
  ek::batch_norm_forward_reference(out.data(), mean.data(), invstd.data(), inp.data(), gamma.data(),
                                   beta.data(), s.B, s.HW, s.C);
  const std::size_t positions = static_cast<std::size_t>(s.B) * s.HW;
  for (int c = 0; c < s.C; c++) {
    auto index = [&](std::size_t p) { return p * s.C + c; };
    const auto [m, v] = moments(out, positions, index);
    const auto [in_mean, in_var] = moments(inp, positions, index);
    EXPECT_NEAR(m, 0.0, 1e-5) << "channel " << c;
    EXPECT_NEAR(v, in_var / (in_var + ek::kNormalizationEps), 1e-4) << "channel " << c;
    EXPECT_NEAR(mean[c], in_mean, 1e-5);
    // PyTorch's rule: running = 0.9·running + 0.1·batch, the variance unbiased.
    float running_mean = 1.0f, running_var = 2.0f;
    ek::batch_norm_update_running(&running_mean, &running_var, &mean[c], &invstd[c], 1, positions);
    EXPECT_NEAR(running_mean, 0.9 * 1.0 + 0.1 * in_mean, 1e-5);
    EXPECT_NEAR(running_var,
                0.9 * 2.0 + 0.1 * in_var * positions / static_cast<double>(positions - 1), 1e-4);
  }
  // Evaluation with the batch's own statistics as the running ones gives the training output.
  std::vector<float> var(s.C), eval_out(inp.size());
  for (int c = 0; c < s.C; c++) var[c] = 1.0f / (invstd[c] * invstd[c]) - ek::kNormalizationEps;
  ek::batch_norm_inference(eval_out.data(), inp.data(), gamma.data(), beta.data(), mean.data(),
                           var.data(), s.B, s.HW, s.C);
  for (std::size_t i = 0; i < out.size(); i++) ASSERT_NEAR(eval_out[i], out[i], 1e-3f) << i;
}

TEST_P(NormalizationTest, BatchNormBackwardMatchesFiniteDifferences) {
  const NormShape s = GetParam();
  std::mt19937 rng(19 + s.C);
  auto inp = random_vector(static_cast<std::size_t>(s.B) * s.HW * s.C, rng);
  auto gamma = random_vector(s.C, rng, 0.5f, 1.5f);
  auto beta = random_vector(s.C, rng);
  auto probe = random_vector(inp.size(), rng);
  std::vector<float> out(inp.size()), mean(s.C), invstd(s.C);
  auto loss = [&] {
    ek::batch_norm_forward_reference(out.data(), mean.data(), invstd.data(), inp.data(),
                                     gamma.data(), beta.data(), s.B, s.HW, s.C);
    return dot(out, probe);
  };
  loss();
  std::vector<float> dinp(inp.size(), 1e9f), dgamma(s.C, 1e9f), dbeta(s.C, 1e9f);
  ek::batch_norm_backward_reference(dinp.data(), dgamma.data(), dbeta.data(), probe.data(),
                                    inp.data(), mean.data(), invstd.data(), gamma.data(), s.B, s.HW,
                                    s.C);
  expect_matches_finite_differences(inp, dinp, loss, 2e-3f, 60, 1e-2, "batchnorm dinp");
  expect_matches_finite_differences(gamma, dgamma, loss, 1e-2f, 60, 2e-3, "batchnorm dgamma");
  expect_matches_finite_differences(beta, dbeta, loss, 1e-2f, 60, 2e-3, "batchnorm dbeta");
}

TEST_P(NormalizationTest, BatchNormFastMatchesReferenceAlsoOnAPaddedBatch) {
  const NormShape s = GetParam();
  std::mt19937 rng(23 + s.C);
  const int max_batch = s.B + 2;  // two padding rows, as the Trainer's XNNPACK backend has
  const std::size_t example = static_cast<std::size_t>(s.HW) * s.C;
  auto inp = random_vector(max_batch * example, rng, -1.0f, 3.0f);
  auto gamma = random_vector(s.C, rng, 0.5f, 1.5f);
  auto beta = random_vector(s.C, rng);
  auto dout = random_vector(max_batch * example, rng);
  std::fill(dout.begin() + s.B * example, dout.end(), 0.0f);  // padding rows: no loss
  std::vector<float> out_ref(s.B * example), mean(s.C), invstd(s.C);
  std::vector<float> dinp_ref(s.B * example), dgamma_ref(s.C), dbeta_ref(s.C);
  ek::batch_norm_forward_reference(out_ref.data(), mean.data(), invstd.data(), inp.data(),
                                   gamma.data(), beta.data(), s.B, s.HW, s.C);
  ek::batch_norm_backward_reference(dinp_ref.data(), dgamma_ref.data(), dbeta_ref.data(),
                                    dout.data(), inp.data(), mean.data(), invstd.data(),
                                    gamma.data(), s.B, s.HW, s.C);
  ek::BatchNormOp op(max_batch, s.HW, s.C);
  std::vector<float> out(max_batch * example, 1e9f), dinp(max_batch * example, 1e9f), dgamma(s.C),
      dbeta(s.C);
  op.forward_training(out.data(), inp.data(), gamma.data(), beta.data(), s.B);
  op.backward(dinp.data(), dgamma.data(), dbeta.data(), dout.data(), inp.data(), gamma.data(), s.B);
  for (std::size_t i = 0; i < out_ref.size(); i++) {
    ASSERT_NEAR(out[i], out_ref[i], 1e-4f) << "out " << i;
    ASSERT_NEAR(dinp[i], dinp_ref[i], 1e-4f * (1 + std::fabs(dinp_ref[i]))) << "dinp " << i;
  }
  for (std::size_t i = out_ref.size(); i < out.size(); i++) {
    ASSERT_TRUE(std::isfinite(out[i])) << "padding row written " << i;
    ASSERT_EQ(dinp[i], 0.0f) << "padding row gradient " << i;
  }
  for (int c = 0; c < s.C; c++) {
    EXPECT_NEAR(mean[c], op.mean()[c], 1e-5f);
    EXPECT_NEAR(dgamma[c], dgamma_ref[c], 1e-3f * (1 + std::fabs(dgamma_ref[c]))) << c;
    EXPECT_NEAR(dbeta[c], dbeta_ref[c], 1e-3f * (1 + std::fabs(dbeta_ref[c]))) << c;
  }
}

// Shapes: one group per channel (instance norm), one group (layer norm), groups of 4 and of
// 2 channels, a 1x1 "image" (after a global pool or fc) and an uneven position count.
INSTANTIATE_TEST_SUITE_P(Shapes, NormalizationTest,
                         ::testing::Values(NormShape{3, 9, 4, 4}, NormShape{2, 16, 6, 1},
                                           NormShape{4, 25, 16, 4}, NormShape{2, 49, 8, 4},
                                           NormShape{5, 1, 12, 6}, NormShape{2, 7, 10, 5}));

// A mean far larger than the spread (1000 ± 0.01): the fast op's shifted sums keep the
// variance that E[x²] − E[x]² in float would lose to cancellation.
TEST(GroupNormOp, KeepsTheVarianceOfValuesFarFromZero) {
  const int B = 2, HW = 49, C = 8, G = 2;
  std::mt19937 rng(29);
  auto inp = random_vector(static_cast<std::size_t>(B) * HW * C, rng, 999.99f, 1000.01f);
  std::vector<float> gamma(C, 1.0f), beta(C, 0.0f), out_ref(inp.size()), out(inp.size());
  std::vector<float> mean(B * G), invstd(B * G);
  ek::group_norm_forward_reference(out_ref.data(), mean.data(), invstd.data(), inp.data(),
                                   gamma.data(), beta.data(), B, HW, C, G);
  ek::GroupNormOp op(B, HW, C, G);
  op.forward(out.data(), inp.data(), gamma.data(), beta.data());
  for (int i = 0; i < B * G; i++) EXPECT_NEAR(op.invstd()[i], invstd[i], 1e-2f * invstd[i]);
  // Normalized values of about ±1.7; the inputs' own float rounding (6e-5 at 1000) is
  // already 1 % of their spread.
  for (std::size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out[i], out_ref[i], 0.05f) << i;
}

TEST(GroupNormOp, RefusesChannelsThatDoNotSplitIntoTheGroups) {
  EXPECT_THROW(ek::GroupNormOp(2, 4, 6, 4), std::invalid_argument);
}

}  // namespace
