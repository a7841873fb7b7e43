#include "transport/model_changes.h"

#include <stdexcept>
#include <string>

#include "transport/codec.h"

namespace edgetrain::transport {

std::optional<std::vector<std::uint8_t>> encode_changes_since(const ChangeRecord& record,
                                                              std::uint64_t since) {
  if (since > record.version || since < record.known_since) return std::nullopt;
  const std::size_t dense_bytes = dense_model_bytes(record.tensor_sizes);
  ModelDelta delta;
  delta.model_id = record.model_id;
  delta.base_version = since;
  delta.version = record.version;
  delta.digest = record.digest;
  // Stop collecting once the delta cannot beat the dense model (the codec's least size of
  // each tensor record).
  std::size_t lower_bound = kModelDeltaHeaderBytes, offset = 0;
  for (std::uint32_t t = 0; t < record.tensor_sizes.size(); ++t) {
    const std::uint32_t size = record.tensor_sizes[t];
    SparseTensor changed{t, size, {}, {}};
    for (std::uint32_t i = 0; i < size; ++i) {
      if (record.last_changed[offset + i] > since) {
        changed.indices.push_back(i);
        changed.values.push_back(record.parameters[offset + i]);
      }
    }
    offset += size;
    if (changed.indices.empty()) continue;
    lower_bound += model_delta_record_min_bytes(changed.size, changed.indices.size());
    if (lower_bound >= dense_bytes) return std::nullopt;
    delta.tensors.push_back(std::move(changed));
  }
  auto encoded = encode_model_delta(delta);
  if (!encoded) throw std::logic_error("cannot encode a model delta: " + encoded.error().message);
  if (encoded.value().size() >= dense_bytes) return std::nullopt;
  return std::move(encoded).value();
}

}  // namespace edgetrain::transport
