// The parameter server's durable state: the parameter store, the per-identity sequence
// numbers that make a retransmitted update apply once, the write-ahead log and the
// checkpoints, in one state directory:
//
//   checkpoint.safetensors  parameters at some version c (runtime::Model's safetensors),
//                           with c, the model id, the sequence table and a checksum
//                           (server/checkpoint_file.h) in __metadata__
//   wal.log                 the updates after c, preceded by the last min(c, D) updates
//                           up to c (D = max staleness): replay needs their touched sets
//                           so that σ after a restart equals σ of an uninterrupted run
//   checkpoint.prev.safetensors, wal.prev.log
//                           the checkpoint before (version p) and the WAL as it was when
//                           c was written (history of p, updates p+1..c): if
//                           checkpoint.safetensors is damaged, recovery starts from p and
//                           replays both logs instead
//
// An update is acknowledged only after its WAL record is fsynced; a restart loads the
// checkpoint, refills the staleness history, replays the rest and resumes at exactly the
// last acknowledged version with bit-identical parameters.
//
// Group commit: submit() syncs once per update. The CoAP server instead stage()s each
// update (checked, WAL record written, not yet synced, not yet applied) and lets one
// fdatasync on a background thread cover every update staged meanwhile (GroupCommit,
// server/group_commit.h); finish_commit() then applies the covered updates in log order
// (the single writer replay relies on) and hands back their results, which are the only
// ones that may be acknowledged.
//
// No networking here (server/resources.h maps this onto CoAP). Thread safety: submit(),
// stage(), the commit calls, checkpoint() and encoded_model() are called by one thread at a
// time (one event loop, or several under ServerResources' mutex); decode_body() may run on
// any thread alongside them; snapshot() may be called from any thread (the evaluator) and
// copies under a mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "server/group_commit.h"
#include "server/parameter_store.h"
#include "model/published_model.h"
#include "server/replica_records.h"
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
  // Off (default): GET /model hands out the exact parameters. On: workers get the published
  // model, which follows the true one by bounded steps (model/published_model.h).
  runtime::PublishOptions publish;
  // The cheap pull (server/replica_records.h; off by default): per device, GET /model
  // answers from the server's record of that device's copy (pull_for_device()). Not with
  // `publish`.
  ReplicaRecordOptions replica_pull;
  std::uint64_t checkpoint_every =
      1000;  // updates between checkpoints; 0: only checkpoint() makes one
  std::size_t max_update_bytes = std::size_t{4} << 20;  // larger bodies are refused as too large
  // Makes the WAL records written so far durable; returns 0 or an errno value. Unset:
  // fdatasync(fd). Runs on the WAL sync thread. Tests inject slow or failing disks here.
  std::function<int(int fd)> wal_sync;
  // Called on the CoAP thread each time an update has been staged and waits for its sync
  // (GroupCommit::StagedHook): a test's signal that a request is now deferred.
  GroupCommit::StagedHook on_staged;
  // Devices that keep sending bad updates (server/README.md, "Bad updates"): after this many
  // consecutive updates refused as out of bounds or malformed, a device's updates get 4.03
  // (kQuarantined) for quarantine_seconds, or until the server restarts when that is 0.
  // 0: never quarantine (the device is still counted and reported).
  std::uint32_t quarantine_after = 0;
  double quarantine_seconds = 0;
  // Per tensor of an update: sent values whose L2 norm exceeds this are scaled down to it
  // before the update is checked, logged (the WAL holds the clipped update, fp32) and
  // applied. 0: no clipping.
  double clip_update_norm = 0;
  // At start, when replay reaches an update that would make a parameter non-finite (a log
  // written before updates were checked) or the checkpoint holds one: resume at the last
  // finite state before it, keeping the logs aside, instead of refusing to start.
  bool rollback_non_finite = false;
  // The clock quarantines are timed with (tests set it).
  std::function<std::chrono::steady_clock::time_point()> now = [] {
    return std::chrono::steady_clock::now();
  };
};

// A device's consecutive refusals after which it is reported (log, /status, stats file).
inline constexpr std::uint32_t kReportAfterConsecutiveRefusals = 3;

enum class SubmitOutcome {
  kApplied,
  kDuplicate,    // (identity, sequence) already applied: same answer, nothing applied
  kTooLarge,     // → 4.13
  kMalformed,    // codec or store refused the bytes, or t_fetch ahead of t → 4.00
  kWrongModel,   // → 4.09, re-pull
  kTooStale,     // → 4.09, re-pull
  kOldSequence,  // below the identity's last applied sequence → 4.09
  kNotDurable,   // the WAL write failed; nothing applied → 5.00
  kOutOfBounds,  // would leave a parameter non-finite or beyond the bound → 4.22
  kQuarantined,  // the sender is quarantined (too many bad updates in a row) → 4.03
};
const char* submit_outcome_name(SubmitOutcome outcome);

struct SubmitResult {
  SubmitOutcome outcome = SubmitOutcome::kApplied;
  std::uint64_t version =
      0;  // applied/duplicate: the version the update produced; else the current one
  std::string diagnostic;  // one line for the worker's log; empty when applied
  std::uint64_t staleness =
      0;  // applied: updates applied between its t_fetch and it (per-device health)
  bool acknowledged() const {
    return outcome == SubmitOutcome::kApplied || outcome == SubmitOutcome::kDuplicate;
  }
};

// What stage() decided: either an answer right away, or a ticket to wait for.
struct StagedSubmit {
  // Set when the answer does not depend on a sync: refusals, a duplicate of an applied
  // update, a failed WAL write.
  std::optional<SubmitResult> settled;
  // Otherwise: the version the update will produce once durable. A duplicate of a staged
  // update gets the ticket of the original. finish_commit() reports results by ticket.
  std::uint64_t ticket = 0;
};

struct SettledSubmit {
  std::uint64_t ticket = 0;
  SubmitResult result;  // kApplied, or kNotDurable when the sync (or the WAL) failed
};

// Per identity: the updates refused, by outcome name, and the run of bad ones (out of
// bounds, malformed) since its last accepted update.
struct DeviceRefusals {
  std::map<std::string, std::uint64_t> refused;
  std::uint32_t consecutive_bad = 0;
  std::uint64_t quarantines = 0;  // times it was quarantined
  bool quarantined = false;
  std::optional<std::chrono::steady_clock::time_point> quarantined_until;  // none: until restart
  bool reported() const { return consecutive_bad >= kReportAfterConsecutiveRefusals; }
};

// Recovery stopped before an update that would have made a parameter non-finite
// (ServerStateOptions::rollback_non_finite).
struct Rollback {
  std::uint64_t non_finite_version = 0;  // the logged update that made a parameter non-finite
  std::uint64_t first_bad_version =
      0;                              // the first one beyond the bound: recovery stopped before it
  std::uint64_t dropped_updates = 0;  // acknowledged records not replayed (kept aside)
  std::vector<std::string> kept_files;  // where the logs as they were are kept
};

struct RecoveryReport {
  bool fresh = false;                    // the state directory was new
  std::uint64_t checkpoint_version = 0;  // of the checkpoint recovery started from
  std::size_t replayed_updates = 0;      // WAL records applied after the checkpoint
  std::uint64_t dropped_wal_bytes = 0;   // a torn tail cut off
  // checkpoint.safetensors was damaged (or missing) and recovery started from
  // checkpoint.prev.safetensors instead.
  bool used_previous_checkpoint = false;
  std::optional<Rollback> rollback;
  // What the operator should read in the log: leftover temporaries removed, a checkpoint
  // without a checksum loaded unverified, a damaged checkpoint set aside.
  std::vector<std::string> notes;
};

// Where submit() spends its time, summed over the updates it applied (refused ones are not
// counted). Wall-clock time on the CoAP thread, so the WAL figure includes waiting for the
// disk. Kept so that a benchmark can tell decoding, durability and applying apart.
struct SubmitTimings {
  std::uint64_t applied_updates = 0;
  double decode_seconds = 0;  // codec decode, sequence lookup, admissibility check
  double wal_seconds =
      0;  // WAL record encode and write, and its share of the fdatasync that covered it
  double apply_seconds = 0;       // the staleness-aware apply
  double checkpoint_seconds = 0;  // automatic checkpoints triggered by updates
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
  // Waits for a running sync; staged updates that were never reported are not applied here
  // (if their records reached the disk, the next start replays them: unacknowledged, but
  // durable, like a crash right after the sync).
  ~ServerState() = default;

  // One POST /update from `identity` (the DTLS identity, non-empty), durable and applied
  // when it returns (one fdatasync of its own). Throws std::logic_error while updates are
  // staged.
  SubmitResult submit(std::string_view identity, std::span<const std::uint8_t> body);

  // Group commit, on the same thread as submit(). stage() checks the update as submit()
  // does, against the version it will land on (after the staged ones), and writes its WAL
  // record without syncing. Nothing is applied and nothing may be acknowledged until
  // finish_commit() reports the ticket.
  StagedSubmit stage(std::string_view identity, std::span<const std::uint8_t> body);
  // The first step of stage() on its own: the size check and the decoding against the
  // model's layout, which read nothing that changes after construction. Any thread, also
  // while another calls stage(): a server with several event loops decodes each body
  // before it takes the lock that orders stage() calls, then passes the result (for the
  // same body) to stage(), which checks exactly as without it.
  struct DecodedBody {
    std::optional<transport::SparseUpdate> update;  // none: refused with outcome and diagnostic
    SubmitOutcome outcome = SubmitOutcome::kMalformed;
    std::string diagnostic;
    double seconds = 0;  // counted into SubmitTimings::decode_seconds when it is applied
  };
  DecodedBody decode_body(std::span<const std::uint8_t> body) const;
  StagedSubmit stage(std::string_view identity, std::span<const std::uint8_t> body,
                     DecodedBody decoded);
  // Starts one fdatasync on the sync thread covering every update staged so far, unless a
  // sync is already running (the updates staged meanwhile wait for the next one).
  void start_commit();
  // Once the running sync has finished (wait = true: blocks until then; false: returns
  // nothing if it is still running), applies the updates it covered, in log order, and
  // returns their results. If the sync failed, every staged update (also those staged
  // after it started) is cut off the WAL and reported kNotDurable; nothing is applied.
  // Runs an automatic checkpoint when one is due (syncing what is staged first), then
  // starts the next sync if updates are staged.
  std::vector<SettledSubmit> finish_commit(bool wait);
  // Updates staged and not yet reported by finish_commit().
  std::size_t staged_updates() const { return commit_.staged(); }
  // Called on the sync thread whenever a sync has finished (finish_commit() then has
  // results): the event loops' wake-up. Set before serving.
  void set_on_sync_finished(std::function<void()> hook) {
    commit_.set_on_finished(std::move(hook));
  }

  // Writes a checkpoint at the current version (atomic rename; the one before becomes
  // checkpoint.prev.safetensors, the WAL until now wal.prev.log) and starts a new WAL that
  // keeps only the records replay needs as staleness history. Throws on I/O failure (the
  // old checkpoint and WAL stay valid), std::logic_error while updates are staged.
  void checkpoint();

  std::uint64_t version() const { return store_.version(); }
  // lr(t) of the store's schedule for the next update (the --lr when there is none).
  float current_learning_rate() const;
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
  // The cheap pull (options.replica_pull): `identity`'s GET /model (since: its ?since=, none
  // for a plain GET /model) answered from the record of its copy: the dense model (etag =
  // version, the record reset), a new delta from the record, or the last delta again
  // (server/replica_records.h). `bytes` stays valid until the next call of this method or of
  // encoded_model*(). Throws std::logic_error when the cheap pull is off.
  struct DeviceModelReply {
    std::span<const std::uint8_t> bytes;
    bool delta = false;
    std::uint64_t etag = 0;
  };
  // fp16_increments: the device asked for the cheap pull's values as fp16 increments (sent
  // when options.replica_pull.pull.values is kFp16Increment; fp32 otherwise).
  DeviceModelReply pull_for_device(std::string_view identity, std::optional<std::uint64_t> since,
                                   bool fp16_increments = false);
  // The records, when the cheap pull is on.
  const ReplicaRecords* replica_records() const { return replicas_ ? &*replicas_ : nullptr; }
  // The published model, when options.publish is on (what encoded_model*() then serve).
  const runtime::PublishedModel* published() const { return published_ ? &*published_ : nullptr; }
  // The version of what GET /model serves: the published model's, else version().
  std::uint64_t served_version() const {
    return published_ ? published_->version() : store_.version();
  }

  const runtime::Model& model() const { return model_; }
  std::uint64_t model_id() const { return model_.layout_id(); }
  const RecoveryReport& recovery() const { return recovery_; }
  const std::map<std::string, SequenceEntry, std::less<>>& sequences() const { return sequences_; }
  std::uint64_t updates_since_checkpoint() const { return updates_since_checkpoint_; }
  const SubmitTimings& submit_timings() const { return submit_timings_; }
  const std::map<std::string, DeviceRefusals, std::less<>>& device_refusals() const {
    return devices_;
  }
  std::uint64_t updates_clipped() const { return updates_clipped_; }
  // For the modes' own messages (round deltas): counts a refusal of `identity` with this
  // outcome, or with kApplied an acceptance, as submit() does for updates, and may
  // quarantine it (quarantine_after); returns the text to add to the refusal's diagnostic.
  std::string note_device_outcome(std::string_view identity, SubmitOutcome outcome) {
    return note_device(identity, outcome);
  }
  // Whether `identity` is quarantined now (its time may have run out).
  bool device_quarantined(std::string_view identity) { return quarantined(identity); }
  // Drops the refusal counts of `identity` (per-device health pushed it out of its bounded
  // table), unless it is quarantined: that must outlive the bookkeeping. True if dropped.
  bool forget_device(std::string_view identity);
  std::uint64_t checkpoint_version() const { return checkpoint_version_; }
  // Empty unless the last automatic checkpoint failed (the WAL still holds everything).
  const std::string& checkpoint_error() const { return checkpoint_error_; }
  const std::filesystem::path& checkpoint_path() const { return checkpoint_path_; }
  const std::filesystem::path& wal_path() const { return wal_path_; }

 private:
  void recover();
  // After each applied update: lets the published model take its step when one is due.
  void publish_after_apply();
  // stage() before the per-device bookkeeping.
  StagedSubmit stage_update(std::string_view identity, std::span<const std::uint8_t> body,
                            DecodedBody decoded);
  // Counts a refusal or an acceptance for `identity`; may quarantine it. Returns text to
  // add to the refusal's diagnostic.
  std::string note_device(std::string_view identity, SubmitOutcome outcome);
  bool quarantined(std::string_view identity);
  // Scales down tensors whose values' norm exceeds the clip; true when it changed any.
  bool clip(transport::SparseUpdate& update) const;
  // Loads a checkpoint file into model_ and `sequences`, returning its version; nullopt
  // with `damage` set when its checksum says it is damaged or it holds a non-finite
  // parameter (then `non_finite` is set too). Throws StateError for a file that is intact
  // but unusable (another model, missing metadata).
  std::optional<std::uint64_t> load_checkpoint(
      const std::filesystem::path& path,
      std::map<std::string, SequenceEntry, std::less<>>& sequences, std::string& damage,
      bool& non_finite);
  // Refills the staleness history and replays `wal_paths`' records (merged, in order) on
  // top of the loaded checkpoint at `checkpoint_version`; returns the merged records from
  // the first one the checkpoint's history needs up to the last one replayed.
  // It replays until the end, or until a record that would make a parameter non-finite: then
  // throws StateError, or with rollback_non_finite stops there (`non_finite_at`), having
  // noted the first record the bound in force refuses (`first_beyond_bound`), which a second
  // replay with `stop_before` set to it stops at (`stopped_before`, `dropped` records left).
  struct Replay {
    std::vector<WalRecord> records;  // from the first history record to the last replayed
    std::optional<std::uint64_t> non_finite_at, first_beyond_bound, stopped_before;
    std::uint64_t dropped = 0;
  };
  Replay replay_wal(std::uint64_t checkpoint_version,
                    const std::vector<std::filesystem::path>& wal_paths,
                    std::optional<std::uint64_t> stop_before = std::nullopt);
  // replay_wal() from the checkpoint `checkpoint` (already loaded once, at `version`); when
  // it reaches a non-finite value (rollback_non_finite), loads the checkpoint again and
  // replays up to the first record beyond the bound.
  Replay replay_with_rollback(const std::filesystem::path& checkpoint, std::uint64_t version,
                              const std::vector<std::filesystem::path>& wal_paths);
  // Recovery stopped before `replay.stopped_before`: keeps `logs` aside under new names
  // (hard links), writes a WAL of the replayed records and a checkpoint at this version.
  void roll_back(const Replay& replay, const std::vector<std::filesystem::path>& logs);
  WalHeader wal_header() const;
  std::size_t history_length() const;  // updates the WAL must keep before a checkpoint
  void remember_recent(WalRecord record);
  transport::SparseUpdate decode_logged(const WalRecord& record) const;
  // σ per entry: the entry versions replay gives the store for `record` (its entry delays
  // over `update`'s t_fetch), in `scratch` (every other entry UINT64_MAX: as old as
  // t_fetch; the caller puts the listed ones back to that after the apply); empty for a
  // record without entry delays. Throws StateError for delays that do not fit.
  std::span<const std::uint64_t> logged_entry_versions(const WalRecord& record,
                                                       const transport::SparseUpdate& update,
                                                       std::vector<std::uint64_t>& scratch) const;
  // Waits for (or polls) the running sync and settles the updates it covered into `out`.
  bool collect_sync(bool wait, std::vector<SettledSubmit>& out);

  runtime::Model model_;
  ServerStateOptions options_;
  std::filesystem::path checkpoint_path_, wal_path_, previous_checkpoint_path_, previous_wal_path_;
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
  std::map<std::string, DeviceRefusals, std::less<>> devices_;
  std::uint64_t updates_clipped_ = 0;
  std::vector<std::uint8_t> encoded_model_;
  std::optional<std::uint64_t> encoded_version_;
  std::vector<std::uint8_t> encoded_delta_;
  std::optional<runtime::PublishedModel> published_;  // with options_.publish
  std::optional<ReplicaRecords> replicas_;            // with options_.replica_pull
  std::uint64_t digest_ = 0;  // parameter_digest() of what GET /model serves, at digest_version_
  std::optional<std::uint64_t> digest_version_;

  std::string wal_broken_;  // set when a failed sync could not be cut off: refuse all updates
  // Declared after wal_, so destroyed first: its destructor waits for a sync of wal_'s file.
  GroupCommit commit_;
};

}  // namespace edgetrain::server
