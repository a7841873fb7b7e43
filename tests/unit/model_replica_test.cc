// The worker's copy of the model (worker/model_replica.h): dense first, then deltas since
// the version held; a delta that does not fit the copy (another base, a wrong digest, bytes
// that do not decode) drops the copy so that the next pull is dense, and a model of another
// layout is refused without touching the copy.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>

#include "worker/model_replica.h"

namespace {

using namespace edgetrain;
using runtime::ModelReplica;
using Outcome = ModelReplica::PullOutcome;

constexpr std::uint64_t kModel = 77;
const std::vector<std::uint32_t> kSizes = {6, 3};

std::vector<std::uint8_t> dense(std::uint64_t version, const std::vector<float>& values) {
  return transport::encode_dense_model(kModel, version, kSizes, values).value();
}

// The delta from `before` to `after` (entries that differ), at versions base → version.
std::vector<std::uint8_t> delta(std::uint64_t base, std::uint64_t version,
                                const std::vector<float>& before, const std::vector<float>& after,
                                std::uint64_t model = kModel) {
  transport::ModelDelta d{model, base, version, transport::parameter_digest(after), {}};
  std::size_t offset = 0;
  for (std::uint32_t t = 0; t < kSizes.size(); ++t) {
    transport::SparseTensor changed{t, kSizes[t], {}, {}};
    for (std::uint32_t i = 0; i < kSizes[t]; ++i)
      if (before[offset + i] != after[offset + i]) {
        changed.indices.push_back(i);
        changed.values.push_back(after[offset + i]);
      }
    if (!changed.indices.empty()) d.tensors.push_back(changed);
    offset += kSizes[t];
  }
  return transport::encode_model_delta(d).value();
}

const std::vector<float> v3 = {1, 2, 3, 4, 5, 6, 7, 8, 9};
const std::vector<float> v5 = {1, 2, -3, 4, 5, 6, 7, 8, 0.5f};
const std::vector<float> v9 = {1, 2, -3, 4, 5, 6.25f, 7, 8, 0.5f};

TEST(ModelReplica, DenseFirstThenDeltasSinceTheVersionHeld) {
  ModelReplica replica(kModel, kSizes);
  EXPECT_EQ(replica.pull_path(), "model");
  ASSERT_EQ(replica.take(dense(3, v3)), Outcome::kDense);
  EXPECT_TRUE(replica.exact());
  EXPECT_EQ(replica.pull_path(), "model?since=3");
  ASSERT_EQ(replica.take(delta(3, 5, v3, v5)), Outcome::kDelta) << replica.mismatch();
  EXPECT_EQ(replica.version(), 5u);
  EXPECT_EQ(std::vector<float>(replica.parameters().begin(), replica.parameters().end()), v5);
  EXPECT_EQ(replica.pull_path(), "model?since=5");
  ASSERT_EQ(replica.take(delta(5, 9, v5, v9)), Outcome::kDelta) << replica.mismatch();
  EXPECT_EQ(std::vector<float>(replica.parameters().begin(), replica.parameters().end()), v9);
  // A dense answer to a sparse request (the server could not give a delta) is taken too.
  ASSERT_EQ(replica.take(dense(12, v3)), Outcome::kDense);
  EXPECT_EQ(replica.version(), 12u);
  EXPECT_EQ(replica.pull_path(), "model?since=12");
}

TEST(ModelReplica, DensePullOptionNeverAsksForADelta) {
  ModelReplica replica(kModel, kSizes, /*dense_pull=*/true);
  ASSERT_EQ(replica.take(dense(3, v3)), Outcome::kDense);
  EXPECT_EQ(replica.pull_path(), "model");
}

TEST(ModelReplica, ADeltaThatDoesNotFitDropsTheCopyAndTheNextPullIsDense) {
  ModelReplica replica(kModel, kSizes);
  // Before any dense model: nothing to apply it to.
  EXPECT_EQ(replica.take(delta(3, 5, v3, v5)), Outcome::kMismatch);
  EXPECT_EQ(replica.pull_path(), "model");

  ASSERT_EQ(replica.take(dense(3, v3)), Outcome::kDense);
  EXPECT_EQ(replica.take(delta(4, 5, v3, v5)), Outcome::kMismatch);  // another base version
  EXPECT_FALSE(replica.exact());
  EXPECT_EQ(replica.pull_path(), "model");
  EXPECT_NE(replica.mismatch().find("from version 4"), std::string::npos) << replica.mismatch();

  // Right base, but the server's parameters at 3 were not v3 (e.g. its state was replaced):
  // the digest of the result differs.
  ASSERT_EQ(replica.take(dense(3, v9)), Outcome::kDense);
  EXPECT_EQ(replica.take(delta(3, 5, v3, v5)), Outcome::kMismatch);
  EXPECT_NE(replica.mismatch().find("digest"), std::string::npos) << replica.mismatch();
  EXPECT_EQ(replica.pull_path(), "model");

  // Bytes that do not decode (truncated): dropped as well, nothing thrown.
  ASSERT_EQ(replica.take(dense(3, v3)), Outcome::kDense);
  auto cut = delta(3, 5, v3, v5);
  cut.resize(cut.size() - 3);
  EXPECT_EQ(replica.take(cut), Outcome::kMismatch);
  EXPECT_NE(replica.mismatch().find("undecodable"), std::string::npos) << replica.mismatch();
}

TEST(ModelReplica, AnAssumedStartTakesADeltaAndAWrongGuessEndsInADensePull) {
  ModelReplica replica(kModel, kSizes);
  replica.assume(0, v3);  // the fleet's seeded initial model
  EXPECT_TRUE(replica.exact());
  EXPECT_EQ(replica.pull_path(), "model?since=0");
  ASSERT_EQ(replica.take(delta(0, 5, v3, v5)), Outcome::kDelta) << replica.mismatch();
  EXPECT_EQ(std::vector<float>(replica.parameters().begin(), replica.parameters().end()), v5);

  // The neighbour started from another model (v9): its delta's digest does not match.
  ModelReplica wrong(kModel, kSizes);
  wrong.assume(0, v3);
  EXPECT_EQ(wrong.take(delta(0, 5, v9, v5)), Outcome::kMismatch);
  EXPECT_EQ(wrong.pull_path(), "model");
}

TEST(ModelReplica, AnotherModelIsRefusedAndTheCopyKept) {
  ModelReplica replica(kModel, kSizes);
  ASSERT_EQ(replica.take(dense(3, v3)), Outcome::kDense);
  EXPECT_THROW(replica.take(delta(3, 5, v3, v5, kModel + 1)), std::runtime_error);
  EXPECT_THROW(replica.take(transport::encode_dense_model(kModel + 1, 4, kSizes, v5).value()),
               std::runtime_error);
  const std::vector<std::uint8_t> junk = {'E', 'T', 'D', 'M', 1};
  EXPECT_THROW(replica.take(junk), std::runtime_error);
  EXPECT_TRUE(replica.exact());
  EXPECT_EQ(replica.version(), 3u);
  EXPECT_EQ(std::vector<float>(replica.parameters().begin(), replica.parameters().end()), v3);
}

}  // namespace
