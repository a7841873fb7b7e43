// Group commit (server/server_state.h, server/resources.h): many updates share one
// fdatasync, and none is applied or acknowledged before the sync that covers its WAL
// record has finished. A failed sync refuses every update it was to cover (and the ones
// staged after it), cuts their records off the log and loses nothing acknowledged before.
// The WAL sync is injected (ServerStateOptions::wal_sync) to observe, slow down or fail it;
// it still calls the real fdatasync when it succeeds.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <thread>

#include "server/resources.h"
#include "server/server_state.h"
#include "server/write_ahead_log.h"
#include "tests/support/served_resources.h"
#include "transport/coap_dtls.h"

namespace {

using namespace edgetrain;
using namespace edgetrain::server;
using edgetrain::testing::random_sparse_update;
using edgetrain::testing::TempDir;

runtime::Model test_model() {
  return edgetrain::testing::initialized_model("input 8x8x1; fc 32 relu; fc 10", "test-mlp", 7);
}

// Wraps fdatasync: remembers how many WAL bytes the last successful sync covered (the
// file's size when it started), counts syncs, can be slowed down and made to fail.
struct SyncProbe {
  std::atomic<std::uint64_t> synced_bytes = 0;
  std::atomic<int> syncs = 0, failures = 0;
  std::atomic<bool> fail = false;
  std::atomic<int> delay_ms = 0;

  std::function<int(int)> hook() {
    return [this](int fd) {
      struct stat info {};
      if (::fstat(fd, &info) != 0) return errno;
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
      ++syncs;
      if (fail) {
        ++failures;
        return EIO;
      }
      if (::fdatasync(fd) != 0) return errno;
      synced_bytes = static_cast<std::uint64_t>(info.st_size);
      return 0;
    };
  }
};

// The versions of the records in the first `bytes` bytes of the WAL at `path`: what a
// crash right now would keep of what the probe saw synced.
std::vector<std::uint64_t> versions_in_synced_prefix(const std::filesystem::path& path,
                                                     std::uint64_t bytes,
                                                     const std::filesystem::path& scratch) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> prefix(bytes);
  in.read(prefix.data(), static_cast<std::streamsize>(bytes));
  std::ofstream(scratch, std::ios::binary | std::ios::trunc).write(prefix.data(), in.gcount());
  std::vector<std::uint64_t> versions;
  for (const auto& record : server::read_wal(scratch).records) versions.push_back(record.version);
  return versions;
}

// Every WAL sync through `probe`; no checkpoints, so everything stays in the WAL.
ServerStateOptions options_for(SyncProbe& probe) {
  ServerStateOptions options;
  options.store.max_staleness = 64;
  options.checkpoint_every = 0;
  options.wal_sync = probe.hook();
  return options;
}

ServerStateOptions options_for(const TempDir& dir, SyncProbe& probe) {
  ServerStateOptions options = options_for(probe);
  options.state_dir = dir.path();
  return options;
}

TEST(GroupCommit, OneSyncCoversManyUpdatesAppliedOnlyAfterItAndBitExactWithSyncPerUpdate) {
  TempDir grouped_dir("edgetrain-group-commit"), reference_dir("edgetrain-group-commit");
  SyncProbe probe, reference_probe;
  ServerState grouped(test_model(), options_for(grouped_dir, probe));
  ServerState reference(test_model(), options_for(reference_dir, reference_probe));
  std::mt19937 rng(11);
  const runtime::Model model = test_model();

  std::uint64_t sequence = 0;
  for (int batch = 0; batch < 5; ++batch) {
    const std::uint64_t version_before = grouped.version();
    std::vector<std::uint64_t> tickets;
    for (int n = 0; n < 4; ++n) {
      // fetched at the durable version: delays grow inside the batch as in a real server
      const auto bytes = random_sparse_update(rng, model, ++sequence, version_before);
      const std::string identity = "device-" + std::to_string(n);
      auto staged = grouped.stage(identity, bytes);
      ASSERT_FALSE(staged.settled) << staged.settled->diagnostic;
      tickets.push_back(staged.ticket);
      auto direct = reference.submit(identity, bytes);
      ASSERT_EQ(direct.outcome, SubmitOutcome::kApplied) << direct.diagnostic;
      ASSERT_EQ(direct.version, staged.ticket);
    }
    EXPECT_EQ(grouped.version(), version_before) << "nothing is applied before its sync";
    const int syncs_before = probe.syncs;
    grouped.start_commit();
    const auto settled = grouped.finish_commit(true);
    EXPECT_EQ(probe.syncs, syncs_before + 1) << "one fdatasync for the whole batch";
    ASSERT_EQ(settled.size(), tickets.size());
    const auto synced = versions_in_synced_prefix(grouped.wal_path(), probe.synced_bytes,
                                                  grouped_dir.path() / "prefix.log");
    for (std::size_t i = 0; i < settled.size(); ++i) {
      EXPECT_EQ(settled[i].ticket, tickets[i]);
      EXPECT_EQ(settled[i].result.outcome, SubmitOutcome::kApplied);
      EXPECT_EQ(settled[i].result.version, tickets[i]);
      EXPECT_NE(std::find(synced.begin(), synced.end(), settled[i].result.version), synced.end())
          << "version " << settled[i].result.version << " reported before its record was synced";
    }
  }
  EXPECT_EQ(grouped.version(), reference.version());
  EXPECT_EQ(grouped.snapshot().parameters, reference.snapshot().parameters);
  EXPECT_EQ(grouped.submit_timings().applied_updates, 20u);

  const auto expected = grouped.snapshot();
  SyncProbe restart_probe;
  ServerState restarted(test_model(), options_for(grouped_dir, restart_probe));
  EXPECT_EQ(restarted.version(), expected.version);
  EXPECT_EQ(restarted.snapshot().parameters, expected.parameters);
}

TEST(GroupCommit, AFailedSyncRefusesEveryUpdateOfItsBatchAndTheLogKeepsOnlyAcknowledgedOnes) {
  TempDir dir("edgetrain-group-commit"), reference_dir("edgetrain-group-commit");
  SyncProbe probe, reference_probe;
  ServerState state(test_model(), options_for(dir, probe));
  ServerState reference(test_model(), options_for(reference_dir, reference_probe));
  std::mt19937 rng(12);
  const runtime::Model model = test_model();
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> updates;
  for (std::uint64_t n = 1; n <= 8; ++n)
    updates.push_back({"device-" + std::to_string(n % 3), random_sparse_update(rng, model, n, 0)});

  for (int n = 0; n < 3; ++n)
    ASSERT_FALSE(state.stage(updates[n].first, updates[n].second).settled);
  state.start_commit();
  for (const auto& s : state.finish_commit(true))
    ASSERT_EQ(s.result.outcome, SubmitOutcome::kApplied);
  ASSERT_EQ(state.version(), 3u);
  const auto acknowledged = state.snapshot();

  // The failing batch: three staged before its sync starts, two more while it runs.
  probe.fail = true;
  probe.delay_ms = 50;
  for (int n = 3; n < 6; ++n)
    ASSERT_FALSE(state.stage(updates[n].first, updates[n].second).settled);
  state.start_commit();
  for (int n = 6; n < 8; ++n)
    ASSERT_FALSE(state.stage(updates[n].first, updates[n].second).settled);
  std::vector<server::SettledSubmit> settled;
  while (state.staged_updates() > 0)
    for (auto& s : state.finish_commit(true)) settled.push_back(std::move(s));
  ASSERT_EQ(settled.size(), 5u);
  for (const auto& s : settled) {
    EXPECT_EQ(s.result.outcome, SubmitOutcome::kNotDurable) << "ticket " << s.ticket;
    EXPECT_NE(s.result.diagnostic.find("Input/output error"), std::string::npos)
        << s.result.diagnostic;
  }
  EXPECT_EQ(state.version(), 3u);
  EXPECT_EQ(state.snapshot().parameters, acknowledged.parameters);
  const auto logged = server::read_wal(state.wal_path());
  ASSERT_EQ(logged.records.size(), 3u) << "the refused records are cut off the log";
  EXPECT_EQ(logged.dropped_bytes, 0u);

  // The disk recovers: the workers retry with the same sequences and nothing is lost.
  probe.fail = false;
  probe.delay_ms = 0;
  for (int n = 3; n < 8; ++n) {
    auto result = state.submit(updates[n].first, updates[n].second);
    ASSERT_EQ(result.outcome, SubmitOutcome::kApplied) << result.diagnostic;
    ASSERT_EQ(result.version, static_cast<std::uint64_t>(n + 1));
  }
  for (const auto& [identity, bytes] : updates)
    ASSERT_TRUE(reference.submit(identity, bytes).acknowledged());
  EXPECT_EQ(state.snapshot().parameters, reference.snapshot().parameters);
  SyncProbe restart_probe;
  ServerState restarted(test_model(), options_for(dir, restart_probe));
  EXPECT_EQ(restarted.version(), 8u);
  EXPECT_EQ(restarted.snapshot().parameters, reference.snapshot().parameters);
}

TEST(GroupCommit, ADuplicateOfAStagedUpdateIsAnsweredOnlyWithItsOriginal) {
  TempDir dir("edgetrain-group-commit");
  SyncProbe probe;
  ServerState state(test_model(), options_for(dir, probe));
  std::mt19937 rng(13);
  const auto bytes = random_sparse_update(rng, test_model(), 1, 0);
  auto original = state.stage("device-1", bytes);
  ASSERT_FALSE(original.settled);
  auto duplicate = state.stage("device-1", bytes);
  EXPECT_FALSE(duplicate.settled)
      << "a duplicate must not be acknowledged before the original is durable";
  EXPECT_EQ(duplicate.ticket, original.ticket);
  EXPECT_EQ(state.staged_updates(), 1u) << "the duplicate is not logged again";
  state.start_commit();
  const auto settled = state.finish_commit(true);
  ASSERT_EQ(settled.size(), 1u);
  EXPECT_EQ(settled[0].result.outcome, SubmitOutcome::kApplied);
  auto later = state.stage("device-1", bytes);
  ASSERT_TRUE(later.settled);
  EXPECT_EQ(later.settled->outcome, SubmitOutcome::kDuplicate);
  EXPECT_EQ(later.settled->version, 1u);
}

// A DTLS-PSK server whose devices are "device-N", all with the key of the clients below.
transport::CoapDtlsServer::Options devices_server_options() {
  transport::CoapDtlsServer::Options options;
  options.psk_lookup = [](std::string_view id) -> std::optional<std::vector<std::uint8_t>> {
    if (id.starts_with("device-")) return std::vector<std::uint8_t>(16, 0x42);
    return std::nullopt;
  };
  return options;
}

// The same over loopback DTLS-PSK with block-wise bodies: concurrent workers, every 2.04's
// version already in the synced part of the WAL when the worker receives it; then a disk
// that fails every sync: every update gets 5.00, none is applied or left in the log.
TEST(GroupCommitOverDtls, EveryAcknowledgedUpdateIsInTheSyncedLogAndFailedSyncsAnswer500) {
  SyncProbe probe;
  probe.delay_ms = 40;  // slow disk: updates pile up behind each sync
  const transport::CoapDtlsServer::Options server_options = devices_server_options();
  edgetrain::testing::ServedResources served("group-commit", test_model(), options_for(probe),
                                             server_options);
  ServerState& state = served.state();
  transport::CoapDtlsServer& server = served.server();

  constexpr int kWorkers = 6, kPostsEach = 4;
  std::atomic<int> acknowledged = 0, refused = 0;
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  auto run_workers = [&](std::uint64_t first_sequence, int expected_code) {
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w)
      workers.emplace_back([&, w] {
        std::mt19937 rng(100 + w);
        const runtime::Model model = test_model();
        transport::CoapDtlsClient client(
            {"127.0.0.1",
             server.port(),
             {"device-" + std::to_string(w), std::vector<std::uint8_t>(16, 0x42)},
             60000});
        for (int p = 0; p < kPostsEach; ++p) {
          const auto body = random_sparse_update(rng, model, first_sequence + p, 0);
          EXPECT_GT(body.size(), 1024u) << "the body must need Block1";
          transport::CoapResponse response;
          try {
            response = client.request(transport::Method::kPost, "update", body);
          } catch (const std::exception& e) {
            std::lock_guard lock(failures_mutex);
            failures.push_back(e.what());
            return;
          }
          if (response.code != expected_code) {
            std::lock_guard lock(failures_mutex);
            failures.push_back("got " + transport::coap_code_string(response.code) + " " +
                               std::string(response.payload.begin(), response.payload.end()));
            continue;
          }
          if (response.code == transport::CoapCode::kChanged) {
            const auto version = server::decode_update_reply(response.payload);
            ASSERT_TRUE(version);
            // What a kill -9 at this moment would keep: the synced prefix of the log.
            const auto synced = versions_in_synced_prefix(
                state.wal_path(), probe.synced_bytes,
                served.state_dir() / ("prefix-" + std::to_string(w) + ".log"));
            if (std::find(synced.begin(), synced.end(), *version) == synced.end()) {
              std::lock_guard lock(failures_mutex);
              failures.push_back("version " + std::to_string(*version) +
                                 " acknowledged before it was synced");
            }
            ++acknowledged;
          } else {
            ++refused;
          }
        }
      });
    for (auto& t : workers) t.join();
  };

  run_workers(1, transport::CoapCode::kChanged);
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_EQ(acknowledged, kWorkers * kPostsEach);
  EXPECT_LT(probe.syncs, acknowledged) << "group commit: fewer syncs than acknowledged updates";
  const std::uint64_t acknowledged_version = kWorkers * kPostsEach;

  probe.fail = true;
  run_workers(1 + kPostsEach, transport::CoapCode::kInternalServerError);
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_EQ(refused, kWorkers * kPostsEach);
  EXPECT_GT(probe.failures, 0);

  served.stop();
  EXPECT_EQ(state.version(), acknowledged_version);
  EXPECT_EQ(server::read_wal(state.wal_path()).records.size(), acknowledged_version)
      << "records of refused updates are cut off the log";
}

// Several event loops (edgetrain-server --loop-threads): two servers on one port
// (SO_REUSEPORT), each driven by its own thread, over one ServerState. Sessions spread over
// both loops; still every 2.04 names a version already in the synced log, the versions
// answered are 1..n once each, the log holds exactly 1..n in order, and replaying it
// (a restart from the initial checkpoint) gives the running server's parameters bit for bit.
TEST(GroupCommitOverDtls,
     TwoLoopsKeepOneOrderOfVersionsAndEveryAcknowledgedOneIsSyncedAndReplaysBitExact) {
  SyncProbe probe;
  probe.delay_ms = 5;  // updates from both loops pile up behind each sync
  const transport::CoapDtlsServer::Options server_options = devices_server_options();
  edgetrain::testing::ServedResources served("group-commit-loops", test_model(), options_for(probe),
                                             server_options, 2);
  ServerState& state = served.state();

  // 16 sessions from 16 source ports: the kernel's hash puts all of them on one socket with
  // probability 2^-15.
  constexpr int kWorkers = 16, kPostsEach = 3;
  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<std::uint64_t> answered_versions;
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w)
    workers.emplace_back([&, w] {
      std::mt19937 rng(300 + w);
      const runtime::Model model = test_model();
      transport::CoapDtlsClient client(
          {"127.0.0.1",
           served.server().port(),
           {"device-" + std::to_string(w), std::vector<std::uint8_t>(16, 0x42)},
           60000});
      for (int p = 0; p < kPostsEach; ++p) {
        transport::CoapResponse response;
        try {
          response = client.request(transport::Method::kPost, "update",
                                    random_sparse_update(rng, model, 1 + p, 0));
        } catch (const std::exception& e) {
          std::lock_guard lock(mutex);
          failures.push_back(e.what());
          return;
        }
        const auto version = server::decode_update_reply(response.payload);
        if (response.code != transport::CoapCode::kChanged || !version) {
          std::lock_guard lock(mutex);
          failures.push_back("got " + transport::coap_code_string(response.code) + " " +
                             std::string(response.payload.begin(), response.payload.end()));
          continue;
        }
        const auto synced = versions_in_synced_prefix(
            state.wal_path(), probe.synced_bytes,
            served.state_dir() / ("prefix-" + std::to_string(w) + ".log"));
        std::lock_guard lock(mutex);
        if (std::find(synced.begin(), synced.end(), *version) == synced.end())
          failures.push_back("version " + std::to_string(*version) +
                             " acknowledged before it was synced");
        answered_versions.push_back(*version);
      }
    });
  for (auto& t : workers) t.join();
  served.stop();
  ASSERT_TRUE(failures.empty()) << failures.front();

  const auto loops = nlohmann::json::parse(served.resources().loops_json());
  ASSERT_EQ(loops.size(), 2u);
  for (const auto& loop : loops)
    EXPECT_GT(loop["updates_deferred"].get<std::uint64_t>(), 0u)
        << "the sessions did not spread: " << loops.dump();

  constexpr std::uint64_t kUpdates = kWorkers * kPostsEach;
  std::sort(answered_versions.begin(), answered_versions.end());
  std::vector<std::uint64_t> one_to_n(kUpdates);
  std::iota(one_to_n.begin(), one_to_n.end(), 1);
  EXPECT_EQ(answered_versions, one_to_n) << "each version answered once, none skipped";
  std::vector<std::uint64_t> logged;
  for (const auto& record : server::read_wal(state.wal_path()).records)
    logged.push_back(record.version);
  EXPECT_EQ(logged, one_to_n) << "the log holds 1..n in order, no gap, no duplicate";
  EXPECT_EQ(state.version(), kUpdates);

  const auto running = state.snapshot();
  SyncProbe restart_probe;
  ServerStateOptions restart_options = options_for(restart_probe);
  restart_options.state_dir = served.state_dir();
  ServerState restarted(test_model(), restart_options);
  EXPECT_EQ(restarted.recovery().replayed_updates, kUpdates);
  EXPECT_EQ(restarted.version(), running.version);
  EXPECT_EQ(restarted.snapshot().parameters, running.parameters) << "replay is bit-exact";
}

// A loop does not poll for finished syncs: its eventfd wakes it. The loops here wait up to
// 30 s when nothing is due, so a deferred 2.04 that waited for the next datagram instead of
// the sync's wake-up would come after the client's 5 s keepalive ping at the earliest. With
// two loops, an answer settled by one loop for the other's session wakes the other one too.
TEST(GroupCommitOverDtls, AFinishedSyncWakesTheLoopsInsteadOfPolling) {
  SyncProbe probe;
  probe.delay_ms = 5;
  const transport::CoapDtlsServer::Options server_options = devices_server_options();
  for (const std::size_t loops : {std::size_t{1}, std::size_t{2}}) {
    SCOPED_TRACE(std::to_string(loops) + " loop(s)");
    edgetrain::testing::ServedResources served("group-commit-wake", test_model(),
                                               options_for(probe), server_options, loops, 30000);
    constexpr int kWorkers = 6, kPostsEach = 3;
    std::mutex mutex;
    std::vector<std::string> failures;
    double slowest = 0;
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w)
      workers.emplace_back([&, w] {
        std::mt19937 rng(700 + w);
        const runtime::Model model = test_model();
        transport::CoapDtlsClient client(
            {"127.0.0.1",
             served.server().port(),
             {"device-" + std::to_string(w), std::vector<std::uint8_t>(16, 0x42)},
             20000});
        for (int p = 0; p < kPostsEach; ++p) {
          const auto body = random_sparse_update(rng, model, 1 + p, 0);
          const auto started = std::chrono::steady_clock::now();
          transport::CoapResponse response;
          try {
            response = client.request(transport::Method::kPost, "update", body);
          } catch (const std::exception& e) {
            std::lock_guard lock(mutex);
            failures.push_back(e.what());
            return;
          }
          const double seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
          std::lock_guard lock(mutex);
          slowest = std::max(slowest, seconds);
          if (response.code != transport::CoapCode::kChanged)
            failures.push_back("got " + transport::coap_code_string(response.code));
        }
      });
    for (auto& t : workers) t.join();
    const auto stop_started = std::chrono::steady_clock::now();
    served.stop();
    const double stop_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - stop_started).count();
    ASSERT_TRUE(failures.empty()) << failures.front();
    EXPECT_EQ(served.state().version(), std::uint64_t{kWorkers * kPostsEach});
    EXPECT_LT(slowest, 4.0) << "an update waited for a datagram, not for its sync";
    EXPECT_LT(stop_seconds, 10.0) << "stop() did not wake the loops out of their 30 s wait";
  }
}

// The transport's deferred answer on its own: it arrives after the empty ACK even when the
// handler answers seconds later (the client's keepalive pings are answered meanwhile).
TEST(DeferredResponseOverDtls, ArrivesSecondsLaterWhileTheClientPings) {
  transport::CoapDtlsServer::Options server_options;
  server_options.psk_lookup = [](std::string_view) -> std::optional<std::vector<std::uint8_t>> {
    return std::vector<std::uint8_t>(16, 0x42);
  };
  auto server = std::make_unique<transport::CoapDtlsServer>(server_options);
  std::vector<transport::DeferredResponse> waiting;  // loop thread only
  std::atomic<int> deferred = 0;
  std::atomic<bool> answer_now = false, stop = false;
  server->add_resource(
      "slow", transport::Method::kPost, [&](const transport::CoapRequest& request) {
        EXPECT_TRUE(request.defer) << "a confirmable request can be answered later";
        waiting.push_back(request.defer());
        ++deferred;
        return transport::CoapResponse{transport::CoapCode::kBadRequest};  // ignored once deferred
      });
  std::thread loop([&] {
    while (!stop) {
      server->run_once(10);
      if (answer_now.exchange(false))
        for (auto& answer : waiting) answer.send({transport::CoapCode::kChanged, {1, 2, 3}});
    }
  });
  const std::uint16_t port = server->port();
  auto client_for = [&] {
    return transport::CoapDtlsClient(
        {"127.0.0.1", port, {"device-1", std::vector<std::uint8_t>(16, 0x42)}, 30000});
  };
  const std::vector<std::uint8_t> body(3000, 7);  // three Block1 blocks

  {
    auto client = client_for();
    std::thread answer_later([&] {
      while (deferred < 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // two keepalive periods
      answer_now = true;
    });
    const auto response = client.request(transport::Method::kPost, "slow", body);
    answer_later.join();
    EXPECT_EQ(response.code, transport::CoapCode::kChanged);
    EXPECT_EQ(response.payload, (std::vector<std::uint8_t>{1, 2, 3}));
  }

  stop = true;
  loop.join();
}

// A server process killed (SIGKILL: no DTLS close_notify, nothing more on the wire) while
// a client waits for its deferred answer: the client's keepalive ping meets ICMP port
// unreachable and the request fails long before its 30 s deadline. The server says on a
// pipe when it has deferred the request; only then is it killed.
TEST(DeferredResponseOverDtls, AClientWaitingForADeferredAnswerNoticesAKilledServer) {
  int port_pipe[2], deferred_pipe[2];
  ASSERT_EQ(::pipe(port_pipe), 0);
  ASSERT_EQ(::pipe(deferred_pipe), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the server: defers every answer, forever
    ::close(port_pipe[0]);
    ::close(deferred_pipe[0]);
    transport::CoapDtlsServer::Options server_options;
    server_options.psk_lookup = [](std::string_view) -> std::optional<std::vector<std::uint8_t>> {
      return std::vector<std::uint8_t>(16, 0x42);
    };
    transport::CoapDtlsServer server(server_options);
    std::vector<transport::DeferredResponse> never_answered;
    server.add_resource("slow", transport::Method::kPost,
                        [&](const transport::CoapRequest& request) {
                          never_answered.push_back(request.defer());
                          const char deferred = 'd';
                          if (::write(deferred_pipe[1], &deferred, 1) != 1) ::_exit(1);
                          return transport::CoapResponse{};
                        });
    const std::uint16_t port = server.port();
    if (::write(port_pipe[1], &port, sizeof(port)) != sizeof(port)) ::_exit(1);
    for (;;) server.run_once(100);
  }
  ::close(port_pipe[1]);
  ::close(deferred_pipe[1]);
  std::uint16_t port = 0;
  ASSERT_EQ(::read(port_pipe[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  ::close(port_pipe[0]);

  transport::CoapDtlsClient client(
      {"127.0.0.1", port, {"device-1", std::vector<std::uint8_t>(16, 0x42)}, 30000});
  std::atomic<bool> was_deferred = false;
  std::chrono::steady_clock::time_point killed_at;
  std::thread kill_server([&] {
    // Bounded: a server that never defers is killed after 10 s and the test fails below.
    pollfd deferred{deferred_pipe[0], POLLIN, 0};
    char byte = 0;
    was_deferred = ::poll(&deferred, 1, 10'000) == 1 && ::read(deferred_pipe[0], &byte, 1) == 1;
    killed_at = std::chrono::steady_clock::now();
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  });
  const auto started = std::chrono::steady_clock::now();
  EXPECT_THROW(client.request(transport::Method::kPost, "slow", std::vector<std::uint8_t>(3000, 7)),
               transport::TransportError);
  const auto failed_at = std::chrono::steady_clock::now();
  kill_server.join();
  ::close(deferred_pipe[0]);
  ASSERT_TRUE(was_deferred) << "the server never deferred the request";
  EXPECT_GT(failed_at, killed_at) << "the request failed before the server was killed";
  const double waited = std::chrono::duration<double>(failed_at - started).count();
  EXPECT_LT(waited, 15.0)
      << "the client waited for its deadline instead of noticing the server was gone";
}

}  // namespace
