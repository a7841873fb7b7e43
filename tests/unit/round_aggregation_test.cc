// Federated rounds' aggregation (server/round_aggregation.h) against a plain reference
// written from the definitions: masked and fedavg, weights by examples, partial deltas; the
// robust rules (trimmed-mean, median) and what the server takes of a delta (its value
// checks and per-device norm clipping).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "server/round_aggregation.h"

namespace {

using namespace edgetrain;
using server::Aggregation;
using server::RoundDelta;

transport::SparseTensor tensor(std::uint32_t index, std::uint32_t size,
                               std::vector<std::uint32_t> indices, std::vector<float> values) {
  return {index, size, std::move(indices), std::move(values)};
}

TEST(RoundAggregation, MaskedAveragesEachEntryOverTheDevicesThatSentIt) {
  const std::vector<std::uint32_t> sizes = {3, 2};
  std::vector<RoundDelta> deltas(2);
  deltas[0].examples = 10;
  deltas[0].delta.tensors = {tensor(0, 3, {0, 1}, {1.0f, 2.0f}), tensor(1, 2, {1}, {4.0f})};
  deltas[1].examples = 30;
  deltas[1].delta.tensors = {tensor(0, 3, {1, 2}, {6.0f, -3.0f})};
  const std::vector<float> masked = server::aggregate_deltas(deltas, sizes, Aggregation::kMasked);
  // entry 0: only device 0; entry 1: (10·2 + 30·6)/40 = 5; entry 2: only device 1;
  // tensor 1 entry 0: nobody (unchanged); entry 1: only device 0.
  EXPECT_EQ(masked, (std::vector<float>{1.0f, 5.0f, -3.0f, 0.0f, 4.0f}));
  const std::vector<float> fedavg = server::aggregate_deltas(deltas, sizes, Aggregation::kFedAvg);
  // Missing entries count as zero: Σ n·v / 40.
  EXPECT_EQ(fedavg, (std::vector<float>{0.25f, 5.0f, -2.25f, 0.0f, 1.0f}));
}

TEST(RoundAggregation, MatchesAPlainReferenceOnRandomPartialDeltas) {
  std::mt19937 rng(11);
  const std::vector<std::uint32_t> sizes = {7, 13, 4};
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<RoundDelta> deltas(1 + rng() % 5);
    // Reference: per flat index, a list of (weight, value).
    std::map<std::size_t, std::vector<std::pair<double, double>>> sent;
    double all_weights = 0;
    for (RoundDelta& d : deltas) {
      d.examples = 1 + rng() % 100;
      all_weights += static_cast<double>(d.examples);
      std::size_t offset = 0;
      for (std::uint32_t t = 0; t < sizes.size(); ++t) {
        transport::SparseTensor st{t, sizes[t], {}, {}};
        for (std::uint32_t i = 0; i < sizes[t]; ++i) {
          if (rng() % 3 == 0) continue;
          const float value = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 16.0f;
          st.indices.push_back(i);
          st.values.push_back(value);
          sent[offset + i].push_back({static_cast<double>(d.examples), value});
        }
        offset += sizes[t];
        if (!st.indices.empty()) d.delta.tensors.push_back(std::move(st));
      }
    }
    const auto masked = server::aggregate_deltas(deltas, sizes, Aggregation::kMasked);
    const auto fedavg = server::aggregate_deltas(deltas, sizes, Aggregation::kFedAvg);
    ASSERT_EQ(masked.size(), 24u);
    for (std::size_t i = 0; i < masked.size(); ++i) {
      double sum = 0, weights = 0;
      for (const auto& [w, v] : sent[i]) {
        sum += w * v;
        weights += w;
      }
      EXPECT_FLOAT_EQ(masked[i], weights > 0 ? static_cast<float>(sum / weights) : 0.0f)
          << trial << " " << i;
      EXPECT_FLOAT_EQ(fedavg[i], static_cast<float>(sum / all_weights)) << trial << " " << i;
    }
  }
}

TEST(RoundAggregation, RefusesDeltasThatDoNotFitAndZeroWeights) {
  const std::vector<std::uint32_t> sizes = {3};
  std::vector<RoundDelta> deltas(1);
  deltas[0].examples = 1;
  deltas[0].delta.tensors = {tensor(0, 4, {0}, {1.0f})};
  EXPECT_THROW(server::aggregate_deltas(deltas, sizes, Aggregation::kMasked),
               std::invalid_argument);
  deltas[0].delta.tensors = {tensor(0, 3, {0}, {1.0f})};
  deltas[0].examples = 0;
  EXPECT_THROW(server::aggregate_deltas(deltas, sizes, Aggregation::kMasked),
               std::invalid_argument);
  EXPECT_EQ(server::parse_aggregation("fedavg"), Aggregation::kFedAvg);
  EXPECT_THROW(server::parse_aggregation("mean"), std::invalid_argument);
}

// The robust rules from their definitions: per entry, the values of the devices that sent
// it, sorted; the median, or the mean of what is left after dropping ⌊β·m⌋ at each end.
double robust_reference(std::vector<double> values, Aggregation rule, double trim_fraction) {
  std::sort(values.begin(), values.end());
  const std::size_t m = values.size();
  if (rule == Aggregation::kMedian)
    return m % 2 ? values[m / 2] : (values[m / 2 - 1] + values[m / 2]) / 2;
  std::size_t k = static_cast<std::size_t>(std::floor(trim_fraction * static_cast<double>(m)));
  if (2 * k >= m) k = (m - 1) / 2;
  double sum = 0;
  for (std::size_t j = k; j < m - k; ++j) sum += values[j];
  return sum / static_cast<double>(m - 2 * k);
}

TEST(RoundAggregation, RobustRulesMatchTheirDefinitionsOnRandomPartialDeltas) {
  std::mt19937 rng(23);
  // A tensor larger than the implementation's block of coordinates, so that a device's
  // cursor crosses blocks.
  const std::vector<std::uint32_t> sizes = {5, 2500, 3};
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<RoundDelta> deltas(1 + rng() % 9);
    std::map<std::size_t, std::vector<double>> sent;
    for (RoundDelta& d : deltas) {
      d.examples = 1 + rng() % 100;  // ignored by the robust rules
      std::size_t offset = 0;
      for (std::uint32_t t = 0; t < sizes.size(); ++t) {
        transport::SparseTensor st{t, sizes[t], {}, {}};
        for (std::uint32_t i = 0; i < sizes[t]; ++i) {
          if (rng() % 4 == 0) continue;
          const float value = static_cast<float>(static_cast<int>(rng() % 2000) - 1000) / 64.0f;
          st.indices.push_back(i);
          st.values.push_back(value);
          sent[offset + i].push_back(value);
        }
        offset += sizes[t];
        if (!st.indices.empty()) d.delta.tensors.push_back(std::move(st));
      }
    }
    for (double beta : {0.0, 0.2, 0.34}) {
      const auto trimmed =
          server::aggregate_deltas(deltas, sizes, {Aggregation::kTrimmedMean, beta});
      const auto median = server::aggregate_deltas(deltas, sizes, Aggregation::kMedian);
      ASSERT_EQ(trimmed.size(), 2508u);
      for (std::size_t i = 0; i < trimmed.size(); ++i) {
        const auto it = sent.find(i);
        if (it == sent.end()) {
          EXPECT_EQ(trimmed[i], 0.0f);  // nobody sent it: unchanged
          EXPECT_EQ(median[i], 0.0f);
          continue;
        }
        EXPECT_FLOAT_EQ(trimmed[i], static_cast<float>(robust_reference(
                                        it->second, Aggregation::kTrimmedMean, beta)))
            << trial << " " << i << " beta " << beta;
        EXPECT_FLOAT_EQ(median[i], static_cast<float>(robust_reference(
                                       it->second, Aggregation::kMedian, beta)))
            << trial << " " << i;
      }
    }
  }
}

TEST(RoundAggregation, RobustRulesIgnoreOneHugeDeviceThatFedAvgFollows) {
  // Five devices agree on 1.0; one sends 1e5 and claims a hundred times the examples.
  const std::vector<std::uint32_t> sizes = {2};
  std::vector<RoundDelta> deltas(6);
  for (std::size_t d = 0; d < deltas.size(); ++d) {
    deltas[d].examples = d == 5 ? 1000 : 10;
    const float v = d == 5 ? 1e5f : 1.0f + 0.01f * static_cast<float>(d);
    deltas[d].delta.tensors = {tensor(0, 2, {0, 1}, {v, -v})};
  }
  const auto fedavg = server::aggregate_deltas(deltas, sizes, Aggregation::kFedAvg);
  const auto trimmed = server::aggregate_deltas(deltas, sizes, Aggregation::kTrimmedMean);
  const auto median = server::aggregate_deltas(deltas, sizes, Aggregation::kMedian);
  EXPECT_GT(fedavg[0], 9e4f);  // the attacker's weight carries the mean
  // β = 0.2 of 6 drops one value at each end: 1.01, 1.02, 1.03, 1.04 are left.
  EXPECT_FLOAT_EQ(trimmed[0], 1.025f);
  EXPECT_FLOAT_EQ(trimmed[1], -1.025f);
  EXPECT_FLOAT_EQ(median[0], 1.025f);  // (1.02 + 1.03) / 2
}

TEST(RoundAggregation, TrimmedCountKeepsAtLeastOneValue) {
  EXPECT_EQ(server::trimmed_count(1, 0.2), 1u);
  EXPECT_EQ(server::trimmed_count(2, 0.2), 2u);   // ⌊0.4⌋ = 0 dropped
  EXPECT_EQ(server::trimmed_count(5, 0.2), 3u);   // one at each end
  EXPECT_EQ(server::trimmed_count(10, 0.2), 6u);  // two at each end
  EXPECT_EQ(server::trimmed_count(3, 0.49), 1u);  // the median
  EXPECT_EQ(server::trimmed_count(4, 0.49), 2u);  // ⌊1.96⌋ = 1 at each end
  EXPECT_EQ(server::trimmed_count(8, 0.0), 8u);
  std::vector<RoundDelta> deltas(1);
  deltas[0].examples = 1;
  deltas[0].delta.tensors = {tensor(0, 1, {0}, {1.0f})};
  const std::vector<std::uint32_t> sizes = {1};
  EXPECT_THROW(server::aggregate_deltas(deltas, sizes, {Aggregation::kTrimmedMean, 0.5}),
               std::invalid_argument);
  EXPECT_THROW(server::aggregate_deltas(deltas, sizes, {Aggregation::kTrimmedMean, -0.1}),
               std::invalid_argument);
  EXPECT_EQ(server::parse_aggregation("trimmed-mean"), Aggregation::kTrimmedMean);
  EXPECT_EQ(server::parse_aggregation("median"), Aggregation::kMedian);
  EXPECT_STREQ(server::aggregation_name(Aggregation::kTrimmedMean), "trimmed-mean");
}

TEST(RoundAggregation, ClipScalesAWholeDeltaToTheNormAndLeavesSmallerOnesAlone) {
  transport::SparseUpdate delta;
  delta.tensors = {tensor(0, 4, {0}, {3.0f}), tensor(1, 2, {1}, {-4.0f})};
  transport::SparseUpdate unclipped = delta;
  EXPECT_DOUBLE_EQ(server::clip_round_delta(unclipped, 0), 5.0);  // 0: off
  EXPECT_EQ(unclipped.tensors[0].values[0], 3.0f);
  EXPECT_DOUBLE_EQ(server::clip_round_delta(unclipped, 5.0), 5.0);  // at the norm: unchanged
  EXPECT_EQ(unclipped.tensors[1].values[0], -4.0f);
  EXPECT_DOUBLE_EQ(server::clip_round_delta(delta, 1.0), 5.0);  // one norm over all tensors
  EXPECT_FLOAT_EQ(delta.tensors[0].values[0], 0.6f);
  EXPECT_FLOAT_EQ(delta.tensors[1].values[0], -0.8f);
  // Values whose squares overflow a float are clipped, not turned into zeros or NaN.
  transport::SparseUpdate huge;
  huge.tensors = {tensor(0, 2, {0, 1}, {3e38f, -3e38f})};
  server::clip_round_delta(huge, 2.0);
  EXPECT_FLOAT_EQ(huge.tensors[0].values[0], std::sqrt(2.0f));
  EXPECT_FLOAT_EQ(huge.tensors[0].values[1], -std::sqrt(2.0f));
}

TEST(RoundAggregation, DeltaProblemsNameTheEntry) {
  transport::SparseUpdate delta;
  delta.tensors = {tensor(2, 9, {7}, {2.0f})};
  EXPECT_EQ(server::round_delta_problem(delta, 1.0f, 10.0f), "");
  EXPECT_NE(server::round_delta_problem(delta, 10.0f, 10.0f).find("tensor 2, entry 7"),
            std::string::npos);  // a step of 20 passes 10
  delta.tensors[0].values[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(server::round_delta_problem(delta, 1.0f, 10.0f).find("not finite"), std::string::npos);
}

TEST(RoundAggregation, DpFedAvgSumsUnweightedOverTheExpectedDevices) {
  const std::vector<std::uint32_t> sizes = {3};
  std::vector<RoundDelta> deltas(2);
  deltas[0].examples = 1;
  deltas[0].delta.tensors = {tensor(0, 3, {0, 1}, {1.0f, 2.0f})};
  deltas[1].examples = 1000;  // weights play no part: each device's sensitivity is its clip
  deltas[1].delta.tensors = {tensor(0, 3, {1}, {4.0f})};
  server::AggregationRule rule(Aggregation::kDpFedAvg);
  rule.expected_devices = 4;
  EXPECT_EQ(server::aggregate_deltas(deltas, sizes, rule),
            (std::vector<float>{0.25f, 1.5f, 0.0f}));
  rule.expected_devices = 0;
  EXPECT_THROW(server::aggregate_deltas(deltas, sizes, rule), std::invalid_argument);
  EXPECT_EQ(server::parse_aggregation("dp-fedavg"), Aggregation::kDpFedAvg);
}

}  // namespace
