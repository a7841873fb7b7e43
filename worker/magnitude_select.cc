#include "worker/magnitude_select.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <stdexcept>

namespace edgetrain::runtime {

// Sized, not only reserved, so that a copy of the selector (a copied Compressor) keeps room.
MagnitudeSelector::MagnitudeSelector(std::size_t largest)
    : candidates_(std::max(kMinCandidates, largest / 16)),
      histogram_(std::size_t{1} << kBucketBits) {}

namespace {

std::uint32_t magnitude_bits(float v) { return std::bit_cast<std::uint32_t>(v) & 0x7fffffffu; }

}  // namespace

MagnitudeRank MagnitudeSelector::select(std::span<const float> values, std::size_t k) {
  const std::size_t n = values.size();
  if (k == 0 || k > n) throw std::invalid_argument("MagnitudeSelector: k must be in [1, n]");
  std::uint32_t* histogram = histogram_.data();
  // Level by level, the bits of the k-th largest magnitude from the top: bits 30..20, 19..9,
  // 8..0 (the sign bit is clear). `prefix` holds the bits found so far; the entries whose
  // magnitude starts with them are the bucket still in play, `rank` is the k-th's rank
  // among them and `above` how many entries lie above them.
  std::uint32_t prefix = 0;
  std::size_t rank = k, above = 0;
  for (int shift = 31 - kBucketBits;; shift = std::max(0, shift - kBucketBits)) {
    const int width = shift == 0 ? 31 - 2 * kBucketBits : kBucketBits;
    const int prefix_shift = shift + width;  // 31, 20, 9
    const std::uint32_t mask = (std::uint32_t{1} << width) - 1;
    std::fill(histogram_.begin(), histogram_.end(), 0u);
    if (prefix_shift == 31) {  // every entry is in play
      for (std::size_t i = 0; i < n; ++i) ++histogram[magnitude_bits(values[i]) >> shift];
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t key = magnitude_bits(values[i]);
        if ((key >> prefix_shift) == prefix) ++histogram[(key >> shift) & mask];
      }
    }
    // This level's bucket of the k-th largest; the entries of the buckets above it are above.
    std::uint32_t bucket = mask + 1;
    while (bucket-- > 0) {
      if (histogram[bucket] >= rank) break;
      rank -= histogram[bucket];
      above += histogram[bucket];
    }
    prefix = (prefix << width) | bucket;
    if (shift == 0) return {std::bit_cast<float>(prefix), above};  // every bit is known
    if (histogram[bucket] <= candidates_.size()) {
      std::uint32_t* candidates = candidates_.data();
      std::size_t count = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t key = magnitude_bits(values[i]);
        if ((key >> shift) == prefix) candidates[count++] = key;
      }
      // 1 ≤ rank ≤ count
      std::nth_element(candidates, candidates + (rank - 1), candidates + count,
                       std::greater<std::uint32_t>());
      const std::uint32_t threshold = candidates[rank - 1];
      for (std::size_t j = 0; j + 1 < rank; ++j) above += candidates[j] > threshold;
      return {std::bit_cast<float>(threshold), above};
    }
  }
}

}  // namespace edgetrain::runtime
