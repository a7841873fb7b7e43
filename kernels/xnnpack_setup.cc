#include "kernels/xnnpack_setup.h"

#include <xnnpack.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

namespace edgetrain::kernels {
namespace {

// Every block starts with this header, one alignment unit before the pointer handed out.
// Free blocks form a singly linked list through `next_free` (no container, so recycling
// itself never calls operator new).
struct BlockHeader {
  std::size_t capacity;
  BlockHeader* next_free;
};
// 64 bytes satisfies XNNPACK's XNN_ALLOCATION_ALIGNMENT on every target (16 on Arm, 64 on x86).
constexpr std::size_t kAlignment = 64;
static_assert(sizeof(BlockHeader) <= kAlignment);

std::mutex g_free_list_mutex;
BlockHeader* g_free_list = nullptr;
std::atomic<std::size_t> g_system_allocations{0};

void* user_pointer(BlockHeader* header) { return reinterpret_cast<char*>(header) + kAlignment; }
BlockHeader* header_of(void* pointer) {
  return reinterpret_cast<BlockHeader*>(static_cast<char*>(pointer) - kAlignment);
}

void* recycling_allocate(void*, std::size_t size) {
  {
    std::lock_guard<std::mutex> lock(g_free_list_mutex);
    // Exact size match: the same operators are recreated with the same sizes every step.
    for (BlockHeader** link = &g_free_list; *link; link = &(*link)->next_free) {
      if ((*link)->capacity == size) {
        BlockHeader* block = *link;
        *link = block->next_free;
        return user_pointer(block);
      }
    }
  }
  void* raw = nullptr;
  if (posix_memalign(&raw, kAlignment, kAlignment + size) != 0) return nullptr;
  g_system_allocations.fetch_add(1, std::memory_order_relaxed);
  auto* header = static_cast<BlockHeader*>(raw);
  header->capacity = size;
  header->next_free = nullptr;
  return user_pointer(header);
}

void recycling_deallocate(void*, void* pointer) {
  if (!pointer) return;
  BlockHeader* header = header_of(pointer);
  std::lock_guard<std::mutex> lock(g_free_list_mutex);
  header->next_free = g_free_list;
  g_free_list = header;
}

void* recycling_reallocate(void* context, void* pointer, std::size_t size) {
  if (!pointer) return recycling_allocate(context, size);
  BlockHeader* header = header_of(pointer);
  if (header->capacity >= size) return pointer;
  void* grown = recycling_allocate(context, size);
  if (!grown) return nullptr;
  std::memcpy(grown, pointer, header->capacity);
  recycling_deallocate(context, pointer);
  return grown;
}

void* recycling_aligned_allocate(void* context, std::size_t alignment, std::size_t size) {
  if (alignment > kAlignment) return nullptr;
  return recycling_allocate(context, size);
}

const xnn_allocator g_recycling_allocator = {
    /*context=*/nullptr,
    /*allocate=*/recycling_allocate,
    /*reallocate=*/recycling_reallocate,
    /*deallocate=*/recycling_deallocate,
    /*aligned_allocate=*/recycling_aligned_allocate,
    /*aligned_deallocate=*/recycling_deallocate,
};

}  // namespace

void ensure_xnnpack_initialized() {
  static std::once_flag once;
  static xnn_status status = xnn_status_uninitialized;
  std::call_once(once, [] { status = xnn_initialize(&g_recycling_allocator); });
  if (status != xnn_status_success) {
    throw std::runtime_error("XNNPACK initialization failed (status " + std::to_string(status) +
                             "): unsupported CPU?");
  }
}

std::size_t xnnpack_system_allocations() {
  return g_system_allocations.load(std::memory_order_relaxed);
}

}  // namespace edgetrain::kernels
