#include "worker/backoff.h"

#include <algorithm>
#include <stdexcept>

namespace edgetrain::runtime {

Backoff::Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds maximum,
                 std::uint64_t seed)
    : initial_(initial), maximum_(maximum), state_(seed) {
  if (initial.count() <= 0 || maximum < initial)
    throw std::invalid_argument("Backoff: need 0 < initial <= maximum");
}

std::chrono::milliseconds Backoff::next_delay() {
  const int doublings = std::min(failures_, 30);
  failures_++;
  const long long cap = std::min<long long>(maximum_.count(), initial_.count() << doublings);
  state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;  // PCG-style LCG step
  const std::uint64_t r = (state_ >> 33);
  return std::chrono::milliseconds(static_cast<long long>(r % static_cast<std::uint64_t>(cap + 1)));
}

}  // namespace edgetrain::runtime
