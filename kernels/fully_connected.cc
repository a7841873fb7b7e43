#include "kernels/fully_connected.h"

#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/xnnpack_setup.h"

namespace edgetrain::kernels {

void fully_connected_forward_reference(float* out, const float* inp, const float* weight, const float* bias,
                                       std::size_t B, std::size_t C, std::size_t OC) {
  for (std::size_t b = 0; b < B; b++) {
    const float* x = inp + b * C;
    for (std::size_t o = 0; o < OC; o++) {
      const float* w = weight + o * C;
      float sum = bias ? bias[o] : 0.0f;
      for (std::size_t c = 0; c < C; c++) sum += x[c] * w[c];
      out[b * OC + o] = sum;
    }
  }
}

FullyConnectedXnn::FullyConnectedXnn(std::size_t C, std::size_t OC, const float* weight, const float* bias,
                                     pthreadpool_t pool)
    : pool_(pool) {
  ensure_xnnpack_initialized();
  const float inf = std::numeric_limits<float>::infinity();
  xnn_status status = xnn_create_fully_connected_nc_f32(C, OC, /*input_stride=*/C, /*output_stride=*/OC, weight,
                                                        bias, -inf, inf, /*flags=*/0, &op_);
  if (status != xnn_status_success) {
    throw std::runtime_error("xnn_create_fully_connected_nc_f32 failed with status " + std::to_string(status));
  }
}

FullyConnectedXnn::~FullyConnectedXnn() {
  if (op_) xnn_delete_operator(op_);
}

void FullyConnectedXnn::forward(float* out, const float* inp, std::size_t B) {
  xnn_status status = xnn_setup_fully_connected_nc_f32(op_, B, inp, out, pool_);
  if (status == xnn_status_success) status = xnn_run_operator(op_, pool_);
  if (status != xnn_status_success) {
    throw std::runtime_error("XNNPACK fully connected failed with status " + std::to_string(status));
  }
}

}  // namespace edgetrain::kernels
