// GET /model?since=V for any parameters that keep a per-entry change record (the server's
// ParameterStore::last_changed(), a PublishedModel's, a gossip peer's published model): the
// model delta (CODEC.md) of the entries changed after V, with their values at `version`.
// Pure functions over spans, like the codec they call.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace edgetrain::transport {

struct ChangeRecord {
  std::uint64_t model_id = 0;
  std::span<const std::uint32_t> tensor_sizes;
  std::span<const float> parameters;            // at `version`
  std::span<const std::uint64_t> last_changed;  // per entry: the version that last changed it
  std::uint64_t version = 0;
  std::uint64_t known_since = 0;  // last_changed is complete for every V ≥ this
  std::uint64_t digest = 0;       // parameter_digest(parameters)
};

// The encoded model delta from `since` to record.version, or nullopt when the client must
// get the dense model instead: `since` is ahead of the version or older than what the record
// knows, or the delta would not be smaller than the dense model.
std::optional<std::vector<std::uint8_t>> encode_changes_since(const ChangeRecord& record,
                                                              std::uint64_t since);

}  // namespace edgetrain::transport
