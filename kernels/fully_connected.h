// Fully connected layer, forward: out[B, OC] = inp[B, C] · weight[OC, C]^T + bias[OC].
// Shape letters: B batch, C input features, OC output features. Row-major throughout.
//
// fully_connected_forward_reference is the definition (plain loops, kept simple on
// purpose); FullyConnectedXnn is the fast path on XNNPACK. Tests compare the two.
#pragma once

#include <pthreadpool.h>
#include <xnnpack.h>

#include <cstddef>

#include "kernels/reference.h"  // fully_connected_forward_reference

namespace edgetrain::kernels {

// An XNNPACK fully-connected operator. XNNPACK packs the weights when the operator is
// created, so create it once per set of weights and call forward() many times.
// `pool` may be null (run on the calling thread); it is not owned.
class FullyConnectedXnn {
 public:
  FullyConnectedXnn(std::size_t C, std::size_t OC, const float* weight, const float* bias,
                    pthreadpool_t pool);
  ~FullyConnectedXnn();
  FullyConnectedXnn(const FullyConnectedXnn&) = delete;
  FullyConnectedXnn& operator=(const FullyConnectedXnn&) = delete;

  void forward(float* out, const float* inp, std::size_t B);

 private:
  xnn_operator_t op_ = nullptr;
  pthreadpool_t pool_ = nullptr;
};

}  // namespace edgetrain::kernels
