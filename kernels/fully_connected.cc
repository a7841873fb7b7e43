#include "kernels/fully_connected.h"

#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/xnnpack_setup.h"

namespace edgetrain::kernels {

FullyConnectedXnn::FullyConnectedXnn(std::size_t C, std::size_t OC, const float* weight,
                                     const float* bias, pthreadpool_t pool)
    : pool_(pool) {
  ensure_xnnpack_initialized();
  const float inf = std::numeric_limits<float>::infinity();
  xnn_status status = xnn_create_fully_connected_nc_f32(
      C, OC, /*input_stride=*/C, /*output_stride=*/OC, weight, bias, -inf, inf, /*flags=*/0, &op_);
  if (status != xnn_status_success) {
    throw std::runtime_error("xnn_create_fully_connected_nc_f32 failed with status " +
                             std::to_string(status));
  }
}

FullyConnectedXnn::~FullyConnectedXnn() {
  if (op_) xnn_delete_operator(op_);
}

void FullyConnectedXnn::forward(float* out, const float* inp, std::size_t B) {
  xnn_status status = xnn_setup_fully_connected_nc_f32(op_, B, inp, out, pool_);
  if (status == xnn_status_success) status = xnn_run_operator(op_, pool_);
  if (status != xnn_status_success) {
    throw std::runtime_error("XNNPACK fully connected failed with status " +
                             std::to_string(status));
  }
}

}  // namespace edgetrain::kernels
