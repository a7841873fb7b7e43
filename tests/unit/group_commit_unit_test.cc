// GroupCommit (server/group_commit.h) on its own, with a sync function the test holds
// back: what a sync covers, what it hands back, in which order, and the staged hook that
// tells a test an update now waits for its sync. ServerState's use of it over the WAL and
// the network: tests/integration/group_commit_test.cc.
#include <gtest/gtest.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "server/group_commit.h"

namespace {

using edgetrain::server::GroupCommit;
using edgetrain::server::StagedUpdate;

StagedUpdate staged(std::uint64_t version, const std::string& identity, std::uint64_t sequence) {
  StagedUpdate update;
  update.record = {version, identity, sequence, {}, {}};
  update.wal_offset = version * 100;
  return update;
}

std::vector<std::uint64_t> versions_of(const std::vector<StagedUpdate>& updates) {
  std::vector<std::uint64_t> versions;
  for (const auto& u : updates) versions.push_back(u.record.version);
  return versions;
}

// A sync that waits until the test releases it, then returns `result`.
struct HeldSync {
  std::mutex mutex;
  std::condition_variable changed;
  int started = 0, released = 0;
  int result = 0;
  std::vector<int> fds;

  GroupCommit::SyncFunction function() {
    return [this](int fd) {
      std::unique_lock lock(mutex);
      fds.push_back(fd);
      const int mine = started++;
      changed.notify_all();
      changed.wait(lock, [&] { return released > mine; });
      return result;
    };
  }
  void release() {
    std::lock_guard lock(mutex);
    ++released;
    changed.notify_all();
  }
  void wait_started(int count) {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return started >= count; });
  }
};

TEST(GroupCommitPipeline, ASyncCoversWhatWasStagedBeforeItAndHandsItBackInLogOrder) {
  HeldSync sync;
  std::vector<std::uint64_t> hooked;
  GroupCommit commit(sync.function(),
                     [&](const StagedUpdate& u) { hooked.push_back(u.record.version); });
  EXPECT_FALSE(commit.finish_sync(false)) << "no sync running";
  commit.stage(staged(1, "a", 10));
  commit.stage(staged(2, "b", 20));
  EXPECT_EQ(hooked, (std::vector<std::uint64_t>{1, 2})) << "the hook runs as each update is staged";
  commit.start_sync(7);
  sync.wait_started(1);
  EXPECT_TRUE(commit.sync_running());
  commit.stage(staged(3, "a", 11));  // staged while the sync runs: waits for the next one
  commit.start_sync(7);              // one sync at a time: nothing happens
  EXPECT_FALSE(commit.finish_sync(false)) << "the sync has not finished";
  ASSERT_NE(commit.staged_sequence("a"), nullptr);
  EXPECT_EQ(commit.staged_sequence("a")->sequence, 11u) << "the latest staged of an identity";

  sync.release();
  auto first = commit.finish_sync(true);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->error, 0);
  EXPECT_EQ(versions_of(first->updates), (std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(commit.staged(), 1u);
  EXPECT_EQ(commit.staged_sequence("b"), nullptr) << "b's only staged update was handed back";
  ASSERT_NE(commit.staged_sequence("a"), nullptr) << "a still has version 3 staged";
  EXPECT_EQ(commit.staged_sequence("a")->version, 3u);

  commit.start_sync(8);
  sync.release();
  auto second = commit.finish_sync(true);
  ASSERT_TRUE(second);
  EXPECT_EQ(versions_of(second->updates), (std::vector<std::uint64_t>{3}));
  EXPECT_EQ(commit.staged(), 0u);
  EXPECT_EQ(commit.staged_sequence("a"), nullptr);
  EXPECT_EQ(sync.fds, (std::vector<int>{7, 8}));
}

TEST(GroupCommitPipeline, AFailedSyncHandsBackEveryStagedUpdateWithItsError) {
  HeldSync sync;
  sync.result = EIO;
  GroupCommit commit(sync.function());
  commit.stage(staged(1, "a", 10));
  commit.start_sync(3);
  sync.wait_started(1);
  commit.stage(staged(2, "b", 20));  // after the sync started: refused with the batch all the same
  sync.release();
  auto result = commit.finish_sync(true);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->error, EIO);
  EXPECT_EQ(versions_of(result->updates), (std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(result->updates.front().wal_offset, 100u) << "where the caller cuts the log";
  EXPECT_EQ(commit.staged(), 0u);
  EXPECT_EQ(commit.staged_sequence("a"), nullptr);
  EXPECT_EQ(commit.staged_sequence("b"), nullptr);
  EXPECT_FALSE(commit.sync_running());
}

TEST(GroupCommitPipeline, NothingStagedStartsNoSync) {
  HeldSync sync;
  GroupCommit commit(sync.function());
  commit.start_sync(3);
  EXPECT_FALSE(commit.sync_running());
  EXPECT_FALSE(commit.finish_sync(true));
  EXPECT_EQ(sync.started, 0);
}

}  // namespace
