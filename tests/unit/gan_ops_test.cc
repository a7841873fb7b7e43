// The generative model's ops (kernels/gan_ops.h): every backward against central finite
// differences of L = sum(out * probe), the transposed convolution on XNNPACK against its
// reference (forward and every gradient, several shapes including the MD-GAN generator's
// 7 -> 14 -> 28 layers and a one-channel output), sigmoid and the BCE loss at extreme logits,
// and Adam against its formula and on a quadratic.
#include "kernels/gan_ops.h"
#include "tests/support/finite_differences.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace ek = edgetrain::kernels;

namespace {

using edgetrain::testing::dot;
using edgetrain::testing::expect_matches_finite_differences;
using edgetrain::testing::random_vector;

TEST(GanOps, ElementwiseBackwardsMatchFiniteDifferences) {
  std::mt19937 rng(3);
  auto x = random_vector(64, rng, -2, 2);
  for (auto& v : x)
    if (std::fabs(v) < 0.05f) v = 0.1f;  // away from the leaky ReLU's kink
  const auto probe = random_vector(64, rng);
  std::vector<float> out(64), dinp(64);

  const float slope = 0.2f;
  auto leaky_loss = [&] {
    ek::leaky_relu_forward(out.data(), x.data(), x.size(), slope);
    return dot(out, probe);
  };
  ek::leaky_relu_backward(dinp.data(), probe.data(), x.data(), x.size(), slope);
  expect_matches_finite_differences(x, dinp, leaky_loss, 1e-3f, 64, 1e-3, "leaky relu");

  auto tanh_loss = [&] {
    ek::tanh_forward(out.data(), x.data(), x.size());
    return dot(out, probe);
  };
  ek::tanh_forward(out.data(), x.data(), x.size());
  ek::tanh_backward(dinp.data(), probe.data(), out.data(), x.size());
  expect_matches_finite_differences(x, dinp, tanh_loss, 1e-3f, 64, 1e-3, "tanh");

  auto targets = random_vector(64, rng, 0, 1);
  auto bce_loss = [&] {
    return static_cast<double>(ek::bce_with_logits_forward(x.data(), targets.data(), x.size()));
  };
  ek::bce_with_logits_backward(dinp.data(), x.data(), targets.data(), x.size());
  expect_matches_finite_differences(x, dinp, bce_loss, 1e-2f, 64, 2e-3, "bce with logits");
}

TEST(GanOps, SigmoidAndBceStayFiniteAtExtremeLogits) {
  const std::vector<float> logits = {-1000.0f, -30.0f, 0.0f, 30.0f, 1000.0f};
  std::vector<float> p(logits.size());
  ek::sigmoid_forward(p.data(), logits.data(), logits.size());
  EXPECT_EQ(p[0], 0.0f);
  EXPECT_FLOAT_EQ(p[2], 0.5f);
  EXPECT_EQ(p[4], 1.0f);
  const std::vector<float> ones(logits.size(), 1.0f), zeros(logits.size(), 0.0f);
  const float loss_real = ek::bce_with_logits_forward(logits.data(), ones.data(), logits.size());
  EXPECT_TRUE(std::isfinite(loss_real));
  EXPECT_NEAR(loss_real, (1000.0 + 30.0 + std::log(2.0) + 0 + 0) / 5, 1e-3);
  std::vector<float> d(logits.size());
  ek::bce_with_logits_backward(d.data(), logits.data(), zeros.data(), logits.size());
  for (float g : d) EXPECT_TRUE(std::isfinite(g));
  EXPECT_FLOAT_EQ(d[4], 1.0f / 5);
}

class Deconv2dTest : public ::testing::TestWithParam<ek::Deconv2dShape> {};

TEST_P(Deconv2dTest, ReferenceBackwardMatchesFiniteDifferences) {
  const ek::Deconv2dShape s = GetParam();
  std::mt19937 rng(11 + s.C + s.OC);
  const std::size_t n_out = static_cast<std::size_t>(s.B) * s.OH() * s.OW() * s.OC;
  auto inp = random_vector(static_cast<std::size_t>(s.B) * s.H * s.W * s.C, rng);
  auto weight = random_vector(static_cast<std::size_t>(s.OC) * s.KH * s.KW * s.C, rng);
  auto bias = random_vector(s.OC, rng);
  const auto probe = random_vector(n_out, rng);
  std::vector<float> out(n_out), dinp(inp.size()), dweight(weight.size()), dbias(bias.size());
  auto loss = [&] {
    ek::deconv2d_forward_reference(out.data(), inp.data(), weight.data(), bias.data(), s);
    return dot(out, probe);
  };
  ek::deconv2d_backward_reference(dinp.data(), dweight.data(), dbias.data(), probe.data(),
                                  inp.data(), weight.data(), s);
  expect_matches_finite_differences(inp, dinp, loss, 1e-2f, 24, 2e-3, "dinp");
  expect_matches_finite_differences(weight, dweight, loss, 1e-2f, 24, 2e-3, "dweight");
  expect_matches_finite_differences(bias, dbias, loss, 1e-2f, 8, 2e-3, "dbias");
}

TEST_P(Deconv2dTest, XnnpackEqualsReference) {
  const ek::Deconv2dShape s = GetParam();
  std::mt19937 rng(5 + s.C * 3 + s.OC);
  const std::size_t n_out = static_cast<std::size_t>(s.B) * s.OH() * s.OW() * s.OC;
  const auto inp = random_vector(static_cast<std::size_t>(s.B) * s.H * s.W * s.C, rng);
  const auto weight = random_vector(static_cast<std::size_t>(s.OC) * s.KH * s.KW * s.C, rng);
  const auto bias = random_vector(s.OC, rng);
  const auto dout = random_vector(n_out, rng);
  std::vector<float> out_ref(n_out), out_fast(n_out);
  std::vector<float> dinp_ref(inp.size()), dinp_fast(inp.size()), dw_ref(weight.size()),
      dw_fast(weight.size());
  std::vector<float> db_ref(bias.size()), db_fast(bias.size());
  ek::deconv2d_forward_reference(out_ref.data(), inp.data(), weight.data(), bias.data(), s);
  ek::deconv2d_backward_reference(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(),
                                  inp.data(), weight.data(), s);
  ek::Deconv2dXnn fast(s, nullptr);
  for (int repeat = 0; repeat < 2;
       repeat++) {  // operators are recreated per call: the second call must agree too
    fast.forward(out_fast.data(), inp.data(), weight.data(), bias.data());
    fast.backward(dinp_fast.data(), dw_fast.data(), db_fast.data(), dout.data(), inp.data(),
                  weight.data());
  }
  // Tolerance as for the other fast ops: 2e-6 per term of the sum plus 1e-5.
  const double taps = static_cast<double>(s.KH) * s.KW;
  auto expect_close = [](const std::vector<float>& a, const std::vector<float>& b, double tolerance,
                         const char* what) {
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); i++)
      ASSERT_NEAR(a[i], b[i], tolerance) << what << " at " << i;
  };
  expect_close(out_fast, out_ref, 2e-6 * taps * s.C + 1e-5, "forward");
  expect_close(dinp_fast, dinp_ref, 2e-6 * taps * s.OC + 1e-5, "dinp");
  expect_close(dw_fast, dw_ref, 2e-6 * s.B * s.H * s.W + 1e-5, "dweight");
  expect_close(db_fast, db_ref, 2e-6 * s.B * s.OH() * s.OW() + 1e-5, "dbias");
  // The input gradient is optional.
  fast.backward(nullptr, dw_fast.data(), nullptr, dout.data(), inp.data(), weight.data());
  expect_close(dw_fast, dw_ref, 2e-6 * s.B * s.H * s.W + 1e-5, "dweight without dinp");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Deconv2dTest,
    ::testing::Values(ek::Deconv2dShape{2, 3, 4, 2, 3},  // 5x5, stride 2, pad 2, adj 1: 3x4 -> 6x8
                      ek::Deconv2dShape{2, 7, 7, 8, 4},  // the generator's first layer, thinner
                      ek::Deconv2dShape{1, 14, 14, 4, 1},  // its last layer: one output channel
                      ek::Deconv2dShape{2, 5, 3, 3, 2, 3, 3, 1, 1, 0},  // 3x3, stride 1: same size
                      ek::Deconv2dShape{1, 4, 4, 2, 3, 4, 4, 2, 1,
                                        0}),  // 4x4, stride 2, no adj: 4x4 -> 8x8
    [](const ::testing::TestParamInfo<ek::Deconv2dShape>& info) {
      const auto& s = info.param;
      return "B" + std::to_string(s.B) + "_" + std::to_string(s.H) + "x" + std::to_string(s.W) +
             "x" + std::to_string(s.C) + "_to_" + std::to_string(s.OH()) + "x" +
             std::to_string(s.OW()) + "x" + std::to_string(s.OC) + "_k" + std::to_string(s.KH) +
             "s" + std::to_string(s.stride);
    });

TEST(GanOps, DeconvRefusesShapesItCannotInvert) {
  EXPECT_THROW(ek::Deconv2dXnn(ek::Deconv2dShape{1, 3, 3, 1, 1, 5, 5, 2, 2, 2}, nullptr),
               std::invalid_argument);  // adj >= stride
  EXPECT_THROW(ek::Deconv2dXnn(ek::Deconv2dShape{1, 3, 3, 0, 1}, nullptr), std::invalid_argument);
}

TEST(GanOps, AdamFollowsItsFormulaAndMinimisesAQuadratic) {
  ek::AdamSettings adam;
  adam.lr = 0.1f;
  adam.beta1 = 0.9f;
  std::vector<float> param = {1.0f, -2.0f}, m(2, 0.0f), v(2, 0.0f);
  // Step 1 with bias correction: m̂ = g, v̂ = g², so the step is lr · sign(g) (up to ε).
  const std::vector<float> grad = {0.5f, -4.0f};
  ek::adam_update(param.data(), m.data(), v.data(), grad.data(), 2, adam, 1);
  EXPECT_NEAR(param[0], 1.0f - 0.1f, 1e-6);
  EXPECT_NEAR(param[1], -2.0f + 0.1f, 1e-6);
  EXPECT_FLOAT_EQ(m[0], 0.05f);
  EXPECT_FLOAT_EQ(v[1], (1.0f - adam.beta2) * 16.0f);
  // f(p) = Σ (p - 3)²: Adam walks every coordinate to 3.
  for (std::uint64_t step = 2; step <= 600; step++) {
    const std::vector<float> g = {2 * (param[0] - 3), 2 * (param[1] - 3)};
    ek::adam_update(param.data(), m.data(), v.data(), g.data(), 2, adam, step);
  }
  EXPECT_NEAR(param[0], 3.0f, 0.05);
  EXPECT_NEAR(param[1], 3.0f, 0.05);
  EXPECT_THROW(ek::adam_update(param.data(), m.data(), v.data(), grad.data(), 2, adam, 0),
               std::invalid_argument);
}

}  // namespace
