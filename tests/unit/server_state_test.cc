// The server's durable state: crash (no checkpoint, torn WAL tail, a crash between
// checkpoint and WAL rotation, a damaged checkpoint file) and restart must resume at the
// acknowledged version with parameters bit-identical to an uninterrupted run; replays apply once;
// refusals change nothing, not even the WAL.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <tuple>
#include <limits>
#include <random>

#include "server/checkpoint_file.h"
#include "server/server_state.h"
#include "tests/support/served_resources.h"

namespace {

using edgetrain::testing::directory_bytes;
using edgetrain::testing::file_bytes;

using namespace edgetrain;
using edgetrain::testing::random_sparse_update;
using edgetrain::testing::TempDir;
using edgetrain::testing::tensor_sizes;
using server::ServerState;
using server::ServerStateOptions;
using server::SubmitOutcome;

runtime::Model small_model() {
  return edgetrain::testing::initialized_model("input 4x4x1; fc 8 relu; fc 3", "tiny", 5);
}

// A random sparse update fetched at a random version up to `max_delay` before `version`.
std::vector<std::uint8_t> random_update(std::mt19937& rng, const runtime::Model& model,
                                        std::uint64_t sequence, std::uint64_t version,
                                        std::uint64_t max_delay) {
  const std::uint64_t fetched_version = version - rng() % (std::min(version, max_delay) + 1);
  return random_sparse_update(rng, model, sequence, fetched_version);
}

struct Sent {
  std::string identity;
  std::vector<std::uint8_t> bytes;
};

// Generates `count` updates from three identities and the parameters an uninterrupted
// store (no WAL, no checkpoints) reaches after each prefix.
class History {
 public:
  // `claim_steps`: some updates say they carry 2..9 local steps (offline updates; the
  // header's u16 at 6), which a store with an offline step credit honours.
  History(const ServerStateOptions& options, int count, std::uint32_t seed,
          bool claim_steps = false)
      : model_(small_model()) {
    std::mt19937 rng(seed);
    server::ParameterStore reference(model_.layout_id(), tensor_sizes(model_),
                                     {model_.parameters().begin(), model_.parameters().end()},
                                     options.store);
    std::uint64_t sequences[3] = {0, 0, 0};
    for (int n = 0; n < count; ++n) {
      const int w = static_cast<int>(rng() % 3);
      Sent sent{"device-" + std::to_string(w),
                random_update(rng, model_, ++sequences[w], reference.version(),
                              options.store.max_staleness)};
      if (claim_steps && rng() % 2 == 0) sent.bytes[6] = static_cast<std::uint8_t>(2 + rng() % 8);
      auto decoded =
          transport::decode_sparse_update(sent.bytes, {model_.layout_id(), tensor_sizes(model_)});
      EXPECT_TRUE(reference.apply(decoded.value()).applied());
      updates_.push_back(std::move(sent));
      parameters_after_.emplace_back(reference.parameters().begin(), reference.parameters().end());
    }
  }
  const std::vector<Sent>& updates() const { return updates_; }
  // Parameters after the first `n` updates (n ≥ 1).
  const std::vector<float>& parameters_after(std::size_t n) const {
    return parameters_after_.at(n - 1);
  }

 private:
  runtime::Model model_;
  std::vector<Sent> updates_;
  std::vector<std::vector<float>> parameters_after_;
};

ServerStateOptions options_for(const TempDir& dir, std::uint64_t checkpoint_every) {
  ServerStateOptions options;
  options.state_dir = dir.path();
  options.store.learning_rate = 0.05f;
  options.store.max_staleness = 4;
  options.checkpoint_every = checkpoint_every;
  return options;
}

std::vector<float> parameters_of(const ServerState& state) { return state.snapshot().parameters; }

void submit_all(ServerState& state, const History& history, std::size_t from, std::size_t to) {
  for (std::size_t n = from; n < to; ++n) {
    auto result = state.submit(history.updates()[n].identity, history.updates()[n].bytes);
    ASSERT_EQ(result.outcome, SubmitOutcome::kApplied) << n << ": " << result.diagnostic;
    ASSERT_EQ(result.version, n + 1);
  }
}

TEST(ServerState, CrashWithoutCheckpointResumesBitExact) {
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 7);  // checkpoints at 7, 14, 21, 28; 30 sits in the WAL
  History history(options, 45, 1);
  {
    ServerState state(small_model(), options);
    EXPECT_TRUE(state.recovery().fresh);
    submit_all(state, history, 0, 30);
    EXPECT_EQ(state.checkpoint_version(), 28u);
  }  // "crash": destroyed without a final checkpoint
  ServerState restarted(small_model(), options);
  EXPECT_FALSE(restarted.recovery().fresh);
  EXPECT_EQ(restarted.recovery().checkpoint_version, 28u);
  EXPECT_EQ(restarted.recovery().replayed_updates, 2u);
  ASSERT_EQ(restarted.version(), 30u);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(30));
  // The staleness history came back too: later updates (with delays reaching across the
  // checkpoint) land exactly where the uninterrupted run puts them.
  submit_all(restarted, history, 30, 45);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(45));
}

// Offline updates: with an offline step credit in force, updates that claim local steps
// replay after a crash to the parameters of the uninterrupted run (the credit is in the WAL
// header, the claims in the logged bytes).
TEST(ServerState, CreditedClaimsReplayBitExact) {
  TempDir dir("edgetrain-state");
  auto options = options_for(dir, 7);
  options.store.offline_step_credit = 4;
  History history(options, 40, 3, true);
  {
    ServerState state(small_model(), options);
    submit_all(state, history, 0, 25);
  }
  ServerState restarted(small_model(), options);
  ASSERT_EQ(restarted.version(), 25u);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(25));
  submit_all(restarted, history, 25, 40);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(40));
  // The claims made a difference: the paper's rule ends elsewhere.
  auto paper = options;
  paper.store.offline_step_credit = 0;
  History unclaimed(paper, 40, 3, true);
  EXPECT_NE(unclaimed.parameters_after(40), history.parameters_after(40));
}

// σ per entry (--entry-staleness, the cheap pull's records of the devices' copies): the
// records are not durable, yet a crash replays to the live run's parameters bit for bit,
// since the WAL keeps each update's entries that were older than its t_fetch; those
// parameters are not the paper's σ's. After the restart the devices have no records: their
// updates fall back to the paper's σ, and replay reproduces that too. A server started
// without --entry-staleness on that state is refused, naming it.
TEST(ServerState, EntryStalenessReplaysBitExactWithoutTheRecords) {
  TempDir dir("edgetrain-state");
  auto options = options_for(dir, 7);
  options.store.max_staleness = 8;
  options.replica_pull = {{0.1, 1, true}, 8};
  // With a learning-rate schedule too: its header extension (format 2) comes before the
  // records that carry entry delays.
  options.store.lr_schedule = {{20}, 0.5f};
  const runtime::Model model = small_model();
  const auto sizes = tensor_sizes(model);
  server::ParameterStore paper(model.layout_id(), sizes,
                               {model.parameters().begin(), model.parameters().end()},
                               options.store);
  std::mt19937 rng(38);
  std::uint64_t sequences[3] = {0, 0, 0};
  std::uint64_t pulled_at[3] = {0, 0, 0};
  // A random device sends an update computed on the copy it pulled, then pulls again.
  auto send = [&](ServerState& state, int device) {
    const std::string identity = "device-" + std::to_string(device);
    const std::vector<std::uint8_t> bytes =
        random_sparse_update(rng, model, ++sequences[device], pulled_at[device]);
    const auto result = state.submit(identity, bytes);
    ASSERT_EQ(result.outcome, SubmitOutcome::kApplied) << result.diagnostic;
    ASSERT_TRUE(paper.apply(transport::decode_sparse_update(bytes, {model.layout_id(), sizes})
                                .value())
                    .applied());
    state.pull_for_device(identity, pulled_at[device]);
    pulled_at[device] = state.version();
  };
  std::vector<float> live;
  {
    ServerState state(small_model(), options);
    for (int d = 0; d < 3; ++d) state.pull_for_device("device-" + std::to_string(d), std::nullopt);
    for (int n = 0; n < 40; ++n) send(state, static_cast<int>(rng() % 3));
    ASSERT_EQ(state.version(), 40u);
    EXPECT_EQ(state.replica_records()->counters().entry_sigma_updates, 40u);
    EXPECT_EQ(state.replica_records()->counters().entry_sigma_fallbacks, 0u);
    live = parameters_of(state);
  }  // "crash": no final checkpoint (the last is at 35)
  std::size_t with_delays = 0;
  for (const server::WalRecord& record : server::read_wal(dir.path() / "wal.log").records)
    with_delays += !record.entry_delays.empty();
  EXPECT_GT(with_delays, 5u) << "the log should carry older entries of most updates";
  EXPECT_NE(live, std::vector<float>(paper.parameters().begin(), paper.parameters().end()))
      << "σ per entry made no difference: the test shows nothing";
  {
    ServerState restarted(small_model(), options);
    EXPECT_EQ(restarted.recovery().checkpoint_version, 35u);
    ASSERT_EQ(restarted.version(), 40u);
    EXPECT_EQ(parameters_of(restarted), live);
    // No records now: a device's next update gets the paper's σ (counted as a fallback).
    for (int n = 0; n < 6; ++n) send(restarted, n % 3);
    EXPECT_EQ(restarted.replica_records()->counters().entry_sigma_fallbacks, 3u);
    EXPECT_EQ(restarted.replica_records()->counters().entry_sigma_updates, 3u);
    live = parameters_of(restarted);
  }
  {
    ServerState again(small_model(), options);
    ASSERT_EQ(again.version(), 46u);
    EXPECT_EQ(parameters_of(again), live);
  }
  auto without = options;
  without.replica_pull.pull.entry_staleness = false;
  try {
    ServerState refused(small_model(), without);
    ADD_FAILURE() << "a log written with σ per entry replayed without it";
  } catch (const server::StateError& e) {
    EXPECT_NE(std::string(e.what()).find("--entry-staleness"), std::string::npos) << e.what();
  }
}

// The learning-rate schedule: a log written under one (kept in the WAL header, format 2)
// replays after a crash to the parameters of the uninterrupted run, across a milestone that
// falls among the replayed updates, and the run goes on as it would have.
TEST(ServerState, ScheduledLearningRateReplaysBitExact) {
  TempDir dir("edgetrain-state");
  auto options = options_for(dir, 7);  // checkpoint at 21; 22..25 replay across milestone 23
  options.store.lr_schedule = {{12, 23, 30}, 0.5f};
  History history(options, 40, 4);
  {
    ServerState state(small_model(), options);
    submit_all(state, history, 0, 25);
    EXPECT_EQ(state.current_learning_rate(), 0.05f * 0.5f * 0.5f);
  }
  EXPECT_EQ(server::read_wal_header(dir.path() / "wal.log").lr_decay_at,
            options.store.lr_schedule.decay_at);
  ServerState restarted(small_model(), options);
  EXPECT_EQ(restarted.recovery().replayed_updates, 4u);
  ASSERT_EQ(restarted.version(), 25u);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(25));
  submit_all(restarted, history, 25, 40);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(40));
  EXPECT_EQ(restarted.current_learning_rate(), 0.05f * 0.5f * 0.5f * 0.5f);
  // The schedule made a difference: a constant lr ends elsewhere.
  auto constant = options;
  constant.store.lr_schedule = {};
  History unscheduled(constant, 40, 4);
  EXPECT_EQ(unscheduled.parameters_after(11), history.parameters_after(11));
  EXPECT_NE(unscheduled.parameters_after(40), history.parameters_after(40));
}

// GET /model?since=V for every V from `oldest` to beyond the current version: a delta,
// applied to the parameters at V, must give the current parameters bit for bit (and their
// digest); otherwise the answer must be the dense model. Returns how many were deltas.
int check_deltas(ServerState& state, const History& history, std::uint64_t oldest) {
  const runtime::Model initial = small_model();
  const auto sizes = tensor_sizes(initial);
  const std::vector<float> now = parameters_of(state);
  int deltas = 0;
  for (std::uint64_t since = oldest; since <= state.version() + 2; ++since) {
    const ServerState::ModelReply reply = state.encoded_model_since(since);
    if (!reply.delta) {
      auto dense = transport::decode_dense_model(reply.bytes, {initial.layout_id(), sizes});
      EXPECT_TRUE(dense.ok());
      if (dense.ok()) {
        EXPECT_EQ(dense.value().values, now) << "dense answer for since=" << since;
      }
      continue;
    }
    ++deltas;
    EXPECT_LE(since, state.version()) << "a delta from a version the server has not reached";
    auto delta = transport::decode_model_delta(reply.bytes, {initial.layout_id(), sizes});
    EXPECT_TRUE(delta.ok()) << (delta.ok() ? "" : delta.error().message);
    if (!delta.ok()) continue;
    EXPECT_EQ(delta.value().base_version, since);
    EXPECT_EQ(delta.value().version, state.version());
    EXPECT_LT(reply.bytes.size(), transport::dense_model_bytes(sizes));
    std::vector<float> copy =
        since == 0 ? std::vector<float>(initial.parameters().begin(), initial.parameters().end())
                   : history.parameters_after(since);
    EXPECT_TRUE(transport::apply_model_delta(delta.value(), sizes, copy));
    EXPECT_EQ(std::memcmp(copy.data(), now.data(), now.size() * sizeof(float)), 0)
        << "since=" << since;
    EXPECT_EQ(transport::parameter_digest(copy), delta.value().digest);
  }
  return deltas;
}

TEST(ServerState, ModelDeltaSinceAnyKnownVersionIsExactAcrossCrashes) {
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 7);  // checkpoints at 7, 14, 21, 28; 29, 30 in the WAL
  History history(options, 45, 11);
  {
    ServerState state(small_model(), options);
    for (std::size_t n = 0; n < 30; ++n) {
      submit_all(state, history, n, n + 1);
      EXPECT_GE(check_deltas(state, history, 0), 1) << "version " << n + 1;  // at least since = now
    }
  }  // "crash": destroyed without a final checkpoint
  ServerState restarted(small_model(), options);
  ASSERT_EQ(restarted.recovery().checkpoint_version, 28u);
  ASSERT_EQ(restarted.version(), 30u);
  // The change record restarts at the oldest update the WAL keeps as history (28 − D = 24):
  // older bases get the dense model, newer ones an exact delta.
  for (std::uint64_t since = 0; since < 24; ++since)
    EXPECT_FALSE(restarted.encoded_model_since(since).delta) << since;
  EXPECT_TRUE(restarted.encoded_model_since(29).delta);
  EXPECT_TRUE(restarted.encoded_model_since(30).delta);
  EXPECT_FALSE(restarted.encoded_model_since(31).delta);
  EXPECT_FALSE(restarted.encoded_model_since(std::numeric_limits<std::uint64_t>::max()).delta);
  EXPECT_GE(check_deltas(restarted, history, 0), 2);
  for (std::size_t n = 30; n < 45; ++n) {
    submit_all(restarted, history, n, n + 1);
    EXPECT_GE(check_deltas(restarted, history, 0), 1) << "version " << n + 1;
  }
  EXPECT_EQ(restarted.encoded_model_since(45).bytes.size(),
            44u);  // nothing changed: the header alone
}

TEST(ServerState, TornLastRecordIsDroppedAndTheLogStaysAppendable) {
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 0);  // no automatic checkpoints: all in the WAL
  History history(options, 12, 2);
  {
    ServerState state(small_model(), options);
    submit_all(state, history, 0, 10);
  }
  const auto wal = dir.path() / "wal.log";
  std::filesystem::resize_file(wal, std::filesystem::file_size(wal) - 5);  // cut into record 10
  {
    ServerState restarted(small_model(), options);
    EXPECT_GT(restarted.recovery().dropped_wal_bytes, 0u);
    ASSERT_EQ(restarted.version(), 9u);
    EXPECT_EQ(parameters_of(restarted), history.parameters_after(9));
    submit_all(restarted, history, 9, 12);  // appended after the cut, not after the garbage
  }
  ServerState again(small_model(), options);
  EXPECT_EQ(again.recovery().dropped_wal_bytes, 0u);
  ASSERT_EQ(again.version(), 12u);
  EXPECT_EQ(parameters_of(again), history.parameters_after(12));
}

TEST(ServerState, CrashBetweenCheckpointAndWalRotationResumesBitExact) {
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 0);
  History history(options, 16, 3);
  const auto wal = dir.path() / "wal.log";
  const auto old_wal = dir.path() / "wal.before-rotation";
  {
    ServerState state(small_model(), options);
    submit_all(state, history, 0, 12);
    std::filesystem::copy_file(wal, old_wal);
    state.checkpoint();
  }
  // As if the process died after renaming the checkpoint but before replacing the WAL.
  std::filesystem::rename(old_wal, wal);
  ServerState restarted(small_model(), options);
  EXPECT_EQ(restarted.recovery().checkpoint_version, 12u);
  EXPECT_EQ(restarted.recovery().replayed_updates, 0u);
  ASSERT_EQ(restarted.version(), 12u);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(12));
  submit_all(restarted, history, 12, 16);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(16));
}

TEST(ServerState, ReplayedSequenceAppliesOnceAcrossRestarts) {
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 3);
  History history(options, 5, 4);
  const Sent& first = history.updates()[0];
  {
    ServerState state(small_model(), options);
    auto applied = state.submit(first.identity, first.bytes);
    ASSERT_EQ(applied.outcome, SubmitOutcome::kApplied);
    auto again = state.submit(first.identity, first.bytes);
    EXPECT_EQ(again.outcome, SubmitOutcome::kDuplicate);
    EXPECT_EQ(again.version, applied.version);
    EXPECT_EQ(state.version(), 1u);
    // The same bytes under another identity are that identity's update, not a replay.
    EXPECT_EQ(state.submit("someone-else", first.bytes).outcome, SubmitOutcome::kApplied);
    EXPECT_EQ(state.version(), 2u);
  }
  ServerState restarted(small_model(), options);
  auto after_restart = restarted.submit(first.identity, first.bytes);
  EXPECT_EQ(after_restart.outcome, SubmitOutcome::kDuplicate);
  EXPECT_EQ(after_restart.version, 1u);
  restarted.checkpoint();  // the table must survive in the checkpoint's metadata as well
  ServerState from_checkpoint(small_model(), options);
  EXPECT_EQ(from_checkpoint.submit(first.identity, first.bytes).outcome, SubmitOutcome::kDuplicate);
  EXPECT_EQ(from_checkpoint.version(), 2u);
}

TEST(ServerState, RefusedUpdatesChangeNothingNotEvenTheLog) {
  TempDir dir("edgetrain-state");
  auto options = options_for(dir, 0);
  options.max_update_bytes = 2000;
  ServerState state(small_model(), options);
  const runtime::Model model = small_model();
  std::mt19937 rng(9);
  ASSERT_EQ(state.submit("a", random_update(rng, model, 5, 0, 0)).outcome, SubmitOutcome::kApplied);
  const auto wal_bytes = std::filesystem::file_size(state.wal_path());
  const auto before = parameters_of(state);

  auto expect_refused = [&](std::vector<std::uint8_t> bytes, SubmitOutcome outcome) {
    auto result = state.submit("a", bytes);
    EXPECT_EQ(result.outcome, outcome) << result.diagnostic;
    EXPECT_FALSE(result.diagnostic.empty());
    EXPECT_EQ(state.version(), 1u);
  };
  auto good = random_update(rng, model, 6, 1, 0);
  expect_refused({good.begin(), good.begin() + 20}, SubmitOutcome::kMalformed);
  expect_refused(std::vector<std::uint8_t>(3000, 0), SubmitOutcome::kTooLarge);
  transport::SparseUpdate u{model.layout_id(), 7, 1, {{0, 128, {3}, {1.0f}}}};
  u.model_id ^= 1;
  expect_refused(transport::encode_sparse_update(u).value(), SubmitOutcome::kWrongModel);
  u.model_id ^= 1;
  u.fetched_version = 2;  // ahead of the server
  expect_refused(transport::encode_sparse_update(u).value(), SubmitOutcome::kMalformed);
  u.fetched_version = 1;
  u.sequence = 4;  // below the last applied 5
  expect_refused(transport::encode_sparse_update(u).value(), SubmitOutcome::kOldSequence);
  // NaN written straight into the bytes (the encoder refuses to produce it).
  u.sequence = 8;
  auto nan_bytes = transport::encode_sparse_update(u).value();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_bytes.data() + nan_bytes.size() - 4, &nan, 4);
  expect_refused(nan_bytes, SubmitOutcome::kMalformed);

  EXPECT_EQ(parameters_of(state), before);
  EXPECT_EQ(std::filesystem::file_size(state.wal_path()), wal_bytes);
}

TEST(ServerState, TooStaleUpdatesAreRefused) {
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 0);  // max staleness 4
  History history(options, 6, 5);
  ServerState state(small_model(), options);
  submit_all(state, history, 0, 6);
  transport::SparseUpdate u{state.model_id(), 100, 1, {{0, 128, {3}, {1.0f}}}};  // delay 5
  auto result = state.submit("late", transport::encode_sparse_update(u).value());
  EXPECT_EQ(result.outcome, SubmitOutcome::kTooStale) << result.diagnostic;
  EXPECT_EQ(state.version(), 6u);
}

TEST(ServerState, OtherSettingsOnTheSameStateAreRefused) {
  TempDir dir("edgetrain-state");
  auto options = options_for(dir, 0);
  { ServerState state(small_model(), options); }
  options.store.learning_rate = 0.1f;
  EXPECT_THROW(ServerState(small_model(), options), server::StateError);
  options = options_for(dir, 0);
  options.store.offline_step_credit = 5;  // replay would credit claims the log's run did not
  EXPECT_THROW(ServerState(small_model(), options), server::StateError);
  options = options_for(dir, 0);
  options.store.lr_schedule = {{10}, 0.5f};  // replay would decay an lr the log's run did not
  EXPECT_THROW(ServerState(small_model(), options), server::StateError);
  options = options_for(dir, 0);
  runtime::Model other(runtime::parse_model_spec("input 4x4x1; fc 5", "other"));
  EXPECT_THROW(ServerState(std::move(other), options), server::StateError);
}

// A log written under a schedule is refused without it, or with other milestones or another
// factor, and opens with the same one.
TEST(ServerState, AnotherLearningRateScheduleOnTheSameStateIsRefused) {
  TempDir dir("edgetrain-state");
  auto options = options_for(dir, 0);
  options.store.lr_schedule = {{10, 20}, 0.5f};
  { ServerState state(small_model(), options); }
  for (const server::LearningRateSchedule& other :
       {server::LearningRateSchedule{}, server::LearningRateSchedule{{10, 21}, 0.5f},
        server::LearningRateSchedule{{10, 20}, 0.25f}, server::LearningRateSchedule{{10}, 0.5f}}) {
    auto changed = options;
    changed.store.lr_schedule = other;
    try {
      ServerState refused(small_model(), changed);
      ADD_FAILURE() << "opened with schedule " << server::format_lr_decay_at(other.decay_at);
    } catch (const server::StateError& e) {
      EXPECT_NE(std::string(e.what()).find("lr decay at 10,20 by 0.5"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(ServerState(small_model(), options));
}

// ---- Damaged checkpoints (issue 18): recovered to the consistent state from the previous
// checkpoint and the WAL, or refused with a message naming the file; never loaded.

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

enum class Damage { kDataByte, kMetadataByte, kChecksumKeyByte, kTruncation };

std::string damage_name(Damage damage) {
  switch (damage) {
    case Damage::kDataByte:
      return "a flipped data byte";
    case Damage::kMetadataByte:
      return "a changed digit of edgetrain.version";
    case Damage::kChecksumKeyByte:
      return "a flipped byte in the checksum's key";
    case Damage::kTruncation:
      return "truncation";
  }
  return "?";
}

void damage_file(const std::filesystem::path& path, Damage damage) {
  std::string bytes = file_bytes(path);
  ASSERT_GT(bytes.size(), 8u);
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  const std::string header = bytes.substr(8, header_length);
  switch (damage) {
    case Damage::kDataByte: {
      const std::size_t data_bytes = bytes.size() - 8 - header_length;
      bytes[8 + header_length + data_bytes / 2] ^= 0x40;  // an exponent bit: a very different float
      break;
    }
    case Damage::kMetadataByte: {
      // Still a valid number, so the file parses and would have been loaded silently.
      const std::string key = "\"edgetrain.version\":\"";
      const std::size_t at = header.find(key);
      ASSERT_NE(at, std::string::npos) << header;
      char& digit = bytes[8 + at + key.size()];
      digit = digit == '9' ? '8' : static_cast<char>(digit + 1);
      break;
    }
    case Damage::kChecksumKeyByte: {
      const std::size_t at = header.find("edgetrain.crc32");
      ASSERT_NE(at, std::string::npos) << header;
      bytes[8 + at + 10] ^= 0x01;  // "crc32" → "brc32": the file looks as if it had no checksum
      break;
    }
    case Damage::kTruncation:
      bytes.resize(bytes.size() - 37);
      break;
  }
  write_bytes(path, bytes);
}

bool any_note_contains(const server::RecoveryReport& report, const std::string& text) {
  for (const std::string& note : report.notes)
    if (note.find(text) != std::string::npos) return true;
  return false;
}

class DamagedCheckpoint : public ::testing::TestWithParam<std::tuple<Damage, bool>> {};

// 30 updates with a checkpoint every 7: a crash leaves checkpoints 28 (current) and 21
// (previous) with 29 and 30 in the WAL; a clean stop checkpoints 30, so 28 is the previous.
TEST_P(DamagedCheckpoint, RecoversTheAcknowledgedStateFromThePreviousCheckpointAndTheWal) {
  const auto [damage, clean_stop] = GetParam();
  SCOPED_TRACE(damage_name(damage) + (clean_stop ? " after a clean stop" : " after a crash"));
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 7);
  History history(options, 40, 11);
  {
    ServerState state(small_model(), options);
    submit_all(state, history, 0, 30);
    if (clean_stop) state.checkpoint();  // what edgetrain-server does on SIGTERM
  }
  const std::filesystem::path checkpoint = dir.path() / "checkpoint.safetensors";
  damage_file(checkpoint, damage);
  const std::string damaged_bytes = file_bytes(checkpoint);
  {
    ServerState restarted(small_model(), options);
    EXPECT_TRUE(restarted.recovery().used_previous_checkpoint);
    EXPECT_EQ(restarted.recovery().checkpoint_version, clean_stop ? 28u : 21u);
    ASSERT_EQ(restarted.version(), 30u);
    EXPECT_EQ(parameters_of(restarted), history.parameters_after(30));  // bit for bit
    EXPECT_TRUE(any_note_contains(restarted.recovery(), checkpoint.string()))
        << restarted.recovery().notes.size();
    EXPECT_EQ(file_bytes(dir.path() / "checkpoint.safetensors.damaged"), damaged_bytes);
    // Training goes on with σ across the fall-back as in an uninterrupted run ...
    submit_all(restarted, history, 30, 35);
    EXPECT_EQ(parameters_of(restarted), history.parameters_after(35));
  }  // ... and the directory is consistent again: another crash, another restart.
  ServerState again(small_model(), options);
  EXPECT_FALSE(again.recovery().used_previous_checkpoint);
  ASSERT_EQ(again.version(), 35u);
  EXPECT_EQ(parameters_of(again), history.parameters_after(35));
  submit_all(again, history, 35, 40);
  EXPECT_EQ(parameters_of(again), history.parameters_after(40));
}

std::string damaged_checkpoint_case_name(
    const ::testing::TestParamInfo<std::tuple<Damage, bool>>& info) {
  static const char* const kNames[] = {"DataByte", "MetadataByte", "ChecksumKeyByte", "Truncation"};
  return std::string(kNames[static_cast<int>(std::get<0>(info.param))]) +
         (std::get<1>(info.param) ? "AfterCleanStop" : "AfterCrash");
}

INSTANTIATE_TEST_SUITE_P(
    EveryDamageAfterStopAndCrash, DamagedCheckpoint,
    ::testing::Combine(::testing::Values(Damage::kDataByte, Damage::kMetadataByte,
                                         Damage::kChecksumKeyByte, Damage::kTruncation),
                       ::testing::Bool()),
    damaged_checkpoint_case_name);

// Without a usable previous checkpoint (damaged too, or its WAL records gone) the server
// refuses to start, names the file, and leaves every file as it was.
TEST(ServerState, DamagedCheckpointWithoutAUsableFallbackIsRefusedNamingTheFile) {
  for (const bool previous_damaged : {true, false}) {
    SCOPED_TRACE(previous_damaged ? "previous checkpoint damaged too" : "wal.prev.log gone");
    TempDir dir("edgetrain-state");
    const auto options = options_for(dir, 7);
    History history(options, 30, 12);
    {
      ServerState state(small_model(), options);
      submit_all(state, history, 0, 30);
      state.checkpoint();
    }
    const std::filesystem::path checkpoint = dir.path() / "checkpoint.safetensors";
    damage_file(checkpoint, Damage::kDataByte);
    if (previous_damaged)
      damage_file(dir.path() / "checkpoint.prev.safetensors", Damage::kTruncation);
    else
      std::filesystem::remove(dir.path() /
                              "wal.prev.log");  // wal.log alone lacks the history of 28
    std::map<std::string, std::string> before;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
      before[entry.path().filename().string()] = file_bytes(entry.path());
    try {
      ServerState refused(small_model(), options);
      ADD_FAILURE() << "started from a damaged checkpoint at version " << refused.version();
    } catch (const server::StateError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(checkpoint.string()), std::string::npos) << message;
      EXPECT_NE(message.find("Refusing to start"), std::string::npos) << message;
      EXPECT_NE(message.find("checksum mismatch"), std::string::npos) << message;
    }
    std::map<std::string, std::string> after;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
      after[entry.path().filename().string()] = file_bytes(entry.path());
    EXPECT_EQ(after, before);
  }
}

// With no previous checkpoint at all (a state directory from before checkpoints were
// kept twice) a damaged checkpoint is refused as well.
TEST(ServerState, DamagedOnlyCheckpointIsRefused) {
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 0);
  History history(options, 5, 13);
  {
    ServerState state(small_model(), options);
    submit_all(state, history, 0, 5);
    state.checkpoint();
  }
  std::filesystem::remove(dir.path() / "checkpoint.prev.safetensors");
  damage_file(dir.path() / "checkpoint.safetensors", Damage::kMetadataByte);
  EXPECT_THROW(ServerState(small_model(), options), server::StateError);
}

// Checkpoints written before they carried a checksum (state format 1) still load, with a
// note for the log.
TEST(ServerState, CheckpointWithoutChecksumFromBeforeLoadsWithANote) {
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 0);
  History history(options, 8, 14);
  {
    ServerState state(small_model(), options);
    submit_all(state, history, 0, 5);
    state.checkpoint();
    submit_all(state, history, 5, 6);
  }
  const std::filesystem::path checkpoint = dir.path() / "checkpoint.safetensors";
  runtime::Model model = small_model();
  std::map<std::string, std::string> metadata = model.load_safetensors(checkpoint.string());
  ASSERT_EQ(metadata.erase(server::kCheckpointChecksumKey), 1u);
  metadata["edgetrain.state_format"] = "1";
  model.save_safetensors(checkpoint.string(), metadata);  // as the server wrote it before
  ServerState restarted(small_model(), options);
  EXPECT_FALSE(restarted.recovery().used_previous_checkpoint);
  EXPECT_TRUE(any_note_contains(restarted.recovery(), "has no checksum"))
      << restarted.recovery().notes.size();
  ASSERT_EQ(restarted.version(), 6u);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(6));
  submit_all(restarted, history, 6, 8);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(8));
}

// Temporaries of writes that never completed (also the model writer's own temporary inside
// the server's, checkpoint.safetensors.tmp.tmp, from before there was one write) are
// removed at start and reported; other files are left alone.
TEST(ServerState, LeftoverTemporariesAreRemovedAtStartAndReported) {
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 0);
  History history(options, 3, 15);
  {
    ServerState state(small_model(), options);
    submit_all(state, history, 0, 3);
  }
  const std::vector<std::string> leftovers = {"checkpoint.safetensors.tmp",
                                              "checkpoint.safetensors.tmp.tmp", "wal.log.tmp",
                                              "wal.prev.log.tmp"};
  for (const std::string& name : leftovers) write_bytes(dir.path() / name, "half written");
  write_bytes(dir.path() / "stats.json.tmp", "not ours");
  ServerState restarted(small_model(), options);
  for (const std::string& name : leftovers) {
    EXPECT_FALSE(std::filesystem::exists(dir.path() / name)) << name;
    EXPECT_TRUE(any_note_contains(restarted.recovery(), (dir.path() / name).string())) << name;
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "stats.json.tmp"));
  ASSERT_EQ(restarted.version(), 3u);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(3));
}

// A checkpoint write that fails leaves no temporary inside a temporary (one write, one
// rename), and the state stays recoverable.
TEST(ServerState, FailedCheckpointWriteLeavesNoNestedTemporary) {
  TempDir dir("edgetrain-state");
  const auto options = options_for(dir, 0);
  History history(options, 6, 16);
  {
    ServerState state(small_model(), options);
    submit_all(state, history, 0, 4);
    std::filesystem::create_directory(dir.path() /
                                      "checkpoint.safetensors.tmp");  // the write cannot open it
    EXPECT_THROW(state.checkpoint(), server::StateError);
    for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
      EXPECT_FALSE(entry.path().filename().string().ends_with(".tmp.tmp")) << entry.path();
    std::filesystem::remove(dir.path() / "checkpoint.safetensors.tmp");
    submit_all(state, history, 4, 5);
  }
  ServerState restarted(small_model(), options);
  ASSERT_EQ(restarted.version(), 5u);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(5));
  submit_all(restarted, history, 5, 6);
  EXPECT_EQ(parameters_of(restarted), history.parameters_after(6));
}

}  // namespace
