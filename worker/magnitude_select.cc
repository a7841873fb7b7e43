#include "worker/magnitude_select.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <stdexcept>

namespace edgetrain::runtime {

// Sized, not only reserved, so that a copy of the selector (a copied Compressor) keeps room.
MagnitudeSelector::MagnitudeSelector(std::size_t largest)
    : keys_(largest), candidates_(largest), histogram_(std::size_t{1} << kBucketBits) {}

MagnitudeRank MagnitudeSelector::select(std::span<const float> values, std::size_t k) {
  const std::size_t n = values.size();
  if (k == 0 || k > n) throw std::invalid_argument("MagnitudeSelector: k must be in [1, n]");
  if (keys_.size() < n) {  // a tensor larger than the constructor was told of
    keys_.resize(n);
    candidates_.resize(n);
  }
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
  std::uint32_t* candidates = candidates_.data();
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i)
    if ((keys[i] >> kShift) == bucket) candidates[count++] = keys[i];
  const std::size_t rank = k - above_bucket;  // 1 ≤ rank ≤ count
  std::nth_element(candidates, candidates + (rank - 1), candidates + count,
                   std::greater<std::uint32_t>());
  const std::uint32_t threshold = candidates[rank - 1];
  std::size_t above = above_bucket;
  for (std::size_t j = 0; j + 1 < rank; ++j) above += candidates[j] > threshold;
  return {std::bit_cast<float>(threshold), above};
}

}  // namespace edgetrain::runtime
