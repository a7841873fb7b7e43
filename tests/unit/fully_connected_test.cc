// The XNNPACK fully-connected operator against the reference loops, on shapes that
// exercise XNNPACK's tails (odd channel counts, batch 1) on both x86 and NEON paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/fully_connected.h"

namespace {

struct Shape {
  std::size_t B, C, OC;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "B=" << s.B << " C=" << s.C << " OC=" << s.OC;
}

class FullyConnectedTest : public ::testing::TestWithParam<Shape> {};

TEST_P(FullyConnectedTest, XnnpackMatchesReference) {
  const auto [B, C, OC] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(B * 1000003 + C * 1009 + OC));
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> inp(B * C), weight(OC * C), bias(OC), fast(B * OC, NAN), ref(B * OC);
  for (auto* v : {&inp, &weight, &bias})
    std::generate(v->begin(), v->end(), [&] { return dist(rng); });

  edgetrain::kernels::FullyConnectedXnn fc(C, OC, weight.data(), bias.data(), /*pool=*/nullptr);
  fc.forward(fast.data(), inp.data(), B);
  edgetrain::kernels::fully_connected_forward_reference(ref.data(), inp.data(), weight.data(),
                                                        bias.data(), B, C, OC);
  // Sums of C products of magnitude <= 1, accumulated in a different order.
  const float tolerance = 1e-5f * static_cast<float>(C) + 1e-6f;
  for (std::size_t i = 0; i < ref.size(); i++)
    ASSERT_NEAR(fast[i], ref[i], tolerance) << "at " << i;
}

TEST(FullyConnected, ReferenceComputesKnownValues) {
  // out = x · W^T + b with W = [[1,2,3],[4,5,6]], b = [0.5,-1].
  const float weight[] = {1, 2, 3, 4, 5, 6}, bias[] = {0.5f, -1}, inp[] = {1, 1, 1, 2, 0, 1};
  float out[4];
  edgetrain::kernels::fully_connected_forward_reference(out, inp, weight, bias, 2, 3, 2);
  EXPECT_FLOAT_EQ(out[0], 6.5f);
  EXPECT_FLOAT_EQ(out[1], 14.0f);
  EXPECT_FLOAT_EQ(out[2], 5.5f);
  EXPECT_FLOAT_EQ(out[3], 13.0f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FullyConnectedTest,
                         ::testing::Values(Shape{1, 1, 1}, Shape{1, 784, 10}, Shape{3, 37, 11},
                                           Shape{10, 3136, 128}, Shape{7, 129, 65},
                                           Shape{32, 128, 10}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return "B" + std::to_string(info.param.B) + "_C" +
                                  std::to_string(info.param.C) + "_OC" +
                                  std::to_string(info.param.OC);
                         });

}  // namespace
