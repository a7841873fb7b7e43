// Group commit for the write-ahead log: the pipeline between "the update's WAL record is
// written" and "the update may be applied and acknowledged".
//
//   stage()        an update whose record was written (not yet synced) waits here, in log
//                  order; per identity the latest staged (sequence, version) is known, so a
//                  duplicate of a waiting update can wait for the same sync;
//   start_sync()   one fdatasync on a background thread covers every record staged so far
//                  (updates staged while it runs wait for the next one);
//   finish_sync()  once that sync has finished, hands back the updates it covered, in log
//                  order: the only ones that may now be applied and acknowledged. A failed
//                  sync hands back every staged update with the error: none of them may be.
//
// What an update is checked against, and applying it, is ServerState's business; this class
// only decides when a staged update is durable. Used on one thread (the CoAP loop), apart
// from the sync function, which runs on the sync thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/write_ahead_log.h"
#include "transport/codec.h"

namespace edgetrain::server {

struct SequenceEntry {
  std::uint64_t sequence = 0;  // last applied sequence of this identity
  std::uint64_t version = 0;   // the version that update produced
};

struct StagedUpdate {
  WalRecord record;  // record.version: the version it will produce
  transport::SparseUpdate update;
  std::uint64_t wal_offset = 0;  // where its record starts in the WAL
  double decode_seconds = 0, write_seconds = 0;
};

class GroupCommit {
 public:
  // Makes the records written to `fd` so far durable; returns 0 or an errno value. Runs on
  // the sync thread. Empty: fdatasync(fd).
  using SyncFunction = std::function<int(int fd)>;
  // Called (on the staging thread) right after an update was staged: from then on it waits
  // for a sync, and a request carrying it is deferred. For tests that must know that
  // moment instead of sleeping until it has surely passed.
  using StagedHook = std::function<void(const StagedUpdate& update)>;

  explicit GroupCommit(SyncFunction sync = {}, StagedHook on_staged = {});
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;
  // Waits for a running sync and stops the sync thread; what is still staged is dropped.
  ~GroupCommit();

  void stage(StagedUpdate update);
  std::size_t staged() const { return staged_.size(); }
  // The latest staged (sequence, version) of `identity`, or null when none is staged.
  const SequenceEntry* staged_sequence(std::string_view identity) const;

  // Starts one sync of `fd` covering every update staged so far, unless a sync is running
  // or nothing is staged.
  void start_sync(int fd);
  bool sync_running() const { return sync_running_; }

  struct SyncResult {
    int error = 0;       // 0, or the errno value of the failed sync
    double seconds = 0;  // how long the sync took
    // error == 0: the updates the sync covered, in log order (later ones stay staged).
    // error != 0: every staged update, in log order (also those staged after the sync
    // started); nothing stays staged.
    std::vector<StagedUpdate> updates;
  };
  // The running sync's result once it has finished (wait = true: blocks until then;
  // false: nullopt while it runs). nullopt when no sync is running.
  std::optional<SyncResult> finish_sync(bool wait);
  // Called on the sync thread each time a sync has finished and its result is ready for
  // finish_sync(): how a waiting event loop learns it without polling. Set before the first
  // sync starts.
  void set_on_finished(std::function<void()> hook) { on_finished_ = std::move(hook); }

 private:
  void run_sync_thread();

  SyncFunction sync_;
  StagedHook on_staged_;
  std::function<void()> on_finished_;
  // Staging thread only.
  std::deque<StagedUpdate> staged_;
  std::map<std::string, SequenceEntry, std::less<>> staged_sequences_;
  bool sync_running_ = false;
  std::size_t syncing_ = 0;  // the first syncing_ of staged_ are covered by the running sync
  // The sync thread and what it shares with the staging thread (under mutex_).
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool requested_ = false, finished_ = false, stop_ = false;
  int fd_ = -1, error_ = 0;
  double seconds_ = 0;
};

}  // namespace edgetrain::server
