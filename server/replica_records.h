// The cheap pull served by edgetrain-server (--pull-fraction; issue 38 part 3, ours): per
// device identity, the server's record R of the copy that device holds, and the answer to
// its GET /model[?since=V] built from it by replica_pull() (server/replica_pull.h, the pure
// function the simulator uses).
//
// What a pull gets:
//   - since=0 when the records were given version 0's model (the seeded first pull, ours: a
//     worker starts from the model built from the run's seed, held as version 0) and the
//     record, if any, is not at version 0 and did not send its last delta from 0: R starts
//     again as that model at version 0, and the answer is a new delta from it as below. A
//     worker whose seeded model is another (another seed, a build that initialises
//     differently) fails the digest and pulls dense; nothing else depends on R being the
//     server's own version 0 (a server resumed from a checkpoint or warm-started with
//     --init-from serves the same deltas from R);
//   - no since=, or a since= the record does not know (no record yet, the record was pushed
//     out, the server restarted, the worker restarted with an old version, a delta it could
//     not use): the dense model, and R becomes the model (the caller sends its ordinary dense
//     body, ETag = version);
//   - since= the version of R while the model has moved on: a new delta from R (replica_pull:
//     per tensor the max(min_entries, ⌈fraction·n⌉) largest |W − R|), with the digest of the
//     new R; R and its version move on;
//   - since= the base of the last delta (or the version of R while the model has not moved):
//     that same delta again, byte for byte. This is what keeps a block-wise answer whole
//     while the model moves on (the transport runs the handler again when it no longer
//     holds the body: the Q-Block2 store after 10 s, libcoap's Block2), and it makes a lost
//     answer cost one repeat, not a dense pull: a delta only sets entries to values, so a
//     worker that did apply it and gets it again ends with the same copy and digest.
// Each delta body has its own ETag (a hash of its bytes, never 0: libcoap 4.3.1 makes one
// up for an ETag of 0 on block-wise bodies), so the blocks of two bodies of one version
// (entries left out sent later while the model stands still) are never mixed.
//
// σ per entry (options.pull.entry_staleness, ours; docs/design.md §3): each record also
// keeps `held_since`, per entry the version at which the copy's value was last the model's
// (replica_pull's), and entry_versions() hands it to the store for that device's update.
// It is the device's copy only while the record's version is the update's t_fetch: with no
// record (never pulled here, pushed out, the server restarted) or a record that moved on
// (the device pulled again before this update arrived) or is behind, the update gets the
// paper's σ (every entry as old as t_fetch), counted as a fallback.
//
// Memory: one float per parameter and device (the copy), 8 more bytes with σ per entry,
// plus the last delta's bytes, for at most `max_devices` devices; the one that pulled longest ago gives its record up first
// (its next pull is dense). Not durable: after a restart every device's next pull is dense,
// and nothing acknowledged is lost, since pulls carry no updates.
//
// Not thread-safe: ServerState calls it under the resources' mutex. Pure bookkeeping, no
// network.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/replica_pull.h"

namespace edgetrain::server {

struct ReplicaRecordOptions {
  ReplicaPullOptions pull;  // pull.fraction > 0: the cheap pull is on
  // Records kept at most (devices × parameters × 4 bytes of copies, plus each last delta).
  std::size_t max_devices = 256;
  bool enabled() const { return pull.enabled(); }
};

// Throws std::invalid_argument naming the setting: the pull options (check_replica_pull_
// options, which refuse entry staleness without a fraction), fp16 values, max_devices 0.
void check_replica_record_options(const ReplicaRecordOptions& options);

class ReplicaRecords {
 public:
  // `version_zero`: the model a worker holds as version 0 before its first pull (the one
  // built from the run's seed), or empty: then since=0 is a base like any other (dense
  // without a record). Throws std::invalid_argument when it has not the layout's length.
  ReplicaRecords(std::uint64_t model_id, std::vector<std::uint32_t> tensor_sizes,
                 ReplicaRecordOptions options, std::vector<float> version_zero = {});

  enum class Kind {
    kDense,   // send the dense model at `version` (ETag = version); R is now that model
    kDelta,   // a new delta from R
    kRepeat,  // the last delta again (same bytes, same ETag)
  };
  struct Pull {
    Kind kind = Kind::kDense;
    std::shared_ptr<const std::vector<std::uint8_t>> body;  // kDelta, kRepeat: the encoded delta
    std::uint64_t etag = 0;                                 // kDelta, kRepeat
  };
  // The answer to `identity`'s GET /model (since: its ?since=, none for a plain GET /model)
  // when the model is `parameters` at `version`. `parameters` must have the layout's length.
  // fp16_increments: the device takes fp16 increments; its new deltas carry them when
  // options.pull.values is kFp16Increment (else, and for a device that did not ask, fp32).
  Pull pull(std::string_view identity, std::optional<std::uint64_t> since,
            std::span<const float> parameters, std::uint64_t version,
            bool fp16_increments = false);

  // σ per entry: the versions h_i of `identity`'s copy for its update computed from
  // `fetched_version` (its t_fetch), valid until the next pull(); empty (the paper's σ) when
  // options.pull.entry_staleness is off or the record is not that copy (above).
  std::span<const std::uint64_t> entry_versions(std::string_view identity,
                                                std::uint64_t fetched_version) const;
  // Counts an update the store accepted as given entry versions or not (σ per entry only).
  void count_update(bool had_entry_versions);

  struct Counters {
    std::uint64_t dense_pulls = 0;     // answered dense (a record made or reset)
    std::uint64_t seeded_records = 0;  // records (re)started from version 0's model (since=0)
    std::uint64_t delta_pulls = 0;     // new deltas
    std::uint64_t repeated_pulls = 0;  // the last delta again
    std::uint64_t records_evicted = 0;
    std::uint64_t delta_bytes = 0;          // of new deltas
    std::uint64_t largest_delta_bytes = 0;  // of one new delta
    // σ per entry: updates given their device's entry versions, and those that fell back
    // to the paper's σ (no record, or one at another version than their t_fetch).
    std::uint64_t entry_sigma_updates = 0;
    std::uint64_t entry_sigma_fallbacks = 0;
  };
  const Counters& counters() const { return counters_; }
  std::size_t records() const { return records_.size(); }
  // Bytes the records hold now (copies, entry versions and last deltas).
  std::size_t bytes() const;
  // {"fraction", "min_entries", "max_devices", "records", "record_bytes", "dense_pulls",
  // "seeded_records", "delta_pulls", "repeated_pulls", "records_evicted", "delta_bytes",
  // "largest_delta_bytes", "dense_model_bytes", "entry_staleness", "entry_sigma_updates",
  // "entry_sigma_fallbacks"} as one JSON object (/status, stats file).
  std::string stats_json() const;
  const ReplicaRecordOptions& options() const { return options_; }

 private:
  struct Record {
    std::vector<float> held;         // R: the device's copy as the server built it
    std::uint64_t held_version = 0;  // the version R was sent as
    // σ per entry only: per entry, the version at which R's value was last the model's.
    std::vector<std::uint64_t> held_since;
    // The last delta: from `last_base` to held_version; empty after a dense pull.
    std::shared_ptr<const std::vector<std::uint8_t>> last_body;
    std::uint64_t last_base = 0;
    std::uint64_t last_etag = 0;
    std::uint64_t last_used = 0;  // pull counter, for pushing out the oldest
  };
  Record& record_for(std::string_view identity);
  Pull dense(Record& record, std::span<const float> parameters, std::uint64_t version);

  std::uint64_t model_id_;
  std::vector<std::uint32_t> tensor_sizes_;
  std::size_t parameter_count_ = 0;
  ReplicaRecordOptions options_;
  std::vector<float> version_zero_;  // empty: no seeded first pull
  std::map<std::string, Record, std::less<>> records_;
  std::uint64_t pulls_ = 0;
  Counters counters_;
};

}  // namespace edgetrain::server
