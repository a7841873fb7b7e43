// The published model (model/published_model.h): every `every` applied updates it copies
// the largest |W − P| entries of each tensor exactly, keeps the rest for later steps, and
// its model deltas (server/model_changes.h) bring a worker's copy to P bit for bit. Through
// ServerState: GET /model serves P, named by its publish version, not the true model.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

#include "worker/model_replica.h"
#include "server/model_changes.h"
#include "model/published_model.h"
#include "server/server_state.h"
#include "tests/support/served_resources.h"

namespace {

using namespace edgetrain;
using runtime::PublishedModel;
using runtime::PublishOptions;

const std::vector<std::uint32_t> kSizes = {4, 2};

std::vector<float> published_of(const runtime::PublishedModel& p) {
  return {p.parameters().begin(), p.parameters().end()};
}

TEST(PublishedModel, CopiesTheLargestDifferencesEveryStepAndKeepsTheRestForLater) {
  const std::vector<float> start = {0, 0, 0, 0, 1, 1};
  // k = ceil(0.25 · 4) = 1 entry of the first tensor, ceil(0.25 · 2) = 1 of the second.
  runtime::PublishedModel published(kSizes, start, 0, runtime::PublishOptions{2, 0.25, 1});
  std::vector<float> w = {0.5f, -2, 0.25f, 0, 1, 3};
  EXPECT_FALSE(published.advance(w, 1));  // one update since the last step: not yet
  EXPECT_EQ(published.version(), 0u);
  EXPECT_EQ(published_of(published), start);
  EXPECT_TRUE(published.advance(w, 2));
  EXPECT_EQ(published.version(), 2u);
  EXPECT_EQ(published_of(published), (std::vector<float>{0, -2, 0, 0, 1, 3}));
  EXPECT_EQ(published.last_changed()[1], 2u);
  EXPECT_EQ(published.last_changed()[0], 0u);
  EXPECT_GT(published.relative_lag(), 0);
  // Nothing new in W: the next step publishes what the first left out (0.5, then 0.25).
  EXPECT_TRUE(published.advance(w, 4));
  EXPECT_EQ(published_of(published), (std::vector<float>{0.5f, -2, 0, 0, 1, 3}));
  EXPECT_TRUE(published.advance(w, 6));
  EXPECT_EQ(published_of(published), w);
  EXPECT_EQ(published.relative_lag(), 0);
  EXPECT_FALSE(published.advance(w, 8));  // nothing left to copy
  EXPECT_EQ(published.version(), 8u);
  EXPECT_EQ(published.steps(), 4u);
}

TEST(PublishedModel, EqualDifferencesGoByIndexSoEveryMachinePublishesTheSame) {
  runtime::PublishedModel published(kSizes, std::vector<float>(6, 0), 0, runtime::PublishOptions{1, 0.5, 1});
  EXPECT_TRUE(published.advance(std::vector<float>{1, -1, 1, -1, 2, -2}, 1));
  EXPECT_EQ(published_of(published), (std::vector<float>{1, -1, 0, 0, 2, 0}));
}

TEST(PublishedModel, SmallTensorsGetAtLeastTheMinimumEntriesPerStep) {
  // fraction 0.01 of 4 entries rounds up to 1; min_entries 3 copies 3 (the bias-sized rule),
  // and a tensor smaller than the minimum is copied whole.
  runtime::PublishedModel published(kSizes, std::vector<float>(6, 0), 0, runtime::PublishOptions{1, 0.01, 3});
  EXPECT_TRUE(published.advance(std::vector<float>{4, 1, 3, 2, 5, 6}, 1));
  EXPECT_EQ(published_of(published), (std::vector<float>{4, 0, 3, 2, 5, 6}));
}

TEST(PublishedModel, RefusesAFractionOutsideZeroToOneAndSizesThatDoNotAddUp) {
  EXPECT_THROW(runtime::PublishedModel(kSizes, std::vector<float>(6), 0, runtime::PublishOptions{1, 0}),
               std::invalid_argument);
  EXPECT_THROW(runtime::PublishedModel(kSizes, std::vector<float>(6), 0, runtime::PublishOptions{1, 1.5}),
               std::invalid_argument);
  EXPECT_THROW(runtime::PublishedModel(kSizes, std::vector<float>(5), 0, runtime::PublishOptions{1, 0.5}),
               std::invalid_argument);
}

// A worker's replica follows P through the deltas of encode_changes_since(), from any
// version it holds, bit for bit; bases outside what the record knows get no delta.
TEST(PublishedModel, WorkerReplicasFollowItByDeltasFromAnyVersionTheyHold) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const std::vector<std::uint32_t> sizes = {300, 20};
  std::vector<float> w(320);
  for (float& v : w) v = normal(rng);
  runtime::PublishedModel published(sizes, w, 10, runtime::PublishOptions{3, 0.05, 1});
  auto record_of = [&] {
    return server::ChangeRecord{7,
                                sizes,
                                published.parameters(),
                                published.last_changed(),
                                published.version(),
                                published.changes_known_since(),
                                transport::parameter_digest(published.parameters())};
  };
  std::vector<runtime::ModelReplica> replicas;
  for (int r = 0; r < 4; ++r) {
    replicas.emplace_back(7, sizes);
    ASSERT_EQ(replicas.back().take(transport::encode_dense_model(7, published.version(), sizes,
                                                                 published.parameters())
                                       .value()),
              runtime::ModelReplica::PullOutcome::kDense);
  }
  for (std::uint64_t version = 11; version <= 60; ++version) {
    for (int n = 0; n < 15; ++n)
      w[rng() % w.size()] += normal(rng);  // an update touches a few entries
    published.advance(w, version);
    // Replica r pulls every r + 1 versions: it skips publish steps.
    for (std::size_t r = 0; r < replicas.size(); ++r) {
      if (version % (r + 1) != 0) continue;
      auto delta = server::encode_changes_since(record_of(), replicas[r].version());
      ASSERT_TRUE(delta.has_value()) << "version " << version;
      ASSERT_EQ(replicas[r].take(*delta), runtime::ModelReplica::PullOutcome::kDelta)
          << replicas[r].mismatch();
      ASSERT_EQ(std::memcmp(replicas[r].parameters().data(), published.parameters().data(),
                            320 * sizeof(float)),
                0);
      EXPECT_EQ(replicas[r].version(), published.version());
    }
  }
  // Only entries the steps copied travel: a step of 5% per tensor every 3 versions.
  auto since_start = server::encode_changes_since(record_of(), 10);
  ASSERT_TRUE(since_start.has_value());
  EXPECT_FALSE(
      server::encode_changes_since(record_of(), 9).has_value());  // before the record began
  EXPECT_FALSE(server::encode_changes_since(record_of(), published.version() + 1).has_value());
}

TEST(PublishedModel, TheServerServesThePublishedModelNamedByItsPublishVersion) {
  edgetrain::testing::TempDir dir("edgetrain-published");
  const runtime::Model model =
      edgetrain::testing::initialized_model("input 4x4x1; fc 8 relu; fc 3", "tiny", 5);
  const auto sizes = edgetrain::testing::tensor_sizes(model);
  server::ServerStateOptions options;
  options.state_dir = dir.path();
  options.store.max_staleness = 8;
  options.publish = {4, 0.1, 1};
  server::ServerState state(model, options);
  ASSERT_NE(state.published(), nullptr);
  std::mt19937 rng(9);
  for (std::uint64_t n = 1; n <= 10; ++n) {
    const auto update =
        edgetrain::testing::random_sparse_update(rng, model, n, state.served_version());
    ASSERT_EQ(state.submit("w", update).outcome, server::SubmitOutcome::kApplied);
  }
  EXPECT_EQ(state.version(), 10u);
  EXPECT_EQ(state.served_version(), 8u);  // steps at 4 and 8
  auto dense = transport::decode_dense_model(state.encoded_model(), {model.layout_id(), sizes});
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense.value().version, 8u);
  EXPECT_EQ(dense.value().values, published_of(*state.published()));
  EXPECT_NE(dense.value().values, state.snapshot().parameters);  // P lags W
  const auto reply = state.encoded_model_since(4);
  ASSERT_TRUE(reply.delta);
  auto delta = transport::decode_model_delta(reply.bytes, {model.layout_id(), sizes});
  ASSERT_TRUE(delta.ok());
  EXPECT_EQ(delta.value().version, 8u);
  EXPECT_EQ(delta.value().digest, transport::parameter_digest(state.published()->parameters()));
}

}  // namespace
