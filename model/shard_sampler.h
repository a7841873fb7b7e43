// Minibatches from one worker's shard: walks the shard in order, reshuffling it (seeded)
// at the start of every pass after the first, so a worker sees all of its data once per
// epoch and the order is the same on every platform for a seed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/dataset.h"
#include "common/splitmix64.h"

namespace edgetrain::runtime {

class ShardSampler {
 public:
  // Throws std::invalid_argument for an empty shard or an example whose image `data` does
  // not have (outside it, or not held by a partial load). `data` must outlive the sampler;
  // a partial load's images in a raw file are read there at each batch (Dataset::copy_image).
  ShardSampler(const Dataset& data, std::vector<std::uint32_t> shard, std::uint64_t seed);

  // Copies the next `count` examples into `pixels` (count × image bytes) and `labels`.
  void next_batch(int count, std::span<std::uint8_t> pixels, std::span<std::int32_t> labels);

  std::size_t shard_size() const { return shard_.size(); }
  std::uint64_t epoch() const { return epoch_; }

 private:
  const Dataset& data_;
  std::vector<std::uint32_t> shard_;
  std::size_t cursor_ = 0;
  std::uint64_t epoch_ = 0;
  SplitMix64 random_;
};

}  // namespace edgetrain::runtime
