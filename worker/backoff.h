// Exponential backoff with full jitter (the delay is drawn uniformly from [0, cap], the
// cap doubling per failure up to a maximum), so a fleet of workers that lost the server at
// the same moment does not come back in lock step.
#pragma once

#include <chrono>
#include <cstdint>

namespace edgetrain::runtime {

class Backoff {
 public:
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds maximum, std::uint64_t seed);
  // The delay before the next attempt; each call counts one more failure.
  std::chrono::milliseconds next_delay();
  void reset() { failures_ = 0; }
  int failures() const { return failures_; }

 private:
  std::chrono::milliseconds initial_, maximum_;
  int failures_ = 0;
  std::uint64_t state_;
};

}  // namespace edgetrain::runtime
