// Every XNNPACK-backed training op against its reference (kernels/reference.h), forward
// and backward, on shapes that exercise XNNPACK's tails: odd sizes, batch 1, both packing
// choices (activations vs weights, patches vs output gradient), stride 2, no padding.
// Runs on x86 and under QEMU on aarch64, where XNNPACK takes its NEON paths.
#include <gtest/gtest.h>
#include <pthreadpool.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/reference.h"
#include "kernels/training_xnn.h"

namespace ek = edgetrain::kernels;

namespace {

std::vector<float> random_vector(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Both sides sum `terms` products of magnitude <= 1 in different orders (and XNNPACK with FMA).
void expect_near_all(const std::vector<float>& fast, const std::vector<float>& ref,
                     std::size_t terms, const char* what) {
  ASSERT_EQ(fast.size(), ref.size());
  const float tolerance = 2e-6f * static_cast<float>(terms) + 1e-5f;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < ref.size() && bad < 5; i++) {
    if (!(std::fabs(fast[i] - ref[i]) <= tolerance)) {
      ADD_FAILURE() << what << "[" << i << "]: fast " << fast[i] << " ref " << ref[i]
                    << " tolerance " << tolerance;
      bad++;
    }
  }
}

// A pthreadpool for the tests that run an op on several threads: the result must equal the
// calling thread's bit for bit (kernels/README.md: our loops split work so that every value
// is summed in the same order whatever the thread count). 3 threads split a batch unevenly.
class ThreadPool {
 public:
  explicit ThreadPool(std::size_t threads) : pool_(pthreadpool_create(threads)) {}
  ~ThreadPool() { pthreadpool_destroy(pool_); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  pthreadpool_t get() const { return pool_; }

 private:
  pthreadpool_t pool_;
};

struct FcCase {
  std::size_t B, C, OC;
  ek::Activation activation;
};

class FullyConnectedTrainXnnTest : public ::testing::TestWithParam<FcCase> {};

TEST_P(FullyConnectedTrainXnnTest, MatchesReference) {
  const auto [B, C, OC, activation] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(B * 7919 + C * 31 + OC));
  auto inp = random_vector(B * C, rng), weight = random_vector(OC * C, rng),
       bias = random_vector(OC, rng);
  auto dout = random_vector(B * OC, rng);
  std::vector<float> out_ref(B * OC), out_fast(B * OC, NAN);
  ek::fully_connected_forward_reference(out_ref.data(), inp.data(), weight.data(), bias.data(), B,
                                        C, OC);
  const bool relu = activation == ek::Activation::relu;
  if (relu) ek::relu_forward(out_ref.data(), out_ref.data(), out_ref.size());

  ek::FullyConnectedTrainXnn fc(B, C, OC, activation, nullptr);
  // Twice: the second call runs on recycled operator memory.
  for (int round = 0; round < 2; round++) {
    fc.forward(out_fast.data(), inp.data(), weight.data(), bias.data());
    expect_near_all(out_fast, out_ref, C, "out");

    std::vector<float> d = dout;
    if (relu) ek::relu_backward(d.data(), d.data(), out_ref.data(), d.size());
    std::vector<float> dinp_ref(B * C), dweight_ref(OC * C), dbias_ref(OC);
    ek::fully_connected_backward_reference(dinp_ref.data(), dweight_ref.data(), dbias_ref.data(),
                                           d.data(), inp.data(), weight.data(), B, C, OC);
    std::vector<float> dinp(B * C, NAN), dweight(OC * C, NAN), dbias(OC, NAN);
    fc.backward(dinp.data(), dweight.data(), dbias.data(), dout.data(),
                relu ? out_fast.data() : nullptr, inp.data(), weight.data());
    expect_near_all(dinp, dinp_ref, OC, "dinp");
    expect_near_all(dweight, dweight_ref, B, "dweight");
    expect_near_all(dbias, dbias_ref, B, "dbias");
    // First layer: no input gradient; the others must not change.
    std::vector<float> dweight2(OC * C, NAN);
    fc.backward(nullptr, dweight2.data(), nullptr, dout.data(), relu ? out_fast.data() : nullptr,
                inp.data(), weight.data());
    EXPECT_EQ(dweight, dweight2);
    // On 2 and 3 threads: the same bits.
    for (std::size_t threads : {2, 3}) {
      ThreadPool pool(threads);
      ek::FullyConnectedTrainXnn pooled(B, C, OC, activation, pool.get());
      std::vector<float> out_p(B * OC, NAN), dinp_p(B * C, NAN), dweight_p(OC * C, NAN),
          dbias_p(OC, NAN);
      pooled.forward(out_p.data(), inp.data(), weight.data(), bias.data());
      EXPECT_EQ(out_p, out_fast) << threads << " threads";
      pooled.backward(dinp_p.data(), dweight_p.data(), dbias_p.data(), dout.data(),
                      relu ? out_p.data() : nullptr, inp.data(), weight.data());
      EXPECT_EQ(dinp_p, dinp) << threads << " threads";
      EXPECT_EQ(dweight_p, dweight) << threads << " threads";
      EXPECT_EQ(dbias_p, dbias) << threads << " threads";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FullyConnectedTrainXnnTest,
                         ::testing::Values(FcCase{1, 1, 1, ek::Activation::none},
                                           FcCase{3, 37, 11, ek::Activation::relu},
                                           FcCase{7, 129, 65, ek::Activation::none},
                                           FcCase{5, 20, 5, ek::Activation::relu},
                                           FcCase{32, 128, 10, ek::Activation::none},
                                           FcCase{10, 3136, 128, ek::Activation::relu},
                                           FcCase{1, 784, 10, ek::Activation::none}),
                         [](const ::testing::TestParamInfo<FcCase>& info) {
                           const auto& p = info.param;
                           return "B" + std::to_string(p.B) + "_C" + std::to_string(p.C) + "_OC" +
                                  std::to_string(p.OC) +
                                  (p.activation == ek::Activation::relu ? "_relu" : "");
                         });

struct ConvCase {
  ek::Conv2dShape s;
  ek::Activation activation;
};

class Conv2dXnnTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv2dXnnTest, MatchesReference) {
  const auto [s, activation] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(s.B * 7 + s.H * 13 + s.C * 17 + s.OC * 19 + s.stride));
  const std::size_t n_in = static_cast<std::size_t>(s.B) * s.H * s.W * s.C;
  const std::size_t n_out = static_cast<std::size_t>(s.B) * s.OH() * s.OW() * s.OC;
  const std::size_t K = static_cast<std::size_t>(s.KH) * s.KW * s.C;
  auto inp = random_vector(n_in, rng), weight = random_vector(s.OC * K, rng),
       bias = random_vector(s.OC, rng);
  auto dout = random_vector(n_out, rng);
  const bool relu = activation == ek::Activation::relu;

  std::vector<float> out_ref(n_out), out_fast(n_out, NAN);
  ek::conv2d_forward_reference(out_ref.data(), inp.data(), weight.data(), bias.data(), s);
  if (relu) ek::relu_forward(out_ref.data(), out_ref.data(), n_out);
  std::vector<float> d = dout;
  if (relu) ek::relu_backward(d.data(), d.data(), out_ref.data(), n_out);
  std::vector<float> dinp_ref(n_in), dweight_ref(s.OC * K), dbias_ref(s.OC);
  ek::conv2d_backward_reference(dinp_ref.data(), dweight_ref.data(), dbias_ref.data(), d.data(),
                                inp.data(), weight.data(), s);

  ek::Conv2dXnn conv(s, activation, nullptr);
  for (int round = 0; round < 2; round++) {
    fill(out_fast.begin(), out_fast.end(), NAN);
    conv.forward(out_fast.data(), inp.data(), weight.data(), bias.data());
    expect_near_all(out_fast, out_ref, K, "out");
    // The second round asks for no input gradient, as for a first layer (C == 1 then
    // takes the direct weight-gradient loop).
    const bool want_dinp = round == 0;
    std::vector<float> dinp(n_in, NAN), dweight(s.OC * K, NAN), dbias(s.OC, NAN);
    conv.backward(want_dinp ? dinp.data() : nullptr, dweight.data(), dbias.data(), dout.data(),
                  relu ? out_fast.data() : nullptr, inp.data(), weight.data());
    if (want_dinp)
      expect_near_all(dinp, dinp_ref, static_cast<std::size_t>(s.OC) * s.KH * s.KW, "dinp");
    const std::size_t M = static_cast<std::size_t>(s.B) * s.OH() * s.OW();
    expect_near_all(dweight, dweight_ref, M, "dweight");
    expect_near_all(dbias, dbias_ref, M, "dbias");
    // Masking the caller's dout in place (the trainer's way) gives the same bits.
    ek::Conv2dXnn in_place(s, activation, nullptr);
    std::vector<float> scratch = dout, dinp2(n_in, NAN), dweight2(s.OC * K, NAN), dbias2(s.OC, NAN);
    in_place.backward_overwriting_dout(want_dinp ? dinp2.data() : nullptr, dweight2.data(),
                                       dbias2.data(), scratch.data(),
                                       relu ? out_fast.data() : nullptr, inp.data(), weight.data());
    if (want_dinp) {
      EXPECT_EQ(dinp2, dinp);
    }
    EXPECT_EQ(dweight2, dweight);
    EXPECT_EQ(dbias2, dbias);
    // The input gradient alone (dweight null) is the same; dbias is still written.
    if (want_dinp) {
      std::vector<float> scratch3 = dout, dinp3(n_in, NAN), dbias3(s.OC, NAN);
      in_place.backward_overwriting_dout(dinp3.data(), nullptr, dbias3.data(), scratch3.data(),
                                         relu ? out_fast.data() : nullptr, inp.data(),
                                         weight.data());
      EXPECT_EQ(dinp3, dinp);
      // One input channel sums the bias gradient image by image with the weight gradient;
      // alone, in one pass over the rows: the same up to rounding.
      if (s.C > 1) {
        EXPECT_EQ(dbias3, dbias);
      } else {
        expect_near_all(dbias3, dbias, M, "dbias (input gradient alone)");
      }
    }
    // On 2 and 3 threads (images split over slots, per-image sums, blocks of our loops): the
    // same bits as on the calling thread.
    for (std::size_t threads : {2, 3}) {
      ThreadPool pool(threads);
      ek::Conv2dXnn pooled(s, activation, pool.get());
      std::vector<float> out_p(n_out, NAN), scratch_p = dout, dinp_p(n_in, NAN),
                                            dweight_p(s.OC * K, NAN), dbias_p(s.OC, NAN);
      pooled.forward(out_p.data(), inp.data(), weight.data(), bias.data());
      EXPECT_EQ(out_p, out_fast) << threads << " threads";
      pooled.backward_overwriting_dout(want_dinp ? dinp_p.data() : nullptr, dweight_p.data(),
                                       dbias_p.data(), scratch_p.data(),
                                       relu ? out_p.data() : nullptr, inp.data(), weight.data());
      if (want_dinp) {
        EXPECT_EQ(dinp_p, dinp) << threads << " threads";
      }
      EXPECT_EQ(dweight_p, dweight) << threads << " threads";
      EXPECT_EQ(dbias_p, dbias) << threads << " threads";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Conv2dXnnTest,
    ::testing::Values(
        ConvCase{{1, 5, 5, 1, 2}, ek::Activation::none},
        ConvCase{{2, 7, 6, 3, 5}, ek::Activation::relu},
        ConvCase{{3, 9, 9, 4, 17}, ek::Activation::none},     // K = 36 > OC: packs dout
        ConvCase{{1, 28, 28, 1, 32}, ek::Activation::relu},   // paper conv1, batch 1
        ConvCase{{2, 14, 14, 32, 64}, ek::Activation::relu},  // paper conv2
        ConvCase{{5, 28, 28, 1, 32}, ek::Activation::relu},   // conv1, images on threads
        ConvCase{{5, 14, 14, 32, 64}, ek::Activation::relu},  // conv2: 3 threads split 5 unevenly
        ConvCase{{2, 7, 7, 3, 4, 3, 3, 2, 1}, ek::Activation::none},  // stride 2, odd size
        ConvCase{{2, 8, 8, 3, 4, 3, 3, 2, 1}, ek::Activation::none},  // stride 2, adjustment
        ConvCase{{1, 6, 5, 2, 3, 2, 3, 1, 0}, ek::Activation::relu},  // 2x3 kernel, no padding
        // one input channel: the direct weight-gradient loop
        ConvCase{{2, 7, 7, 1, 4, 3, 3, 2, 1}, ek::Activation::relu},  // stride 2, odd size
        ConvCase{{1, 6, 5, 1, 3, 2, 3, 1, 0}, ek::Activation::none},  // 2x3 kernel, no padding
        ConvCase{{2, 5, 9, 1, 5, 5, 5, 1, 2}, ek::Activation::relu},  // 5x5, wide padding
        // pointwise (1x1): MobileNet's channel mixing, K = C; and 1x1 with stride 2
        ConvCase{{2, 7, 7, 8, 16, 1, 1, 1, 0}, ek::Activation::relu},
        ConvCase{{3, 5, 6, 24, 6, 1, 1, 1, 0}, ek::Activation::none},  // K = 24 > OC
        ConvCase{{2, 7, 7, 4, 8, 1, 1, 2, 0}, ek::Activation::none},
        // stride 2 with 'same' padding on an even size, as `conv 32 3x3 stride 2 same`
        ConvCase{{2, 28, 28, 1, 8, 3, 3, 2, 1}, ek::Activation::relu},
        ConvCase{{2, 14, 14, 8, 16, 3, 3, 2, 1}, ek::Activation::relu},
        // resnet-8's 16-channel block (K = 144 > OC: the transposed im2col from channel
        // planes, memcpy rows), and a 5x5 kernel whose padding of 2 zeroes two border columns
        ConvCase{{2, 28, 28, 16, 16}, ek::Activation::relu},
        ConvCase{{2, 6, 9, 3, 4, 5, 5, 1, 2}, ek::Activation::none},
        ConvCase{{2, 9, 6, 3, 4, 5, 5, 2, 2}, ek::Activation::relu}),
    [](const ::testing::TestParamInfo<ConvCase>& info) {
      const auto& s = info.param.s;
      return "B" + std::to_string(s.B) + "_H" + std::to_string(s.H) + "_W" + std::to_string(s.W) +
             "_C" + std::to_string(s.C) + "_OC" + std::to_string(s.OC) + "_K" +
             std::to_string(s.KH) + std::to_string(s.KW) + "_S" + std::to_string(s.stride) + "_P" +
             std::to_string(s.pad) + (info.param.activation == ek::Activation::relu ? "_relu" : "");
    });

class MaxPool2x2XnnTest : public ::testing::TestWithParam<std::array<int, 4>> {};

TEST_P(MaxPool2x2XnnTest, MatchesReference) {
  const auto [B, H, W, C] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(B + H * 10 + W * 100 + C * 1000));
  // Distinct values, so the maximum of every window is unique (tie order is not compared).
  std::vector<float> inp(static_cast<std::size_t>(B) * H * W * C);
  for (std::size_t i = 0; i < inp.size(); i++) inp[i] = static_cast<float>(i) * 0.25f - 7.0f;
  std::shuffle(inp.begin(), inp.end(), rng);
  const std::size_t n_out = static_cast<std::size_t>(B) * (H / 2) * (W / 2) * C;
  std::vector<float> out_ref(n_out), out_fast(n_out, NAN);
  std::vector<std::uint32_t> argmax(n_out), window(n_out, 99);
  ek::maxpool2x2_forward_reference(out_ref.data(), argmax.data(), inp.data(), B, H, W, C);
  ek::MaxPool2x2Xnn pool(B, H, W, C, nullptr);
  pool.forward(out_fast.data(), window.data(), inp.data());
  EXPECT_EQ(out_fast, out_ref);
  for (std::size_t i = 0; i < n_out; i++)
    ASSERT_EQ(pool.window_index_to_flat(i, window[i]), argmax[i]) << i;

  auto dout = random_vector(n_out, rng);
  std::vector<float> dinp_ref(inp.size()), dinp_fast(inp.size(), NAN);
  ek::maxpool2x2_backward_reference(dinp_ref.data(), dout.data(), argmax.data(), B, H, W, C);
  pool.backward(dinp_fast.data(), dout.data(), window.data());
  EXPECT_EQ(dinp_fast, dinp_ref);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MaxPool2x2XnnTest,
                         ::testing::Values(std::array<int, 4>{1, 2, 2, 1},
                                           std::array<int, 4>{2, 5, 6, 3},
                                           std::array<int, 4>{1, 7, 7, 5},
                                           std::array<int, 4>{3, 28, 28, 32},
                                           std::array<int, 4>{2, 14, 14, 64}));

class DepthwiseConv2dXnnTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(DepthwiseConv2dXnnTest, MatchesReference) {
  const auto [s, activation] = GetParam();
  ASSERT_EQ(s.C, s.OC);
  std::mt19937 rng(static_cast<unsigned>(s.B * 7 + s.H * 13 + s.C * 17 + s.KH * 19 + s.stride));
  const std::size_t n_in = static_cast<std::size_t>(s.B) * s.H * s.W * s.C;
  const std::size_t n_out = static_cast<std::size_t>(s.B) * s.OH() * s.OW() * s.C;
  const std::size_t taps = static_cast<std::size_t>(s.KH) * s.KW;
  auto inp = random_vector(n_in, rng), weight = random_vector(s.C * taps, rng),
       bias = random_vector(s.C, rng), dout = random_vector(n_out, rng);
  const bool relu = activation == ek::Activation::relu;

  std::vector<float> out_ref(n_out), out_fast(n_out, NAN);
  ek::depthwise_conv2d_forward_reference(out_ref.data(), inp.data(), weight.data(), bias.data(), s);
  if (relu) ek::relu_forward(out_ref.data(), out_ref.data(), n_out);
  std::vector<float> d = dout;
  if (relu) ek::relu_backward(d.data(), d.data(), out_ref.data(), n_out);
  std::vector<float> dinp_ref(n_in), dweight_ref(s.C * taps), dbias_ref(s.C);
  ek::depthwise_conv2d_backward_reference(dinp_ref.data(), dweight_ref.data(), dbias_ref.data(),
                                          d.data(), inp.data(), weight.data(), s);

  ek::DepthwiseConv2dXnn conv(s, activation, nullptr);
  const std::size_t M = static_cast<std::size_t>(s.B) * s.OH() * s.OW();
  for (int round = 0; round < 2; round++) {  // the second without input gradient (first layer)
    std::fill(out_fast.begin(), out_fast.end(), NAN);
    conv.forward(out_fast.data(), inp.data(), weight.data(), bias.data());
    expect_near_all(out_fast, out_ref, taps, "out");
    const bool want_dinp = round == 0;
    std::vector<float> scratch = dout, dinp(n_in, NAN), dweight(s.C * taps, NAN), dbias(s.C, NAN);
    conv.backward_overwriting_dout(want_dinp ? dinp.data() : nullptr, dweight.data(), dbias.data(),
                                   scratch.data(), relu ? out_fast.data() : nullptr, inp.data(),
                                   weight.data());
    if (want_dinp) expect_near_all(dinp, dinp_ref, taps, "dinp");
    expect_near_all(dweight, dweight_ref, M, "dweight");
    expect_near_all(dbias, dbias_ref, M, "dbias");
    ThreadPool pool(2);  // the mask and bias gradient in blocks: the same bits
    ek::DepthwiseConv2dXnn pooled(s, activation, pool.get());
    std::vector<float> out_p(n_out, NAN), scratch_p = dout, dinp_p(n_in, NAN),
                                          dweight_p(s.C * taps, NAN), dbias_p(s.C, NAN);
    pooled.forward(out_p.data(), inp.data(), weight.data(), bias.data());
    EXPECT_EQ(out_p, out_fast);
    pooled.backward_overwriting_dout(want_dinp ? dinp_p.data() : nullptr, dweight_p.data(),
                                     dbias_p.data(), scratch_p.data(),
                                     relu ? out_p.data() : nullptr, inp.data(), weight.data());
    if (want_dinp) {
      EXPECT_EQ(dinp_p, dinp);
    }
    EXPECT_EQ(dweight_p, dweight);
    EXPECT_EQ(dbias_p, dbias);
  }
  EXPECT_THROW(ek::DepthwiseConv2dXnn(ek::Conv2dShape{1, 5, 5, 2, 3}, activation, nullptr),
               std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DepthwiseConv2dXnnTest,
    ::testing::Values(ConvCase{{1, 5, 5, 1, 1}, ek::Activation::none},
                      ConvCase{{2, 7, 6, 3, 3}, ek::Activation::relu},
                      ConvCase{{2, 14, 14, 32, 32}, ek::Activation::relu},  // MobileNet-sized
                      ConvCase{{2, 7, 7, 5, 5, 3, 3, 2, 1}, ek::Activation::none},  // stride 2, odd
                      ConvCase{{2, 8, 8, 17, 17, 3, 3, 2, 1}, ek::Activation::relu},  // adjustment
                      ConvCase{{1, 9, 8, 4, 4, 5, 5, 1, 2}, ek::Activation::relu},    // 5x5 same
                      ConvCase{{3, 6, 7, 6, 6, 3, 3, 1, 0}, ek::Activation::none}),   // valid
    [](const ::testing::TestParamInfo<ConvCase>& info) {
      const auto& s = info.param.s;
      return "B" + std::to_string(s.B) + "_H" + std::to_string(s.H) + "_W" + std::to_string(s.W) +
             "_C" + std::to_string(s.C) + "_K" + std::to_string(s.KH) + "_S" +
             std::to_string(s.stride) + "_P" + std::to_string(s.pad) +
             (info.param.activation == ek::Activation::relu ? "_relu" : "");
    });

class AvgPoolXnnTest : public ::testing::TestWithParam<std::array<int, 5>> {};

TEST_P(AvgPoolXnnTest, MatchesReference) {
  const auto [B, H, W, C, K] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(B + H * 10 + W * 100 + C * 1000 + K));
  auto inp = random_vector(static_cast<std::size_t>(B) * H * W * C, rng);
  const std::size_t n_out = static_cast<std::size_t>(B) * (H / K) * (W / K) * C;
  std::vector<float> out_ref(n_out), out_fast(n_out, NAN);
  ek::avgpool_forward_reference(out_ref.data(), inp.data(), B, H, W, C, K);
  ek::AvgPoolXnn pool(B, H, W, C, K, nullptr);
  pool.forward(out_fast.data(), inp.data());
  expect_near_all(out_fast, out_ref, static_cast<std::size_t>(K) * K, "out");
  auto dout = random_vector(n_out, rng);
  std::vector<float> dinp_ref(inp.size()), dinp_fast(inp.size(), NAN);
  ek::avgpool_backward_reference(dinp_ref.data(), dout.data(), B, H, W, C, K);
  pool.backward(dinp_fast.data(), dout.data());
  expect_near_all(dinp_fast, dinp_ref, 1, "dinp");
}

INSTANTIATE_TEST_SUITE_P(Shapes, AvgPoolXnnTest,
                         ::testing::Values(std::array<int, 5>{1, 2, 2, 1, 2},
                                           std::array<int, 5>{2, 5, 6, 3, 2},
                                           std::array<int, 5>{2, 7, 8, 5, 3},
                                           std::array<int, 5>{3, 14, 14, 32, 2},
                                           std::array<int, 5>{2, 7, 7, 64, 7}));

TEST(GlobalAvgPoolXnn, MatchesReference) {
  for (auto [B, HW, C] : {std::array<int, 3>{1, 1, 3}, {2, 49, 64}, {3, 10, 17}}) {
    std::mt19937 rng(static_cast<unsigned>(B + HW * 10 + C * 100));
    auto inp = random_vector(static_cast<std::size_t>(B) * HW * C, rng);
    std::vector<float> out_ref(static_cast<std::size_t>(B) * C), out_fast(out_ref.size(), NAN);
    ek::global_avgpool_forward_reference(out_ref.data(), inp.data(), B, HW, C);
    ek::GlobalAvgPoolXnn pool(B, HW, C, nullptr);
    pool.forward(out_fast.data(), inp.data());
    expect_near_all(out_fast, out_ref, static_cast<std::size_t>(HW), "out");
    auto dout = random_vector(out_ref.size(), rng);
    std::vector<float> dinp_ref(inp.size()), dinp_fast(inp.size(), NAN);
    ek::global_avgpool_backward_reference(dinp_ref.data(), dout.data(), B, HW, C);
    pool.backward(dinp_fast.data(), dout.data());
    expect_near_all(dinp_fast, dinp_ref, 1, "dinp");
  }
}

TEST(OwnKernels, TransposeAndBiasBackward) {
  std::mt19937 rng(1);
  // 4x4 vector blocks inside 32x32 tiles, with leftover rows and columns of each; an image's
  // 784 pixels x 16 channels (resnet-8's planes); smaller than one block.
  for (const auto& [n_rows, n_cols] :
       std::vector<std::pair<std::size_t, std::size_t>>{{784, 16}, {3, 5}, {4, 4}, {37, 70}}) {
    auto m = random_vector(n_rows * n_cols, rng);
    std::vector<float> mt(n_rows * n_cols, NAN);
    ek::transpose(mt.data(), m.data(), n_rows, n_cols);
    for (std::size_t r = 0; r < n_rows; r++)
      for (std::size_t c = 0; c < n_cols; c++)
        ASSERT_EQ(mt[c * n_rows + r], m[r * n_cols + c]) << n_rows << "x" << n_cols;
  }
  const std::size_t rows = 37, cols = 70;
  auto a = random_vector(rows * cols, rng);
  std::vector<float> dbias(cols, NAN);
  ek::bias_backward(dbias.data(), a.data(), rows, cols);
  for (std::size_t c = 0; c < cols; c++) {
    double sum = 0;
    for (std::size_t r = 0; r < rows; r++) sum += a[r * cols + c];
    EXPECT_NEAR(dbias[c], sum, 1e-4);
  }
}

}  // namespace
