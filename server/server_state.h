// The parameter server's durable state: the parameter store, the per-identity sequence
// numbers that make a retransmitted update apply once, the write-ahead log and the
// checkpoints, in one state directory:
//
//   checkpoint.safetensors  parameters at some version c (runtime::Model's safetensors),
//                           with c, the model id and the sequence table in __metadata__
//   wal.log                 the updates after c, preceded by the last min(c, D) updates
//                           up to c (D = max staleness): replay needs their touched sets
//                           so that σ after a restart equals σ of an uninterrupted run
//
// An update is acknowledged only after its WAL record is fsynced; a restart loads the
// checkpoint, refills the staleness history, replays the rest and resumes at exactly the
// last acknowledged version with bit-identical parameters.
//
// No networking here (server/resources.h maps this onto CoAP). Thread safety: submit(),
// checkpoint() and encoded_model() belong to one thread (the CoAP loop); snapshot() may be
// called from any thread (the evaluator) and copies under a mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/model.h"
#include "server/parameter_store.h"
#include "server/write_ahead_log.h"
#include "transport/codec.h"

namespace edgetrain::server {

// The state directory cannot be used as it is (other settings, damage, missing pieces).
class StateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ServerStateOptions {
  std::filesystem::path state_dir;
  ParameterStoreOptions store;
  std::uint64_t checkpoint_every = 1000;  // updates between checkpoints; 0: only checkpoint() makes one
  std::size_t max_update_bytes = std::size_t{4} << 20;  // larger bodies are refused as too large
};

enum class SubmitOutcome {
  kApplied,
  kDuplicate,     // (identity, sequence) already applied: same answer, nothing applied
  kTooLarge,      // → 4.13
  kMalformed,     // codec or store refused the bytes, or t_fetch ahead of t → 4.00
  kWrongModel,    // → 4.09, re-pull
  kTooStale,      // → 4.09, re-pull
  kOldSequence,   // below the identity's last applied sequence → 4.09
  kNotDurable,    // the WAL write failed; nothing applied → 5.00
};
const char* submit_outcome_name(SubmitOutcome outcome);

struct SubmitResult {
  SubmitOutcome outcome = SubmitOutcome::kApplied;
  std::uint64_t version = 0;  // applied/duplicate: the version the update produced; else the current one
  std::string diagnostic;     // one line for the worker's log; empty when applied
  bool acknowledged() const { return outcome == SubmitOutcome::kApplied || outcome == SubmitOutcome::kDuplicate; }
};

struct RecoveryReport {
  bool fresh = false;                  // the state directory was new
  std::uint64_t checkpoint_version = 0;
  std::size_t replayed_updates = 0;    // WAL records applied after the checkpoint
  std::uint64_t dropped_wal_bytes = 0; // a torn tail cut off
};

// Where submit() spends its time, summed over the updates it applied (refused ones are not
// counted). Wall-clock time on the CoAP thread, so the WAL figure includes waiting for the
// disk. Kept so that a benchmark can tell decoding, durability and applying apart.
struct SubmitTimings {
  std::uint64_t applied_updates = 0;
  double decode_seconds = 0;      // codec decode, sequence lookup, admissibility check
  double wal_seconds = 0;         // WAL record encode, write and fdatasync
  double apply_seconds = 0;       // the staleness-aware apply
  double checkpoint_seconds = 0;  // automatic checkpoints triggered by updates
};

struct SequenceEntry {
  std::uint64_t sequence = 0;  // last applied sequence of this identity
  std::uint64_t version = 0;   // the version that update produced
};

class ServerState {
 public:
  // Opens (or creates) the state in options.state_dir. A new directory starts from
  // `model`'s current parameters and gets a checkpoint at version 0 right away. Throws
  // StateError when the directory's checkpoint or WAL belongs to another model or other
  // settings (learning rate, max staleness, rule), or is damaged beyond a torn WAL tail.
  ServerState(runtime::Model model, ServerStateOptions options);
  ServerState(const ServerState&) = delete;
  ServerState& operator=(const ServerState&) = delete;

  // One POST /update from `identity` (the DTLS identity, non-empty).
  SubmitResult submit(std::string_view identity, std::span<const std::uint8_t> body);
  // Writes a checkpoint at the current version (atomic rename) and starts a new WAL that
  // keeps only the records replay needs as staleness history. Throws on I/O failure (the
  // old checkpoint and WAL stay valid).
  void checkpoint();

  std::uint64_t version() const { return store_.version(); }
  struct Snapshot {
    std::uint64_t version = 0;
    std::vector<float> parameters;
  };
  Snapshot snapshot() const;
  // The dense model message (codec) at the current version, encoded once per version.
  std::span<const std::uint8_t> encoded_model();
  // GET /model?since=V: a model delta (codec) with the parameters that changed after
  // `since`, or the dense model when `since` is ahead of the current version, older than
  // the parameter store's change record (e.g. before the last restart's history), or the
  // delta would not be smaller. `bytes` stays valid until the next call of either method.
  struct ModelReply {
    std::span<const std::uint8_t> bytes;
    bool delta = false;
  };
  ModelReply encoded_model_since(std::uint64_t since);

  const runtime::Model& model() const { return model_; }
  std::uint64_t model_id() const { return model_.layout_id(); }
  const RecoveryReport& recovery() const { return recovery_; }
  const std::map<std::string, SequenceEntry, std::less<>>& sequences() const { return sequences_; }
  std::uint64_t updates_since_checkpoint() const { return updates_since_checkpoint_; }
  const SubmitTimings& submit_timings() const { return submit_timings_; }
  std::uint64_t checkpoint_version() const { return checkpoint_version_; }
  // Empty unless the last automatic checkpoint failed (the WAL still holds everything).
  const std::string& checkpoint_error() const { return checkpoint_error_; }
  const std::filesystem::path& checkpoint_path() const { return checkpoint_path_; }
  const std::filesystem::path& wal_path() const { return wal_path_; }

 private:
  void recover();
  WalHeader wal_header() const;
  std::size_t history_length() const;  // updates the WAL must keep before a checkpoint
  void remember_recent(WalRecord record);
  transport::SparseUpdate decode_logged(const WalRecord& record) const;

  runtime::Model model_;
  ServerStateOptions options_;
  std::filesystem::path checkpoint_path_, wal_path_;
  std::vector<std::uint32_t> tensor_sizes_;
  ParameterStore store_;
  mutable std::mutex parameters_mutex_;  // guards store_'s parameters against snapshot()
  std::optional<WalWriter> wal_;
  std::deque<WalRecord> recent_;  // the last history_length() records, oldest first
  std::map<std::string, SequenceEntry, std::less<>> sequences_;
  RecoveryReport recovery_;
  std::uint64_t updates_since_checkpoint_ = 0;
  std::uint64_t checkpoint_version_ = 0;
  std::string checkpoint_error_;
  SubmitTimings submit_timings_;
  std::vector<std::uint8_t> encoded_model_;
  std::optional<std::uint64_t> encoded_version_;
  std::vector<std::uint8_t> encoded_delta_;
  std::uint64_t digest_ = 0;  // parameter_digest() at digest_version_
  std::optional<std::uint64_t> digest_version_;
};

}  // namespace edgetrain::server
