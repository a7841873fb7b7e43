// The cheap pull as edgetrain-server serves it (server/replica_records.h): per device, the
// record of its copy, what each GET /model[?since=V] gets from it (dense, a new delta, the
// last delta again), the records of two devices apart, a bound on the records; a worker's
// ModelReplica that takes every answer checks the digest each time.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "server/replica_records.h"
#include "transport/codec.h"
#include "worker/model_replica.h"

namespace {

using namespace edgetrain;
using server::ReplicaRecordOptions;
using server::ReplicaRecords;
using Kind = ReplicaRecords::Kind;

constexpr std::uint64_t kModelId = 0x5eed;
const std::vector<std::uint32_t> kSizes = {400, 8};

// A model that moves: every step changes ~10% of the entries by random amounts.
struct MovingModel {
  std::vector<float> w = std::vector<float>(408, 0.f);
  std::uint64_t version = 0;
  std::mt19937 rng{7};
  void step() {
    std::uniform_real_distribution<float> change(-1, 1);
    for (float& x : w)
      if (rng() % 10 == 0) x += change(rng);
    ++version;
  }
};

// What a worker does with an answer: the dense model (the ordinary body at `version`) or the
// delta's bytes.
runtime::ModelReplica::PullOutcome take(runtime::ModelReplica& replica,
                                        const ReplicaRecords::Pull& pull, const MovingModel& m) {
  if (pull.kind == Kind::kDense)
    return replica.take(transport::encode_dense_model(kModelId, m.version, kSizes, m.w).value());
  return replica.take(*pull.body);
}

ReplicaRecordOptions options(double fraction, std::uint32_t min_entries = 2,
                             std::size_t max_devices = 8) {
  return {{fraction, min_entries}, max_devices};
}

TEST(ReplicaRecords, FirstPullIsDenseLaterOnesSmallDeltasThatTheWorkerChecks) {
  ReplicaRecords records(kModelId, kSizes, options(0.05));
  MovingModel m;
  runtime::ModelReplica replica(kModelId, kSizes);
  // No record yet: dense, whatever the base.
  EXPECT_EQ(records.pull("pi-01", 0, m.w, m.version).kind, Kind::kDense);
  replica.assume(m.version, m.w);
  for (int i = 0; i < 30; ++i) {
    m.step();
    const ReplicaRecords::Pull pull = records.pull("pi-01", replica.version(), m.w, m.version);
    ASSERT_EQ(pull.kind, Kind::kDelta) << "pull " << i;
    // 5% of 400 and at least 2 of 8: at most 22 entries, far below the dense model.
    auto delta = transport::decode_model_delta(*pull.body, {kModelId, kSizes});
    ASSERT_TRUE(delta.ok());
    std::size_t entries = 0;
    for (const auto& t : delta.value().tensors) entries += t.indices.size();
    EXPECT_LE(entries, 22u);
    EXPECT_LT(pull.body->size(), transport::dense_model_bytes(kSizes));
    ASSERT_EQ(take(replica, pull, m), runtime::ModelReplica::PullOutcome::kDelta)
        << replica.mismatch();
    EXPECT_EQ(replica.version(), m.version);
  }
  // The model stops: one more body brings entries that were left out, at the same version;
  // asked again from that version, the record repeats it (the worker may or may not have
  // applied it: either way the copy checks out), so nothing moves until the model does.
  const ReplicaRecords::Pull left_out = records.pull("pi-01", replica.version(), m.w, m.version);
  ASSERT_EQ(left_out.kind, Kind::kDelta);
  ASSERT_EQ(take(replica, left_out, m), runtime::ModelReplica::PullOutcome::kDelta);
  EXPECT_EQ(records.pull("pi-01", replica.version(), m.w, m.version).kind, Kind::kRepeat);
  EXPECT_EQ(records.counters().dense_pulls, 1u);
  EXPECT_GE(records.counters().delta_pulls, 30u);
  EXPECT_EQ(records.records(), 1u);
  EXPECT_GE(records.bytes(), 408 * sizeof(float));
}

// The seeded first pull: a worker holds version 0's model (built from the run's seed) and
// asks from 0; the record starts from that model and the first answer is a delta as small as
// any later one. A worker that holds another model fails the digest and pulls dense.
TEST(ReplicaRecords, SinceZeroGetsADeltaFromVersionZerosModelWhenTheRecordsHaveIt) {
  MovingModel m;
  for (int i = 0; i < 408; ++i) m.w[i] = 0.01f * static_cast<float>(i % 37);  // "the seeded model"
  const std::vector<float> version_zero = m.w;
  ReplicaRecords records(kModelId, kSizes, options(0.05), version_zero);
  for (int i = 0; i < 20; ++i) m.step();

  runtime::ModelReplica replica(kModelId, kSizes);
  replica.assume(0, version_zero);
  const ReplicaRecords::Pull first = records.pull("pi-01", 0, m.w, m.version);
  ASSERT_EQ(first.kind, Kind::kDelta);
  auto delta = transport::decode_model_delta(*first.body, {kModelId, kSizes});
  ASSERT_TRUE(delta.ok());
  std::size_t entries = 0;
  for (const auto& t : delta.value().tensors) entries += t.indices.size();
  EXPECT_LE(entries, 22u) << "5% of 400 and at least 2 of 8, as every later delta";
  EXPECT_LT(first.body->size() * 4, transport::dense_model_bytes(kSizes));
  ASSERT_EQ(take(replica, first, m), runtime::ModelReplica::PullOutcome::kDelta)
      << replica.mismatch();
  EXPECT_EQ(replica.version(), m.version);
  // Asked again from 0 (a lost answer, a block-wise body fetched again): the same bytes.
  const ReplicaRecords::Pull again = records.pull("pi-01", 0, m.w, m.version);
  EXPECT_EQ(again.kind, Kind::kRepeat);
  EXPECT_EQ(*again.body, *first.body);
  m.step();
  ASSERT_EQ(take(replica, records.pull("pi-01", replica.version(), m.w, m.version), m),
            runtime::ModelReplica::PullOutcome::kDelta)
      << replica.mismatch();
  // The worker restarts and holds version 0's model again: its record starts over from it.
  runtime::ModelReplica restarted(kModelId, kSizes);
  restarted.assume(0, version_zero);
  EXPECT_EQ(take(restarted, records.pull("pi-01", 0, m.w, m.version), m),
            runtime::ModelReplica::PullOutcome::kDelta)
      << restarted.mismatch();

  // Another seed's model: the digest fails, the copy is dropped, the next pull is dense.
  std::vector<float> other_seed = version_zero;
  other_seed[5] += 0.5f;
  runtime::ModelReplica other(kModelId, kSizes);
  other.assume(0, other_seed);
  EXPECT_EQ(take(other, records.pull("pi-02", 0, m.w, m.version), m),
            runtime::ModelReplica::PullOutcome::kMismatch);
  EXPECT_EQ(other.pull_path(), "model");
  EXPECT_EQ(records.pull("pi-02", std::nullopt, m.w, m.version).kind, Kind::kDense);
  EXPECT_EQ(records.counters().seeded_records, 3u);
  EXPECT_EQ(records.counters().dense_pulls, 1u);

  // A record at version 0 (the dense model sent before any update) gave that version: a
  // worker asking from 0 gets a delta from it, not a new start from version 0's model (which
  // may not be the server's version 0, --init-from: a worker would then alternate between a
  // failing delta and a dense pull while the model stands still).
  MovingModel warm;
  warm.w[9] = 5.0f;  // version 0 is not the seeded model
  ReplicaRecords warm_records(kModelId, kSizes, options(0.05), version_zero);
  ASSERT_EQ(warm_records.pull("pi-03", std::nullopt, warm.w, warm.version).kind, Kind::kDense);
  runtime::ModelReplica warm_copy(kModelId, kSizes);
  warm_copy.assume(0, warm.w);
  EXPECT_EQ(take(warm_copy, warm_records.pull("pi-03", 0, warm.w, warm.version), warm),
            runtime::ModelReplica::PullOutcome::kDelta)
      << warm_copy.mismatch();
  EXPECT_EQ(warm_records.counters().seeded_records, 0u);

  // Without version 0's model, since=0 is a base like any other: dense without a record.
  ReplicaRecords unseeded(kModelId, kSizes, options(0.05));
  EXPECT_EQ(unseeded.pull("pi-01", 0, m.w, m.version).kind, Kind::kDense);
  EXPECT_THROW(ReplicaRecords(kModelId, kSizes, options(0.05), std::vector<float>(7)),
               std::invalid_argument);
}

TEST(ReplicaRecords, ABaseTheRecordDidNotGiveGetsTheDenseModelAndResetsTheRecord) {
  ReplicaRecords records(kModelId, kSizes, options(0.05));
  MovingModel m;
  ASSERT_EQ(records.pull("pi-01", std::nullopt, m.w, m.version).kind, Kind::kDense);
  m.step();
  m.step();
  // The worker restarted and asks from a version of its own (or of another run): dense.
  EXPECT_EQ(records.pull("pi-01", 1, m.w, m.version).kind, Kind::kDense);
  EXPECT_EQ(records.pull("pi-01", 99, m.w, m.version).kind, Kind::kDense);
  // A plain GET /model (a worker without a copy) is always dense, and resets the record too.
  EXPECT_EQ(records.pull("pi-01", std::nullopt, m.w, m.version).kind, Kind::kDense);
  EXPECT_EQ(records.counters().dense_pulls, 4u);
  // The record is the dense model now: a delta from it reproduces the model's digest.
  runtime::ModelReplica replica(kModelId, kSizes);
  replica.assume(m.version, m.w);
  m.step();
  const ReplicaRecords::Pull pull = records.pull("pi-01", replica.version(), m.w, m.version);
  ASSERT_EQ(pull.kind, Kind::kDelta);
  EXPECT_EQ(take(replica, pull, m), runtime::ModelReplica::PullOutcome::kDelta)
      << replica.mismatch();
  // A digest the worker cannot match (its copy is not the record) makes it pull dense.
  std::vector<float> other(replica.parameters().begin(), replica.parameters().end());
  other[3] += 1;
  m.step();
  const ReplicaRecords::Pull next = records.pull("pi-01", m.version - 1, m.w, m.version);
  ASSERT_EQ(next.kind, Kind::kDelta);
  runtime::ModelReplica copy_of_other(kModelId, kSizes);
  copy_of_other.assume(m.version - 1, other);
  EXPECT_EQ(take(copy_of_other, next, m), runtime::ModelReplica::PullOutcome::kMismatch);
  EXPECT_FALSE(copy_of_other.exact());
  EXPECT_EQ(copy_of_other.pull_path(), "model");  // and asks for the dense model next
}

TEST(ReplicaRecords, TwoDevicesRecordsAreIndependent) {
  ReplicaRecords records(kModelId, kSizes, options(0.02));
  MovingModel m;
  runtime::ModelReplica a(kModelId, kSizes), b(kModelId, kSizes);
  ASSERT_EQ(take(a, records.pull("a", std::nullopt, m.w, m.version), m),
            runtime::ModelReplica::PullOutcome::kDense);
  // b comes later and pulls rarely; a pulls after every step.
  for (int i = 0; i < 20; ++i) {
    m.step();
    if (i == 3) {
      ASSERT_EQ(take(b, records.pull("b", std::nullopt, m.w, m.version), m),
                runtime::ModelReplica::PullOutcome::kDense);
    }
    ASSERT_EQ(take(a, records.pull("a", a.version(), m.w, m.version), m),
              runtime::ModelReplica::PullOutcome::kDelta)
        << a.mismatch();
    if (i > 3 && i % 5 == 0) {
      ASSERT_EQ(take(b, records.pull("b", b.version(), m.w, m.version), m),
                runtime::ModelReplica::PullOutcome::kDelta)
          << b.mismatch();
    }
  }
  // Both copies are behind the model in their own ways (their records), and both checked.
  EXPECT_EQ(a.version(), m.version);
  EXPECT_EQ(b.version(), 16u);
  EXPECT_NE(std::vector<float>(a.parameters().begin(), a.parameters().end()), m.w);
  EXPECT_NE(std::vector<float>(a.parameters().begin(), a.parameters().end()),
            std::vector<float>(b.parameters().begin(), b.parameters().end()));
  // One device asking from the other's version gets the dense model, not the other's delta.
  EXPECT_EQ(records.pull("a", b.version(), m.w, m.version).kind, Kind::kDense);
  EXPECT_EQ(records.records(), 2u);
}

// A block-wise answer is asked for again when the transport no longer holds it: the same
// request must give the same bytes and ETag while the model moves on, and a worker that got
// the body twice (or applied it and asks again) still checks the digest.
TEST(ReplicaRecords, TheSameRequestGetsTheSameBodyAndETagWhileTheModelMovesOn) {
  ReplicaRecords records(kModelId, kSizes, options(0.05));
  MovingModel m;
  runtime::ModelReplica replica(kModelId, kSizes);
  ASSERT_EQ(take(replica, records.pull("pi-01", std::nullopt, m.w, m.version), m),
            runtime::ModelReplica::PullOutcome::kDense);
  m.step();
  const std::uint64_t base = replica.version();
  const ReplicaRecords::Pull first = records.pull("pi-01", base, m.w, m.version);
  ASSERT_EQ(first.kind, Kind::kDelta);
  const std::vector<std::uint8_t> first_bytes = *first.body;
  for (int i = 0; i < 3; ++i) {
    m.step();  // other devices' updates land meanwhile
    const ReplicaRecords::Pull again = records.pull("pi-01", base, m.w, m.version);
    ASSERT_EQ(again.kind, Kind::kRepeat);
    EXPECT_EQ(*again.body, first_bytes);
    EXPECT_EQ(again.etag, first.etag);
  }
  EXPECT_NE(first.etag, 0u);  // libcoap 4.3.1 would replace 0 with its own
  ASSERT_EQ(take(replica, first, m), runtime::ModelReplica::PullOutcome::kDelta);
  // The next pull from the delivered version is new: another body, another ETag.
  const ReplicaRecords::Pull next = records.pull("pi-01", replica.version(), m.w, m.version);
  ASSERT_EQ(next.kind, Kind::kDelta);
  EXPECT_NE(next.etag, first.etag);
  ASSERT_EQ(take(replica, next, m), runtime::ModelReplica::PullOutcome::kDelta)
      << replica.mismatch();
  EXPECT_EQ(replica.version(), m.version);
  EXPECT_EQ(records.counters().repeated_pulls, 3u);

  // While the model stands still, entries left out go out in bodies of one version: each
  // its own ETag, and applying one twice changes nothing.
  const ReplicaRecords::Pull left_out = records.pull("pi-01", m.version, m.w, m.version);
  ASSERT_EQ(left_out.kind, Kind::kDelta);
  EXPECT_NE(left_out.etag, next.etag);
  ASSERT_EQ(take(replica, left_out, m), runtime::ModelReplica::PullOutcome::kDelta);
  const ReplicaRecords::Pull twice = records.pull("pi-01", m.version, m.w, m.version);
  ASSERT_EQ(twice.kind, Kind::kRepeat);
  EXPECT_EQ(twice.etag, left_out.etag);
  EXPECT_EQ(take(replica, twice, m), runtime::ModelReplica::PullOutcome::kDelta)
      << replica.mismatch();
}

TEST(ReplicaRecords, RecordsAreBoundedTheOneThatPulledLongestAgoGoesFirst) {
  ReplicaRecords records(kModelId, kSizes, options(0.05, 2, 2));
  MovingModel m;
  records.pull("a", std::nullopt, m.w, m.version);
  records.pull("b", std::nullopt, m.w, m.version);
  m.step();
  ASSERT_EQ(records.pull("a", 0, m.w, m.version).kind, Kind::kDelta);  // b is now the oldest
  records.pull("c", std::nullopt, m.w, m.version);
  EXPECT_EQ(records.records(), 2u);
  EXPECT_EQ(records.counters().records_evicted, 1u);
  EXPECT_EQ(records.pull("b", 0, m.w, m.version).kind, Kind::kDense);  // its record went
  m.step();
  EXPECT_EQ(records.pull("c", 1, m.w, m.version).kind, Kind::kDelta);
  EXPECT_LE(records.bytes(), 2 * (408 * sizeof(float)) + 2 * 1024);
}

TEST(ReplicaRecords, ADeltaAsLargeAsTheModelGoesDenseAndSettingsAreChecked) {
  ReplicaRecords records(kModelId, kSizes, options(1.0));
  MovingModel m;
  records.pull("a", std::nullopt, m.w, m.version);
  for (int i = 0; i < 60; ++i) m.step();  // nearly every entry changed: no delta beats dense
  EXPECT_EQ(records.pull("a", 0, m.w, m.version).kind, Kind::kDense);
  EXPECT_THROW(records.pull("a", 60, std::vector<float>(7), 61), std::invalid_argument);
  // σ per entry needs the cheap pull; with it, it is served.
  EXPECT_THROW(server::check_replica_record_options({{0, 32, true}, 8}), std::invalid_argument);
  EXPECT_NO_THROW(server::check_replica_record_options({{0.01, 32, true}, 8}));
  EXPECT_THROW(server::check_replica_record_options({{0.01, 32}, 0}), std::invalid_argument);
  EXPECT_THROW(server::check_replica_record_options({{1.5, 32}, 8}), std::invalid_argument);
  EXPECT_NO_THROW(server::check_replica_record_options({{0, 32}, 0}));  // off: nothing to check
}

// σ per entry (options.pull.entry_staleness): the record keeps per entry the version its
// value was last the model's, and hands it out only for an update computed on that copy
// (t_fetch = the record's version); 8 more bytes per parameter in the bound.
TEST(ReplicaRecords, EntryVersionsFollowTheCopyAndOnlyServeTheVersionItWasPulledAt) {
  ReplicaRecordOptions with = options(0.05);
  with.pull.entry_staleness = true;
  ReplicaRecords records(kModelId, kSizes, with);
  ReplicaRecords plain(kModelId, kSizes, options(0.05));
  MovingModel m;
  EXPECT_TRUE(records.entry_versions("a", 0).empty()) << "no record yet";
  records.pull("a", std::nullopt, m.w, m.version);
  plain.pull("a", std::nullopt, m.w, m.version);
  EXPECT_EQ(records.bytes(), plain.bytes() + 408 * sizeof(std::uint64_t));
  // After the dense pull every entry is the model's at version 0.
  std::span<const std::uint64_t> since = records.entry_versions("a", 0);
  ASSERT_EQ(since.size(), 408u);
  EXPECT_TRUE(std::all_of(since.begin(), since.end(), [](std::uint64_t h) { return h == 0; }));
  std::vector<float> copy = m.w;  // the device's copy, as the deltas leave it
  std::uint64_t held = 0;
  for (int i = 0; i < 6; ++i) {
    m.step();
    const ReplicaRecords::Pull pull = records.pull("a", held, m.w, m.version);
    ASSERT_EQ(pull.kind, Kind::kDelta);
    auto delta = transport::decode_model_delta(*pull.body, {kModelId, kSizes});
    ASSERT_TRUE(delta.ok());
    ASSERT_TRUE(transport::apply_model_delta(delta.value(), kSizes, copy));
    held = m.version;
  }
  since = records.entry_versions("a", held);
  ASSERT_EQ(since.size(), 408u);
  // h_i is the version now exactly for the entries the copy has right, older for the rest
  // (a 5% pull leaves most of the changes out), and never in the future.
  std::size_t older = 0;
  for (std::size_t i = 0; i < 408; ++i) {
    EXPECT_LE(since[i], held);
    EXPECT_EQ(since[i] == held, copy[i] == m.w[i]) << i;
    older += since[i] < held;
  }
  EXPECT_GT(older, 20u);
  // Another version than the record's: not this copy.
  EXPECT_TRUE(records.entry_versions("a", held - 1).empty());
  EXPECT_TRUE(records.entry_versions("b", held).empty());
  EXPECT_TRUE(plain.entry_versions("a", held).empty()) << "off: never";
  records.count_update(true);
  records.count_update(false);
  records.count_update(false);
  EXPECT_EQ(records.counters().entry_sigma_updates, 1u);
  EXPECT_EQ(records.counters().entry_sigma_fallbacks, 2u);
  EXPECT_NE(records.stats_json().find("\"entry_sigma_fallbacks\":2"), std::string::npos);
}

}  // namespace
