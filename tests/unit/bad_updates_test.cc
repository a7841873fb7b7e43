// Updates cannot poison the model (issue 18, part 2), at the ServerState level: the issue's
// sequence of fourteen −3.4e38 at one bias is refused (out of bounds), counted for the
// device, and leaves parameters, WAL and served model as they were; staged updates are
// checked against the ones staged before them; devices that keep failing are quarantined
// when asked for; a state directory poisoned before these checks existed is refused at
// start, or rolled back to the last good state with the logs kept; clipped updates replay
// bit for bit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "server/checkpoint_file.h"
#include "server/server_state.h"
#include "server/write_ahead_log.h"
#include "tests/support/served_resources.h"

namespace {

using edgetrain::testing::directory_bytes;
using edgetrain::testing::file_bytes;

using namespace edgetrain;
using edgetrain::testing::TempDir;
using edgetrain::testing::tensor_sizes;
using server::ServerState;
using server::ServerStateOptions;
using server::SubmitOutcome;

runtime::Model small_model() {
  return edgetrain::testing::initialized_model("input 4x4x1; fc 8 relu; fc 3", "tiny", 5);
}

ServerStateOptions options_for(const TempDir& dir) {
  ServerStateOptions options;
  options.state_dir = dir.path();
  options.store.max_staleness = 4;  // lr 0.1, bound 1e6: the defaults
  options.checkpoint_every = 0;
  return options;
}

// One value at entry 0 of tensor 1 (fc 8's bias).
std::vector<std::uint8_t> bias_update(const runtime::Model& model, std::uint64_t sequence,
                                      std::uint64_t fetched, float value) {
  const auto sizes = tensor_sizes(model);
  transport::SparseUpdate u{model.layout_id(), sequence, fetched, {{1, sizes[1], {0}, {value}}}};
  return transport::encode_sparse_update(u).value();
}

std::vector<std::uint8_t> poison(const runtime::Model& model, std::uint64_t sequence,
                                 std::uint64_t fetched) {
  return bias_update(model, sequence, fetched, -3.4e38f);
}

std::vector<float> parameters_of(const ServerState& state) { return state.snapshot().parameters; }

std::size_t bias_index(const runtime::Model& model) {
  return tensor_sizes(model)[0];
}  // tensor 1, entry 0

TEST(BadUpdates, PoisoningSequenceIsRefusedCountedAndTheModelStaysIntact) {
  TempDir dir("edgetrain-bad");
  const runtime::Model model = small_model();
  {
    ServerState state(small_model(), options_for(dir));
    ASSERT_EQ(state.submit("pi-01", bias_update(model, 1, 0, 0.5f)).outcome,
              SubmitOutcome::kApplied);
    const auto parameters = parameters_of(state);
    const auto wal_bytes = file_bytes(state.wal_path());
    const std::vector<std::uint8_t> served(state.encoded_model().begin(),
                                           state.encoded_model().end());
    for (std::uint64_t n = 2; n <= 15; ++n) {
      const auto result = state.submit("pi-01", poison(model, n, state.version()));
      EXPECT_EQ(result.outcome, SubmitOutcome::kOutOfBounds) << n << ": " << result.diagnostic;
      EXPECT_NE(result.diagnostic.find("beyond"), std::string::npos) << result.diagnostic;
      EXPECT_EQ(result.version, 1u);
    }
    EXPECT_EQ(state.version(), 1u);
    EXPECT_EQ(parameters_of(state), parameters);
    EXPECT_EQ(file_bytes(state.wal_path()), wal_bytes);
    EXPECT_EQ(std::vector<std::uint8_t>(state.encoded_model().begin(), state.encoded_model().end()),
              served);
    const auto& device = state.device_refusals().at("pi-01");
    EXPECT_EQ(device.refused.at("out of bounds"), 14u);
    EXPECT_EQ(device.consecutive_bad, 14u);
    EXPECT_TRUE(device.reported());
    EXPECT_FALSE(device.quarantined);  // quarantine is off by default
    // The device still trains when its updates are sound again; the run of bad ones ends.
    ASSERT_EQ(state.submit("pi-01", bias_update(model, 16, 1, 0.25f)).outcome,
              SubmitOutcome::kApplied);
    EXPECT_EQ(state.device_refusals().at("pi-01").consecutive_bad, 0u);
    EXPECT_EQ(state.device_refusals().at("pi-01").refused.at("out of bounds"), 14u);
  }
  ServerState restarted(small_model(), options_for(dir));
  EXPECT_EQ(restarted.version(), 2u);
  EXPECT_TRUE(std::isfinite(parameters_of(restarted)[bias_index(model)]));
}

// Group commit: an update staged behind others is checked against the values they will
// leave (in version order, before any of them is durable); a failed sync takes their
// reservations away, so the next update is checked against the durable state again.
TEST(BadUpdates, StagedUpdatesAreCheckedAgainstTheUpdatesStagedBeforeThem) {
  TempDir dir("edgetrain-bad");
  std::atomic<bool> fail_sync = false;
  auto options = options_for(dir);
  options.store.learning_rate = 0.5f;
  options.wal_sync = [&](int fd) { return fail_sync ? EIO : ::fdatasync(fd); };
  const runtime::Model model = small_model();
  const std::size_t b = bias_index(model);
  ServerState state(small_model(), options);
  const float start = parameters_of(state)[b];

  auto first = state.stage("pi-01", bias_update(model, 1, 0, -1.5e6f));  // start + 7.5e5
  ASSERT_FALSE(first.settled);
  auto second = state.stage("pi-02", bias_update(model, 1, 1, -1.0e6f));  // + 5e5 more: beyond 1e6
  ASSERT_TRUE(second.settled);
  EXPECT_EQ(second.settled->outcome, SubmitOutcome::kOutOfBounds) << second.settled->diagnostic;
  auto third = state.stage("pi-02", bias_update(model, 2, 1, -0.4e6f));  // + 2e5: fits
  ASSERT_FALSE(third.settled);
  EXPECT_EQ(parameters_of(state)[b], start);  // nothing applied before the sync
  state.start_commit();
  std::vector<server::SettledSubmit> settled;
  for (int pass = 0; pass < 10 && settled.size() < 2; ++pass)
    for (auto& s : state.finish_commit(true)) settled.push_back(s);
  ASSERT_EQ(settled.size(), 2u);
  for (const auto& s : settled)
    EXPECT_EQ(s.result.outcome, SubmitOutcome::kApplied) << s.result.diagnostic;
  const float after_two = parameters_of(state)[b];
  EXPECT_EQ(after_two, (start - 0.5f * -1.5e6f / 1.0f) - 0.5f * -0.4e6f / 1.0f);

  // A staged update whose sync fails is taken back: the same second step then fits.
  fail_sync = true;
  auto doomed = state.stage("pi-01", bias_update(model, 2, 2, 0.2e6f));  // − 1e5
  ASSERT_FALSE(doomed.settled);
  auto riding =
      state.stage("pi-02", bias_update(model, 3, 2, -0.2e6f));  // + 1e5 on top of − 1e5: fits
  ASSERT_FALSE(riding.settled);
  state.start_commit();
  for (auto& s : state.finish_commit(true)) EXPECT_EQ(s.result.outcome, SubmitOutcome::kNotDurable);
  EXPECT_EQ(state.staged_updates(), 0u);
  EXPECT_EQ(state.version(), 2u);
  fail_sync = false;
  // Now from the durable value (start + 9.5e5), without the cancelled − 1e5: + 1e5 is
  // beyond, + 1e4 fits.
  EXPECT_EQ(state.submit("pi-02", bias_update(model, 3, 2, -0.2e6f)).outcome,
            SubmitOutcome::kOutOfBounds);
  const auto ok = state.submit("pi-02", bias_update(model, 4, 2, -0.02e6f));
  EXPECT_EQ(ok.outcome, SubmitOutcome::kApplied) << ok.diagnostic;
  EXPECT_EQ(parameters_of(state)[b], after_two - 0.5f * -0.02e6f / 1.0f);
}

TEST(BadUpdates, ADeviceThatKeepsFailingIsQuarantinedUntilRestart) {
  TempDir dir("edgetrain-bad");
  auto options = options_for(dir);
  options.quarantine_after = 3;
  const runtime::Model model = small_model();
  {
    ServerState state(small_model(), options);
    // Two bad ones, then a good one: the run is broken.
    EXPECT_EQ(state.submit("pi-01", poison(model, 1, 0)).outcome, SubmitOutcome::kOutOfBounds);
    EXPECT_EQ(state.submit("pi-01", edgetrain::testing::bytes_of("garbage")).outcome,
              SubmitOutcome::kMalformed);
    ASSERT_EQ(state.submit("pi-01", bias_update(model, 1, 0, 0.5f)).outcome,
              SubmitOutcome::kApplied);
    EXPECT_FALSE(state.device_refusals().at("pi-01").quarantined);
    // Three in a row (malformed counts too): quarantined.
    EXPECT_EQ(state.submit("pi-01", poison(model, 2, 1)).outcome, SubmitOutcome::kOutOfBounds);
    EXPECT_EQ(state.submit("pi-01", edgetrain::testing::bytes_of("garbage")).outcome,
              SubmitOutcome::kMalformed);
    const auto third = state.submit("pi-01", poison(model, 2, 1));
    EXPECT_EQ(third.outcome, SubmitOutcome::kOutOfBounds);
    EXPECT_NE(third.diagnostic.find("QUARANTINED"), std::string::npos) << third.diagnostic;
    const auto refused = state.submit("pi-01", bias_update(model, 2, 1, 0.5f));
    EXPECT_EQ(refused.outcome, SubmitOutcome::kQuarantined);
    EXPECT_NE(refused.diagnostic.find("until the server restarts"), std::string::npos)
        << refused.diagnostic;
    EXPECT_EQ(state.version(), 1u);
    // Other devices train on.
    EXPECT_EQ(state.submit("pi-02", bias_update(model, 1, 1, 0.5f)).outcome,
              SubmitOutcome::kApplied);
    const auto& device = state.device_refusals().at("pi-01");
    EXPECT_TRUE(device.quarantined);
    EXPECT_EQ(device.quarantines, 1u);
    EXPECT_EQ(device.refused.at("quarantined"), 1u);
    EXPECT_EQ(device.refused.at("out of bounds"), 3u);
    EXPECT_EQ(device.refused.at("malformed"), 2u);
  }
  ServerState restarted(small_model(), options);
  EXPECT_EQ(restarted.submit("pi-01", bias_update(model, 2, 2, 0.5f)).outcome,
            SubmitOutcome::kApplied);
}

TEST(BadUpdates, AQuarantineWithAPeriodEndsAfterIt) {
  TempDir dir("edgetrain-bad");
  auto clock = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  auto options = options_for(dir);
  options.quarantine_after = 2;
  options.quarantine_seconds = 60;
  options.now = [&clock] { return clock; };
  const runtime::Model model = small_model();
  ServerState state(small_model(), options);
  EXPECT_EQ(state.submit("pi-01", poison(model, 1, 0)).outcome, SubmitOutcome::kOutOfBounds);
  EXPECT_EQ(state.submit("pi-01", poison(model, 1, 0)).outcome, SubmitOutcome::kOutOfBounds);
  const auto refused = state.submit("pi-01", bias_update(model, 1, 0, 0.5f));
  EXPECT_EQ(refused.outcome, SubmitOutcome::kQuarantined);
  EXPECT_NE(refused.diagnostic.find("60 more seconds"), std::string::npos) << refused.diagnostic;
  clock += std::chrono::seconds(59);
  EXPECT_EQ(state.submit("pi-01", bias_update(model, 1, 0, 0.5f)).outcome,
            SubmitOutcome::kQuarantined);
  clock += std::chrono::seconds(2);
  EXPECT_EQ(state.submit("pi-01", bias_update(model, 1, 0, 0.5f)).outcome, SubmitOutcome::kApplied);
  EXPECT_FALSE(state.device_refusals().at("pi-01").quarantined);
  EXPECT_EQ(state.device_refusals().at("pi-01").refused.at("quarantined"), 2u);
}

// ---- A state directory poisoned by a server from before these checks: its WAL holds the
// issue's fourteen acknowledged −3.4e38 updates after some good ones.

struct PoisonedState {
  std::uint64_t good = 0;  // good updates before the poison (versions 1..good)
  std::vector<float> good_parameters;
};

// Good random updates from pi-01, then fourteen poisoned records from pi-bad appended to the
// WAL as an unchecked server would have logged them (version v fetched at v − 1).
PoisonedState make_poisoned_state(const TempDir& dir, const ServerStateOptions& options) {
  PoisonedState poisoned;
  poisoned.good = 6;
  const runtime::Model model = small_model();
  std::mt19937 rng(17);
  std::uint64_t wal_size = 0;
  {
    ServerState state(small_model(), options);
    for (std::uint64_t n = 1; n <= poisoned.good; ++n) {
      const auto bytes = edgetrain::testing::random_sparse_update(rng, model, n, state.version());
      EXPECT_EQ(state.submit("pi-01", bytes).outcome, SubmitOutcome::kApplied);
    }
    poisoned.good_parameters = parameters_of(state);
    wal_size = std::filesystem::file_size(state.wal_path());
  }
  server::WalWriter wal = server::WalWriter::append_to(dir.path() / "wal.log", wal_size);
  for (std::uint64_t n = 1; n <= 14; ++n) {
    const std::uint64_t version = poisoned.good + n;
    wal.append({version, "pi-bad", n, poison(model, n, version - 1), {}});
  }
  return poisoned;
}

TEST(BadUpdates, APoisonedLogIsRefusedAtStartNamingTheRecordAndTheSetting) {
  TempDir dir("edgetrain-bad");
  const auto options = options_for(dir);
  make_poisoned_state(dir, options);
  const auto before = directory_bytes(dir.path());
  try {
    ServerState refused(small_model(), options);
    ADD_FAILURE() << "started at version " << refused.version();
  } catch (const server::StateError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--rollback-non-finite"), std::string::npos) << message;
    EXPECT_NE(message.find("pi-bad"), std::string::npos) << message;
  }
  EXPECT_EQ(directory_bytes(dir.path()), before);
}

TEST(BadUpdates, RollbackResumesBeforeTheFirstBadUpdateAndKeepsTheLogs) {
  TempDir dir("edgetrain-bad");
  auto options = options_for(dir);
  const PoisonedState poisoned = make_poisoned_state(dir, options);
  const std::string wal_before = file_bytes(dir.path() / "wal.log");
  options.rollback_non_finite = true;
  const runtime::Model model = small_model();
  {
    ServerState state(small_model(), options);
    ASSERT_TRUE(state.recovery().rollback);
    const server::Rollback& rollback = *state.recovery().rollback;
    // The first poisoned update already leaves the bias at 3.4e37, beyond 1e6; the 11th
    // (lr 0.1: 11 × 3.4e37 > FLT_MAX) is the one that overflowed.
    EXPECT_EQ(rollback.first_bad_version, poisoned.good + 1);
    EXPECT_EQ(rollback.non_finite_version, poisoned.good + 11);
    EXPECT_EQ(rollback.dropped_updates, 14u);
    ASSERT_EQ(rollback.kept_files.size(), 1u);
    EXPECT_EQ(file_bytes(rollback.kept_files[0]),
              wal_before);  // every acknowledged record still on disk
    EXPECT_EQ(state.version(), poisoned.good);
    EXPECT_EQ(parameters_of(state), poisoned.good_parameters);  // bit for bit
    EXPECT_NO_THROW(state.encoded_model());
    // pi-bad's sequence numbers went with its records: its next update (a sound one) applies.
    EXPECT_EQ(state.submit("pi-bad", bias_update(model, 1, state.version(), 0.5f)).outcome,
              SubmitOutcome::kApplied);
  }
  // Consistent again: a plain restart (no rollback setting) resumes where it left off.
  options.rollback_non_finite = false;
  ServerState again(small_model(), options);
  EXPECT_FALSE(again.recovery().rollback);
  EXPECT_EQ(again.version(), poisoned.good + 1);
  EXPECT_TRUE(std::filesystem::exists(
      dir.path() / ("wal.log.rolled-back-at-" + std::to_string(poisoned.good + 1))));
}

// The state after a restart: the poisoned server's exit checkpoint holds −inf. It
// is never served: refused without the setting, and with it recovery starts from the
// previous checkpoint and the logs, and rolls back as above.
TEST(BadUpdates, ANonFiniteCheckpointIsNeverServed) {
  TempDir dir("edgetrain-bad");
  auto options = options_for(dir);
  const PoisonedState poisoned = make_poisoned_state(dir, options);
  {
    // What the unchecked server did at exit, by hand: a checkpoint at the last version with
    // the bias at −inf (the one before becomes the previous one, the WAL wal.prev.log).
    runtime::Model model = small_model();
    std::vector<float> parameters = poisoned.good_parameters;
    parameters[bias_index(model)] = -INFINITY;
    std::copy(parameters.begin(), parameters.end(), model.parameters().begin());
    const std::filesystem::path checkpoint = dir.path() / "checkpoint.safetensors";
    std::filesystem::rename(checkpoint, dir.path() / "checkpoint.prev.safetensors");
    std::filesystem::create_hard_link(dir.path() / "wal.log", dir.path() / "wal.prev.log");
    const std::map<std::string, std::string> metadata = {
        {"edgetrain.state_format", "2"},
        {"edgetrain.version", std::to_string(poisoned.good + 14)},
        {"edgetrain.model_id", std::to_string(model.layout_id())},
        {"edgetrain.sequences", "{}"},
        {"edgetrain.model", model.spec().name}};
    const auto bytes = server::sealed_checkpoint_bytes(model, metadata);
    std::ofstream(checkpoint, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  const auto before = directory_bytes(dir.path());
  try {
    ServerState refused(small_model(), options);
    ADD_FAILURE() << "served a non-finite checkpoint at version " << refused.version();
  } catch (const server::StateError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("non-finite"), std::string::npos) << message;
    EXPECT_NE(message.find("--rollback-non-finite"), std::string::npos) << message;
  }
  EXPECT_EQ(directory_bytes(dir.path()), before);

  options.rollback_non_finite = true;
  ServerState state(small_model(), options);
  EXPECT_TRUE(state.recovery().used_previous_checkpoint);
  ASSERT_TRUE(state.recovery().rollback);
  EXPECT_EQ(state.version(), poisoned.good);
  EXPECT_EQ(parameters_of(state), poisoned.good_parameters);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "checkpoint.safetensors.non-finite"));
}

// Clipping: the WAL holds the clipped update, so a crash and replay (with clipping off, or
// another clip) reach the same parameters bit for bit; what was applied is the update
// scaled to the clip norm per tensor.
TEST(BadUpdates, ClippedUpdatesReplayBitExact) {
  TempDir dir("edgetrain-bad");
  auto options = options_for(dir);
  options.clip_update_norm = 0.75;
  const runtime::Model model = small_model();
  std::mt19937 rng(23);
  std::vector<float> live;
  server::ParameterStoreOptions store_options = options.store;
  server::ParameterStore reference(model.layout_id(), tensor_sizes(model),
                                   {model.parameters().begin(), model.parameters().end()},
                                   store_options);
  {
    ServerState state(small_model(), options);
    for (std::uint64_t n = 1; n <= 12; ++n) {
      const auto bytes = edgetrain::testing::random_sparse_update(rng, model, n, state.version());
      ASSERT_EQ(state.submit("pi-01", bytes).outcome, SubmitOutcome::kApplied);
      auto update =
          transport::decode_sparse_update(bytes, {model.layout_id(), tensor_sizes(model)}).value();
      for (auto& t : update.tensors) {
        double squares = 0;
        for (float v : t.values) squares += static_cast<double>(v) * v;
        const double norm = std::sqrt(squares);
        if (norm > 0.75)
          for (float& v : t.values) v = static_cast<float>(static_cast<double>(v) * (0.75 / norm));
      }
      ASSERT_TRUE(reference.apply(update).applied());
    }
    EXPECT_GT(state.updates_clipped(), 0u);  // random updates of ~30 values in [−1, 1) exceed 0.75
    live = parameters_of(state);
    EXPECT_EQ(live,
              std::vector<float>(reference.parameters().begin(), reference.parameters().end()));
  }  // a crash: no checkpoint since version 0, everything replays from the WAL
  options.clip_update_norm = 0;
  ServerState replayed(small_model(), options);
  EXPECT_EQ(replayed.recovery().replayed_updates, 12u);
  EXPECT_EQ(parameters_of(replayed), live);
}

}  // namespace
