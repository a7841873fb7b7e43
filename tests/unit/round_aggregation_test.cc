// Federated rounds' aggregation (server/round_aggregation.h) against a plain reference
// written from the definitions: masked and fedavg, weights by examples, partial deltas.
#include <gtest/gtest.h>

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

}  // namespace
