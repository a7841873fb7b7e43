#include "kernels/xnnpack_setup.h"

#include <xnnpack.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace edgetrain::kernels {

void ensure_xnnpack_initialized() {
  static std::once_flag once;
  static xnn_status status = xnn_status_uninitialized;
  std::call_once(once, [] { status = xnn_initialize(/*allocator=*/nullptr); });
  if (status != xnn_status_success) {
    throw std::runtime_error("XNNPACK initialization failed (status " + std::to_string(status) +
                             "): unsupported CPU?");
  }
}

}  // namespace edgetrain::kernels
