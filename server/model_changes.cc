#include "server/model_changes.h"

#include <stdexcept>
#include <string>

#include "transport/codec.h"

namespace edgetrain::server {

ChangeRecord served_changes(std::uint64_t model_id, std::span<const std::uint32_t> tensor_sizes,
                            const ParameterStore& store, const runtime::PublishedModel* published) {
  if (published)
    return {model_id,
            tensor_sizes,
            published->parameters(),
            published->last_changed(),
            published->version(),
            published->changes_known_since(),
            0};
  return {model_id,
          tensor_sizes,
          store.parameters(),
          store.last_changed(),
          store.version(),
          store.changes_known_since(),
          0};
}

}  // namespace edgetrain::server
