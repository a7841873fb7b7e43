// The k-th largest magnitude of a tensor: the threshold of the AdaComp paper's per-tensor
// top-k (worker/compressor.h), found in linear passes instead of an introselect.
//
// A finite float's magnitude orders like its bit pattern read as an unsigned integer, so
// a histogram of the top 11 bits of |v| (sign bit clear: 2,048 buckets, an eighth of an
// octave each) says which bucket holds the k-th largest; one more pass gathers that
// bucket's entries (for a gradient's top 1 %, well under 1 % of the tensor) and
// std::nth_element runs on those alone. A bucket too large for the candidate buffer (a
// rank near the median, many equal values) is narrowed instead by a histogram of the next
// 11 bits of its entries, then of the last 9, which pins the value itself: radix selection,
// one pass over the tensor per level. The answer is the same value std::nth_element over
// all magnitudes gives; only the time differs (tests/bench/compressor_bench.cc prints both).
// Memory: the 2,048-entry histogram and the candidate buffer (at least 4,096 entries, a
// 16th of the largest tensor), nothing per entry: 108 kB for the paper CNN, where a copy of
// the magnitudes and a candidate buffer as large as the tensor took 3.2 MB. A 64th was too
// small for top-10 % or error-feedback gradients: their bucket needed the second level, 7-13 %
// slower than the one-bucket gather (edgetrain-compressor-bench).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace edgetrain::runtime {

struct MagnitudeRank {
  float threshold = 0.0f;  // the k-th largest |v|
  std::size_t above = 0;   // how many entries have |v| > threshold (< k)
};

class MagnitudeSelector {
 public:
  // Sizes the scratch for tensors of up to `largest` entries (any size works; the
  // candidate buffer is a 16th of it), so that select() allocates nothing.
  explicit MagnitudeSelector(std::size_t largest = 0);

  // 1 ≤ k ≤ values.size(), values finite (NaN has no rank; the compressor refuses it
  // before selecting). Throws std::invalid_argument otherwise on k.
  MagnitudeRank select(std::span<const float> values, std::size_t k);

 private:
  static constexpr int kBucketBits = 11;
  static constexpr std::size_t kMinCandidates = 4096;
  std::vector<std::uint32_t> candidates_;  // the k-th's bucket, when it fits
  std::vector<std::uint32_t> histogram_;
};

}  // namespace edgetrain::runtime
