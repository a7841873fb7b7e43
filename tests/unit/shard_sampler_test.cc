#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "model/shard_sampler.h"

namespace {

using namespace edgetrain::runtime;

Dataset tiny_dataset(int n) {
  Dataset d;
  d.height = 1;
  d.width = 1;
  d.channels = 1;
  d.num_classes = 10;
  for (int i = 0; i < n; i++) {
    d.pixels.push_back(static_cast<std::uint8_t>(i));
    d.labels.push_back(i % 10);
  }
  return d;
}

TEST(ShardSampler, EveryEpochVisitsTheWholeShardOnceInANewOrder) {
  Dataset data = tiny_dataset(50);
  std::vector<std::uint32_t> shard = {3, 7, 11, 19, 23, 29, 31};
  ShardSampler sampler(data, shard, 42);
  std::vector<std::uint8_t> pixels(7);
  std::vector<std::int32_t> labels(7);
  std::vector<std::vector<std::uint8_t>> epochs;
  for (int e = 0; e < 3; e++) {
    sampler.next_batch(7, pixels, labels);
    std::multiset<std::uint32_t> seen(pixels.begin(), pixels.end());
    EXPECT_EQ(seen, std::multiset<std::uint32_t>(shard.begin(), shard.end()));
    for (int i = 0; i < 7; i++) EXPECT_EQ(labels[i], pixels[i] % 10);
    epochs.push_back(pixels);
  }
  EXPECT_EQ(epochs[0],
            std::vector<std::uint8_t>({3, 7, 11, 19, 23, 29, 31}));  // first pass in shard order
  EXPECT_NE(epochs[1], epochs[2]);
  // Batches that straddle an epoch boundary still draw every example once per epoch.
  ShardSampler again(data, shard, 42);
  std::vector<std::uint8_t> three(3);
  std::vector<std::int32_t> three_labels(3);
  std::multiset<std::uint32_t> first_two_epochs;
  for (int b = 0; b < 14 / 3 + 1; b++) {
    again.next_batch(3, three, three_labels);
    first_two_epochs.insert(three.begin(), three.end());
  }
  for (std::uint32_t i : shard) EXPECT_GE(first_two_epochs.count(i), 2u);
}

TEST(ShardSampler, RefusesBadShards) {
  Dataset data = tiny_dataset(5);
  EXPECT_THROW(ShardSampler(data, {}, 1), std::invalid_argument);
  EXPECT_THROW(ShardSampler(data, {1, 5}, 1), std::invalid_argument);
  ShardSampler ok(data, {1}, 1);
  std::vector<std::uint8_t> small(1);
  std::vector<std::int32_t> labels(2);
  EXPECT_THROW(ok.next_batch(2, small, labels), std::invalid_argument);
}

}  // namespace
