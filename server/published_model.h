// The published model lives in runtime/published_model.h (the model library): the server
// hands it to workers, and a gossip peer publishes its own model the same way.
#pragma once

#include "runtime/published_model.h"

namespace edgetrain::server {
using runtime::PublishedModel;
using runtime::PublishOptions;
}  // namespace edgetrain::server
