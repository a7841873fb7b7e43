#include "model/shard_sampler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace edgetrain::runtime {

ShardSampler::ShardSampler(const Dataset& data, std::vector<std::uint32_t> shard,
                           std::uint64_t seed)
    : data_(data), shard_(std::move(shard)), random_{seed} {
  if (shard_.empty()) throw std::invalid_argument("ShardSampler: empty shard");
  for (std::uint32_t i : shard_) {
    if (!data.has_image(i))
      throw std::invalid_argument("ShardSampler: example " + std::to_string(i) +
                                  (i < data.size() ? " is not held (a partial load)"
                                                   : " not in the data set"));
  }
}

void ShardSampler::next_batch(int count, std::span<std::uint8_t> pixels,
                              std::span<std::int32_t> labels) {
  const std::size_t image = data_.image_bytes();
  if (count < 0 || pixels.size() < static_cast<std::size_t>(count) * image ||
      labels.size() < static_cast<std::size_t>(count)) {
    throw std::invalid_argument("ShardSampler: batch buffers too small");
  }
  for (int i = 0; i < count; i++) {
    if (cursor_ == shard_.size()) {
      cursor_ = 0;
      epoch_++;
      for (std::size_t j = shard_.size() - 1; j > 0; j--)
        std::swap(shard_[j], shard_[random_.next() % (j + 1)]);
    }
    const std::uint32_t example = shard_[cursor_++];
    data_.copy_image(example, pixels.data() + static_cast<std::size_t>(i) * image);
    labels[i] = data_.labels[example];
  }
}

}  // namespace edgetrain::runtime
