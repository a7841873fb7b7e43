#include "runtime/magnitude_select.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <stdexcept>

namespace edgetrain::runtime {

MagnitudeSelector::MagnitudeSelector(std::size_t largest) : histogram_(std::size_t{1} << kBucketBits) {
  keys_.reserve(largest);
  candidates_.reserve(largest);
}

MagnitudeRank MagnitudeSelector::select(std::span<const float> values, std::size_t k) {
  const std::size_t n = values.size();
  if (k == 0 || k > n) throw std::invalid_argument("MagnitudeSelector: k must be in [1, n]");
  keys_.resize(n);
  std::fill(histogram_.begin(), histogram_.end(), 0u);
  std::uint32_t* keys = keys_.data();
  std::uint32_t* histogram = histogram_.data();
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t key = std::bit_cast<std::uint32_t>(values[i]) & 0x7fffffffu;  // |v|
    keys[i] = key;
    ++histogram[key >> kShift];
  }
  // The bucket of the k-th largest, and how many entries lie in the buckets above it.
  std::size_t above_bucket = 0;
  std::uint32_t bucket = static_cast<std::uint32_t>(histogram_.size());
  while (bucket-- > 0) {
    if (above_bucket + histogram[bucket] >= k) break;
    above_bucket += histogram[bucket];
  }
  candidates_.clear();
  for (std::size_t i = 0; i < n; ++i)
    if ((keys[i] >> kShift) == bucket) candidates_.push_back(keys[i]);
  const std::size_t rank = k - above_bucket;  // 1 ≤ rank ≤ the bucket's count
  std::nth_element(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(rank - 1), candidates_.end(),
                   std::greater<std::uint32_t>());
  const std::uint32_t threshold = candidates_[rank - 1];
  std::size_t above = above_bucket;
  for (std::size_t j = 0; j + 1 < rank; ++j) above += candidates_[j] > threshold;
  return {std::bit_cast<float>(threshold), above};
}

}  // namespace edgetrain::runtime
