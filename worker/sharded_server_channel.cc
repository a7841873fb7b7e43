#include "worker/sharded_server_channel.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <exception>
#include <numeric>
#include <optional>
#include <stdexcept>

namespace edgetrain::runtime {
namespace {

using transport::CoapCode;
using transport::CoapResponse;

// 5.02 Bad Gateway: a shard answered what this channel cannot use (it relays, like a proxy).
constexpr int kBadGateway = 502;

CoapResponse text_answer(int code, const std::string& text) {
  return CoapResponse(code, std::vector<std::uint8_t>(text.begin(), text.end()));
}

std::optional<std::uint64_t> since_of(const std::string& path) {
  static constexpr std::string_view kPrefix = "model?since=";
  if (!path.starts_with(kPrefix)) return std::nullopt;
  std::uint64_t value = 0;
  const char* first = path.data() + kPrefix.size();
  const char* last = path.data() + path.size();
  const auto [end, error] = std::from_chars(first, last, value);
  if (first == last || error != std::errc() || end != last) return std::nullopt;
  return value;
}

// The value encoding of an update's first tensor record (CODEC.md: byte 12 of the record,
// which starts after the 36-byte header); the worker's encoder uses one for all records.
// Only called on a body that decoded, so the record is there.
transport::ValueEncoding value_encoding_of(std::span<const std::uint8_t> body,
                                           const transport::SparseUpdate& update) {
  constexpr std::size_t kHeaderBytes = 36, kEncodingByte = 12;
  if (update.tensors.empty() || body.size() <= kHeaderBytes + kEncodingByte)
    return transport::ValueEncoding::kFp32;
  return static_cast<transport::ValueEncoding>(body[kHeaderBytes + kEncodingByte]);
}

int refusal_code(transport::CodecErrorCode code) {
  if (code == transport::CodecErrorCode::kWrongModel) return CoapCode::kConflict;
  if (code == transport::CodecErrorCode::kTooLarge) return CoapCode::kRequestEntityTooLarge;
  return CoapCode::kBadRequest;
}

}  // namespace

ShardedUpdateSplitter::ShardedUpdateSplitter(const Model& model, std::uint32_t shard_count) {
  if (shard_count == 0) throw std::invalid_argument("a sharded server needs at least one shard");
  std::vector<std::uint32_t> tensor_sizes;
  for (const TensorInfo& t : model.tensors())
    tensor_sizes.push_back(static_cast<std::uint32_t>(t.size));
  pieces_of_tensor_.resize(tensor_sizes.size());
  for (std::uint32_t s = 0; s < shard_count; s++) {
    const ShardId id{s, shard_count};
    layout_ids_.push_back(shard_model(model, id).layout_id());
    const std::vector<ShardPiece> pieces = shard_pieces(tensor_sizes, id);
    for (std::uint32_t j = 0; j < pieces.size(); j++)
      pieces_of_tensor_[pieces[j].tensor].push_back({s, j, pieces[j].offset, pieces[j].size});
  }
}

void ShardedUpdateSplitter::split(const transport::SparseUpdate& update,
                                  std::span<const std::uint64_t> fetched_versions,
                                  std::vector<transport::SparseUpdate>& parts) const {
  if (fetched_versions.size() != shard_count())
    throw std::invalid_argument("ShardedUpdateSplitter::split: " +
                                std::to_string(fetched_versions.size()) +
                                " fetched versions for " + std::to_string(shard_count()) +
                                " shards");
  parts.assign(shard_count(), {});
  for (std::size_t s = 0; s < shard_count(); s++) {
    parts[s].model_id = layout_ids_[s];
    parts[s].sequence = update.sequence;
    parts[s].fetched_version = fetched_versions[s];
  }
  for (const transport::SparseTensor& record : update.tensors) {
    if (record.tensor >= pieces_of_tensor_.size())
      throw std::invalid_argument("ShardedUpdateSplitter::split: tensor " +
                                  std::to_string(record.tensor) + " is not one of the model's " +
                                  std::to_string(pieces_of_tensor_.size()));
    const std::vector<PieceRef>& refs = pieces_of_tensor_[record.tensor];
    std::size_t r = 0;
    transport::SparseTensor* target = nullptr;
    for (std::size_t j = 0; j < record.indices.size(); j++) {
      const std::uint32_t index = record.indices[j];
      bool moved = false;
      while (index >= refs[r].offset + refs[r].size) {
        if (++r == refs.size())
          throw std::invalid_argument("ShardedUpdateSplitter::split: index " +
                                      std::to_string(index) + " is past tensor " +
                                      std::to_string(record.tensor));
        moved = true;
      }
      if (target == nullptr || moved) {
        transport::SparseUpdate& part = parts[refs[r].shard];
        part.tensors.push_back({refs[r].local_tensor, refs[r].size, {}, {}});
        target = &part.tensors.back();
      }
      target->indices.push_back(index - refs[r].offset);
      target->values.push_back(record.values[j]);
    }
  }
}

ShardedServerChannel::ShardedServerChannel(const Model& model,
                                           std::vector<std::unique_ptr<ServerChannel>> shards)
    : model_id_(model.layout_id()),
      splitter_(model, static_cast<std::uint32_t>(shards.size())),
      parameters_(model.parameter_count(), 0.0f),
      acknowledged_(shards.size(), 0) {
  for (const TensorInfo& t : model.tensors())
    tensor_sizes_.push_back(static_cast<std::uint32_t>(t.size));
  const auto count = static_cast<std::uint32_t>(shards.size());
  for (std::uint32_t s = 0; s < count; s++) {
    const ShardId id{s, count};
    Shard shard;
    shard.channel = std::move(shards[s]);
    shard.layout_id = splitter_.shard_layout_id(s);
    shard.pieces = shard_pieces(tensor_sizes_, id);
    const auto [first, last] = shard_range(parameters_.size(), id);
    shard.first = static_cast<std::size_t>(first);
    shard.size = static_cast<std::size_t>(last - first);
    for (const ShardPiece& p : shard.pieces) shard.tensor_sizes.push_back(p.size);
    shards_.push_back(std::move(shard));
  }
}

std::uint64_t ShardedServerChannel::synthetic_version() const {
  std::uint64_t sum = 0;
  for (const Shard& s : shards_) sum += s.version;
  return sum;
}

void ShardedServerChannel::remember_versions() {
  std::vector<std::uint64_t> versions;
  for (const Shard& s : shards_) versions.push_back(s.version);
  if (!recent_.empty() && recent_.back().second == versions) return;
  recent_.emplace_back(synthetic_version(), std::move(versions));
  // A worker posts against its last pull; a few more cover retries across a re-pull.
  constexpr std::size_t kRemembered = 64;
  if (recent_.size() > kRemembered) recent_.pop_front();
}

const std::vector<std::uint64_t>* ShardedServerChannel::versions_behind(
    std::uint64_t synthetic) const {
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it)
    if (it->first == synthetic) return &it->second;
  return nullptr;
}

CoapResponse ShardedServerChannel::pull_shard(std::size_t s,
                                              std::vector<transport::SparseTensor>& changed) {
  Shard& shard = shards_[s];
  const transport::ModelLayout layout{shard.layout_id, shard.tensor_sizes};
  const std::span<float> slice = std::span<float>(parameters_).subspan(shard.first, shard.size);
  std::string problem;
  // A delta that does not fit (or a shard replaced under us) costs one more pull of the slice.
  for (int attempt = 0; attempt < 2; attempt++) {
    const std::string path = shard.exact ? "model?since=" + std::to_string(shard.version) : "model";
    CoapResponse answer = shard.channel->get_model(path);
    if (answer.code != CoapCode::kContent) return answer;
    const auto kind = transport::model_message_kind(answer.payload);
    if (kind == transport::ModelMessageKind::kDense) {
      auto decoded = transport::decode_dense_model(answer.payload, layout);
      if (decoded) {
        // The entries whose bits changed are this shard's part of a delta for a worker that
        // holds the previous assembly (a shard sends its whole slice when that is smaller).
        changed.clear();
        const std::vector<float>& values = decoded.value().values;
        std::size_t start = 0;
        for (std::uint32_t j = 0; j < shard.tensor_sizes.size(); j++) {
          transport::SparseTensor record{j, shard.tensor_sizes[j], {}, {}};
          for (std::uint32_t i = 0; i < shard.tensor_sizes[j]; i++)
            if (std::bit_cast<std::uint32_t>(values[start + i]) !=
                std::bit_cast<std::uint32_t>(slice[start + i])) {
              record.indices.push_back(i);
              record.values.push_back(values[start + i]);
            }
          if (!record.indices.empty()) changed.push_back(std::move(record));
          start += shard.tensor_sizes[j];
        }
        std::copy(values.begin(), values.end(), slice.begin());
        shard.version = decoded.value().version;
        shard.exact = true;
        return answer;
      }
      problem = decoded.error().message;
    } else if (kind == transport::ModelMessageKind::kDelta && shard.exact) {
      auto decoded = transport::decode_model_delta(answer.payload, layout);
      if (!decoded) {
        problem = decoded.error().message;
      } else if (decoded.value().base_version != shard.version) {
        problem = "a delta from version " + std::to_string(decoded.value().base_version) +
                  ", asked from " + std::to_string(shard.version);
      } else if (!transport::apply_model_delta(decoded.value(), shard.tensor_sizes, slice)) {
        problem = "a delta that does not fit the slice";
      } else if (transport::parameter_digest(slice) != decoded.value().digest) {
        problem = "the slice after the delta is not the shard's (digest)";
      } else {
        shard.version = decoded.value().version;
        changed = std::move(decoded.value().tensors);
        return answer;
      }
    } else {
      problem = "neither a model nor a delta";
    }
    shard.exact = false;
  }
  return text_answer(kBadGateway, "shard " + std::to_string(s) + " of " +
                                      std::to_string(shards_.size()) +
                                      " sent an unusable model: " + problem);
}

CoapResponse ShardedServerChannel::dense_answer() const {
  auto encoded =
      transport::encode_dense_model(model_id_, synthetic_version(), tensor_sizes_, parameters_);
  if (!encoded)
    throw std::logic_error("sharded channel: cannot encode the model: " + encoded.error().message);
  return CoapResponse(CoapCode::kContent, std::move(encoded).value());
}

CoapResponse ShardedServerChannel::get_model(const std::string& path) {
  const std::optional<std::uint64_t> since = since_of(path);
  if (!since && path != "model")
    return text_answer(CoapCode::kNotFound, "no such resource: " + path);
  // The worker holds what this channel holds when it asks from a version whose shard
  // versions are where every slice is now: then the shards' deltas, put together, are its
  // delta. (Not so after a pull that one shard's silence broke off: the shards before it
  // moved on, and the worker never got their part.)
  bool worker_current = since.has_value();
  if (worker_current) {
    const std::vector<std::uint64_t>* behind = versions_behind(*since);
    worker_current = behind != nullptr;
    for (std::size_t s = 0; s < shards_.size() && worker_current; s++)
      worker_current = shards_[s].exact && shards_[s].version == (*behind)[s];
  }
  worker_current = worker_current && !slices_changed_unseen_;
  std::vector<std::vector<transport::SparseTensor>> changed(shards_.size());
  auto note_broken_off = [&] {
    for (const auto& records : changed) slices_changed_unseen_ |= !records.empty();
  };
  for (std::size_t s = 0; s < shards_.size(); s++) {
    CoapResponse answer;
    try {
      answer = pull_shard(s, changed[s]);
    } catch (...) {
      note_broken_off();
      throw;
    }
    if (answer.code != CoapCode::kContent) {
      note_broken_off();
      return answer;
    }
  }
  slices_changed_unseen_ = false;  // this answer brings the worker to the assembly
  remember_versions();
  if (!worker_current) return dense_answer();

  transport::ModelDelta delta;
  delta.model_id = model_id_;
  delta.base_version = *since;
  delta.version = synthetic_version();
  delta.digest = transport::parameter_digest(parameters_);
  std::vector<transport::SparseTensor> whole(tensor_sizes_.size());
  // Shards in order, each holding one piece of a tensor at most: indices stay increasing.
  for (std::size_t s = 0; s < shards_.size(); s++) {
    for (const transport::SparseTensor& record : changed[s]) {
      const ShardPiece& piece = shards_[s].pieces[record.tensor];
      transport::SparseTensor& target = whole[piece.tensor];
      target.tensor = piece.tensor;
      target.size = tensor_sizes_[piece.tensor];
      for (std::size_t j = 0; j < record.indices.size(); j++) {
        target.indices.push_back(piece.offset + record.indices[j]);
        target.values.push_back(record.values[j]);
      }
    }
  }
  for (auto& t : whole)
    if (!t.indices.empty()) delta.tensors.push_back(std::move(t));
  auto encoded = transport::encode_model_delta(delta);
  if (!encoded || encoded.value().size() >= transport::dense_model_bytes(tensor_sizes_))
    return dense_answer();
  return CoapResponse(CoapCode::kContent, std::move(encoded).value());
}

CoapResponse ShardedServerChannel::post_update(std::span<const std::uint8_t> body) {
  auto decoded = transport::decode_sparse_update(body, {model_id_, tensor_sizes_});
  if (!decoded) return text_answer(refusal_code(decoded.error().code), decoded.error().message);
  const transport::SparseUpdate& update = decoded.value();
  const std::vector<std::uint64_t>* fetched = versions_behind(update.fetched_version);
  if (!fetched)
    return text_answer(CoapCode::kConflict,
                       "version " + std::to_string(update.fetched_version) +
                           " is not one of this channel's recent models: pull again");
  std::vector<transport::SparseUpdate> parts;
  splitter_.split(update, *fetched, parts);
  // A piece of a sign + scale record keeps its values ±s, so it encodes the same way.
  const transport::EncodeOptions options{value_encoding_of(body, update)};
  std::optional<CoapResponse> refusal;
  std::exception_ptr unanswered;
  std::uint64_t sum = 0;
  for (std::size_t s = 0; s < shards_.size(); s++) {
    auto encoded = transport::encode_sparse_update(parts[s], options);
    if (!encoded)
      throw std::logic_error("sharded channel: cannot encode shard " + std::to_string(s) +
                             "'s part: " + encoded.error().message);
    CoapResponse answer;
    try {
      answer = shards_[s].channel->post_update(encoded.value());
    } catch (const transport::TransportError&) {
      if (!unanswered) unanswered = std::current_exception();
      continue;
    }
    if (answer.code == CoapCode::kChanged) {
      const auto version = transport::decode_update_reply(answer.payload);
      if (!version) {
        if (!refusal)
          refusal =
              text_answer(kBadGateway, "shard " + std::to_string(s) + " acknowledged no version");
        continue;
      }
      acknowledged_[s] = std::max(acknowledged_[s], *version);
      sum += *version;
    } else if (!refusal) {
      refusal = std::move(answer);
    }
  }
  if (unanswered) std::rethrow_exception(unanswered);
  if (refusal) return *refusal;
  return CoapResponse(CoapCode::kChanged, transport::encode_update_reply(sum));
}

}  // namespace edgetrain::runtime
