// Fast training ops on XNNPACK 2022-02 operators, forward and backward, taking the same
// pointers as the reference ops in kernels/reference.h (which define what they compute).
//
// XNNPACK is an inference library; the backward passes are composed from its operators:
//   FC forward           fully-connected operator
//   FC input gradient    batch < OC: our loop over the unpacked weights; else fully-connected
//                        on the transposed weights (XNN_FLAG_TRANSPOSE_WEIGHTS)
//   FC weight gradient   fully-connected whose packed "weights" are the activations
//   conv forward         convolution operator (ReLU optionally fused as an output clamp)
//   conv input gradient  deconvolution with the weights' O and I swapped
//   conv weight gradient one input channel: our direct loop; else im2col (ours) +
//                        fully-connected, packing the smaller operand (dout: image by
//                        image, the products added up)
//   max pooling          argmax pooling / unpooling
// plus small loops of our own (transposes, im2col, bias gradients).
//
// XNNPACK packs an operator's weights when it is created. Weights change every step in
// training, so operators with a changing packed operand are recreated on every call; the
// recycling allocator (kernels/xnnpack_setup.h) makes that allocation-free after the first
// step. Operators without weights (pooling) are created once. Each class is built for one
// shape and batch; its scratch memory is allocated in the constructor or on the first call
// that needs it (a conv's ReLU mask copy: only backward(), not backward_overwriting_dout(),
// and a single-channel conv without an input gradient, the first layer, masks row by row),
// so forward/backward never allocate after their first call. `pool` may be null (run on the
// calling thread) and is not owned; with a pool our own loops run on it as well as XNNPACK's
// operators, and every result is the same bits as without one (kernels/README.md, "Our loops
// on the thread pool"). A Conv2dXnn packing dout keeps one im2col buffer, plane buffer and
// product per thread of the pool it was built with.
// Errors from XNNPACK throw std::runtime_error.
#pragma once

#include <pthreadpool.h>
#include <xnnpack.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "kernels/reference.h"

namespace edgetrain::kernels {

// Owns one xnn_operator_t; reset() deletes the current one.
class XnnOperator {
 public:
  XnnOperator() = default;
  ~XnnOperator() { reset(); }
  XnnOperator(const XnnOperator&) = delete;
  XnnOperator& operator=(const XnnOperator&) = delete;
  void reset();
  xnn_operator_t* out_param() {
    reset();
    return &op_;
  }
  xnn_operator_t get() const { return op_; }

 private:
  xnn_operator_t op_ = nullptr;
};

enum class Activation { none, relu };

// out [B][OC] = act(inp [B][C] · weight [OC][C]^T + bias [OC]).
class FullyConnectedTrainXnn {
 public:
  FullyConnectedTrainXnn(std::size_t B, std::size_t C, std::size_t OC, Activation activation,
                         pthreadpool_t pool);
  void forward(float* out, const float* inp, const float* weight, const float* bias);
  // Same contract as fully_connected_backward_reference: dinp, dweight and dbias may be null.
  // With Activation::relu, `dout` is the gradient after the ReLU and `out` the forward output
  // (the ReLU mask); pass out = nullptr for Activation::none.
  void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* out,
                const float* inp, const float* weight);

 private:
  std::size_t B_, C_, OC_;
  Activation activation_;
  pthreadpool_t pool_;
  XnnOperator forward_op_, dinp_op_, dweight_op_;
  std::vector<float> out_transposed_;   // [OC][B] when forward packs the activations
  std::vector<float> dout_masked_;      // [B][OC] gradient before the ReLU
  std::vector<float> dout_transposed_;  // [OC][B]
};

// out [B][OH][OW][OC] = act(conv(inp, weight [OC][KH][KW][C]) + bias).
class Conv2dXnn {
 public:
  Conv2dXnn(const Conv2dShape& shape, Activation activation, pthreadpool_t pool);
  void forward(float* out, const float* inp, const float* weight, const float* bias);
  // Same contract as conv2d_backward_reference (dinp, dbias nullable); ReLU as in
  // FullyConnectedTrainXnn, and out = nullptr with Activation::relu: dout is masked already.
  // dweight may be null when dinp is not: the input gradient alone (the bias gradient is
  // still written when dbias is given).
  void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* out,
                const float* inp, const float* weight);
  // The same, with `dout` the caller's scratch, which it overwrites: the ReLU mask is applied
  // in place instead of into a copy (the trainer passes its own gradient buffer). A layer
  // called only this way never holds the [M][OC] copy (0.5 MB for the paper CNN's conv2 at
  // batch 10).
  void backward_overwriting_dout(float* dinp, float* dweight, float* dbias, float* dout,
                                 const float* out, const float* inp, const float* weight);
  const Conv2dShape& shape() const { return s_; }

 private:
  // `masked`: where the ReLU-masked dout goes (dout itself, or the copy).
  void backward_into(float* dinp, float* dweight, float* dbias, const float* dout, float* masked,
                     const float* out, const float* inp, const float* weight);
  // Packing dout on a pool of several threads: the images' products on the slots, added in
  // image order into dweight_transposed_ (the same sums as one thread's loop).
  void weight_gradient_on_slots(const float* d, const float* inp);

  Conv2dShape s_;
  Activation activation_;
  pthreadpool_t pool_;
  std::size_t M_, K_;    // M = B*OH*OW output pixels, K = KH*KW*C values per patch
  bool single_channel_;  // C == 1: weight gradient by a direct loop (when no input gradient is
                         // asked)
  bool pack_patches_;    // otherwise the weight gradient packs im2col (K <= OC) or dout (K > OC)
  XnnOperator forward_op_, dinp_op_, dweight_op_;
  std::vector<float> weight_swapped_;      // [C][KH][KW][OC] deconvolution kernel
  std::vector<float> dout_masked_;  // [M][OC], made by the first backward() that masks a copy
                                   // (single channel: [OW][OC] until then)
  std::vector<float> patches_;             // im2col: [M][K], or one image's transposed [K][M/B]
  std::vector<float> dout_transposed_;     // [OC][M] when packing patches
  std::vector<float> dweight_transposed_;  // [K][OC] when packing dout
  std::vector<float> dweight_image_;       // [K][OC]: one image's product, when packing dout
                                           // (one per slot on slots)
  std::vector<float> input_planes_;  // [C][H*W]: one image's channel planes, when packing dout
                                     // (patches_ and input_planes_ one per slot on slots)
  std::vector<float> image_sums_;    // single channel: [B][KH*KW + 1][OC] per-image sums
  // Packing dout with a pool of more than one thread: slots (min(threads, B)) of images,
  // each with its own operator; errors caught on the pool's threads, rethrown after.
  std::size_t slots_ = 1;
  std::unique_ptr<XnnOperator[]> slot_ops_;
  std::unique_ptr<std::exception_ptr[]> slot_errors_;
  std::atomic<std::size_t> next_image_{0};  // the next image whose product may be added
  std::atomic<bool> slot_failed_{false};    // a slot threw: the others stop waiting
};

// 2x2 / stride 2 max pooling, floor(H/2) x floor(W/2) output.
// Unlike the reference, `window_index` holds XNNPACK's index within each 2x2 window
// (0..3, see window_index_to_flat), which is what XNNPACK's unpooling consumes.
class MaxPool2x2Xnn {
 public:
  MaxPool2x2Xnn(int B, int H, int W, int C, pthreadpool_t pool);
  void forward(float* out, std::uint32_t* window_index, const float* inp);
  void backward(float* dinp, const float* dout, const std::uint32_t* window_index);
  // The flat index into inp (as maxpool2x2_forward_reference's argmax) of output element i.
  std::uint32_t window_index_to_flat(std::size_t i, std::uint32_t window_index) const;

 private:
  int B_, H_, W_, C_;
  pthreadpool_t pool_;
  XnnOperator pool_op_, unpool_op_;
  std::vector<float> unpooled_;  // [B][2*OH][2*OW][C] when H or W is odd
};

// Depthwise convolution (channel multiplier 1; shape.OC == shape.C), weights [C][KH][KW][1]
// as depthwise_conv2d_forward_reference: out = act(dwconv(inp, weight) + bias).
// Forward: XNNPACK's convolution with groups = C (one channel per group, which it runs on its
// depthwise microkernels). Input, weight and bias gradients: our loops over contiguous
// channels (XNNPACK's deconvolution with groups = C gives the input gradient too, but
// 3-6x slower: kernels/README.md).
class DepthwiseConv2dXnn {
 public:
  DepthwiseConv2dXnn(const Conv2dShape& shape, Activation activation, pthreadpool_t pool);
  void forward(float* out, const float* inp, const float* weight, const float* bias);
  // As Conv2dXnn::backward_overwriting_dout: `dout` is the caller's scratch, masked in place
  // by out > 0 with Activation::relu (out = nullptr: masked already). dinp, dbias nullable.
  void backward_overwriting_dout(float* dinp, float* dweight, float* dbias, float* dout,
                                 const float* out, const float* inp, const float* weight);
  const Conv2dShape& shape() const { return s_; }

 private:
  Conv2dShape s_;
  Activation activation_;
  pthreadpool_t pool_;
  XnnOperator forward_op_;
  std::vector<float> dweight_by_tap_;  // [KH*KW][C]: accumulated along contiguous channels
  std::vector<float> weight_by_tap_;   // [KH*KW][C]: the weights, for the input gradient
};

// K x K / stride K average pooling, floor(H/K) x floor(W/K) output, as
// avgpool_forward_reference. Forward: XNNPACK's average pooling (created once); backward:
// our loop (XNNPACK has no average unpooling).
class AvgPoolXnn {
 public:
  AvgPoolXnn(int B, int H, int W, int C, int K, pthreadpool_t pool);
  void forward(float* out, const float* inp);
  void backward(float* dinp, const float* dout);  // dinp fully overwritten

 private:
  int B_, H_, W_, C_, K_;
  pthreadpool_t pool_;
  XnnOperator op_;
};

// Global average pooling, [B][HW][C] -> [B][C]. Forward: XNNPACK's global average pooling
// (created once); backward: our loop (the gradient spread evenly over the HW positions).
class GlobalAvgPoolXnn {
 public:
  GlobalAvgPoolXnn(int B, int HW, int C, pthreadpool_t pool);
  void forward(float* out, const float* inp);
  void backward(float* dinp, const float* dout);

 private:
  int B_, HW_, C_;
  pthreadpool_t pool_;
  XnnOperator op_;
};

// Column sums: dbias[OC] = sum over rows of dout [rows][OC].
void bias_backward(float* dbias, const float* dout, std::size_t rows, std::size_t OC);
// out [cols][rows] = inp [rows][cols]^T, cache-blocked.
void transpose(float* out, const float* inp, std::size_t rows, std::size_t cols);

}  // namespace edgetrain::kernels
