#include "server/group_commit.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace edgetrain::server {

GroupCommit::GroupCommit(SyncFunction sync, StagedHook on_staged)
    : sync_(std::move(sync)), on_staged_(std::move(on_staged)) {}

GroupCommit::~GroupCommit() {
  if (!thread_.joinable()) return;
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return !sync_running_ || finished_; });
    stop_ = true;
    changed_.notify_all();
  }
  thread_.join();
}

void GroupCommit::stage(StagedUpdate update) {
  staged_sequences_[update.record.identity] = {update.record.sequence, update.record.version};
  staged_.push_back(std::move(update));
  if (on_staged_) on_staged_(staged_.back());
}

const SequenceEntry* GroupCommit::staged_sequence(std::string_view identity) const {
  const auto it = staged_sequences_.find(identity);
  return it == staged_sequences_.end() ? nullptr : &it->second;
}

void GroupCommit::start_sync(int fd) {
  if (sync_running_ || staged_.empty()) return;
  if (!thread_.joinable()) thread_ = std::thread([this] { run_sync_thread(); });
  syncing_ = staged_.size();
  {
    std::lock_guard lock(mutex_);
    fd_ = fd;
    requested_ = true;
    changed_.notify_all();
  }
  sync_running_ = true;
}

void GroupCommit::run_sync_thread() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return requested_ || stop_; });
    if (!requested_) return;
    requested_ = false;
    const int fd = fd_;
    lock.unlock();
    const auto started = std::chrono::steady_clock::now();
    // fdatasync: the data and the file size are what replay needs; timestamps are not.
    const int error = sync_ ? sync_(fd) : (::fdatasync(fd) == 0 ? 0 : errno);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    lock.lock();
    error_ = error;
    seconds_ = seconds;
    finished_ = true;
    changed_.notify_all();
    if (on_finished_)
      on_finished_();  // under the lock: the hook only signals, and finish_sync may run at once
  }
}

std::optional<GroupCommit::SyncResult> GroupCommit::finish_sync(bool wait) {
  if (!sync_running_) return std::nullopt;
  SyncResult result;
  {
    std::unique_lock lock(mutex_);
    if (wait) changed_.wait(lock, [this] { return finished_; });
    if (!finished_) return std::nullopt;
    finished_ = false;
    result.error = error_;
    result.seconds = seconds_;
  }
  sync_running_ = false;
  const std::size_t covered = result.error != 0 ? staged_.size() : syncing_;
  syncing_ = 0;
  result.updates.reserve(covered);
  for (std::size_t n = 0; n < covered; ++n) {
    StagedUpdate update = std::move(staged_.front());
    staged_.pop_front();
    // A later staged update of the same identity keeps its own entry.
    if (auto it = staged_sequences_.find(update.record.identity);
        it != staged_sequences_.end() && it->second.version == update.record.version)
      staged_sequences_.erase(it);
    result.updates.push_back(std::move(update));
  }
  return result;
}

}  // namespace edgetrain::server
