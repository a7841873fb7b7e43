// The range split of a sharded server (model/model_shards.h): every parameter in exactly
// one shard, sizes within one of each other, and a shard's model a slice of the whole one.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <vector>

#include "model/model.h"
#include "model/model_shards.h"

namespace {

using namespace edgetrain::runtime;

// Every (tensor, index) of the model, from the pieces of all shards, in order, once.
void expect_exact_cover(const std::vector<std::uint32_t>& sizes, std::uint32_t count) {
  std::uint64_t total = 0;
  for (auto n : sizes) total += n;
  std::uint64_t flat = 0, smallest = total, largest = 0;
  for (std::uint32_t i = 0; i < count; i++) {
    const auto pieces = shard_pieces(sizes, {i, count});
    const auto [first, last] = shard_range(total, {i, count});
    EXPECT_EQ(first, flat) << "shard " << i << " of " << count;
    std::uint64_t held = 0;
    for (const ShardPiece& p : pieces) {
      ASSERT_LT(p.tensor, sizes.size());
      ASSERT_GE(p.size, 1u);
      ASSERT_LE(std::uint64_t{p.offset} + p.size, sizes[p.tensor]);
      // The piece is the next stretch of the flat parameters.
      std::uint64_t tensor_start = 0;
      for (std::uint32_t t = 0; t < p.tensor; t++) tensor_start += sizes[t];
      EXPECT_EQ(tensor_start + p.offset, flat) << "shard " << i << " of " << count;
      flat += p.size;
      held += p.size;
    }
    EXPECT_EQ(held, last - first);
    smallest = std::min(smallest, held);
    largest = std::max(largest, held);
  }
  EXPECT_EQ(flat, total) << count << " shards";
  EXPECT_LE(largest - smallest, 1u) << count << " shards";
}

TEST(ModelShards, EveryParameterIsInExactlyOneShard) {
  const std::vector<std::uint32_t> sizes = {288,    32,  18432, 64,
                                            401408, 128, 1280,  10};  // the paper CNN
  for (std::uint32_t count : {1u, 2u, 3u, 7u, 8u, 9u, 100u}) expect_exact_cover(sizes, count);
  expect_exact_cover({1, 1, 1}, 3);
  expect_exact_cover({5}, 5);
}

TEST(ModelShards, OneShardIsTheWholeModel) {
  const std::vector<std::uint32_t> sizes = {6, 2, 9};
  const std::vector<ShardPiece> expected = {{0, 0, 6}, {1, 0, 2}, {2, 0, 9}};
  EXPECT_EQ(shard_pieces(sizes, {0, 1}), expected);
}

TEST(ModelShards, ATensorSplitAcrossShards) {
  // 17 parameters in 3 shards: [0, 5), [5, 11), [11, 17).
  const std::vector<std::uint32_t> sizes = {10, 7};
  EXPECT_EQ(shard_pieces(sizes, {0, 3}), (std::vector<ShardPiece>{{0, 0, 5}}));
  EXPECT_EQ(shard_pieces(sizes, {1, 3}), (std::vector<ShardPiece>{{0, 5, 5}, {1, 0, 1}}));
  EXPECT_EQ(shard_pieces(sizes, {2, 3}), (std::vector<ShardPiece>{{1, 1, 6}}));
}

TEST(ModelShards, MoreShardsThanTensors) {
  const std::vector<std::uint32_t> sizes = {4, 2};
  for (std::uint32_t i = 0; i < 6; i++) {
    const auto pieces = shard_pieces(sizes, {i, 6});
    ASSERT_EQ(pieces.size(), 1u);
    EXPECT_EQ(pieces[0].size, 1u);
  }
  EXPECT_EQ(shard_pieces(sizes, {5, 6})[0], (ShardPiece{1, 1, 1}));
}

TEST(ModelShards, RefusesImpossibleSplits) {
  const std::vector<std::uint32_t> sizes = {4, 2};
  EXPECT_THROW(shard_pieces(sizes, {0, 7}), std::invalid_argument);  // more shards than parameters
  EXPECT_THROW(shard_pieces(sizes, {2, 2}), std::invalid_argument);
  EXPECT_THROW(shard_pieces(sizes, {0, 0}), std::invalid_argument);
}

TEST(ModelShards, ParsesShardIds) {
  EXPECT_EQ(parse_shard_id("0/1"), (ShardId{0, 1}));
  EXPECT_EQ(parse_shard_id("2/3"), (ShardId{2, 3}));
  for (const char* bad : {"", "3", "3/3", "1/0", "-1/3", "a/3", "1/3x", " 1/3", "1//3", "/3", "1/"})
    EXPECT_FALSE(parse_shard_id(bad)) << bad;
}

TEST(ModelShards, AShardModelIsASliceWithALayoutOfItsOwn) {
  Model full(builtin_model_spec("mlp"));
  full.initialize(7);
  std::vector<std::uint32_t> sizes;
  for (const auto& t : full.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
  std::set<std::uint64_t> layouts = {full.layout_id()};
  std::size_t flat = 0;
  for (std::uint32_t i = 0; i < 3; i++) {
    const Model shard = shard_model(full, {i, 3});
    EXPECT_TRUE(layouts.insert(shard.layout_id()).second) << "shard " << i;
    ASSERT_EQ(shard.tensors().size(), shard_pieces(sizes, {i, 3}).size());
    for (std::size_t j = 0; j < shard.parameter_count(); j++)
      ASSERT_EQ(shard.parameters()[j], full.parameters()[flat + j])
          << "shard " << i << " entry " << j;
    flat += shard.parameter_count();
    EXPECT_EQ(shard.num_classes(), 0);
  }
  EXPECT_EQ(flat, full.parameter_count());
  // The names say which piece of which tensor; another shard count gives other layouts.
  EXPECT_EQ(shard_model(full, {0, 1}).tensors()[0].name,
            "fc1.weight[0:" + std::to_string(full.tensors()[0].size) + "]");
  EXPECT_NE(shard_model(full, {0, 2}).layout_id(), shard_model(full, {0, 3}).layout_id());
  EXPECT_NE(shard_model(full, {0, 1}).layout_id(), full.layout_id());
}

}  // namespace
