// The paper CNN (Hardy et al. 2017) composed from kernels/ ops, for tests and benchmarks:
// conv3x3 1->32 + ReLU + maxpool2 -> conv3x3 32->64 + ReLU + maxpool2 -> FC 3136->128 +
// ReLU -> FC 128->10, softmax cross-entropy; 28x28x1 NHWC inputs; 421,642 parameters in
// one arena. Either every op is a reference loop (Path::reference) or the XNNPACK-backed
// ops of kernels/training_xnn.h (Path::fast). The real model lives in model/; this
// copy exists so the kernels can be tested and measured as a whole without depending on it.
#pragma once

#include <pthreadpool.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kernels/reference.h"
#include "kernels/training_xnn.h"

namespace edgetrain::testing {

class PaperCnn {
 public:
  enum class Path { reference, fast };
  static constexpr int kH = 28, kW = 28, kClasses = 10;
  static constexpr std::size_t kParameterCount = 421642;

  // One tensor of the parameter arena: offset and size in floats.
  struct Tensor {
    std::size_t offset, size;
  };
  // conv1 weight, conv1 bias, conv2 weight, conv2 bias, fc1 weight, fc1 bias, fc2 weight, fc2 bias.
  static constexpr int kTensorCount = 8;
  static const Tensor kTensors[kTensorCount];

  PaperCnn(int B, Path path, pthreadpool_t pool);

  // LeCun uniform initialization, biases zero; deterministic in `seed`.
  void init_parameters(unsigned seed);
  // Forward and backward on one batch of standardized images [B][28][28][1]; fills
  // gradients() and returns the mean loss. *correct (nullable) counts right predictions.
  float forward_backward(const float* images, const std::int32_t* labels, int* correct);
  // Mean loss only (used by finite differences).
  float loss(const float* images, const std::int32_t* labels);
  void sgd_step(float lr) { kernels::sgd_update(params.data(), grads.data(), lr, params.size()); }

  std::vector<float> params, grads;

 private:
  void forward(const float* images);
  float* p(int t) { return params.data() + kTensors[t].offset; }
  float* g(int t) { return grads.data() + kTensors[t].offset; }

  int B_;
  Path path_;
  kernels::Conv2dShape conv1_, conv2_;
  std::unique_ptr<kernels::Conv2dXnn> conv1_xnn_, conv2_xnn_;
  std::unique_ptr<kernels::MaxPool2x2Xnn> pool1_xnn_, pool2_xnn_;
  std::unique_ptr<kernels::FullyConnectedTrainXnn> fc1_xnn_, fc2_xnn_;
  // Activations and their gradients, allocated once.
  std::vector<float> a1_, p1_, a2_, p2_, h_, logits_, probs_;
  std::vector<float> da1_, dp1_, da2_, dp2_, dh_, dlogits_;
  std::vector<std::uint32_t> idx1_, idx2_;
};

// Linearly separable stand-in for digits: class k is a fixed random 28x28 template plus
// Gaussian noise, standardized per image. Deterministic in the seed.
class SyntheticDigits {
 public:
  explicit SyntheticDigits(unsigned seed, float noise = 0.5f);
  void batch(float* images, std::int32_t* labels, int B);

 private:
  std::vector<float> templates_;  // [10][784]
  float noise_;
  std::mt19937 rng_;
};

}  // namespace edgetrain::testing
