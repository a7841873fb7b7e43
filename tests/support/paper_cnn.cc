#include "tests/support/paper_cnn.h"

#include <cmath>
#include <random>

namespace edgetrain::testing {

namespace ek = kernels;

const PaperCnn::Tensor PaperCnn::kTensors[PaperCnn::kTensorCount] = {
    {0, 32 * 9},          // conv1 weight [32][3][3][1]
    {288, 32},            // conv1 bias
    {320, 64 * 9 * 32},   // conv2 weight [64][3][3][32]
    {18752, 64},          // conv2 bias
    {18816, 128 * 3136},  // fc1 weight [128][3136]
    {420224, 128},        // fc1 bias
    {420352, 10 * 128},   // fc2 weight [10][128]
    {421632, 10},         // fc2 bias
};

PaperCnn::PaperCnn(int B, Path path, pthreadpool_t pool)
    : params(kParameterCount),
      grads(kParameterCount),
      B_(B),
      path_(path),
      conv1_{B, 28, 28, 1, 32},
      conv2_{B, 14, 14, 32, 64} {
  const std::size_t b = B;
  a1_.resize(b * 28 * 28 * 32), p1_.resize(b * 14 * 14 * 32), a2_.resize(b * 14 * 14 * 64);
  p2_.resize(b * 3136), h_.resize(b * 128), logits_.resize(b * 10), probs_.resize(b * 10);
  da1_.resize(a1_.size()), dp1_.resize(p1_.size()), da2_.resize(a2_.size()),
      dp2_.resize(p2_.size());
  dh_.resize(h_.size()), dlogits_.resize(logits_.size());
  idx1_.resize(p1_.size()), idx2_.resize(p2_.size());
  if (path == Path::fast) {
    conv1_xnn_ = std::make_unique<ek::Conv2dXnn>(conv1_, ek::Activation::relu, pool);
    conv2_xnn_ = std::make_unique<ek::Conv2dXnn>(conv2_, ek::Activation::relu, pool);
    pool1_xnn_ = std::make_unique<ek::MaxPool2x2Xnn>(B, 28, 28, 32, pool);
    pool2_xnn_ = std::make_unique<ek::MaxPool2x2Xnn>(B, 14, 14, 64, pool);
    fc1_xnn_ =
        std::make_unique<ek::FullyConnectedTrainXnn>(b, 3136, 128, ek::Activation::relu, pool);
    fc2_xnn_ = std::make_unique<ek::FullyConnectedTrainXnn>(b, 128, 10, ek::Activation::none, pool);
  }
}

void PaperCnn::init_parameters(unsigned seed) {
  std::mt19937 rng(seed);
  const std::size_t fan_in[kTensorCount] = {9, 0, 288, 0, 3136, 0, 128, 0};
  for (int t = 0; t < kTensorCount; t++) {
    if (fan_in[t] == 0) {
      std::fill(p(t), p(t) + kTensors[t].size, 0.0f);
      continue;
    }
    // LeCun uniform (variance 1/fan_in): keeps the initial logits small, loss near ln 10.
    const float limit = std::sqrt(3.0f / static_cast<float>(fan_in[t]));
    std::uniform_real_distribution<float> dist(-limit, limit);
    for (std::size_t i = 0; i < kTensors[t].size; i++) p(t)[i] = dist(rng);
  }
}

void PaperCnn::forward(const float* images) {
  if (path_ == Path::fast) {
    conv1_xnn_->forward(a1_.data(), images, p(0), p(1));
    pool1_xnn_->forward(p1_.data(), idx1_.data(), a1_.data());
    conv2_xnn_->forward(a2_.data(), p1_.data(), p(2), p(3));
    pool2_xnn_->forward(p2_.data(), idx2_.data(), a2_.data());
    fc1_xnn_->forward(h_.data(), p2_.data(), p(4), p(5));
    fc2_xnn_->forward(logits_.data(), h_.data(), p(6), p(7));
    return;
  }
  ek::conv2d_forward_reference(a1_.data(), images, p(0), p(1), conv1_);
  ek::relu_forward(a1_.data(), a1_.data(), a1_.size());
  ek::maxpool2x2_forward_reference(p1_.data(), idx1_.data(), a1_.data(), B_, 28, 28, 32);
  ek::conv2d_forward_reference(a2_.data(), p1_.data(), p(2), p(3), conv2_);
  ek::relu_forward(a2_.data(), a2_.data(), a2_.size());
  ek::maxpool2x2_forward_reference(p2_.data(), idx2_.data(), a2_.data(), B_, 14, 14, 64);
  ek::fully_connected_forward_reference(h_.data(), p2_.data(), p(4), p(5), B_, 3136, 128);
  ek::relu_forward(h_.data(), h_.data(), h_.size());
  ek::fully_connected_forward_reference(logits_.data(), h_.data(), p(6), p(7), B_, 128, 10);
}

float PaperCnn::loss(const float* images, const std::int32_t* labels) {
  forward(images);
  return ek::softmax_cross_entropy_forward(probs_.data(), logits_.data(), labels, B_, kClasses,
                                           nullptr);
}

float PaperCnn::forward_backward(const float* images, const std::int32_t* labels, int* correct) {
  forward(images);
  const float mean_loss = ek::softmax_cross_entropy_forward(probs_.data(), logits_.data(), labels,
                                                            B_, kClasses, correct);
  ek::softmax_cross_entropy_backward(dlogits_.data(), probs_.data(), labels, B_, kClasses);
  if (path_ == Path::fast) {
    fc2_xnn_->backward(dh_.data(), g(6), g(7), dlogits_.data(), nullptr, h_.data(), p(6));
    fc1_xnn_->backward(dp2_.data(), g(4), g(5), dh_.data(), h_.data(), p2_.data(), p(4));
    pool2_xnn_->backward(da2_.data(), dp2_.data(), idx2_.data());
    conv2_xnn_->backward(dp1_.data(), g(2), g(3), da2_.data(), a2_.data(), p1_.data(), p(2));
    pool1_xnn_->backward(da1_.data(), dp1_.data(), idx1_.data());
    conv1_xnn_->backward(nullptr, g(0), g(1), da1_.data(), a1_.data(), images, p(0));
    return mean_loss;
  }
  ek::fully_connected_backward_reference(dh_.data(), g(6), g(7), dlogits_.data(), h_.data(), p(6),
                                         B_, 128, 10);
  ek::relu_backward(dh_.data(), dh_.data(), h_.data(), dh_.size());
  ek::fully_connected_backward_reference(dp2_.data(), g(4), g(5), dh_.data(), p2_.data(), p(4), B_,
                                         3136, 128);
  ek::maxpool2x2_backward_reference(da2_.data(), dp2_.data(), idx2_.data(), B_, 14, 14, 64);
  ek::relu_backward(da2_.data(), da2_.data(), a2_.data(), da2_.size());
  ek::conv2d_backward_reference(dp1_.data(), g(2), g(3), da2_.data(), p1_.data(), p(2), conv2_);
  ek::maxpool2x2_backward_reference(da1_.data(), dp1_.data(), idx1_.data(), B_, 28, 28, 32);
  ek::relu_backward(da1_.data(), da1_.data(), a1_.data(), da1_.size());
  ek::conv2d_backward_reference(nullptr, g(0), g(1), da1_.data(), images, p(0), conv1_);
  return mean_loss;
}

SyntheticDigits::SyntheticDigits(unsigned seed, float noise)
    : templates_(10 * 784), noise_(noise), rng_(seed) {
  std::normal_distribution<float> dist(0, 1);
  for (auto& v : templates_) v = dist(rng_);
}

void SyntheticDigits::batch(float* images, std::int32_t* labels, int B) {
  std::normal_distribution<float> dist(0, 1);
  std::uniform_int_distribution<int> label(0, 9);
  for (int b = 0; b < B; b++) {
    labels[b] = label(rng_);
    for (int i = 0; i < 784; i++)
      images[b * 784 + i] = templates_[labels[b] * 784 + i] + noise_ * dist(rng_);
  }
  ek::standardize_per_image(images, images, B, 784);
}

}  // namespace edgetrain::testing
