// The ops a generative adversarial network adds to the classifier's (MD-GAN, issue 16):
// leaky ReLU, tanh, sigmoid with binary cross-entropy on logits, the transposed convolution
// (reference and XNNPACK-backed, forward and backward) and Adam. Same conventions as
// kernels/reference.h: plain-loop definitions named `<op>_forward` / `<op>_backward`,
// gradients with a `d` prefix, backward ops overwrite their outputs, nothing allocates
// (Deconv2dXnn allocates its scratch memory once, in its constructor).
#pragma once

#include <pthreadpool.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/training_xnn.h"

namespace edgetrain::kernels {

// out = x for x > 0, slope * x otherwise. out may alias inp.
void leaky_relu_forward(float* out, const float* inp, std::size_t n, float slope);
// From the forward INPUT's sign (the output's sign is the same for slope > 0). dinp may alias dout.
void leaky_relu_backward(float* dinp, const float* dout, const float* inp, std::size_t n,
                         float slope);

// XNNPACK 2022 has no f32 tanh: our loop. out may alias inp.
void tanh_forward(float* out, const float* inp, std::size_t n);
// From the forward OUTPUT: d tanh = 1 - tanh². dinp may alias dout.
void tanh_backward(float* dinp, const float* dout, const float* out, std::size_t n);

// 1 / (1 + e^-x), without overflow for large |x|. out may alias inp.
void sigmoid_forward(float* out, const float* inp, std::size_t n);

// Mean binary cross-entropy of n logits against targets in [0, 1]:
//   mean(max(x, 0) - x t + log(1 + e^-|x|))  (the same as -t log σ(x) - (1-t) log(1-σ(x)), but
//   finite
// for every finite x). Accumulated in double.
float bce_with_logits_forward(const float* logits, const float* targets, std::size_t n);
// Gradient of that MEAN: (σ(x) - t) / n.
void bce_with_logits_backward(float* dlogits, const float* logits, const float* targets,
                              std::size_t n);

// Transposed convolution ("deconvolution"; PyTorch's ConvTranspose2d): every input pixel
// (iy, ix) adds weight-scaled copies of its C values into the output window at
// (iy·stride − pad + ky, ix·stride − pad + kx). Weights [OC][KH][KW][C] (XNNPACK's deconvolution
// layout), activations NHWC, output (H−1)·stride − 2·pad + KH + adj (adj < stride: the extra rows
// PyTorch calls output_padding). The default is the MD-GAN generator's 5x5, stride 2, doubling
// 7 → 14 → 28.
struct Deconv2dShape {
  int B, H, W, C, OC;
  int KH = 5, KW = 5, stride = 2, pad = 2, adj = 1;
  int OH() const { return (H - 1) * stride - 2 * pad + KH + adj; }
  int OW() const { return (W - 1) * stride - 2 * pad + KW + adj; }
};
// out [B][OH][OW][OC] = deconv(inp [B][H][W][C], weight [OC][KH][KW][C]) + bias [OC] (bias may be
// null).
void deconv2d_forward_reference(float* out, const float* inp, const float* weight,
                                const float* bias, const Deconv2dShape& s);
// dinp and dbias may be null; dweight (and dbias) overwritten.
void deconv2d_backward_reference(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const Deconv2dShape& s);

// The transposed convolution on XNNPACK. Forward: XNNPACK's deconvolution operator. Backward:
// the input gradient is the ordinary convolution of dout with the weights' O and I swapped,
// and the weight gradient is that convolution's weight gradient with the roles of input and
// output gradient exchanged (then transposed back), so both come from Conv2dXnn; the bias
// gradient is a sum over pixels. Built for one shape; `pool` may be null, not owned.
class Deconv2dXnn {
 public:
  Deconv2dXnn(const Deconv2dShape& shape, pthreadpool_t pool);
  void forward(float* out, const float* inp, const float* weight, const float* bias);
  // Same contract as deconv2d_backward_reference.
  void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                const float* weight);
  const Deconv2dShape& shape() const { return s_; }

 private:
  Deconv2dShape s_;
  pthreadpool_t pool_;
  XnnOperator forward_op_;
  Conv2dXnn adjoint_;                   // conv OH×OW×OC → H×W×C, weights [C][KH][KW][OC]
  std::vector<float> weight_swapped_;   // [C][KH][KW][OC]
  std::vector<float> dweight_swapped_;  // [C][KH][KW][OC]
};

// One Adam step (Kingma & Ba 2015) with bias correction; `step` counts from 1:
//   m = β1 m + (1 − β1) g,  v = β2 v + (1 − β2) g²,
//   param −= lr · (m / (1 − β1^step)) / (sqrt(v / (1 − β2^step)) + ε).
struct AdamSettings {
  float lr = 2e-4f, beta1 = 0.5f, beta2 = 0.999f, epsilon = 1e-8f;  // DCGAN's choice for GANs
};
void adam_update(float* param, float* m, float* v, const float* grad, std::size_t n,
                 const AdamSettings& adam, std::uint64_t step);

}  // namespace edgetrain::kernels
