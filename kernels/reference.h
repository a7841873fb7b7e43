// Reference training ops: the algorithmic definition of every op the worker trains with,
// in plain loops, kept simple on purpose. They are the yardstick the XNNPACK-backed ops
// in kernels/*_xnn.h are tested against, and a fallback on any CPU.
//
// Naming follows llm.c: `<op>_forward` / `<op>_backward`; gradients carry a `d` prefix.
// Shape letters: B batch, H/W height/width, C input channels (or features), OC output
// channels, KH/KW kernel size, OH/OW output height/width, N values per image, NC classes.
// Layouts: activations NHWC; conv weights [OC][KH][KW][C] (XNNPACK's OHWI); fully
// connected weights [OC][C]; biases [OC]. Backward ops overwrite their outputs, never
// accumulate into them. Nothing here allocates.
#pragma once

#include <cstddef>
#include <cstdint>

namespace edgetrain::kernels {

// 2-D convolution shape. Padding is symmetric (`pad` zeros on every side), so the default
// 3x3 / stride 1 / pad 1 is TensorFlow's SAME padding.
struct Conv2dShape {
  int B, H, W, C, OC;
  int KH = 3, KW = 3, stride = 1, pad = 1;
  int OH() const { return (H + 2 * pad - KH) / stride + 1; }
  int OW() const { return (W + 2 * pad - KW) / stride + 1; }
};

// out [B][OH][OW][OC] = conv(inp [B][H][W][C], weight [OC][KH][KW][C]) + bias [OC] (bias may be
// null).
void conv2d_forward_reference(float* out, const float* inp, const float* weight, const float* bias,
                              const Conv2dShape& s);
// dinp may be null (first layer). dweight/dbias are overwritten, not accumulated; dbias may be
// null.
void conv2d_backward_reference(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const Conv2dShape& s);

// 2x2 window, stride 2, floor(H/2) x floor(W/2) output (odd last row/column ignored).
// argmax[i] = flat index into inp of the element out[i] was taken from (first max on ties,
// windows scanned row by row).
void maxpool2x2_forward_reference(float* out, std::uint32_t* argmax, const float* inp, int B, int H,
                                  int W, int C);
// dinp [B][H][W][C] is fully overwritten: zero except at the argmax positions.
void maxpool2x2_backward_reference(float* dinp, const float* dout, const std::uint32_t* argmax,
                                   int B, int H, int W, int C);

// Depthwise 2-D convolution, channel multiplier 1: every channel has its own KH x KW filter
// (a grouped convolution with groups = C). s.OC must equal s.C. weight [C][KH][KW][1] (the
// grouped layout [groups][OC per group][KH][KW][C per group] with one channel per group, so
// PyTorch's Conv2d(groups=C).weight [C][1][KH][KW] is a transpose away as for conv);
// bias [C] (may be null).
void depthwise_conv2d_forward_reference(float* out, const float* inp, const float* weight,
                                        const float* bias, const Conv2dShape& s);
// dinp and dbias may be null; dweight/dbias are overwritten.
void depthwise_conv2d_backward_reference(float* dinp, float* dweight, float* dbias,
                                         const float* dout, const float* inp, const float* weight,
                                         const Conv2dShape& s);

// K x K window, stride K, floor(H/K) x floor(W/K) output (leftover rows/columns ignored, as
// for max pooling): out = the window's mean.
void avgpool_forward_reference(float* out, const float* inp, int B, int H, int W, int C, int K);
// dinp [B][H][W][C] is fully overwritten: dout / (K*K) over each window, zero elsewhere.
void avgpool_backward_reference(float* dinp, const float* dout, int B, int H, int W, int C, int K);

// out [B][C] = the mean of inp [B][HW][C] over its HW positions.
void global_avgpool_forward_reference(float* out, const float* inp, int B, int HW, int C);
// dinp [B][HW][C] = dout [B][C] / HW at every position.
void global_avgpool_backward_reference(float* dinp, const float* dout, int B, int HW, int C);

// Inverted dropout: out[i] = inp[i] / (1 - rate) where element i is kept, 0 where dropped;
// element i is dropped iff its uniform draw u(seed, i) in [0, 1) (24 bits of a splitmix64
// hash of seed and i) is below `rate`. The draw is a function of (seed, i) alone, not of a
// sequence, so the backward pass recomputes the mask instead of storing it and a step
// repeats exactly for its seed on every platform. rate in [0, 1).
void dropout_forward(float* out, const float* inp, std::size_t n, float rate, std::uint64_t seed);
// dinp[i] = dout[i] / (1 - rate) where kept, 0 where dropped (the same mask); may alias.
void dropout_backward(float* dinp, const float* dout, std::size_t n, float rate,
                      std::uint64_t seed);
// Whether dropout keeps element i for `seed` (the mask both passes use).
bool dropout_keeps(std::uint64_t seed, std::size_t i, float rate);

// A residual connection: out = a + b element by element (out may alias either). Its
// backward passes dout to both summands; a tensor read by several layers sums their
// gradients with accumulate().
void add_forward(float* out, const float* a, const float* b, std::size_t n);
// sum[i] += addend[i].
void accumulate(float* sum, const float* addend, std::size_t n);

void relu_forward(float* out, const float* inp, std::size_t n);
// Uses the forward output as the mask (out > 0); dinp may alias dout.
void relu_backward(float* dinp, const float* dout, const float* out, std::size_t n);

// out [B][OC] = inp [B][C] · weight [OC][C]^T + bias [OC] (bias may be null).
void fully_connected_forward_reference(float* out, const float* inp, const float* weight,
                                       const float* bias, std::size_t B, std::size_t C,
                                       std::size_t OC);
// dinp may be null (first layer); dweight and dbias may be null (an input gradient alone, e.g.
// a discriminator's feedback to a generator). dweight/dbias are overwritten.
void fully_connected_backward_reference(float* dinp, float* dweight, float* dbias,
                                        const float* dout, const float* inp, const float* weight,
                                        std::size_t B, std::size_t C, std::size_t OC);

// Mean cross-entropy over the batch. probs [B][NC] receives the softmax of logits;
// *correct (may be null) receives how many rows have argmax(logits) == label.
float softmax_cross_entropy_forward(float* probs, const float* logits, const std::int32_t* labels,
                                    int B, int NC, int* correct);
// Gradient of the MEAN loss: (probs - onehot(label)) / B.
void softmax_cross_entropy_backward(float* dlogits, const float* probs, const std::int32_t* labels,
                                    int B, int NC);

// Per image: (x - mean) / max(stddev, 1/sqrt(N)), as tf.image.per_image_standardization;
// N = H*W*C values per image. out may alias inp.
void standardize_per_image(float* out, const float* inp, int B, int N);

// param -= lr * grad.
void sgd_update(float* param, const float* grad, float lr, std::size_t n);

}  // namespace edgetrain::kernels
