// The timeline of a run with a sharded server (edgetrain-emulate --shards N): the assembled
// model's evaluations and the shards' ingress, in timeline.csv's columns so that summarize
// and compare read it like an unsharded server's.
#pragma once

#include <filesystem>
#include <string>
#include <utility>

namespace edgetrain::emulation {

// The run's ingress so far, {payload bytes, socket bytes}: over every shard and every
// incarnation of it (a shard killed with SIGKILL counts up to its last stats write, at most
// a second old), the ingress_payload_bytes and ingress_socket_bytes of its stats file
// (RUN/logs/shard-J-K.stats.json; other files are not counted).
std::pair<double, double> shard_ingress(const std::filesystem::path& run);

// Appends one timeline.csv row (creating the file with its header) from an evaluation of
// the shards' checkpoints (EVAL: edgetrain-fleet-eval --shards's JSON, with accuracy and
// shard_versions) made at ELAPSED seconds, and returns it. Its version is the mean of the
// shards' checkpoint versions, rounded: every worker update reaches every shard, so that is
// the count of updates applied, comparable with one server's version (the sum, which the
// workers see, would be N times larger). Throws when shard_versions is missing or empty.
std::string append_shard_row(const std::filesystem::path& run, double elapsed,
                             const std::filesystem::path& eval);

}  // namespace edgetrain::emulation
