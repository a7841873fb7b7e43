// One-time XNNPACK initialization shared by every XNNPACK-backed kernel, and the
// recycling allocator XNNPACK is initialized with.
//
// Why a recycling allocator: XNNPACK 2022-02 packs an operator's weights when the
// operator is created, and in training the weights change every step, so the training
// ops recreate some operators every step. Their memory blocks have the same sizes step
// after step; handing freed blocks back out keeps the train step free of heap
// allocation after the first step. Blocks are kept for reuse, never returned to the system.
#pragma once

#include <cstddef>

namespace edgetrain::kernels {

// Initializes XNNPACK on first call; throws std::runtime_error if this CPU is not
// supported (XNNPACK needs SSE2 on x86 and NEON on Arm).
void ensure_xnnpack_initialized();

// How many times XNNPACK's allocator had to ask the system for memory (a free block of
// the right size was not available). Constant across a step = no heap allocation in it.
std::size_t xnnpack_system_allocations();

}  // namespace edgetrain::kernels
