// GET /model?since=V, for any parameters that keep a per-entry change record (the true
// model's ParameterStore::last_changed(), or PublishedModel::last_changed()): the model
// delta (transport/CODEC.md) of the entries changed after V, with their values at `version`.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "server/parameter_store.h"
#include "server/published_model.h"

namespace edgetrain::server {

struct ChangeRecord {
  std::uint64_t model_id = 0;
  std::span<const std::uint32_t> tensor_sizes;
  std::span<const float> parameters;           // at `version`
  std::span<const std::uint64_t> last_changed;  // per entry: the version that last changed it
  std::uint64_t version = 0;
  std::uint64_t known_since = 0;  // last_changed is complete for every V ≥ this
  std::uint64_t digest = 0;       // transport::parameter_digest(parameters)
};

// What GET /model serves: the published model when there is one, else the store's exact
// parameters. The digest is left 0: the caller sets it (and may cache it per version).
ChangeRecord served_changes(std::uint64_t model_id, std::span<const std::uint32_t> tensor_sizes,
                            const ParameterStore& store, const PublishedModel* published);

// The encoded model delta from `since` to record.version, or nullopt when the worker must
// get the dense model instead: `since` is ahead of the version or older than what the record
// knows, or the delta would not be smaller than the dense model.
std::optional<std::vector<std::uint8_t>> encode_changes_since(const ChangeRecord& record, std::uint64_t since);

}  // namespace edgetrain::server
