// An owned pthreadpool, or none: threads <= 1 gives a null pool, which the kernels take as
// "run on the calling thread".
#pragma once

#include <pthreadpool.h>

#include <stdexcept>

namespace edgetrain::runtime {

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    if (threads > 1) {
      pool_ = pthreadpool_create(static_cast<size_t>(threads));
      if (!pool_)
        throw std::runtime_error("cannot create a pool of " + std::to_string(threads) + " threads");
    }
  }
  ~ThreadPool() {
    if (pool_) pthreadpool_destroy(pool_);
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  pthreadpool_t get() const { return pool_; }

 private:
  pthreadpool_t pool_ = nullptr;
};

}  // namespace edgetrain::runtime
