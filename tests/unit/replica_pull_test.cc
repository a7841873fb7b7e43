// The cheap pull (server/replica_pull.h): per worker, the server sends the largest changes
// since the copy that worker holds and keeps the rest; the worker's ModelReplica applies
// the delta and checks its digest as for an exact pull; what is left out arrives later.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>

#include "server/replica_pull.h"
#include "transport/codec.h"
#include "worker/model_replica.h"

namespace {

using namespace edgetrain;
using server::replica_pull;
using server::ReplicaPullOptions;

const std::vector<std::uint32_t> kSizes = {4, 2};

std::vector<std::pair<std::uint32_t, float>> entries(const transport::SparseTensor& t) {
  std::vector<std::pair<std::uint32_t, float>> out;
  for (std::size_t j = 0; j < t.indices.size(); ++j) out.emplace_back(t.indices[j], t.values[j]);
  return out;
}

TEST(ReplicaPull, SendsTheLargestChangesAndKeepsTheRestInTheServersCopy) {
  const std::vector<float> w = {0.5f, -2, 0.25f, 0, 1, 3};
  std::vector<float> held = {0, 0, 0, 0, 1, 1};
  // k = max(1, ceil(0.25 · 4)) = 1 of the first tensor; the second has one change.
  const transport::ModelDelta delta =
      replica_pull(7, kSizes, w, 12, held, 10, ReplicaPullOptions{0.25, 1});
  EXPECT_EQ(delta.model_id, 7u);
  EXPECT_EQ(delta.base_version, 10u);
  EXPECT_EQ(delta.version, 12u);
  ASSERT_EQ(delta.tensors.size(), 2u);
  EXPECT_EQ(delta.tensors[0].tensor, 0u);
  EXPECT_EQ(entries(delta.tensors[0]), (std::vector<std::pair<std::uint32_t, float>>{{1, -2}}));
  EXPECT_EQ(entries(delta.tensors[1]), (std::vector<std::pair<std::uint32_t, float>>{{1, 3}}));
  // What is kept: the server's record of the worker's copy after it applies the delta.
  EXPECT_EQ(held, (std::vector<float>{0, -2, 0, 0, 1, 3}));
  EXPECT_EQ(delta.digest, transport::parameter_digest(held));
  // Nothing new in W: the next pulls send what the first left out, largest first.
  auto next = replica_pull(7, kSizes, w, 12, held, 12, ReplicaPullOptions{0.25, 1});
  ASSERT_EQ(next.tensors.size(), 1u);
  EXPECT_EQ(entries(next.tensors[0]), (std::vector<std::pair<std::uint32_t, float>>{{0, 0.5f}}));
  next = replica_pull(7, kSizes, w, 12, held, 12, ReplicaPullOptions{0.25, 1});
  EXPECT_EQ(entries(next.tensors[0]), (std::vector<std::pair<std::uint32_t, float>>{{2, 0.25f}}));
  EXPECT_EQ(held, w);
  next = replica_pull(7, kSizes, w, 12, held, 12, ReplicaPullOptions{0.25, 1});
  EXPECT_TRUE(next.tensors.empty());  // the copy is exact: nothing to send
}

// held_since: per entry, the version at which the worker's value was last the model's. An
// entry sent, or equal to the model's, is the pull's; one left out keeps its version.
TEST(ReplicaPull, KeepsTheVersionEachEntryOfTheCopyComesFrom) {
  std::vector<float> held = {0, 0, 0, 0, 1, 1};
  std::vector<std::uint64_t> since(6, 10);
  std::vector<float> w = {0.5f, -2, 0.25f, 0, 1, 3};
  replica_pull(7, kSizes, w, 12, held, 10, ReplicaPullOptions{0.25, 1}, since);
  // Sent: entries 1 and 5; unchanged: 3 and 4; left out: 0 and 2.
  EXPECT_EQ(since, (std::vector<std::uint64_t>{10, 12, 10, 12, 12, 12}));
  w[3] = 7;  // version 15 changes entry 3 by most: it goes out, 0 and 2 wait again
  replica_pull(7, kSizes, w, 15, held, 12, ReplicaPullOptions{0.25, 1}, since);
  EXPECT_EQ(since, (std::vector<std::uint64_t>{10, 15, 10, 15, 15, 15}));
  replica_pull(7, kSizes, w, 16, held, 15, ReplicaPullOptions{0.25, 1}, since);
  EXPECT_EQ(since, (std::vector<std::uint64_t>{16, 16, 10, 16, 16, 16}));
  std::vector<std::uint64_t> short_record(5);
  EXPECT_THROW(replica_pull(7, kSizes, w, 17, held, 16, ReplicaPullOptions{0.25, 1}, short_record),
               std::invalid_argument);
  EXPECT_THROW(server::check_replica_pull_options({0, 32, true}), std::invalid_argument);
  EXPECT_NO_THROW(server::check_replica_pull_options({0.5, 32, true}));
}

TEST(ReplicaPull, EqualChangesGoByIndexAndSmallTensorsGetTheMinimum) {
  std::vector<float> held(6, 0);
  const std::vector<float> w = {1, -1, 1, -1, 2, -2};
  // min_entries 3: 3 of the first tensor (the lowest indices of four equal changes), the
  // whole of the second (smaller than the minimum).
  const auto delta = replica_pull(7, kSizes, w, 1, held, 0, ReplicaPullOptions{0.01, 3});
  EXPECT_EQ(held, (std::vector<float>{1, -1, 1, 0, 2, -2}));
  ASSERT_EQ(delta.tensors.size(), 2u);
  EXPECT_EQ(delta.tensors[0].indices, (std::vector<std::uint32_t>{0, 1, 2}));
}

TEST(ReplicaPull, RefusesSpansThatDoNotFitTheLayoutAndBadOptions) {
  std::vector<float> held(5, 0);
  EXPECT_THROW(replica_pull(7, kSizes, std::vector<float>(6), 1, held, 0, {0.5, 1}),
               std::invalid_argument);
  EXPECT_THROW(server::check_replica_pull_options({1.5, 1}), std::invalid_argument);
  EXPECT_THROW(server::check_replica_pull_options({-0.1, 1}), std::invalid_argument);
  EXPECT_THROW(server::check_replica_pull_options({0.1, 0}), std::invalid_argument);
  EXPECT_NO_THROW(server::check_replica_pull_options({0, 0}));  // exact pulls
}

// The worker side: a ModelReplica that applies the encoded pulls holds the server's record
// of its copy bit for bit (the digest checks out), and once W stops moving, later pulls
// bring it to W exactly: what a pull leaves out is delayed, never lost.
TEST(ReplicaPull, TheWorkersReplicaIsTheServersRecordAndCatchesUpWithTheModel) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const std::vector<std::uint32_t> sizes = {300, 20};
  std::vector<float> w(320);
  for (float& v : w) v = normal(rng);
  std::vector<float> held = w;  // the first pull is dense
  runtime::ModelReplica replica(7, sizes);
  ASSERT_EQ(replica.take(transport::encode_dense_model(7, 0, sizes, w).value()),
            runtime::ModelReplica::PullOutcome::kDense);
  const ReplicaPullOptions options{0.02, 2};  // 6 of 300, 2 of 20 per pull
  std::uint64_t held_version = 0;
  for (std::uint64_t version = 1; version <= 40; ++version) {
    for (int n = 0; n < 30; ++n) w[rng() % w.size()] += normal(rng);  // an update
    const auto delta = replica_pull(7, sizes, w, version, held, held_version, options);
    // The large tensor always has more than 6 changes waiting; the small one at most 2 sent.
    ASSERT_FALSE(delta.tensors.empty());
    EXPECT_EQ(delta.tensors[0].tensor, 0u);
    EXPECT_EQ(delta.tensors[0].indices.size(), 6u);
    if (delta.tensors.size() > 1) {
      EXPECT_LE(delta.tensors[1].indices.size(), 2u);
    }
    held_version = version;
    ASSERT_EQ(replica.take(transport::encode_model_delta(delta).value()),
              runtime::ModelReplica::PullOutcome::kDelta)
        << replica.mismatch();
    ASSERT_EQ(std::memcmp(replica.parameters().data(), held.data(), held.size() * sizeof(float)), 0);
    EXPECT_EQ(replica.version(), version);
  }
  EXPECT_NE(held, w);  // 30 changes per version against at most 8 sent: the copy lags
  for (int pull = 0; pull < 100 && held != w; ++pull) {
    const auto delta = replica_pull(7, sizes, w, 40, held, 40, options);
    ASSERT_EQ(replica.take(transport::encode_model_delta(delta).value()),
              runtime::ModelReplica::PullOutcome::kDelta);
  }
  EXPECT_EQ(held, w);
  EXPECT_EQ(std::memcmp(replica.parameters().data(), w.data(), w.size() * sizeof(float)), 0);
}

// fp16 values (ReplicaPullOptions::values): the server's record holds what the worker
// really holds, the model's value rounded to fp16; the worker that decodes the pull (as a
// reader that asked for fp16) holds that record bit for bit, the digest says so, and the
// rounding error stays in W − R: once W moves past the rounding, the entry goes out again,
// and a copy left to catch up ends at the model rounded to fp16, after which pulls are
// empty.
TEST(ReplicaPull, Fp16ValuesKeepTheRoundedCopyAndSendTheRoundingErrorLater) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const std::vector<std::uint32_t> sizes = {300, 20};
  std::vector<float> w(320);
  for (float& v : w) v = 0.1f * normal(rng);
  std::vector<float> held = w;  // the first pull is dense, fp32
  std::vector<float> worker = w;
  transport::DecodeLimits fp16_reader;
  fp16_reader.accept_fp16_delta_values = true;
  ReplicaPullOptions options{0.02, 2};
  options.values = transport::ValueEncoding::kFp16;
  ASSERT_NO_THROW(server::check_replica_pull_options(options));
  std::uint64_t held_version = 0;
  std::size_t fp16_bytes = 0, fp32_bytes = 0;
  for (std::uint64_t version = 1; version <= 40; ++version) {
    for (int n = 0; n < 30; ++n) w[rng() % w.size()] += 0.01f * normal(rng);
    std::vector<float> held_fp32 = held;  // the same pull in fp32, for its size
    const auto as_fp32 = replica_pull(7, sizes, w, version, held_fp32, held_version, {0.02, 2});
    const auto delta = replica_pull(7, sizes, w, version, held, held_version, options);
    EXPECT_EQ(delta.values, transport::ValueEncoding::kFp16);
    for (const auto& t : delta.tensors)
      for (const float v : t.values)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(v), std::bit_cast<std::uint32_t>(transport::round_to_fp16(v)));
    held_version = version;
    const auto bytes = transport::encode_model_delta(delta).value();
    fp16_bytes += bytes.size();
    // 2 bytes a value instead of 4; the indices and headers stay.
    transport::ModelDelta same_in_fp32 = delta;
    same_in_fp32.values = transport::ValueEncoding::kFp32;
    std::size_t entries = 0;
    for (const auto& t : delta.tensors) entries += t.indices.size();
    EXPECT_EQ(bytes.size() + 2 * entries, transport::encode_model_delta(same_in_fp32).value().size());
    fp32_bytes += transport::encode_model_delta(as_fp32).value().size();
    EXPECT_FALSE(transport::decode_model_delta(bytes, {7, sizes}).ok());  // not asked for
    const auto decoded = transport::decode_model_delta(bytes, {7, sizes}, fp16_reader);
    ASSERT_TRUE(decoded.ok()) << decoded.error().message;
    ASSERT_TRUE(transport::apply_model_delta(decoded.value(), sizes, worker));
    ASSERT_EQ(transport::parameter_digest(worker), decoded.value().digest);
    ASSERT_EQ(std::memcmp(worker.data(), held.data(), held.size() * sizeof(float)), 0);
  }
  EXPECT_LT(fp16_bytes, fp32_bytes);  // than the same pulls in fp32
  // Left to catch up, the copy ends at the rounded model: an entry whose rounded value is
  // the worker's is not sent, though W differs from it.
  for (int pull = 0; pull < 400; ++pull) {
    const auto delta = replica_pull(7, sizes, w, 40, held, 40, options);
    if (delta.tensors.empty()) break;
    ASSERT_TRUE(transport::apply_model_delta(delta, sizes, worker));
  }
  EXPECT_TRUE(replica_pull(7, sizes, w, 40, held, 40, options).tensors.empty());
  std::size_t rounded_away = 0;
  for (std::size_t j = 0; j < w.size(); ++j) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(held[j]), std::bit_cast<std::uint32_t>(transport::round_to_fp16(w[j])));
    rounded_away += held[j] != w[j];
  }
  EXPECT_GT(rounded_away, 0u);  // the copy is the rounded model, not the model
  // The rounding error is sent once it shows: nudge an entry by one fp16 step.
  const std::size_t i = 17;
  const float step = std::ldexp(1.0f, std::ilogb(held[i]) - 10);
  w[i] = held[i] + 1.01f * step;
  const auto nudged = replica_pull(7, sizes, w, 41, held, 40, options);
  ASSERT_EQ(nudged.tensors.size(), 1u);
  EXPECT_EQ(nudged.tensors[0].indices, (std::vector<std::uint32_t>{static_cast<std::uint32_t>(i)}));
  EXPECT_EQ(held[i], transport::round_to_fp16(w[i]));
}

// The exact default stays: fp32 pulls send the model's values as they are, and a model
// beyond fp16's range is pulled in fp32 even when fp16 was asked for (never clamped).
TEST(ReplicaPull, Fp32IsTheDefaultAndAModelBeyondFp16GoesInFp32) {
  EXPECT_EQ(ReplicaPullOptions{}.values, transport::ValueEncoding::kFp32);
  const std::vector<float> w = {0.1f, 70000.0f, 0.3f, 0, 1, 3};
  std::vector<float> held(6, 0);
  ReplicaPullOptions options{1, 1};
  options.values = transport::ValueEncoding::kFp16;
  const auto delta = replica_pull(7, kSizes, w, 3, held, 2, options);
  EXPECT_EQ(delta.values, transport::ValueEncoding::kFp32);
  EXPECT_EQ(held, w);
  EXPECT_TRUE(transport::encode_model_delta(delta).ok());
  ReplicaPullOptions bad = options;
  bad.fraction = 0;
  EXPECT_THROW(server::check_replica_pull_options(bad), std::invalid_argument);
  bad = options;
  bad.values = transport::ValueEncoding::kSignScale;
  EXPECT_THROW(server::check_replica_pull_options(bad), std::invalid_argument);
}

// fp16 increments (ReplicaPullOptions::values kFp16Increment, ours): the pull sends
// half(W − R) and the worker adds it; the server's record takes the same float addition, so
// over many pulls the worker's ModelReplica (which asked for increments) is the record bit for
// bit and its digest checks out. What rounding leaves stays in W − R and goes out later: a copy
// left to catch up ends within a float step of the model, not within an fp16 step of it as with
// fp16 values. A replica that did not ask refuses the pull.
TEST(ReplicaPull, Fp16IncrementsKeepTheCopyBitExactAndCloseOnTheModel) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  const std::vector<std::uint32_t> sizes = {300, 20};
  std::vector<float> w(320);
  for (float& v : w) v = 0.1f * normal(rng);
  std::vector<float> held = w;  // the first pull is dense (fp32)
  std::vector<float> held_as_values = w;  // the same pulls with fp16 values, for comparison
  runtime::ModelReplica replica(7, sizes);
  replica.accept_fp16_increments(true);
  runtime::ModelReplica did_not_ask(7, sizes);
  for (runtime::ModelReplica* r : {&replica, &did_not_ask})
    ASSERT_EQ(r->take(transport::encode_dense_model(7, 0, sizes, w).value()),
              runtime::ModelReplica::PullOutcome::kDense);
  ReplicaPullOptions options{0.02, 2};
  options.values = transport::ValueEncoding::kFp16Increment;
  ASSERT_NO_THROW(server::check_replica_pull_options(options));
  ReplicaPullOptions as_values = options;
  as_values.values = transport::ValueEncoding::kFp16;
  std::uint64_t held_version = 0;
  for (std::uint64_t version = 1; version <= 200; ++version) {
    for (int n = 0; n < 30; ++n) w[rng() % w.size()] += 0.01f * normal(rng);
    replica_pull(7, sizes, w, version, held_as_values, held_version, as_values);
    const auto delta = replica_pull(7, sizes, w, version, held, held_version, options);
    held_version = version;
    EXPECT_EQ(delta.values, transport::ValueEncoding::kFp16Increment);
    ASSERT_FALSE(delta.tensors.empty());
    EXPECT_EQ(delta.tensors[0].indices.size(), 6u);  // as many entries as an fp32 pull
    const auto bytes = transport::encode_model_delta(delta).value();
    if (version == 1) {
      EXPECT_EQ(did_not_ask.take(bytes), runtime::ModelReplica::PullOutcome::kMismatch);
    }
    ASSERT_EQ(replica.take(bytes), runtime::ModelReplica::PullOutcome::kDelta) << replica.mismatch();
    ASSERT_EQ(std::memcmp(replica.parameters().data(), held.data(), held.size() * sizeof(float)), 0)
        << "version " << version;
  }
  // Left to catch up: pulls until none moves the copy, which then is within a float step of
  // W (or below fp16's smallest increment, 2^-24).
  int pulls = 0;
  for (; pulls < 2000; ++pulls) {
    const auto delta = replica_pull(7, sizes, w, 200, held, 200, options);
    if (delta.tensors.empty()) break;
    ASSERT_EQ(replica.take(transport::encode_model_delta(delta).value()),
              runtime::ModelReplica::PullOutcome::kDelta);
  }
  ASSERT_LT(pulls, 2000);
  for (int pull = 0; pull < 2000; ++pull)
    if (replica_pull(7, sizes, w, 200, held_as_values, 200, as_values).tensors.empty()) break;
  float increment_error = 0, value_error = 0;
  for (std::size_t j = 0; j < w.size(); ++j) {
    const float step = std::nextafter(std::fabs(held[j]), INFINITY) - std::fabs(held[j]);
    ASSERT_LE(std::fabs(w[j] - held[j]), std::max(step, std::ldexp(1.0f, -24))) << j;
    increment_error = std::max(increment_error, std::fabs(w[j] - held[j]));
    value_error = std::max(value_error, std::fabs(w[j] - held_as_values[j]));
  }
  // fp16 values leave up to half an fp16 step (|W|·2^-11) in the copy for good.
  EXPECT_LT(increment_error * 100, value_error);
  EXPECT_EQ(std::memcmp(replica.parameters().data(), held.data(), held.size() * sizeof(float)), 0);
  // A same-version delta taken twice (the server's repeat of a request, server/README.md
  // "Cheap pull"): the increments are added once.
  w[3] += 0.5f;
  const auto same_version = transport::encode_model_delta(replica_pull(7, sizes, w, 200, held, 200, options)).value();
  for (int twice = 0; twice < 2; ++twice) {
    ASSERT_EQ(replica.take(same_version), runtime::ModelReplica::PullOutcome::kDelta) << replica.mismatch();
    ASSERT_EQ(std::memcmp(replica.parameters().data(), held.data(), held.size() * sizeof(float)), 0);
  }
}

// The fp32 path is unchanged by the other encodings: the same pulls from the same records
// give the model's values, bit for bit, and a record equal to the model (what the simulator's
// exact-path test, Simulator.TheCheapPullIsExactAtFractionOneAndSendsFarLessBelow, relies on).
TEST(ReplicaPull, Fp32PullsSendTheModelsValuesBitForBit) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  const std::vector<std::uint32_t> sizes = {300, 20};
  std::vector<float> w(320);
  for (float& v : w) v = normal(rng);
  std::vector<float> held = w;
  for (std::uint64_t version = 1; version <= 20; ++version) {
    for (int n = 0; n < 30; ++n) w[rng() % w.size()] += normal(rng);
    const auto delta = replica_pull(7, sizes, w, version, held, version - 1, {0.02, 2});
    EXPECT_EQ(delta.values, transport::ValueEncoding::kFp32);
    std::size_t offset = 0;
    for (const auto& t : delta.tensors) {
      offset = t.tensor == 0 ? 0 : 300;
      for (std::size_t j = 0; j < t.indices.size(); ++j) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(t.values[j]), std::bit_cast<std::uint32_t>(w[offset + t.indices[j]]));
        ASSERT_EQ(std::bit_cast<std::uint32_t>(held[offset + t.indices[j]]), std::bit_cast<std::uint32_t>(w[offset + t.indices[j]]));
      }
    }
  }
}

}  // namespace
