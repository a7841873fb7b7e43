#include "model/model_shards.h"

#include <charconv>
#include <stdexcept>
#include <string>

namespace edgetrain::runtime {
namespace {

std::optional<std::uint32_t> parse_u32(std::string_view text) {
  std::uint32_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::vector<std::uint32_t> sizes_of(const Model& model) {
  std::vector<std::uint32_t> sizes;
  for (const TensorInfo& t : model.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
  return sizes;
}

}  // namespace

std::optional<ShardId> parse_shard_id(std::string_view text) {
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const auto index = parse_u32(text.substr(0, slash));
  const auto count = parse_u32(text.substr(slash + 1));
  if (!index || !count || *count == 0 || *index >= *count) return std::nullopt;
  return ShardId{*index, *count};
}

std::pair<std::uint64_t, std::uint64_t> shard_range(std::uint64_t parameter_count, ShardId shard) {
  if (shard.count == 0 || shard.index >= shard.count)
    throw std::invalid_argument(
        "shard " + std::to_string(shard.index) + "/" + std::to_string(shard.count) +
        ": the index must be below the shard count, which must be at least 1");
  if (shard.count > parameter_count)
    throw std::invalid_argument(std::to_string(shard.count) + " shards for a model of " +
                                std::to_string(parameter_count) +
                                " parameters: at most one shard per parameter");
  // parameter_count < 2^32 · 2^26 in practice (models are capped far below), so no overflow.
  return {parameter_count * shard.index / shard.count,
          parameter_count * (shard.index + 1) / shard.count};
}

std::vector<ShardPiece> shard_pieces(std::span<const std::uint32_t> tensor_sizes, ShardId shard) {
  std::uint64_t total = 0;
  for (std::uint32_t size : tensor_sizes) total += size;
  const auto [first, last] = shard_range(total, shard);
  std::vector<ShardPiece> pieces;
  std::uint64_t tensor_start = 0;
  for (std::size_t t = 0; t < tensor_sizes.size(); t++) {
    const std::uint64_t tensor_end = tensor_start + tensor_sizes[t];
    const std::uint64_t begin = std::max(first, tensor_start), end = std::min(last, tensor_end);
    if (begin < end)
      pieces.push_back({static_cast<std::uint32_t>(t),
                        static_cast<std::uint32_t>(begin - tensor_start),
                        static_cast<std::uint32_t>(end - begin)});
    tensor_start = tensor_end;
  }
  return pieces;
}

Model shard_model(const Model& full, ShardId shard) {
  const std::vector<std::uint32_t> sizes = sizes_of(full);
  const std::vector<ShardPiece> pieces = shard_pieces(sizes, shard);
  std::vector<TensorInfo> tensors;
  std::size_t offset = 0;
  for (const ShardPiece& p : pieces) {
    const TensorInfo& whole = full.tensors()[p.tensor];
    tensors.push_back({whole.name + "[" + std::to_string(p.offset) + ":" +
                           std::to_string(p.offset + p.size) + "]",
                       {static_cast<int>(p.size)},
                       offset,
                       p.size});
    offset += p.size;
  }
  const std::string label = full.spec().name + " shard " + std::to_string(shard.index) + "/" +
                            std::to_string(shard.count);
  Model slice(label, std::move(tensors), label + " of layout " + std::to_string(full.layout_id()));
  const std::uint64_t first = shard_range(full.parameter_count(), shard).first;
  const auto source = full.parameters().subspan(first, slice.parameter_count());
  std::copy(source.begin(), source.end(), slice.parameters().begin());
  return slice;
}

}  // namespace edgetrain::runtime
