// A sharded parameter server (server/README.md, "Sharded server") splits a model's flat
// parameter range [0, P) into N contiguous ranges whose sizes differ by at most one: shard i
// holds [⌊iP/N⌋, ⌊(i+1)P/N⌋). Ranges, not whole tensors: the paper CNN's fc1 weight is 95 %
// of its parameters, so shards by tensor could not be balanced. A shard's own tensors are the
// pieces of the model's tensors that fall in its range, in model order.
//
// Pure functions over tensor sizes, in the model library so that the server (which builds a
// shard's model) and the worker's ShardedServerChannel (which splits updates and reassembles
// models) use the same split without a dependency between them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "model/model.h"

namespace edgetrain::runtime {

struct ShardId {
  std::uint32_t index = 0;  // 0 ≤ index < count
  std::uint32_t count = 1;
  bool operator==(const ShardId&) const = default;
};

// "I/N" (decimal, I < N, N ≥ 1); nullopt for anything else.
std::optional<ShardId> parse_shard_id(std::string_view text);

// Shard `shard`'s range of a model of `parameter_count` parameters: [first, second).
// Throws std::invalid_argument unless 1 ≤ count ≤ parameter_count and index < count (a
// shard without parameters would serve nothing).
std::pair<std::uint64_t, std::uint64_t> shard_range(std::uint64_t parameter_count, ShardId shard);

// One piece of a shard: entries [offset, offset + size) of the model's tensor `tensor`.
struct ShardPiece {
  std::uint32_t tensor = 0;
  std::uint32_t offset = 0;
  std::uint32_t size = 0;  // ≥ 1
  bool operator==(const ShardPiece&) const = default;
};

// The pieces of shard `shard` of a model whose tensors have `tensor_sizes`, in model order
// (so their concatenation is the shard's range of the flat parameters). Throws like
// shard_range().
std::vector<ShardPiece> shard_pieces(std::span<const std::uint32_t> tensor_sizes, ShardId shard);

// `full`'s shard as a model of its own: one flat tensor per piece, named after it
// ("fc1.weight[0:100352]"), with `full`'s parameters of that range (so a 1-shard and an
// N-shard run start from the same parameters), and a layout id of its own for every (full
// layout, index, count): an update or a model meant for another shard, another shard count
// or another model is refused as another model (4.09), and a state directory written with
// another shard count is refused at start-up. It has no layers: it can be stored,
// checkpointed and served, not trained or evaluated. Throws like shard_range().
Model shard_model(const Model& full, ShardId shard);

}  // namespace edgetrain::runtime
