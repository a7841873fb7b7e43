// One-time XNNPACK initialization shared by every XNNPACK-backed kernel.
#pragma once

namespace edgetrain::kernels {

// Initializes XNNPACK on first call; throws std::runtime_error if this CPU is not
// supported (XNNPACK needs SSE2 on x86 and NEON on Arm).
void ensure_xnnpack_initialized();

}  // namespace edgetrain::kernels
