// Parameter store: σ_i and the applied parameters against a brute-force reference that keeps
// the whole history, over random update histories (random delays, overlapping indices,
// dense updates mixed in), for every staleness rule (tests/support/staleness_rules.h:
// σ and Zhang et al.'s delay); every refusal leaves the store untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "server/parameter_store.h"
#include "tests/support/paper_cnn_tensor_sizes.h"
#include "tests/support/staleness_rules.h"

using namespace edgetrain::server;
using edgetrain::transport::SparseTensor;
using edgetrain::transport::SparseUpdate;

namespace {

constexpr std::uint64_t kModel = 99;

// Keeps every update's touched flat indices and applies the rule literally.
class ReferenceStore {
 public:
  ReferenceStore(std::vector<std::uint32_t> sizes, std::vector<float> params,
                 ParameterStoreOptions options)
      : sizes_(std::move(sizes)), params_(std::move(params)), options_(options) {
    std::size_t offset = 0;
    for (auto n : sizes_) {
      offsets_.push_back(offset);
      offset += n;
    }
  }
  // Returns the divisor per sent entry, in the update's order. `entry_versions` (per flat
  // index; empty: none): each entry's delay is t − min(h_i, t_fetch), at most D.
  std::vector<std::uint32_t> apply(const SparseUpdate& u,
                                   const std::vector<std::uint64_t>& entry_versions = {}) {
    std::vector<std::uint32_t> divisors;
    std::vector<bool> touched(params_.size(), false);
    // The schedule, literally: one multiplication by the factor per milestone reached by the
    // version this update produces.
    float learning_rate = options_.learning_rate;
    for (std::uint64_t milestone : options_.lr_schedule.decay_at)
      if (milestone <= history_.size() + 1) learning_rate *= options_.lr_schedule.factor;
    for (const auto& t : u.tensors)
      for (std::size_t e = 0; e < t.indices.size(); ++e) {
        const std::size_t i = offsets_[t.tensor] + t.indices[e];
        std::uint64_t delay = history_.size() - u.fetched_version;
        if (!entry_versions.empty())
          delay = std::min<std::uint64_t>(
              history_.size() - std::min(entry_versions[i], u.fetched_version),
              options_.max_staleness);
        std::uint32_t sigma = 0;
        for (std::uint64_t back = 1; back <= delay; ++back)
          sigma += history_[history_.size() - back][i];
        std::uint32_t divisor =
            options_.rule == StalenessRule::kPerParameterSigma ? std::max<std::uint32_t>(1, sigma)
            : options_.rule == StalenessRule::kNone
                ? 1u
                : static_cast<std::uint32_t>(std::max<std::uint64_t>(1, delay));
        // Offline updates, literally: d / min(s', d) rounded up, s' = min(s, C), at least 1.
        const std::uint32_t credited = std::max<std::uint32_t>(
            1, std::min<std::uint32_t>(u.local_steps, options_.offline_step_credit));
        const std::uint32_t by = std::min(credited, divisor);
        divisor = static_cast<std::uint32_t>(std::ceil(static_cast<double>(divisor) / by));
        divisors.push_back(divisor);
        params_[i] -= learning_rate * t.values[e] / static_cast<float>(divisor);
        touched[i] = true;
      }
    history_.push_back(touched);
    return divisors;
  }
  const std::vector<float>& params() const { return params_; }
  std::uint64_t version() const { return history_.size(); }

 private:
  std::vector<std::uint32_t> sizes_;
  std::vector<std::size_t> offsets_;
  std::vector<float> params_;
  ParameterStoreOptions options_;
  std::vector<std::vector<bool>> history_;
};

SparseUpdate random_update(std::mt19937& rng, const std::vector<std::uint32_t>& sizes,
                           std::uint64_t version, std::uint32_t max_staleness) {
  SparseUpdate u;
  u.model_id = kModel;
  const std::uint64_t max_delay = std::min<std::uint64_t>(version, max_staleness);
  u.fetched_version = version - rng() % (max_delay + 1);
  const bool dense = rng() % 6 == 0;
  for (std::uint32_t t = 0; t < sizes.size(); ++t) {
    if (!dense && rng() % 3 == 0) continue;
    SparseTensor tensor{t, sizes[t], {}, {}};
    // Small tensors and few entries make overlaps between updates common.
    for (std::uint32_t i = 0; i < sizes[t]; ++i)
      if (dense || rng() % 3 == 0) {
        tensor.indices.push_back(i);
        tensor.values.push_back(static_cast<float>(static_cast<int>(rng() % 17) - 8) * 0.25f);
      }
    u.tensors.push_back(std::move(tensor));
  }
  std::shuffle(u.tensors.begin(), u.tensors.end(), rng);
  return u;
}

// An update's claimed local steps (offline updates): mostly none, else 0..11, so that a
// credit of 5 meets claims below, at and beyond it.
void draw_local_steps(std::mt19937& rng, SparseUpdate& u) {
  u.local_steps = rng() % 3 == 0 ? static_cast<std::uint16_t>(rng() % 12) : 0;
}

void run_against_reference(ParameterStoreOptions options, std::uint32_t seed, int updates,
                           bool claim_steps = false) {
  std::mt19937 rng(seed);
  const std::vector<std::uint32_t> sizes = {7, 30, 3};
  const std::size_t total = 40;
  std::vector<float> initial(total);
  for (auto& w : initial) w = static_cast<float>(static_cast<int>(rng() % 100)) / 16.0f;
  ParameterStore store(kModel, sizes, initial, options);
  ReferenceStore reference(sizes, initial, options);
  for (int n = 0; n < updates; ++n) {
    SparseUpdate u = random_update(rng, sizes, store.version(), options.max_staleness);
    if (claim_steps) draw_local_steps(rng, u);
    auto result = store.apply(u);
    ASSERT_TRUE(result.applied()) << result.reason;
    auto expected = reference.apply(u);
    ASSERT_EQ(result.version, reference.version());
    ASSERT_EQ(
        std::vector<std::uint32_t>(store.last_divisors().begin(), store.last_divisors().end()),
        expected)
        << "update " << n << " delay " << (reference.version() - 1 - u.fetched_version);
    ASSERT_EQ(std::vector<float>(store.parameters().begin(), store.parameters().end()),
              reference.params())
        << "update " << n;
  }
}

// Every rule of tests/support/staleness_rules.h against the reference's literal reading of
// it, over random histories and several D (σ: the AdaComp paper; delay: Zhang et al.).
class EveryStalenessRule
    : public ::testing::TestWithParam<edgetrain::testing::Variant<StalenessRule>> {};

TEST_P(EveryStalenessRule, MatchesTheBruteForceReferenceOverRandomHistories) {
  // D ≤ 64 counts σ with bit masks, a larger D along chains of touches: both are checked.
  for (std::uint32_t d : {1u, 2u, 5u, 6u, 16u, 63u, 64u, 65u, 100u}) {
    SCOPED_TRACE("D = " + std::to_string(d));
    ParameterStoreOptions options;
    options.rule = GetParam().setting;
    options.max_staleness = d;
    run_against_reference(options, 10 + d, 400);
  }
}

// Per-entry staleness (the cheap pull): each entry's version h_i drawn per update, most at
// the pull's version, some older (beyond D too: counted within D), some newer than the pull
// (a record that moved on: the pull's version bounds it); the store through apply() and
// through reserve() against the reference's literal count.
TEST_P(EveryStalenessRule, PerEntryVersionsMatchTheBruteForceReference) {
  for (std::uint32_t d : {1u, 5u, 16u, 64u, 65u, 100u}) {
    SCOPED_TRACE("D = " + std::to_string(d));
    ParameterStoreOptions options;
    options.rule = GetParam().setting;
    options.max_staleness = d;
    std::mt19937 rng(40 + d);
    const std::vector<std::uint32_t> sizes = {7, 30, 3};
    std::vector<float> initial(40);
    for (auto& w : initial) w = static_cast<float>(static_cast<int>(rng() % 100)) / 16.0f;
    ParameterStore applied(kModel, sizes, initial, options), reserved(kModel, sizes, initial, options);
    ReferenceStore reference(sizes, initial, options);
    int older = 0;  // divisors above the update's own: the case is not vacuous
    for (int n = 0; n < 300; ++n) {
      SparseUpdate u = random_update(rng, sizes, applied.version(), d);
      std::vector<std::uint64_t> versions(40);
      for (auto& h : versions) {
        const std::uint32_t pick = rng() % 8;
        h = pick < 4   ? u.fetched_version
            : pick < 7 ? u.fetched_version - rng() % (std::min<std::uint64_t>(u.fetched_version, 2 * d) + 1)
                       : applied.version();
      }
      auto result = applied.apply(u, ValueCheck::kBound, versions);
      ASSERT_TRUE(result.applied()) << result.reason;
      ASSERT_TRUE(reserved.reserve(u, ValueCheck::kBound, versions).applied());
      ASSERT_TRUE(reserved.apply_reserved().applied());
      const auto own = ReferenceStore(reference).apply(u);  // by the update's delay
      const auto expected = reference.apply(u, versions);
      const std::vector<std::uint32_t> got(applied.last_divisors().begin(),
                                           applied.last_divisors().end());
      ASSERT_EQ(got, expected) << "update " << n;
      ASSERT_EQ(std::vector<std::uint32_t>(reserved.last_divisors().begin(),
                                           reserved.last_divisors().end()),
                expected)
          << "update " << n;
      ASSERT_EQ(std::vector<float>(applied.parameters().begin(), applied.parameters().end()),
                reference.params());
      ASSERT_EQ(std::vector<float>(reserved.parameters().begin(), reserved.parameters().end()),
                reference.params());
      for (std::size_t j = 0; j < got.size(); ++j) older += got[j] > own[j];
    }
    if (options.rule != StalenessRule::kNone && d > 1) {  // D = 1: every divisor is 1
      EXPECT_GT(older, 100);
    }
  }
}

// With every entry's version at the update's t_fetch (what an exact pull records), the
// divisors and the parameters are those of the update's own delay, bit for bit.
TEST_P(EveryStalenessRule, EntryVersionsAtThePullAreTheUpdatesOwnRule) {
  for (std::uint32_t d : {5u, 64u, 100u}) {
    SCOPED_TRACE("D = " + std::to_string(d));
    ParameterStoreOptions options;
    options.rule = GetParam().setting;
    options.max_staleness = d;
    std::mt19937 rng(70 + d);
    const std::vector<std::uint32_t> sizes = {7, 30, 3};
    ParameterStore plain(kModel, sizes, std::vector<float>(40, 1.0f), options);
    ParameterStore per_entry(kModel, sizes, std::vector<float>(40, 1.0f), options);
    for (int n = 0; n < 200; ++n) {
      const SparseUpdate u = random_update(rng, sizes, plain.version(), d);
      const std::vector<std::uint64_t> versions(40, u.fetched_version);
      ASSERT_TRUE(plain.apply(u).applied());
      ASSERT_TRUE(per_entry.apply(u, ValueCheck::kBound, versions).applied());
      ASSERT_TRUE(std::equal(plain.last_divisors().begin(), plain.last_divisors().end(),
                             per_entry.last_divisors().begin(), per_entry.last_divisors().end()));
    }
    ASSERT_EQ(std::memcmp(plain.parameters().data(), per_entry.parameters().data(), 40 * sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(StalenessRules, EveryStalenessRule,
                         ::testing::ValuesIn(edgetrain::testing::staleness_rules()),
                         edgetrain::testing::VariantName());

// The paper CNN's sizes, k = 1% per tensor with half the picks from a hot 5% of each tensor
// (so σ is often well above 1), delays at or near D = 64 a third of the time, a dense update
// now and then, and a restart (restore from the last D updates) every 150 updates: the
// setting in which the σ chains walk their longest. Each update's divisors are checked
// against a brute-force count over the kept history.
TEST(ParameterStore, SigmaMatchesBruteForceAtPaperCnnScale) {
  const std::vector<std::uint32_t>& sizes = edgetrain::testing::kPaperCnnTensorSizes;
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  std::vector<std::size_t> offsets;
  for (std::size_t t = 0, offset = 0; t < sizes.size(); offset += sizes[t++])
    offsets.push_back(offset);
  ParameterStoreOptions options;
  options.max_staleness = 64;
  ParameterStore store(kModel, sizes, std::vector<float>(total, 0.0f), options);
  std::vector<SparseUpdate> applied;
  std::vector<std::vector<bool>> touched_by;  // per applied update, its flat indices
  std::mt19937 rng(64);
  std::uint32_t largest = 0;
  for (int n = 0; n < 450; ++n) {
    if (n > 0 && n % 150 == 0) {
      const std::size_t keep = std::min<std::size_t>(applied.size(), options.max_staleness);
      std::vector<float> parameters(store.parameters().begin(), store.parameters().end());
      store.restore(store.version(), parameters, std::span(applied).subspan(applied.size() - keep));
    }
    SparseUpdate u;
    u.model_id = kModel;
    const std::uint64_t max_delay = std::min<std::uint64_t>(store.version(), options.max_staleness);
    u.fetched_version = store.version() - (rng() % 3 == 0 ? max_delay - rng() % 2 * (max_delay > 0)
                                                          : rng() % (max_delay + 1));
    const bool dense = rng() % 100 == 0;
    for (std::uint32_t t = 0; t < sizes.size(); ++t) {
      SparseTensor tensor{t, sizes[t], {}, {}};
      if (dense) {
        tensor.indices.resize(sizes[t]);
        std::iota(tensor.indices.begin(), tensor.indices.end(), 0u);
      } else {
        const std::uint32_t k = std::max<std::uint32_t>(1, sizes[t] / 100);
        const std::uint32_t hot = std::max<std::uint32_t>(1, sizes[t] / 20);
        for (std::uint32_t j = 0; j < k; ++j)
          tensor.indices.push_back(rng() % 2 ? rng() % hot : rng() % sizes[t]);
        std::sort(tensor.indices.begin(), tensor.indices.end());
        tensor.indices.erase(std::unique(tensor.indices.begin(), tensor.indices.end()),
                             tensor.indices.end());
      }
      tensor.values.assign(tensor.indices.size(), 0.5f);
      u.tensors.push_back(std::move(tensor));
    }
    const std::uint64_t delay = store.version() - u.fetched_version;
    auto result = store.apply(u);
    ASSERT_TRUE(result.applied()) << result.reason;
    std::vector<bool> touched(total, false);
    std::size_t j = 0;
    for (const auto& t : u.tensors)
      for (std::uint32_t i : t.indices) {
        const std::size_t flat = offsets[t.tensor] + i;
        std::uint32_t sigma = 0;
        for (std::uint64_t back = 1; back <= delay; ++back)
          sigma += touched_by[touched_by.size() - back][flat];
        ASSERT_EQ(store.last_divisors()[j], std::max<std::uint32_t>(1, sigma))
            << "update " << n << ", delay " << delay << ", tensor " << t.tensor << ", index " << i;
        largest = std::max(largest, sigma);
        touched[flat] = true;
        ++j;
      }
    touched_by.push_back(std::move(touched));
    applied.push_back(std::move(u));
  }
  EXPECT_GE(largest, 8u);  // the hot regions do pile up
}

TEST(ParameterStore, SigmaIsAtMostTheDelayAndSometimesAboveOne) {
  // Guards the reference test against vacuous histories: σ > 1 must actually occur.
  std::mt19937 rng(3);
  const std::vector<std::uint32_t> sizes = {7, 30, 3};
  ParameterStoreOptions options;
  options.max_staleness = 8;
  ParameterStore store(kModel, sizes, std::vector<float>(40, 0.0f), options);
  std::uint32_t largest = 0;
  for (int n = 0; n < 200; ++n) {
    SparseUpdate u = random_update(rng, sizes, store.version(), options.max_staleness);
    const std::uint64_t delay = store.version() - u.fetched_version;
    ASSERT_TRUE(store.apply(u).applied());
    for (auto divisor : store.last_divisors()) {
      ASSERT_LE(divisor, std::max<std::uint64_t>(1, delay));
      largest = std::max(largest, divisor);
    }
  }
  EXPECT_GE(largest, 4u);
}

TEST(ParameterStore, DenseUpdatesOnly) {
  // Dense ASGD: every update touches everything, so σ_i = delay for all i.
  std::mt19937 rng(8);
  const std::vector<std::uint32_t> sizes = {4, 5};
  ParameterStoreOptions options;
  options.max_staleness = 5;
  ParameterStore store(kModel, sizes, std::vector<float>(9, 1.0f), options);
  ReferenceStore reference(sizes, std::vector<float>(9, 1.0f), options);
  for (int n = 0; n < 100; ++n) {
    SparseUpdate u{
        kModel, 0, store.version() - rng() % (std::min<std::uint64_t>(store.version(), 5) + 1), {}};
    for (std::uint32_t t = 0; t < 2; ++t) {
      SparseTensor tensor{t, sizes[t], {}, {}};
      for (std::uint32_t i = 0; i < sizes[t]; ++i) {
        tensor.indices.push_back(i);
        tensor.values.push_back(0.5f);
      }
      u.tensors.push_back(tensor);
    }
    const std::uint64_t delay = store.version() - u.fetched_version;
    ASSERT_TRUE(store.apply(u).applied());
    auto expected = reference.apply(u);
    ASSERT_EQ(
        std::vector<std::uint32_t>(store.last_divisors().begin(), store.last_divisors().end()),
        expected);
    for (auto divisor : store.last_divisors())
      ASSERT_EQ(divisor, std::max<std::uint64_t>(1, delay));
  }
  EXPECT_EQ(std::vector<float>(store.parameters().begin(), store.parameters().end()),
            reference.params());
}

// Per-entry staleness on a case worked by hand. Versions 1–4 touch {0, 1, 3}, {0}, {0, 2},
// {1, 3}. A worker pulled at 4, but its copy's entries 0, 1, 2, 3 are the model's of
// versions 1, 2, 4, 0 (the cheap pull left them out since then), and it sends all four:
//   σ_0 = updates 2, 3 = 2   σ_1 = update 4 = 1   σ_2 = none = 0   σ_3 = updates 1, 4 = 2,
// divisors max(1, σ) = 2, 1, 1, 2, where the update's own delay (0) divides by 1 everywhere.
TEST(ParameterStore, PerEntrySigmaOnAHandMadeCase) {
  for (std::uint32_t d : {8u, 100u}) {  // bit masks and chains
    SCOPED_TRACE("D = " + std::to_string(d));
    ParameterStoreOptions options;
    options.max_staleness = d;
    ParameterStore store(kModel, {4}, {0, 0, 0, 0}, options);
    for (const std::vector<std::uint32_t>& touched :
         std::vector<std::vector<std::uint32_t>>{{0, 1, 3}, {0}, {0, 2}, {1, 3}})
      ASSERT_TRUE(store
                      .apply({kModel, 0, store.version(),
                              {{0, 4, touched, std::vector<float>(touched.size(), 1.0f)}}})
                      .applied());
    const SparseUpdate all{kModel, 0, 4, {{0, 4, {0, 1, 2, 3}, {1, 1, 1, 1}}}};
    const std::vector<std::uint64_t> held = {1, 2, 4, 0};
    ParameterStore exact = store;
    ASSERT_TRUE(exact.apply(all).applied());
    EXPECT_EQ(std::vector<std::uint32_t>(exact.last_divisors().begin(), exact.last_divisors().end()),
              (std::vector<std::uint32_t>{1, 1, 1, 1}));
    ParameterStore per_entry = store;
    ASSERT_TRUE(per_entry.apply(all, ValueCheck::kBound, held).applied());
    EXPECT_EQ(std::vector<std::uint32_t>(per_entry.last_divisors().begin(),
                                         per_entry.last_divisors().end()),
              (std::vector<std::uint32_t>{2, 1, 1, 2}));
    // W was {-0.3, -0.2, -0.1, -0.2}: entries 0 and 3 move by half a step (lr 0.1 / 2).
    EXPECT_FLOAT_EQ(per_entry.parameters()[0], -0.3f - 0.05f);
    EXPECT_FLOAT_EQ(per_entry.parameters()[3], -0.2f - 0.05f);
    EXPECT_FLOAT_EQ(per_entry.parameters()[2], -0.1f - 0.1f);
    // A record newer than the pull counts from the pull: pulled at 3, entry 1 held since 4
    // counts update 4 (σ 1), not nothing.
    ParameterStore newer = store;
    ASSERT_TRUE(newer.apply({kModel, 0, 3, {{0, 4, {1}, {1}}}}, ValueCheck::kBound,
                            std::vector<std::uint64_t>{3, 4, 3, 3})
                    .applied());
    EXPECT_EQ(newer.last_divisors()[0], 1u);
    ASSERT_TRUE(newer.apply({kModel, 0, 3, {{0, 4, {1}, {1}}}}, ValueCheck::kBound,
                            std::vector<std::uint64_t>{3, 4, 3, 3})
                    .applied());
    EXPECT_EQ(newer.last_divisors()[0], 2u);  // updates 4 and 5 touched entry 1
    EXPECT_THROW(store.apply(all, ValueCheck::kBound, std::vector<std::uint64_t>(3, 0)),
                 std::invalid_argument);
  }
  // D = 2: the history holds the last two versions only, so an older entry counts those:
  // entry 0 (held since 1) σ = update 3 = 1, entry 3 (since 0) σ = update 4 = 1.
  ParameterStoreOptions options;
  options.max_staleness = 2;
  ParameterStore store(kModel, {4}, {0, 0, 0, 0}, options);
  for (const std::vector<std::uint32_t>& touched :
       std::vector<std::vector<std::uint32_t>>{{0, 1, 3}, {0}, {0, 2}, {1, 3}})
    ASSERT_TRUE(store
                    .apply({kModel, 0, store.version(),
                            {{0, 4, touched, std::vector<float>(touched.size(), 1.0f)}}})
                    .applied());
  ASSERT_TRUE(store
                  .apply({kModel, 0, 4, {{0, 4, {0, 3}, {1, 1}}}}, ValueCheck::kBound,
                         std::vector<std::uint64_t>{1, 2, 4, 0})
                  .applied());
  EXPECT_EQ(std::vector<std::uint32_t>(store.last_divisors().begin(), store.last_divisors().end()),
            (std::vector<std::uint32_t>{1, 1}));
}

TEST(ParameterStore, DelayZeroAppliesTheFullStep) {
  ParameterStore store(kModel, {3}, {1.0f, 2.0f, 3.0f}, {});
  SparseUpdate u{kModel, 0, 0, {{0, 3, {1}, {5.0f}}}};
  ASSERT_TRUE(store.apply(u).applied());
  EXPECT_EQ(store.parameters()[1], 2.0f - 0.1f * 5.0f);
  EXPECT_EQ(store.parameters()[0], 1.0f);
  EXPECT_EQ(store.version(), 1u);
}

TEST(ParameterStore, RefusalsChangeNothing) {
  ParameterStoreOptions options;
  options.max_staleness = 2;
  ParameterStore store(kModel, {4, 2}, {1, 2, 3, 4, 5, 6}, options);
  for (int n = 0; n < 3; ++n)
    ASSERT_TRUE(store.apply({kModel, 0, store.version(), {{0, 4, {0}, {1.0f}}}}).applied());
  const std::vector<float> before(store.parameters().begin(), store.parameters().end());
  const std::uint64_t version = store.version();  // 3

  auto expect_refused = [&](const SparseUpdate& u, ApplyStatus status) {
    auto r = store.apply(u);
    EXPECT_EQ(r.status, status) << apply_status_name(r.status) << ": " << r.reason;
    EXPECT_FALSE(r.reason.empty());
    EXPECT_EQ(r.version, version);
    EXPECT_EQ(store.version(), version);
    EXPECT_EQ(std::vector<float>(store.parameters().begin(), store.parameters().end()), before);
  };
  expect_refused({kModel + 1, 0, 3, {{0, 4, {0}, {1.0f}}}}, ApplyStatus::kWrongModel);
  expect_refused({kModel, 0, 0, {{0, 4, {0}, {1.0f}}}}, ApplyStatus::kTooStale);  // delay 3 > D = 2
  expect_refused({kModel, 0, 4, {{0, 4, {0}, {1.0f}}}}, ApplyStatus::kFromTheFuture);
  expect_refused({kModel, 0, 3, {{2, 4, {0}, {1.0f}}}}, ApplyStatus::kMalformed);  // no tensor 2
  expect_refused({kModel, 0, 3, {{1, 4, {0}, {1.0f}}}}, ApplyStatus::kMalformed);  // size
  expect_refused({kModel, 0, 3, {{1, 2, {2}, {1.0f}}}}, ApplyStatus::kMalformed);  // index
  expect_refused({kModel, 0, 3, {{0, 4, {2, 1}, {1.0f, 1.0f}}}}, ApplyStatus::kMalformed);
  expect_refused({kModel, 0, 3, {{0, 4, {1}, {NAN}}}}, ApplyStatus::kMalformed);
  // A valid first tensor followed by a bad one must not be half-applied.
  expect_refused({kModel, 0, 3, {{0, 4, {1}, {1.0f}}, {0, 4, {2}, {1.0f}}}},
                 ApplyStatus::kMalformed);
  // Delay exactly D is accepted.
  EXPECT_TRUE(store.apply({kModel, 0, 1, {{1, 2, {1}, {1.0f}}}}).applied());
}

TEST(ParameterStore, MaxStalenessZeroAcceptsOnlyFreshUpdates) {
  ParameterStoreOptions options;
  options.max_staleness = 0;
  ParameterStore store(kModel, {2}, {0, 0}, options);
  EXPECT_TRUE(store.apply({kModel, 0, 0, {{0, 2, {0, 1}, {1, 1}}}}).applied());
  EXPECT_EQ(store.apply({kModel, 0, 0, {{0, 2, {0}, {1}}}}).status, ApplyStatus::kTooStale);
  EXPECT_TRUE(store.apply({kModel, 0, 1, {{0, 2, {0}, {1}}}}).applied());
  EXPECT_EQ(store.last_divisors()[0], 1u);
}

TEST(ParameterStore, RejectsBadConstruction) {
  EXPECT_THROW(ParameterStore(kModel, {2, 3}, std::vector<float>(4), {}), std::invalid_argument);
  EXPECT_THROW(ParameterStore(kModel, {2, 0}, std::vector<float>(2), {}), std::invalid_argument);
}

}  // namespace

namespace {

TEST(ParameterStore, RestoreWithRecentUpdatesContinuesLikeAnUninterruptedRun) {
  // A restart from a checkpoint at version c plus the last D updates must give the same
  // divisors and parameters afterwards as a store that never stopped.
  std::mt19937 rng(21);
  const std::vector<std::uint32_t> sizes = {7, 30, 3};
  ParameterStoreOptions options;
  options.max_staleness = 5;
  std::vector<float> initial(40, 1.0f);
  ParameterStore uninterrupted(kModel, sizes, initial, options);
  std::vector<SparseUpdate> history;
  for (int n = 0; n < 40; ++n) {
    history.push_back(random_update(rng, sizes, uninterrupted.version(), options.max_staleness));
    ASSERT_TRUE(uninterrupted.apply(history.back()).applied());
  }
  ParameterStore restarted(kModel, sizes, initial, options);
  std::span<const SparseUpdate> recent(history.data() + history.size() - options.max_staleness,
                                       options.max_staleness);
  restarted.restore(uninterrupted.version(), uninterrupted.parameters(), recent);
  ASSERT_EQ(restarted.version(), 40u);
  for (int n = 0; n < 60; ++n) {
    SparseUpdate u = random_update(rng, sizes, uninterrupted.version(), options.max_staleness);
    ASSERT_TRUE(uninterrupted.apply(u).applied());
    ASSERT_TRUE(restarted.apply(u).applied());
    ASSERT_EQ(std::vector<std::uint32_t>(restarted.last_divisors().begin(),
                                         restarted.last_divisors().end()),
              std::vector<std::uint32_t>(uninterrupted.last_divisors().begin(),
                                         uninterrupted.last_divisors().end()));
  }
  EXPECT_EQ(
      std::vector<float>(restarted.parameters().begin(), restarted.parameters().end()),
      std::vector<float>(uninterrupted.parameters().begin(), uninterrupted.parameters().end()));
}

TEST(ParameterStore, AdmissibleAgreesWithApplyAndChangesNothing) {
  ParameterStore store(kModel, {4}, std::vector<float>(4, 0.0f));
  SparseUpdate good{kModel, 0, 0, {SparseTensor{0, 4, {1}, {1.0f}}}};
  SparseUpdate future{kModel, 0, 5, {}};
  EXPECT_TRUE(store.admissible(good).applied());
  EXPECT_EQ(store.admissible(future).status, ApplyStatus::kFromTheFuture);
  EXPECT_EQ(store.version(), 0u);
  EXPECT_EQ(store.parameters()[1], 0.0f);
}

// Group commit's reservations against the literal rule: batches of updates are reserved
// (each checked against the values and history the ones before it leave), applied in order
// or cancelled (the newest, or all: a failed WAL write or sync), and the parameters and
// divisors are those of applying only the surviving updates one by one, bit for bit.
void run_reservations_against_reference(ParameterStoreOptions options, std::uint32_t seed,
                                        int rounds, bool claim_steps = false) {
  std::mt19937 rng(seed);
  const std::vector<std::uint32_t> sizes = {7, 30, 3};
  std::vector<float> initial(40);
  for (auto& w : initial) w = static_cast<float>(static_cast<int>(rng() % 100)) / 16.0f;
  ParameterStore store(kModel, sizes, initial, options);
  ReferenceStore reference(sizes, initial, options);
  for (int round = 0; round < rounds; ++round) {
    std::vector<SparseUpdate> batch;
    const int size = 1 + static_cast<int>(rng() % 6);
    for (int n = 0; n < size; ++n) {
      SparseUpdate u =
          random_update(rng, sizes, store.version() + store.reserved(), options.max_staleness);
      if (claim_steps) draw_local_steps(rng, u);
      auto result = store.reserve(u);
      ASSERT_TRUE(result.applied()) << result.reason;
      ASSERT_EQ(result.version, store.version() + store.reserved());
      batch.push_back(std::move(u));
    }
    const int outcome = static_cast<int>(rng() % 4);
    if (outcome == 0) {  // the sync failed: all of them go
      store.cancel_reserved();
      batch.clear();
    } else if (outcome == 1) {  // the newest one's WAL write failed
      store.cancel_last_reserved();
      batch.pop_back();
    }
    ASSERT_EQ(store.reserved(), batch.size());
    for (const auto& u : batch) {
      auto result = store.apply_reserved();
      auto expected = reference.apply(u);
      ASSERT_EQ(result.version, reference.version());
      ASSERT_EQ(
          std::vector<std::uint32_t>(store.last_divisors().begin(), store.last_divisors().end()),
          expected)
          << "round " << round;
      ASSERT_EQ(std::vector<float>(store.parameters().begin(), store.parameters().end()),
                reference.params())
          << "round " << round;
    }
  }
}

TEST_P(EveryStalenessRule, ReservationsApplyLikeTheReferenceInVersionOrderAndCancelCleanly) {
  for (std::uint32_t d : {1u, 3u, 8u, 64u, 70u}) {
    ParameterStoreOptions options;
    options.learning_rate = 0.5f;
    options.max_staleness = d;
    options.rule = GetParam().setting;
    SCOPED_TRACE("D = " + std::to_string(d));
    run_reservations_against_reference(options, 100 + d, 150);
  }
}

// Offline updates (server/parameter_store.h): updates claiming 0..11 local steps, with the
// credit off (claims ignored: the rule as before) and at 5 (claims beyond it cut to 5),
// through apply() and reserve(), against the reference's literal ⌈d / min(s', d)⌉.
TEST_P(EveryStalenessRule, ClaimedLocalStepsMatchTheReference) {
  for (std::uint32_t credit : {0u, 5u})
    for (std::uint32_t d : {2u, 16u, 64u, 100u}) {
      SCOPED_TRACE("credit " + std::to_string(credit) + ", D = " + std::to_string(d));
      ParameterStoreOptions options;
      options.rule = GetParam().setting;
      options.max_staleness = d;
      options.offline_step_credit = credit;
      run_against_reference(options, 200 + d, 300, true);
      run_reservations_against_reference(options, 300 + d, 80, true);
    }
}

// The learning-rate schedule (step decay): milestones inside the run, through apply() and
// reserve(), with claimed steps too, against the reference's literal lr(t).
TEST_P(EveryStalenessRule, ScheduledLearningRateMatchesTheReference) {
  for (std::uint32_t d : {2u, 64u, 100u}) {
    SCOPED_TRACE("D = " + std::to_string(d));
    ParameterStoreOptions options;
    options.rule = GetParam().setting;
    options.max_staleness = d;
    options.offline_step_credit = 5;
    options.lr_schedule = {{1, 40, 41, 150}, 0.3f};
    run_against_reference(options, 400 + d, 200, true);
    run_reservations_against_reference(options, 500 + d, 60, true);
  }
}

// No schedule is the store as it was: the same bits as a schedule whose first milestone is
// never reached, and a schedule changes nothing before its first milestone and everything it
// touches from there on: the update producing version m is the first with lr · F.
TEST(ParameterStore, AScheduleChangesNothingBeforeItsFirstMilestone) {
  std::mt19937 rng(77);
  const std::vector<std::uint32_t> sizes = {7, 30, 3};
  std::vector<float> initial(40);
  for (auto& w : initial) w = static_cast<float>(static_cast<int>(rng() % 100)) / 16.0f;
  ParameterStoreOptions constant;
  constant.max_staleness = 8;
  ParameterStoreOptions unreached = constant, scheduled = constant;
  unreached.lr_schedule = {{1000}, 0.5f};
  constexpr std::uint64_t kMilestone = 30;
  scheduled.lr_schedule = {{kMilestone}, 0.5f};
  ParameterStore a(kModel, sizes, initial, constant), b(kModel, sizes, initial, unreached),
      c(kModel, sizes, initial, scheduled);
  for (int n = 0; n < 60; ++n) {
    const SparseUpdate u = random_update(rng, sizes, a.version(), constant.max_staleness);
    const std::vector<float> before(c.parameters().begin(), c.parameters().end());
    ASSERT_TRUE(a.apply(u).applied());
    ASSERT_TRUE(b.apply(u).applied());
    if (a.version() == kMilestone) {
      // From here on c has left a: check the one step by hand, then follow c alone.
      ASSERT_TRUE(c.apply(u).applied());
      std::size_t j = 0;
      for (const auto& t : u.tensors) {
        const std::size_t offset = std::accumulate(sizes.begin(), sizes.begin() + t.tensor, 0u);
        for (std::size_t e = 0; e < t.indices.size(); ++e, ++j) {
          const std::size_t i = offset + t.indices[e];
          const float half = constant.learning_rate * 0.5f;
          EXPECT_EQ(c.parameters()[i],
                    before[i] - half * t.values[e] / static_cast<float>(c.last_divisors()[j]))
              << "entry " << i;
        }
      }
      EXPECT_NE(std::vector<float>(a.parameters().begin(), a.parameters().end()),
                std::vector<float>(c.parameters().begin(), c.parameters().end()));
      continue;
    }
    if (a.version() > kMilestone) continue;
    ASSERT_TRUE(c.apply(u).applied());
    ASSERT_EQ(std::memcmp(a.parameters().data(), c.parameters().data(), 40 * sizeof(float)), 0)
        << "version " << a.version();
  }
  EXPECT_EQ(std::memcmp(a.parameters().data(), b.parameters().data(), 40 * sizeof(float)), 0);
  EXPECT_EQ(learning_rate_at(0.1f, {}, 5), 0.1f);
  EXPECT_EQ(learning_rate_at(0.1f, {{3, 5}, 0.5f}, 4), 0.1f * 0.5f);
  EXPECT_EQ(learning_rate_at(0.1f, {{3, 5}, 0.5f}, 5), 0.1f * 0.5f * 0.5f);
}

TEST(ParameterStore, LearningRateScheduleTextIsCheckedNamingTheProblem) {
  EXPECT_EQ(parse_lr_decay_at("3000,4500"), (std::vector<std::uint64_t>{3000, 4500}));
  EXPECT_TRUE(parse_lr_decay_at("").empty());
  EXPECT_EQ(format_lr_decay_at(parse_lr_decay_at("1,20,300")), "1,20,300");
  const auto message = [](const std::string& text) -> std::string {
    try {
      parse_lr_decay_at(text);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(message("4500,3000").find("not strictly increasing"), std::string::npos);
  EXPECT_NE(message("0,10").find("milestone 0"), std::string::npos);
  EXPECT_NE(message("10,,20").find("'' is not a version"), std::string::npos);
  EXPECT_NE(message("1e3").find("'1e3' is not a version"), std::string::npos);
  EXPECT_NE(message("99999999999999999999").find("not a version"), std::string::npos);
  ParameterStoreOptions options;
  options.lr_schedule = {{10}, 1.0f};  // a factor of 1 decays nothing: a mistake
  EXPECT_THROW(ParameterStore(kModel, {4}, std::vector<float>(4), options), std::invalid_argument);
  options.lr_schedule = {{10}, 0.0f};
  EXPECT_THROW(ParameterStore(kModel, {4}, std::vector<float>(4), options), std::invalid_argument);
}

// A forged claim: the most steps an update can say (65535) against a credit of 1000 lowers
// σ to 1, never below, so the stale update moves the model exactly as a fresh one would;
// the same update without the claim moves it by a σth of that.
TEST(ParameterStore, AClaimOfManyStepsWeighsAtMostAFreshUpdate) {
  for (std::uint32_t d : {8u, 100u}) {
    SCOPED_TRACE("D = " + std::to_string(d));
    ParameterStoreOptions options;
    options.max_staleness = d;
    options.offline_step_credit = 1000;
    ParameterStore store(kModel, {2}, {0, 0}, options);
    for (int n = 0; n < 6; ++n)  // six updates touch entry 0 after version 0
      ASSERT_TRUE(store.apply({kModel, 0, store.version(), {{0, 2, {0}, {1.0f}}}}).applied());
    ParameterStore unclaimed = store;
    SparseUpdate offline{kModel, 0, 0, {{0, 2, {0, 1}, {2.0f, 2.0f}}}};
    ASSERT_TRUE(unclaimed.apply(offline).applied());
    EXPECT_EQ(unclaimed.last_divisors()[0], 6u);
    offline.local_steps = 65535;
    const float before = store.parameters()[0];
    ASSERT_TRUE(store.apply(offline).applied());
    EXPECT_EQ(store.last_divisors()[0], 1u);
    EXPECT_FLOAT_EQ(store.parameters()[0], before - 0.1f * 2.0f);
    // Three claimed steps against σ = 6 leave a divisor of 2.
    ParameterStore three = unclaimed;
    for (int n = 0; n < 6; ++n)
      ASSERT_TRUE(three.apply({kModel, 0, three.version(), {{0, 2, {1}, {1.0f}}}}).applied());
    SparseUpdate claim3{kModel, 0, 7, {{0, 2, {1}, {1.0f}}}, 3};
    ASSERT_TRUE(three.apply(claim3).applied());
    EXPECT_EQ(three.last_divisors()[0], 2u);
  }
  ParameterStoreOptions beyond;
  beyond.offline_step_credit = 65536;
  EXPECT_THROW(ParameterStore(kModel, {2}, {0, 0}, beyond), std::invalid_argument);
}

// --offline-average: a credited update of s' steps at delay d has every divisor at least
// ⌈(s' + d) / s'⌉, on the entries the fleet moved and on those it did not; the credit's own
// divisor wins where it is larger, and a forged claim still weighs at most the average.
TEST(ParameterStore, OfflineAverageWeighsACreditedUpdateByItsShareOfTheStepsSince) {
  ParameterStoreOptions options;
  options.max_staleness = 100;
  options.offline_step_credit = 1000;
  ParameterStore credited(kModel, {4}, {0, 0, 0, 0}, options);
  for (int n = 0; n < 12; ++n)  // twelve updates touch entry 0 after version 0
    ASSERT_TRUE(credited.apply({kModel, 0, credited.version(), {{0, 4, {0}, {1.0f}}}}).applied());
  options.offline_average = true;
  ParameterStore averaged(kModel, {4}, {0, 0, 0, 0}, options);
  for (int n = 0; n < 12; ++n)
    ASSERT_TRUE(averaged.apply({kModel, 0, averaged.version(), {{0, 4, {0}, {1.0f}}}}).applied());
  const SparseUpdate four_steps{kModel, 0, 0, {{0, 4, {0, 3}, {2.0f, 2.0f}}}, 4};
  ParameterStore credited4 = credited;
  ASSERT_TRUE(credited4.apply(four_steps).applied());
  EXPECT_EQ(credited4.last_divisors()[0], 3u) << "the credit alone: ceil(12 / 4)";
  EXPECT_EQ(credited4.last_divisors()[1], 1u) << "an entry nobody moved: full weight";
  ParameterStore averaged4 = averaged;
  const float before = averaged4.parameters()[3];
  ASSERT_TRUE(averaged4.apply(four_steps).applied());
  EXPECT_EQ(averaged4.last_divisors()[0], 4u) << "ceil((4 + 12) / 4)";
  EXPECT_EQ(averaged4.last_divisors()[1], 4u);
  EXPECT_FLOAT_EQ(averaged4.parameters()[3], before - 0.1f * 2.0f / 4);
  // Two claimed steps: the credit's ceil(12 / 2) = 6 is below ceil(14 / 2) = 7.
  ParameterStore averaged2 = averaged;
  SparseUpdate two_steps = four_steps;
  two_steps.local_steps = 2;
  ASSERT_TRUE(averaged2.apply(two_steps).applied());
  EXPECT_EQ(averaged2.last_divisors()[0], 7u);
  // A forged claim of 65535 steps is believed up to C = 1000: ceil(1012 / 1000) = 2.
  ParameterStore forged = averaged;
  SparseUpdate many = four_steps;
  many.local_steps = 65535;
  ASSERT_TRUE(forged.apply(many).applied());
  EXPECT_EQ(forged.last_divisors()[0], 2u);
  EXPECT_EQ(forged.last_divisors()[1], 2u);
  // An update that claims no steps meets the paper's σ, averaged or not.
  ParameterStore online = averaged;
  SparseUpdate unclaimed = four_steps;
  unclaimed.local_steps = 0;
  ASSERT_TRUE(online.apply(unclaimed).applied());
  EXPECT_EQ(online.last_divisors()[0], 12u);
  EXPECT_EQ(online.last_divisors()[1], 1u);
  ParameterStoreOptions without_credit;
  without_credit.offline_average = true;
  EXPECT_THROW(ParameterStore(kModel, {2}, {0, 0}, without_credit), std::invalid_argument);
}

// A value that would leave a parameter beyond the bound is refused exactly at the bound
// (lr 0.5 and these values are exact in float), and the refusal changes nothing.
TEST(ParameterStore, BoundIsCheckedOnTheExactNewValue) {
  ParameterStoreOptions options;
  options.learning_rate = 0.5f;
  ParameterStore store(kModel, {4}, std::vector<float>(4, 0.0f), options);
  ASSERT_EQ(options.max_parameter_magnitude, 1e6f);
  const SparseUpdate at_bound{
      kModel, 1, 0, {SparseTensor{0, 4, {1}, {-2e6f}}}};  // 0 − 0.5·(−2e6) = 1e6
  ASSERT_TRUE(store.apply(at_bound).applied());
  EXPECT_EQ(store.parameters()[1], 1e6f);
  const SparseUpdate beyond{
      kModel, 2, 1, {SparseTensor{0, 4, {0, 1}, {1.0f, -0.25f}}}};  // 1e6 + 0.125
  const auto refused = store.apply(beyond);
  EXPECT_EQ(refused.status, ApplyStatus::kOutOfBounds);
  EXPECT_NE(refused.reason.find("index 1"), std::string::npos) << refused.reason;
  EXPECT_EQ(store.version(), 1u);
  EXPECT_EQ(store.parameters()[0], 0.0f);  // the entry before the bad one was not written either
  EXPECT_EQ(store.parameters()[1], 1e6f);
  // A step back inside the bound is accepted.
  const SparseUpdate back{kModel, 3, 1, {SparseTensor{0, 4, {1}, {2.0f}}}};
  ASSERT_TRUE(store.apply(back).applied());
  EXPECT_EQ(store.parameters()[1], 999999.0f);
}

// The poisoning sequence: fourteen −3.4e38 at one bias. With the default bound the
// first is refused; with no bound but finiteness (FLT_MAX) exactly those that would
// overflow are refused, and the parameter stays what the accepted ones made it.
TEST(ParameterStore, PoisoningSequenceNeverMakesAParameterNonFinite) {
  for (const float bound : {kDefaultMaxParameterMagnitude, FLT_MAX}) {
    SCOPED_TRACE("bound " + std::to_string(bound));
    ParameterStoreOptions options;
    options.max_parameter_magnitude = bound;
    ParameterStore store(kModel, {8, 2}, std::vector<float>(10, 0.25f), options);
    float expected = 0.25f;
    std::uint64_t accepted = 0;
    for (std::uint64_t n = 1; n <= 14; ++n) {
      const SparseUpdate poison{kModel, n, store.version(), {SparseTensor{1, 2, {0}, {-3.4e38f}}}};
      const float next = expected - options.learning_rate * -3.4e38f / 1.0f;
      const auto result = store.apply(poison);
      if (std::isfinite(next) && std::fabs(next) <= bound) {
        ASSERT_TRUE(result.applied()) << n << ": " << result.reason;
        expected = next;
        ++accepted;
      } else {
        ASSERT_EQ(result.status, ApplyStatus::kOutOfBounds) << n;
      }
      ASSERT_EQ(store.parameters()[8], expected) << n;
      ASSERT_TRUE(std::isfinite(store.parameters()[8]));
    }
    EXPECT_EQ(accepted, bound == FLT_MAX ? 10u : 0u);  // 10 × 3.4e37 < FLT_MAX < 11 × 3.4e37
    // Replay's check (finiteness only) refuses the overflowing one too.
    const SparseUpdate poison{kModel, 15, store.version(), {SparseTensor{1, 2, {0}, {-3.4e38f}}}};
    if (bound == FLT_MAX) {
      EXPECT_EQ(store.apply(poison, ValueCheck::kFiniteOnly).status, ApplyStatus::kOutOfBounds);
    }
  }
}

// A reserved update is checked against the values the reservations before it will leave:
// two steps that are each fine alone, but not together, get the second refused before the
// first is applied; once the first is cancelled, the second fits.
TEST(ParameterStore, AReservationSeesTheValuesOfTheOnesBeforeIt) {
  ParameterStoreOptions options;
  options.learning_rate = 0.5f;
  ParameterStore store(kModel, {4}, std::vector<float>(4, 0.0f), options);
  const SparseUpdate first{kModel, 1, 0, {SparseTensor{0, 4, {2}, {-1.5e6f}}}};  // → 7.5e5
  const SparseUpdate second{
      kModel, 2, 1, {SparseTensor{0, 4, {2}, {-1.0e6f}}}};  // → 1.25e6 after first
  ASSERT_TRUE(store.reserve(first).applied());
  EXPECT_EQ(store.parameters()[2], 0.0f);  // reserved, not applied
  EXPECT_EQ(store.reserve(second).status, ApplyStatus::kOutOfBounds);
  EXPECT_EQ(store.reserved(), 1u);
  store.cancel_reserved();
  const SparseUpdate second_alone{kModel, 2, 0, {SparseTensor{0, 4, {2}, {-1.0e6f}}}};
  ASSERT_TRUE(store.reserve(second_alone).applied());
  ASSERT_TRUE(store.apply_reserved().applied());
  EXPECT_EQ(store.parameters()[2], 5e5f);
  EXPECT_EQ(store.version(), 1u);
}

}  // namespace
