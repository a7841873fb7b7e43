// The reference ops against their definitions: known values for the forward ops, and
// every backward op against central finite differences of a scalar loss
// L = sum(out * probe) with a fixed random probe. Inputs are nudged away from ReLU kinks
// and max-pool ties, where the derivative does not exist and finite differences lie.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/reference.h"
#include "tests/support/finite_differences.h"

namespace ek = edgetrain::kernels;

namespace {

using edgetrain::testing::dot;
using edgetrain::testing::expect_matches_finite_differences;
using edgetrain::testing::random_vector;

class Conv2dReferenceTest : public ::testing::TestWithParam<ek::Conv2dShape> {};

TEST_P(Conv2dReferenceTest, BackwardMatchesFiniteDifferences) {
  const ek::Conv2dShape s = GetParam();
  std::mt19937 rng(42 + s.C * 7 + s.OC);
  const std::size_t n_out = static_cast<std::size_t>(s.B) * s.OH() * s.OW() * s.OC;
  auto inp = random_vector(static_cast<std::size_t>(s.B) * s.H * s.W * s.C, rng);
  auto weight = random_vector(static_cast<std::size_t>(s.OC) * s.KH * s.KW * s.C, rng);
  auto bias = random_vector(s.OC, rng);
  auto probe = random_vector(n_out, rng);
  std::vector<float> out(n_out), dinp(inp.size()), dweight(weight.size()), dbias(bias.size());
  auto loss = [&] {
    ek::conv2d_forward_reference(out.data(), inp.data(), weight.data(), bias.data(), s);
    return dot(out, probe);
  };
  // dweight/dbias must be overwritten, so poison them first.
  std::fill(dweight.begin(), dweight.end(), 1e9f);
  std::fill(dbias.begin(), dbias.end(), 1e9f);
  std::fill(dinp.begin(), dinp.end(), 1e9f);
  ek::conv2d_backward_reference(dinp.data(), dweight.data(), dbias.data(), probe.data(), inp.data(),
                                weight.data(), s);
  // The loss is linear in each argument, so only float rounding separates the two.
  expect_matches_finite_differences(inp, dinp, loss, 1e-2f, 40, 2e-3, "dinp");
  expect_matches_finite_differences(weight, dweight, loss, 1e-2f, 40, 2e-3, "dweight");
  expect_matches_finite_differences(bias, dbias, loss, 1e-2f, 40, 2e-3, "dbias");

  // A null dinp (first layer) leaves the weight gradient unchanged.
  std::vector<float> dweight2(weight.size());
  ek::conv2d_backward_reference(nullptr, dweight2.data(), nullptr, probe.data(), inp.data(),
                                weight.data(), s);
  EXPECT_EQ(dweight, dweight2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Conv2dReferenceTest,
                         ::testing::Values(ek::Conv2dShape{1, 5, 5, 1, 2},
                                           ek::Conv2dShape{2, 4, 7, 3, 5},
                                           ek::Conv2dShape{2, 6, 5, 2, 3, 3, 3, 2, 1},
                                           ek::Conv2dShape{1, 5, 4, 2, 2, 2, 3, 1, 0},
                                           // pointwise (1x1), and 1x1 with stride 2
                                           ek::Conv2dShape{2, 4, 5, 6, 3, 1, 1, 1, 0},
                                           ek::Conv2dShape{1, 5, 5, 3, 4, 1, 1, 2, 0}));

TEST(Conv2dReference, ComputesKnownValues) {
  // 3x3 image 1..9, all-ones 3x3 kernel, SAME padding: each output is the sum of its neighbourhood.
  const float inp[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  float weight[9];
  std::fill(weight, weight + 9, 1.0f);
  const float bias[] = {0.5f};
  float out[9];
  ek::conv2d_forward_reference(out, inp, weight, bias, ek::Conv2dShape{1, 3, 3, 1, 1});
  const float expected[] = {12, 21, 16, 27, 45, 33, 24, 39, 28};
  for (int i = 0; i < 9; i++) EXPECT_FLOAT_EQ(out[i], expected[i] + 0.5f) << i;
  EXPECT_EQ((ek::Conv2dShape{1, 28, 28, 1, 32}.OH()), 28);
  EXPECT_EQ((ek::Conv2dShape{1, 7, 7, 1, 1, 3, 3, 2, 1}.OW()), 4);
}

TEST(FullyConnectedReference, BackwardMatchesFiniteDifferences) {
  for (auto [B, C, OC] : {std::array<std::size_t, 3>{1, 1, 1}, {3, 7, 5}, {4, 13, 2}}) {
    std::mt19937 rng(static_cast<unsigned>(B * 100 + C * 10 + OC));
    auto inp = random_vector(B * C, rng), weight = random_vector(OC * C, rng),
         bias = random_vector(OC, rng);
    auto probe = random_vector(B * OC, rng);
    std::vector<float> out(B * OC), dinp(B * C, 1e9f), dweight(OC * C, 1e9f), dbias(OC, 1e9f);
    auto loss = [&] {
      ek::fully_connected_forward_reference(out.data(), inp.data(), weight.data(), bias.data(), B,
                                            C, OC);
      return dot(out, probe);
    };
    ek::fully_connected_backward_reference(dinp.data(), dweight.data(), dbias.data(), probe.data(),
                                           inp.data(), weight.data(), B, C, OC);
    expect_matches_finite_differences(inp, dinp, loss, 1e-2f, 50, 2e-3, "dinp");
    expect_matches_finite_differences(weight, dweight, loss, 1e-2f, 50, 2e-3, "dweight");
    expect_matches_finite_differences(bias, dbias, loss, 1e-2f, 50, 2e-3, "dbias");
  }
}

TEST(ReluReference, ForwardAndBackwardAwayFromTheKink) {
  std::mt19937 rng(3);
  auto inp = random_vector(64, rng);
  // Keep every input at least 0.05 from 0 so a +-0.01 nudge never crosses the kink.
  for (auto& x : inp) x = x >= 0 ? x + 0.05f : x - 0.05f;
  auto probe = random_vector(64, rng);
  std::vector<float> out(64), dinp(64);
  auto loss = [&] {
    ek::relu_forward(out.data(), inp.data(), inp.size());
    return dot(out, probe);
  };
  loss();
  for (std::size_t i = 0; i < inp.size(); i++) EXPECT_EQ(out[i], inp[i] > 0 ? inp[i] : 0.0f);
  ek::relu_backward(dinp.data(), probe.data(), out.data(), out.size());
  expect_matches_finite_differences(inp, dinp, loss, 1e-2f, 64, 1e-3, "relu dinp");
  // In place: dinp aliases dout.
  std::vector<float> inplace = probe;
  ek::relu_backward(inplace.data(), inplace.data(), out.data(), out.size());
  EXPECT_EQ(inplace, dinp);
}

TEST(MaxPoolReference, ForwardAndBackwardAwayFromTies) {
  for (auto [B, H, W, C] : {std::array<int, 4>{1, 2, 2, 1}, {2, 5, 6, 3}, {1, 7, 7, 2}}) {
    std::mt19937 rng(static_cast<unsigned>(B + H * 10 + W * 100 + C));
    // A shuffled ladder with steps of 0.1: no two values within 2*eps of each other.
    std::vector<float> inp(static_cast<std::size_t>(B) * H * W * C);
    for (std::size_t i = 0; i < inp.size(); i++) inp[i] = 0.1f * static_cast<float>(i) - 3.0f;
    std::shuffle(inp.begin(), inp.end(), rng);
    const std::size_t n_out = static_cast<std::size_t>(B) * (H / 2) * (W / 2) * C;
    auto probe = random_vector(n_out, rng);
    std::vector<float> out(n_out), dinp(inp.size(), 1e9f);
    std::vector<std::uint32_t> argmax(n_out);
    auto loss = [&] {
      ek::maxpool2x2_forward_reference(out.data(), argmax.data(), inp.data(), B, H, W, C);
      return dot(out, probe);
    };
    loss();
    for (std::size_t i = 0; i < n_out; i++) EXPECT_EQ(out[i], inp[argmax[i]]);
    ek::maxpool2x2_backward_reference(dinp.data(), probe.data(), argmax.data(), B, H, W, C);
    expect_matches_finite_differences(inp, dinp, loss, 1e-2f, 1000, 1e-3, "maxpool dinp");
  }
}

TEST(MaxPoolReference, FirstMaxWinsOnTies) {
  const float inp[] = {1, 1, 1, 1};
  float out;
  std::uint32_t argmax = 99;
  ek::maxpool2x2_forward_reference(&out, &argmax, inp, 1, 2, 2, 1);
  EXPECT_EQ(argmax, 0u);
}

class DepthwiseConv2dReferenceTest : public ::testing::TestWithParam<ek::Conv2dShape> {};

TEST_P(DepthwiseConv2dReferenceTest, BackwardMatchesFiniteDifferences) {
  const ek::Conv2dShape s = GetParam();
  ASSERT_EQ(s.C, s.OC);
  std::mt19937 rng(7 + s.C * 5 + s.stride);
  const std::size_t n_out = static_cast<std::size_t>(s.B) * s.OH() * s.OW() * s.C;
  auto inp = random_vector(static_cast<std::size_t>(s.B) * s.H * s.W * s.C, rng);
  auto weight = random_vector(static_cast<std::size_t>(s.C) * s.KH * s.KW, rng);
  auto bias = random_vector(s.C, rng);
  auto probe = random_vector(n_out, rng);
  std::vector<float> out(n_out), dinp(inp.size(), 1e9f), dweight(weight.size(), 1e9f),
      dbias(bias.size(), 1e9f);
  auto loss = [&] {
    ek::depthwise_conv2d_forward_reference(out.data(), inp.data(), weight.data(), bias.data(), s);
    return dot(out, probe);
  };
  ek::depthwise_conv2d_backward_reference(dinp.data(), dweight.data(), dbias.data(), probe.data(),
                                          inp.data(), weight.data(), s);
  expect_matches_finite_differences(inp, dinp, loss, 1e-2f, 60, 2e-3, "dinp");
  expect_matches_finite_differences(weight, dweight, loss, 1e-2f, 60, 2e-3, "dweight");
  expect_matches_finite_differences(bias, dbias, loss, 1e-2f, 60, 2e-3, "dbias");
}

INSTANTIATE_TEST_SUITE_P(Shapes, DepthwiseConv2dReferenceTest,
                         ::testing::Values(ek::Conv2dShape{1, 5, 5, 1, 1},
                                           ek::Conv2dShape{2, 6, 7, 3, 3},
                                           ek::Conv2dShape{2, 7, 6, 4, 4, 3, 3, 2, 1},
                                           ek::Conv2dShape{1, 6, 5, 2, 2, 5, 5, 1, 0}));

TEST(DepthwiseConv2dReference, EachChannelSeesOnlyItsOwnFilter) {
  // Two channels, 3x3 image: channel 0 is 1..9 under an all-ones filter (the neighbourhood
  // sums, as conv's known values), channel 1 is all ones under a centre-only filter of 2.
  float inp[18], weight[18] = {}, out[18];
  for (int p = 0; p < 9; p++) {
    inp[2 * p] = static_cast<float>(p + 1);
    inp[2 * p + 1] = 1.0f;
    weight[p] = 1.0f;
  }
  weight[9 + 4] = 2.0f;
  const float bias[] = {0.5f, -1.0f};
  ek::depthwise_conv2d_forward_reference(out, inp, weight, bias, ek::Conv2dShape{1, 3, 3, 2, 2});
  const float expected[] = {12, 21, 16, 27, 45, 33, 24, 39, 28};
  for (int p = 0; p < 9; p++) {
    EXPECT_FLOAT_EQ(out[2 * p], expected[p] + 0.5f) << p;
    EXPECT_FLOAT_EQ(out[2 * p + 1], 1.0f) << p;
  }
}

TEST(AvgPoolReference, KnownValuesAndBackwardMatchesFiniteDifferences) {
  // 5x5 one-channel image 0..24, window 2: the last row and column fall in no window.
  float inp[25], out[4];
  for (int i = 0; i < 25; i++) inp[i] = static_cast<float>(i);
  ek::avgpool_forward_reference(out, inp, 1, 5, 5, 1, 2);
  EXPECT_FLOAT_EQ(out[0], (0 + 1 + 5 + 6) / 4.0f);
  EXPECT_FLOAT_EQ(out[3], (12 + 13 + 17 + 18) / 4.0f);
  for (auto [B, H, W, C, K] :
       {std::array<int, 5>{1, 2, 2, 1, 2}, {2, 5, 6, 3, 2}, {1, 7, 8, 2, 3}}) {
    std::mt19937 rng(static_cast<unsigned>(B + H * 10 + W * 100 + C + K));
    auto x = random_vector(static_cast<std::size_t>(B) * H * W * C, rng);
    const std::size_t n_out = static_cast<std::size_t>(B) * (H / K) * (W / K) * C;
    auto probe = random_vector(n_out, rng);
    std::vector<float> y(n_out), dinp(x.size(), 1e9f);
    auto loss = [&] {
      ek::avgpool_forward_reference(y.data(), x.data(), B, H, W, C, K);
      return dot(y, probe);
    };
    ek::avgpool_backward_reference(dinp.data(), probe.data(), B, H, W, C, K);
    expect_matches_finite_differences(x, dinp, loss, 1e-2f, 1000, 1e-3, "avgpool dinp");
  }
}

TEST(GlobalAvgPoolReference, KnownValuesAndBackwardMatchesFiniteDifferences) {
  const float inp[] = {1, 10, 2, 20, 3, 30, 6, 60};  // 4 positions x 2 channels
  float out[2];
  ek::global_avgpool_forward_reference(out, inp, 1, 4, 2);
  EXPECT_FLOAT_EQ(out[0], 3.0f);
  EXPECT_FLOAT_EQ(out[1], 30.0f);
  std::mt19937 rng(12);
  const int B = 3, HW = 10, C = 4;
  auto x = random_vector(static_cast<std::size_t>(B) * HW * C, rng);
  auto probe = random_vector(static_cast<std::size_t>(B) * C, rng);
  std::vector<float> y(probe.size()), dinp(x.size(), 1e9f);
  auto loss = [&] {
    ek::global_avgpool_forward_reference(y.data(), x.data(), B, HW, C);
    return dot(y, probe);
  };
  ek::global_avgpool_backward_reference(dinp.data(), probe.data(), B, HW, C);
  expect_matches_finite_differences(x, dinp, loss, 1e-2f, 1000, 1e-3, "global avgpool dinp");
}

TEST(DropoutReference, InvertedSeededAndItsOwnGradient) {
  const std::size_t n = 20000;
  const float rate = 0.2f;
  std::mt19937 rng(4);
  auto x = random_vector(n, rng, 0.5f, 1.5f);  // never zero: a zero output means dropped
  std::vector<float> out(n), again(n), other(n);
  ek::dropout_forward(out.data(), x.data(), n, rate, 77);
  ek::dropout_forward(again.data(), x.data(), n, rate, 77);
  ek::dropout_forward(other.data(), x.data(), n, rate, 78);
  EXPECT_EQ(out, again);  // the same seed, the same mask
  EXPECT_NE(out, other);
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < n; i++) {
    if (out[i] == 0.0f) {
      dropped++;
      EXPECT_FALSE(ek::dropout_keeps(77, i, rate));
    } else {
      EXPECT_FLOAT_EQ(out[i], x[i] / (1.0f - rate)) << i;  // inverted: kept ones scaled up
      EXPECT_TRUE(ek::dropout_keeps(77, i, rate));
    }
  }
  // Binomial(20000, 0.2): mean 4000, standard deviation 57.
  EXPECT_NEAR(static_cast<double>(dropped), 4000.0, 300.0);
  // The backward pass applies the same mask; the loss is linear in x, so finite differences
  // match up to rounding.
  std::vector<float> small_x(x.begin(), x.begin() + 300), y(300), dinp(300, 1e9f);
  auto probe = random_vector(300, rng);
  auto loss = [&] {
    ek::dropout_forward(y.data(), small_x.data(), small_x.size(), rate, 5);
    return dot(y, probe);
  };
  ek::dropout_backward(dinp.data(), probe.data(), probe.size(), rate, 5);
  expect_matches_finite_differences(small_x, dinp, loss, 1e-2f, 300, 1e-3, "dropout dinp");
  // Rate 0 keeps everything unchanged.
  ek::dropout_forward(y.data(), small_x.data(), small_x.size(), 0.0f, 5);
  EXPECT_TRUE(std::equal(y.begin(), y.end(), small_x.begin()));
}

TEST(SoftmaxCrossEntropy, ForwardKnownValuesAndBackwardMatchesFiniteDifferences) {
  const int B = 3, NC = 5;
  std::mt19937 rng(5);
  auto logits = random_vector(B * NC, rng, -3, 3);
  const std::int32_t labels[] = {4, 0, 2};
  std::vector<float> probs(B * NC), dlogits(B * NC);
  int correct = -1;
  auto loss = [&] {
    return static_cast<double>(
        ek::softmax_cross_entropy_forward(probs.data(), logits.data(), labels, B, NC, &correct));
  };
  const double l = loss();
  double expected = 0;
  int expected_correct = 0;
  for (int b = 0; b < B; b++) {
    double z = 0;
    for (int k = 0; k < NC; k++) z += std::exp(logits[b * NC + k]);
    expected -= std::log(std::exp(logits[b * NC + labels[b]]) / z) / B;
    const int best =
        static_cast<int>(std::max_element(&logits[b * NC], &logits[b * NC] + NC) - &logits[b * NC]);
    expected_correct += best == labels[b];
  }
  EXPECT_NEAR(l, expected, 1e-5);
  EXPECT_EQ(correct, expected_correct);
  ek::softmax_cross_entropy_backward(dlogits.data(), probs.data(), labels, B, NC);
  expect_matches_finite_differences(logits, dlogits, loss, 1e-2f, 100, 2e-3, "dlogits");
  // Huge logits stay finite.
  std::vector<float> big(NC, 1000.0f);
  big[1] = 1010.0f;
  const float big_loss =
      ek::softmax_cross_entropy_forward(probs.data(), big.data(), labels, 1, NC, nullptr);
  EXPECT_TRUE(std::isfinite(big_loss));
  EXPECT_NEAR(big_loss, 10.0, 1e-3);
}

TEST(StandardizePerImage, ZeroMeanUnitVarianceAndConstantImages) {
  std::mt19937 rng(9);
  const int B = 2, N = 50;
  auto inp = random_vector(B * N, rng, 0, 1);
  std::fill(inp.begin() + N, inp.end(), 0.7f);  // second image is constant
  std::vector<float> out(B * N);
  ek::standardize_per_image(out.data(), inp.data(), B, N);
  double mean = 0, sq = 0;
  for (int i = 0; i < N; i++) mean += out[i] / N;
  for (int i = 0; i < N; i++) sq += (out[i] - mean) * (out[i] - mean) / N;
  EXPECT_NEAR(mean, 0, 1e-5);
  EXPECT_NEAR(sq, 1, 1e-4);
  for (int i = N; i < 2 * N; i++) EXPECT_EQ(out[i], 0.0f);
}

TEST(SgdUpdate, SubtractsScaledGradient) {
  float param[] = {1, 2, 3};
  const float grad[] = {1, -1, 0.5f};
  ek::sgd_update(param, grad, 0.1f, 3);
  EXPECT_FLOAT_EQ(param[0], 0.9f);
  EXPECT_FLOAT_EQ(param[1], 2.1f);
  EXPECT_FLOAT_EQ(param[2], 2.95f);
}

}  // namespace
