// What GET /model serves (the change record of transport/model_changes.h): the true model's
// ParameterStore::last_changed(), or the published model's.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "server/parameter_store.h"
#include "model/published_model.h"
#include "transport/model_changes.h"

namespace edgetrain::server {

using transport::ChangeRecord;
using transport::encode_changes_since;

// What GET /model serves: the published model when there is one, else the store's exact
// parameters. The digest is left 0: the caller sets it (and may cache it per version).
ChangeRecord served_changes(std::uint64_t model_id, std::span<const std::uint32_t> tensor_sizes,
                            const ParameterStore& store, const runtime::PublishedModel* published);

}  // namespace edgetrain::server
