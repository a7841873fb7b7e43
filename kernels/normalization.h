// Normalization layers for training (issue 35): group normalization (Wu & He, 2018) and
// batch normalization (Ioffe & Szegedy, 2015), forward and backward, on NHWC activations
// seen as [B][HW][C].
//
// Each op has a reference version in plain loops (the definition, double accumulators, kept
// simple on purpose) and a fast version, a class built once per shape that owns the saved
// statistics and its scratch: XNNPACK 2022 has no normalization operator, so the fast
// versions are our loops, written so the compiler vectorizes them over channels: per
// example (group norm) or per batch (batch norm) one pass gathers per-channel sums, and one
// pass applies a per-channel scale and shift (forward) or the backward's per-channel
// coefficients. They run on the calling thread; nothing allocates after construction.
//
// Both normalize with 1/sqrt(var + eps), var the biased (1/M) variance, and then apply a
// per-channel affine map gamma[c]·x̂ + beta[c], as PyTorch's GroupNorm and BatchNorm2d do
// (eps 1e-5, kNormalizationEps, as PyTorch's default).
// Backward ops overwrite their outputs (dgamma, dbeta are sums over the whole batch); dinp
// may be null (a first layer).
#pragma once

#include <cstddef>
#include <vector>

namespace edgetrain::kernels {

constexpr float kNormalizationEps = 1e-5f;
// Batch norm's running statistics: running = (1 − momentum)·running + momentum·batch, with
// the batch variance unbiased (M/(M − 1)), as PyTorch's BatchNorm2d (momentum 0.1).
constexpr float kBatchNormMomentum = 0.1f;

// --- Group normalization: statistics per example and group of C/G consecutive channels,
// over its HW positions; C % G == 0. mean, invstd [B][G] receive the saved statistics.
void group_norm_forward_reference(float* out, float* mean, float* invstd, const float* inp,
                                  const float* gamma, const float* beta, int B, int HW, int C,
                                  int G, float eps = kNormalizationEps);
void group_norm_backward_reference(float* dinp, float* dgamma, float* dbeta, const float* dout,
                                   const float* inp, const float* mean, const float* invstd,
                                   const float* gamma, int B, int HW, int C, int G);

// --- Batch normalization, training: statistics per channel over all B·HW positions.
// mean, invstd [C] receive the batch's statistics (what the backward pass needs).
void batch_norm_forward_reference(float* out, float* mean, float* invstd, const float* inp,
                                  const float* gamma, const float* beta, int B, int HW, int C,
                                  float eps = kNormalizationEps);
void batch_norm_backward_reference(float* dinp, float* dgamma, float* dbeta, const float* dout,
                                   const float* inp, const float* mean, const float* invstd,
                                   const float* gamma, int B, int HW, int C);
// Evaluation: out = gamma·(x − running_mean)/sqrt(running_var + eps) + beta, per channel.
void batch_norm_inference(float* out, const float* inp, const float* gamma, const float* beta,
                          const float* running_mean, const float* running_var, int B, int HW, int C,
                          float eps = kNormalizationEps);
// The momentum update of the running statistics from a batch's mean and invstd over
// `positions` = B·HW values per channel (the variance unbiased; as is when positions is 1).
void batch_norm_update_running(float* running_mean, float* running_var, const float* mean,
                               const float* invstd, int C, std::size_t positions,
                               float momentum = kBatchNormMomentum, float eps = kNormalizationEps);

// Fast group normalization for `B` examples of HW x C (G groups).
class GroupNormOp {
 public:
  GroupNormOp(int B, int HW, int C, int G, float eps = kNormalizationEps);
  void forward(float* out, const float* inp, const float* gamma, const float* beta);
  // After forward() on the same `inp` (uses the statistics it saved).
  void backward(float* dinp, float* dgamma, float* dbeta, const float* dout, const float* inp,
                const float* gamma);
  const float* mean() const { return mean_.data(); }
  const float* invstd() const { return invstd_.data(); }

 private:
  int B_, HW_, C_, G_;
  float eps_;
  std::vector<float> mean_, invstd_;  // [B][G]
  // Per-channel scratch for one example: sums, then the scale/shift or the backward's
  // coefficients.
  std::vector<float> sum_a_, sum_b_, coef_a_, coef_b_, coef_c_;
};

// Fast batch normalization, built for up to `max_batch` rows. Training statistics come from
// the first `count` rows only; rows count..max_batch − 1 (a zero-padded batch) are normalized
// with them too, and get a zero input gradient, so they change no statistic and no gradient.
class BatchNormOp {
 public:
  BatchNormOp(int max_batch, int HW, int C, float eps = kNormalizationEps);
  void forward_training(float* out, const float* inp, const float* gamma, const float* beta,
                        int count);
  void backward(float* dinp, float* dgamma, float* dbeta, const float* dout, const float* inp,
                const float* gamma, int count);
  const float* mean() const { return mean_.data(); }
  const float* invstd() const { return invstd_.data(); }

 private:
  int max_batch_, HW_, C_;
  float eps_;
  std::vector<float> mean_, invstd_;  // [C] of the last forward_training
  std::vector<double> sum_a_, sum_b_;
  std::vector<float> coef_a_, coef_b_, coef_c_;
};

}  // namespace edgetrain::kernels
