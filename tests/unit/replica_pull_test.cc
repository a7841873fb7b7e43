// The cheap pull (server/replica_pull.h): per worker, the server sends the largest changes
// since the copy that worker holds and keeps the rest; the worker's ModelReplica applies
// the delta and checks its digest as for an exact pull; what is left out arrives later.
#include <gtest/gtest.h>

#include <algorithm>
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

// Selection rules (ReplicaPullOptions::selection, ours). The default is the rule every run
// so far used: checked here against a plain reference (sort every differing entry by |W − R|,
// then index) over pulls of a moving model, deltas, records and versions bit for bit.
TEST(ReplicaPullSelection, TheDefaultIsThePlainLargestChangeRuleBitForBit) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  const std::vector<std::uint32_t> sizes = {300, 20, 7};
  std::vector<float> w(327);
  for (float& v : w) v = normal(rng);
  std::vector<float> held = w, reference = w;
  std::vector<std::uint64_t> since(w.size(), 0), reference_since(w.size(), 0);
  const ReplicaPullOptions options{0.03, 8};  // 9 of 300, 8 of 20, the 7 whole
  for (std::uint64_t version = 1; version <= 30; ++version) {
    for (int n = 0; n < 40; ++n) w[rng() % w.size()] += normal(rng);
    if (version % 5 == 0) {  // two equal changes, for the order of ties
      const std::size_t i = rng() % 300, j = rng() % 300;
      held[i] = reference[i] = held[j] = reference[j] = 0;
      w[i] = 1.25f;
      w[j] = -1.25f;
    }
    const auto delta = replica_pull(7, sizes, w, version, held, version - 1, options, since);
    // The reference: per tensor, every entry whose bits differ, ordered by (|W − R| desc,
    // index asc), the first max(min_entries, ⌈f·n⌉) of them.
    transport::ModelDelta expected;
    std::size_t offset = 0;
    for (std::uint32_t t = 0; t < sizes.size(); ++t) {
      std::vector<std::uint32_t> differ;
      for (std::uint32_t i = 0; i < sizes[t]; ++i) {
        if (std::bit_cast<std::uint32_t>(w[offset + i]) != std::bit_cast<std::uint32_t>(reference[offset + i]))
          differ.push_back(i);
        else
          reference_since[offset + i] = version;
      }
      std::stable_sort(differ.begin(), differ.end(), [&](std::uint32_t a, std::uint32_t b) {
        return std::fabs(w[offset + a] - reference[offset + a]) > std::fabs(w[offset + b] - reference[offset + b]);
      });
      const std::size_t budget = std::max<std::size_t>(8, static_cast<std::size_t>(std::ceil(0.03 * sizes[t])));
      if (differ.size() > budget) differ.resize(budget);
      std::sort(differ.begin(), differ.end());
      if (differ.empty()) {
        offset += sizes[t];
        continue;
      }
      transport::SparseTensor sent{t, sizes[t], differ, {}};
      for (const std::uint32_t i : differ) {
        reference[offset + i] = w[offset + i];
        reference_since[offset + i] = version;
        sent.values.push_back(w[offset + i]);
      }
      expected.tensors.push_back(sent);
      offset += sizes[t];
    }
    ASSERT_EQ(delta.tensors.size(), expected.tensors.size()) << "version " << version;
    for (std::size_t k = 0; k < delta.tensors.size(); ++k) {
      EXPECT_EQ(delta.tensors[k].tensor, expected.tensors[k].tensor);
      EXPECT_EQ(delta.tensors[k].indices, expected.tensors[k].indices) << "version " << version;
      EXPECT_EQ(delta.tensors[k].values, expected.tensors[k].values);
    }
    ASSERT_EQ(std::memcmp(held.data(), reference.data(), held.size() * sizeof(float)), 0);
    ASSERT_EQ(since, reference_since);
    EXPECT_EQ(delta.digest, transport::parameter_digest(reference));
  }
}

TEST(ReplicaPullSelection, AgeWeightedSendsAnEntryLeftOutLongBeforeALargerFreshOne) {
  // One tensor of 4, one entry per pull. Entry 0 is 1.0 off since version 0, entry 1 is 1.5
  // off since version 90; at version 100 with τ = 10: 1·(1 + 100/10) = 11 against
  // 1.5·(1 + 10/10) = 3.
  const std::vector<std::uint32_t> sizes = {4};
  const std::vector<float> w = {1, 1.5f, 0, 0};
  ReplicaPullOptions age{0.25, 1};
  age.selection = ReplicaPullOptions::Selection::kAgeWeighted;
  age.age_versions = 10;
  std::vector<float> held = {0, 0, 0, 0};
  std::vector<std::uint64_t> since = {0, 90, 50, 50};
  auto delta = replica_pull(7, sizes, w, 100, held, 90, age, since);
  EXPECT_EQ(entries(delta.tensors.at(0)), (std::vector<std::pair<std::uint32_t, float>>{{0, 1}}));
  EXPECT_EQ(since, (std::vector<std::uint64_t>{100, 90, 100, 100}));
  // The default sends the larger change first.
  held = {0, 0, 0, 0};
  since = {0, 90, 50, 50};
  delta = replica_pull(7, sizes, w, 100, held, 90, {0.25, 1}, since);
  EXPECT_EQ(entries(delta.tensors.at(0)), (std::vector<std::pair<std::uint32_t, float>>{{1, 1.5f}}));
  // Equal ages: the larger change; equal scores: the lower index.
  held = {0, 0, 0, 0};
  since = {40, 40, 40, 40};
  delta = replica_pull(7, sizes, std::vector<float>{1, 1.5f, 1.5f, 0}, 100, held, 90, age, since);
  EXPECT_EQ(delta.tensors.at(0).indices, (std::vector<std::uint32_t>{1}));
  // Without the entries' versions there is no age to weigh.
  EXPECT_THROW(replica_pull(7, sizes, w, 100, held, 90, age), std::invalid_argument);
}

TEST(ReplicaPullSelection, GlobalPoolsTheBudgetsByChangeRelativeToEachTensorsScale) {
  // Tensor 0 holds values of 10, tensor 1 values of 0.1, tensor 2 (2 entries) is covered by
  // the minimum. Budgets: max(2, ⌈0.25·8⌉) = 2 for tensors 0 and 1, pooled to 4; tensor 2 whole.
  const std::vector<std::uint32_t> sizes = {8, 8, 2};
  std::vector<float> w(18);
  std::fill(w.begin(), w.begin() + 8, 10.0f);
  std::fill(w.begin() + 8, w.begin() + 16, 0.1f);
  w[16] = 5;
  w[17] = 6;
  std::vector<float> held = w;
  // Tensor 0: changes of 1.0 and 0.9 (0.1 and 0.09 of its RMS); tensor 1: 0.05, 0.04,
  // 0.03 (0.5, 0.4, 0.3 of its RMS); tensor 2: both entries.
  held[0] -= 1.0f;
  held[1] -= 0.9f;
  held[8] -= 0.05f;
  held[9] -= 0.04f;
  held[10] -= 0.03f;
  held[16] = 0;
  held[17] = 0;
  ReplicaPullOptions global{0.25, 2};
  global.selection = ReplicaPullOptions::Selection::kGlobalScaled;
  std::vector<float> copy = held;
  auto delta = replica_pull(7, sizes, w, 3, copy, 2, global);
  // The pool of 4: tensor 1's three, then tensor 0's largest relative change.
  ASSERT_EQ(delta.tensors.size(), 3u);
  EXPECT_EQ(delta.tensors[0].indices, (std::vector<std::uint32_t>{0}));
  EXPECT_EQ(delta.tensors[1].indices, (std::vector<std::uint32_t>{0, 1, 2}));
  EXPECT_EQ(delta.tensors[2].indices, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(copy[1], held[1]);  // left out
  // Unscaled (global-raw): the pool goes to the largest |W − R|, two of each tensor here.
  copy = held;
  global.selection = ReplicaPullOptions::Selection::kGlobalLargest;
  delta = replica_pull(7, sizes, w, 3, copy, 2, global);
  ASSERT_EQ(delta.tensors.size(), 3u);
  EXPECT_EQ(delta.tensors[0].indices, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(delta.tensors[1].indices, (std::vector<std::uint32_t>{0, 1}));
  held[1] = w[1] - 0.01f;  // now below tensor 1's three: the pool takes those and tensor 0's 1.0
  copy = held;
  delta = replica_pull(7, sizes, w, 3, copy, 2, global);
  EXPECT_EQ(delta.tensors[0].indices, (std::vector<std::uint32_t>{0}));
  EXPECT_EQ(delta.tensors[1].indices, (std::vector<std::uint32_t>{0, 1, 2}));
  global.selection = ReplicaPullOptions::Selection::kGlobalScaled;
  // Per tensor (the default), two of each.
  copy = held;
  delta = replica_pull(7, sizes, w, 3, copy, 2, {0.25, 2});
  EXPECT_EQ(delta.tensors[0].indices, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(delta.tensors[1].indices, (std::vector<std::uint32_t>{0, 1}));
  // Equal relative changes across tensors (exact in binary: 1/8 and 0.0625/0.5): the lower
  // index in the model goes first. Budgets of 1 (⌈0.125·8⌉), tensor 2's 1 of its 2 entries
  // pooled too: 3 for 4 equal scores.
  std::vector<float> even(18, 8.0f);
  std::fill(even.begin() + 8, even.begin() + 16, 0.5f);
  copy = even;
  copy[1] -= 1;
  copy[2] -= 1;
  copy[8] -= 0.0625f;
  copy[9] -= 0.0625f;
  global.fraction = 0.125;
  global.min_entries = 1;
  delta = replica_pull(7, sizes, even, 3, copy, 2, global);
  ASSERT_EQ(delta.tensors.size(), 2u);
  EXPECT_EQ(delta.tensors[0].indices, (std::vector<std::uint32_t>{1, 2}));
  EXPECT_EQ(delta.tensors[1].indices, (std::vector<std::uint32_t>{0}));
}

TEST(ReplicaPullSelection, RelativeSendsTheChangeLargestAgainstItsOwnWeight) {
  // RMS of W = {10, 0.01, 1, 1} is about 5.05, ε about 0.505: entry 0 moved by 1 scores
  // 1/10.5, entry 1 moved by 0.5 scores 0.5/0.515; the default sends entry 0.
  const std::vector<std::uint32_t> sizes = {4};
  const std::vector<float> w = {10, 0.01f, 1, 1};
  ReplicaPullOptions relative{0.25, 1};
  relative.selection = ReplicaPullOptions::Selection::kRelativeChange;
  std::vector<float> held = {9, -0.49f, 1, 1};
  auto delta = replica_pull(7, sizes, w, 1, held, 0, relative);
  EXPECT_EQ(delta.tensors.at(0).indices, (std::vector<std::uint32_t>{1}));
  held = {9, -0.49f, 1, 1};
  delta = replica_pull(7, sizes, w, 1, held, 0, {0.25, 1});
  EXPECT_EQ(delta.tensors.at(0).indices, (std::vector<std::uint32_t>{0}));
  // An all-zero tensor has no scale: ε is FLT_MIN, and the changes still go by size.
  std::vector<float> zeros = {1, 2, 0, 0};
  delta = replica_pull(7, sizes, std::vector<float>(4, 0), 1, zeros, 0, relative);
  EXPECT_EQ(delta.tensors.at(0).indices, (std::vector<std::uint32_t>{1}));
}

// Nothing lost, whatever the rule: the worker's ModelReplica holds the server's record bit
// for bit, and once W stops moving later pulls bring it to W exactly.
TEST(ReplicaPullSelection, EveryRuleDelaysButNeverLosesAChange) {
  using Selection = ReplicaPullOptions::Selection;
  for (const Selection selection : {Selection::kLargestChange, Selection::kAgeWeighted,
                                    Selection::kGlobalScaled, Selection::kRelativeChange,
                                    Selection::kGlobalLargest}) {
    SCOPED_TRACE(server::pull_selection_name(selection));
    std::mt19937 rng(31);
    std::normal_distribution<float> normal;
    const std::vector<std::uint32_t> sizes = {300, 64, 20};
    std::vector<float> w(384);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = normal(rng) * (i < 300 ? 0.05f : 1.0f);
    std::vector<float> held = w;
    std::vector<std::uint64_t> since(w.size(), 0);
    runtime::ModelReplica replica(7, sizes);
    ASSERT_EQ(replica.take(transport::encode_dense_model(7, 0, sizes, w).value()),
              runtime::ModelReplica::PullOutcome::kDense);
    ReplicaPullOptions options{0.02, 3};
    options.selection = selection;
    options.age_versions = 5;
    std::uint64_t version = 0;
    for (; version < 40; ++version) {
      for (int n = 0; n < 30; ++n) w[rng() % w.size()] += normal(rng) * 0.01f;
      const auto delta = replica_pull(7, sizes, w, version + 1, held, version, options, since);
      std::size_t sent = 0;
      for (const auto& t : delta.tensors) sent += t.indices.size();
      EXPECT_LE(sent, 6u + 3 + 3);  // the budgets: 6 of 300, 3 of 64, 3 of 20
      ASSERT_EQ(replica.take(transport::encode_model_delta(delta).value()),
                runtime::ModelReplica::PullOutcome::kDelta)
          << replica.mismatch();
    }
    EXPECT_NE(held, w);
    for (int pull = 0; pull < 200 && held != w; ++pull, ++version) {
      const auto delta = replica_pull(7, sizes, w, 40, held, 40, options, since);
      ASSERT_EQ(replica.take(transport::encode_model_delta(delta).value()),
                runtime::ModelReplica::PullOutcome::kDelta);
    }
    EXPECT_EQ(held, w);
    EXPECT_EQ(std::memcmp(replica.parameters().data(), w.data(), w.size() * sizeof(float)), 0);
    EXPECT_EQ(since, std::vector<std::uint64_t>(w.size(), 40));
  }
}

TEST(ReplicaPullSelection, NamesAndOptionsAreChecked) {
  using Selection = ReplicaPullOptions::Selection;
  for (const Selection selection : {Selection::kLargestChange, Selection::kAgeWeighted,
                                    Selection::kGlobalScaled, Selection::kRelativeChange,
                                    Selection::kGlobalLargest})
    EXPECT_EQ(server::parse_pull_selection(server::pull_selection_name(selection)), selection);
  try {
    server::parse_pull_selection("oldest");
    ADD_FAILURE() << "an unknown rule was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'oldest'"), std::string::npos) << e.what();
  }
  ReplicaPullOptions options;  // exact pulls
  options.selection = Selection::kGlobalScaled;
  EXPECT_THROW(server::check_replica_pull_options(options), std::invalid_argument);
  options.fraction = 0.01;
  EXPECT_NO_THROW(server::check_replica_pull_options(options));
  options.age_versions = 0;
  EXPECT_THROW(server::check_replica_pull_options(options), std::invalid_argument);
}

}  // namespace
