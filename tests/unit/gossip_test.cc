// The shared rules of gossip training (worker/gossip.h): topologies and their file,
// Metropolis weights, the workload balancer, the accuracy-aware plateau rule, and what a
// peer takes from a neighbour (the magnitude bound and the clipped difference).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "worker/gossip.h"

namespace {

using namespace edgetrain::runtime;

TEST(GossipTopology, RingHasTwoNeighboursEachAndIsConnected) {
  const GossipTopology t = make_topology(TopologyKind::kRing, 5);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t.neighbours[0], (std::vector<std::uint32_t>{1, 4}));
  EXPECT_EQ(t.neighbours[2], (std::vector<std::uint32_t>{1, 3}));
  EXPECT_EQ(t.edges().size(), 5u);
  EXPECT_TRUE(t.connected());
  EXPECT_EQ(t.peers[3].name, "peer-3");
  EXPECT_EQ(make_topology(TopologyKind::kRing, 2).edges().size(), 1u);
}

TEST(GossipTopology, RandomRegularHasExactDegreeNoDoubleEdgesAndRepeatsForASeed) {
  for (std::uint32_t n : {8u, 16u, 32u}) {
    const GossipTopology t = make_topology(TopologyKind::kRandomRegular, n, 4, 7);
    EXPECT_TRUE(t.connected());
    for (std::uint32_t i = 0; i < n; ++i) {
      ASSERT_EQ(t.neighbours[i].size(), 4u) << "peer " << i;
      for (std::uint32_t j : t.neighbours[i]) EXPECT_NE(i, j);
    }
    EXPECT_EQ(t.edges(), make_topology(TopologyKind::kRandomRegular, n, 4, 7).edges());
  }
  EXPECT_NE(make_topology(TopologyKind::kRandomRegular, 16, 4, 1).edges(),
            make_topology(TopologyKind::kRandomRegular, 16, 4, 2).edges());
  EXPECT_THROW(make_topology(TopologyKind::kRandomRegular, 5, 3),
               std::invalid_argument);  // 15 half-edges
  EXPECT_THROW(make_topology(TopologyKind::kRandomRegular, 4, 4), std::invalid_argument);
}

TEST(GossipTopology, TheFileRoundTripsAndBadFilesAreRefusedByName) {
  GossipTopology t = make_topology(TopologyKind::kRandomRegular, 8, 3 + 1, 3);
  t.peers[2].address = "10.0.2.2:5684";
  const GossipTopology back = parse_topology_json(topology_json(t));
  EXPECT_EQ(back.kind, TopologyKind::kRandomRegular);
  EXPECT_EQ(back.edges(), t.edges());
  EXPECT_EQ(back.peers[2].address, "10.0.2.2:5684");
  EXPECT_EQ(back.find("peer-7"), 7u);
  EXPECT_FALSE(back.find("peer-8").has_value());

  auto refused = [](const std::string& text, const std::string& says) {
    try {
      parse_topology_json(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("[]", "not a JSON object");
  refused("{\"peers\": [], \"edges\": []}", "1 to");
  refused("{\"peers\": [{\"name\": \"a\"}], \"edges\": [[0, 1]]}", "beyond");
  refused("{\"peers\": [{\"name\": \"a\"}, {\"name\": \"b\"}], \"edges\": [[1, 1]]}", "self loop");
  refused("{\"peers\": [{\"name\": \"a\"}, {\"name\": \"a\"}], \"edges\": []}", "twice");
  refused("{\"peers\": [{\"name\": \"a\\nb\"}], \"edges\": []}", "plain identity");
  refused("{\"peers\": [{\"name\": \"a\"}], \"edges\": [[0, -1]]}", "peer indices");
  refused("{\"peers\": [{\"name\": \"a\"}], \"edges\": [], \"kind\": \"star\"}",
          "unknown topology");
  refused("{\"peers\": [{\"name\": \"a\"}], \"edges\": [[0, 99999999999]]}", "beyond");
}

TEST(GossipTopology, MetropolisWeightsAreDoublyStochastic) {
  // A path 0-1-2 plus a pendant 3 on 1: degrees 1, 3, 1, 1.
  const GossipTopology t =
      topology_from_edges({{"a", ""}, {"b", ""}, {"c", ""}, {"d", ""}}, {{0, 1}, {1, 2}, {1, 3}});
  std::vector<std::vector<double>> w(4, std::vector<double>(4, 0));
  for (std::uint32_t i = 0; i < 4; ++i) {
    const auto weights = metropolis_weights(t, i);
    ASSERT_EQ(weights.size(), t.neighbours[i].size() + 1);
    for (std::size_t k = 0; k < t.neighbours[i].size(); ++k) w[i][t.neighbours[i][k]] = weights[k];
    w[i][i] = weights.back();
  }
  for (int i = 0; i < 4; ++i) {
    double row = 0, column = 0;
    for (int j = 0; j < 4; ++j) {
      row += w[i][j];
      column += w[j][i];
      EXPECT_DOUBLE_EQ(w[i][j], w[j][i]);
      EXPECT_GE(w[i][j], 0);
    }
    EXPECT_NEAR(row, 1, 1e-12);
    EXPECT_NEAR(column, 1, 1e-12);
  }
  EXPECT_DOUBLE_EQ(w[0][1], 0.25);  // 1 / (1 + max(1, 3))
}

TEST(WorkloadBalancer, SizesTheBatchToTheTargetAndFollowsASpeedChange) {
  WorkloadBalancer b({.target_seconds = 0.5,
                      .base_batch = 10,
                      .base_lr = 0.1,
                      .min_batch = 2,
                      .max_batch = 64,
                      .max_lr_factor = 4,
                      .smoothing = 1});
  EXPECT_EQ(b.batch(), 10);
  b.observe(10, 0.1);  // 100 examples/s: 50 in half a second, 48 on the ladder 10 * 2^(k/4)
  EXPECT_EQ(b.batch(), 48);
  EXPECT_DOUBLE_EQ(b.learning_rate(), 0.4);  // 4.8x the batch, capped at 4x
  b.observe(48, 0.46);  // 104 examples/s: 52 wanted, within a tenth of 48: kept
  EXPECT_EQ(b.batch(), 48);
  b.observe(48, 0.4);  // 120 examples/s: 60 wanted, 57 on the ladder
  EXPECT_EQ(b.batch(), 57);
  b.observe(50, 5.0);  // the CPU quota dropped: 10 examples/s
  EXPECT_EQ(b.batch(), 5);
  EXPECT_DOUBLE_EQ(b.learning_rate(), 0.05);
  b.observe(5, 10.0);  // slower than the least batch allows
  EXPECT_EQ(b.batch(), 2);
  b.observe(0, 1.0);  // nothing trained: nothing learnt
  EXPECT_EQ(b.batch(), 2);

  WorkloadBalancer off({.target_seconds = 0, .base_batch = 10});
  off.observe(10, 0.01);
  EXPECT_EQ(off.batch(), 10);
  EXPECT_THROW(WorkloadBalancer({.target_seconds = 1, .base_batch = 10, .min_batch = 20}),
               std::invalid_argument);
}

TEST(PlateauDetector, DecaysThenStopsOnPlateausAndNeverWithPatienceZero) {
  PlateauDetector p({.patience = 2, .min_delta = 0.01, .max_decays = 1});
  EXPECT_EQ(p.report(0.5), PlateauDetector::Verdict::kContinue);
  EXPECT_EQ(p.report(0.6), PlateauDetector::Verdict::kContinue);
  EXPECT_EQ(p.report(0.605), PlateauDetector::Verdict::kContinue);
  EXPECT_EQ(p.report(0.6), PlateauDetector::Verdict::kDecay);
  EXPECT_DOUBLE_EQ(p.lr_factor(), 0.5);
  EXPECT_EQ(p.report(0.7),
            PlateauDetector::Verdict::kContinue);  // improved: the count starts again
  EXPECT_EQ(p.report(0.7), PlateauDetector::Verdict::kContinue);
  EXPECT_EQ(p.report(0.7), PlateauDetector::Verdict::kStop);
  EXPECT_TRUE(p.stopped());
  EXPECT_EQ(p.report(0.9), PlateauDetector::Verdict::kStop);

  PlateauDetector never({.patience = 0});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(never.report(0.5), PlateauDetector::Verdict::kContinue);
}

TEST(NeighbourModel, NonFiniteAndHugeValuesAreRefusedHonestOnesTaken) {
  const std::vector<float> honest = {0.5f, -2.75f, 3.0f, 0.0f};
  EXPECT_EQ(check_neighbour_model(honest, kDefaultMaxNeighbourMagnitude),
            NeighbourVerdict::kAccepted);
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = honest;
    x[2] = bad;
    EXPECT_EQ(check_neighbour_model(x, kDefaultMaxNeighbourMagnitude),
              NeighbourVerdict::kNonFinite);
    EXPECT_EQ(check_neighbour_model(x, 0), NeighbourVerdict::kNonFinite);  // always refused
  }
  std::vector<float> huge = honest;
  huge[1] = 1e30f;
  EXPECT_EQ(check_neighbour_model(huge, kDefaultMaxNeighbourMagnitude),
            NeighbourVerdict::kTooLarge);
  huge[1] = -1.0001e4f;
  EXPECT_EQ(check_neighbour_model(huge, 1e4), NeighbourVerdict::kTooLarge);
  huge[1] = 1e4f;  // the bound itself is allowed
  EXPECT_EQ(check_neighbour_model(huge, 1e4), NeighbourVerdict::kAccepted);
  huge[1] = 1e30f;
  EXPECT_EQ(check_neighbour_model(huge, 0), NeighbourVerdict::kAccepted);  // 0: no bound
  // A NaN after a huge value is still called non-finite.
  huge[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(check_neighbour_model(huge, 1e4), NeighbourVerdict::kNonFinite);
  EXPECT_STREQ(neighbour_verdict_reason(NeighbourVerdict::kTooLarge),
               "model above the magnitude bound from a neighbour");
}

TEST(NeighbourModel, TheClipScalesTheDifferenceToTauAndLeavesAShorterOneAlone) {
  const std::vector<float> own = {1, 1, 1, 1};
  const std::vector<float> theirs = {4, 5, 1, 1};         // difference (3, 4, 0, 0): norm 5
  EXPECT_EQ(neighbour_clip_scale(theirs, own, 0), 1.0);   // off
  EXPECT_EQ(neighbour_clip_scale(theirs, own, 5), 1.0);   // at τ: unchanged
  EXPECT_EQ(neighbour_clip_scale(theirs, own, 10), 1.0);  // under τ: unchanged
  const double s = neighbour_clip_scale(theirs, own, 2);
  EXPECT_DOUBLE_EQ(s, 0.4);
  // Mixed in with weight 1 and γ 1, the peer moves by exactly τ (up to float rounding).
  std::vector<float> x = own;
  const MixTerm term{1.0, theirs, s};
  dpsgd_mix(x, own, std::span<const MixTerm>(&term, 1), 1.0);
  double moved = 0;
  for (std::size_t i = 0; i < x.size(); ++i) moved += std::pow(x[i] - own[i], 2);
  EXPECT_NEAR(std::sqrt(moved), 2.0, 1e-6);
  EXPECT_FLOAT_EQ(x[0], 1 + 1.2f);
  EXPECT_FLOAT_EQ(x[1], 1 + 1.6f);
  // A scale of 1 is the plain mix, bit for bit.
  std::vector<float> plain = own, clipped_off = own;
  const MixTerm unscaled{0.25, theirs};
  const MixTerm at_one{0.25, theirs, neighbour_clip_scale(theirs, own, 100)};
  dpsgd_mix(plain, own, std::span<const MixTerm>(&unscaled, 1), 0.7);
  dpsgd_mix(clipped_off, own, std::span<const MixTerm>(&at_one, 1), 0.7);
  EXPECT_EQ(plain, clipped_off);
  // A poisoned neighbour clipped: the step is τ however far it is.
  std::vector<float> far = own;
  far[0] = 1e30f;
  EXPECT_NEAR(neighbour_clip_scale(far, own, 2) * (static_cast<double>(far[0]) - 1), 2.0, 1e-9);
}

TEST(NeighbourModel, TheSettingsAreCheckedByName) {
  GossipSettings s;
  s.max_neighbour_magnitude = -1;
  EXPECT_THROW(check_gossip_settings(s), std::invalid_argument);
  s.max_neighbour_magnitude = 0;
  EXPECT_NO_THROW(check_gossip_settings(s));
  s.neighbour_clip = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(check_gossip_settings(s), std::invalid_argument);
  s.neighbour_clip = 3;
  EXPECT_NO_THROW(check_gossip_settings(s));
  s.algorithm = GossipAlgorithm::kAdpsgd;
  EXPECT_THROW(check_gossip_settings(s), std::invalid_argument);  // d-psgd only
}

}  // namespace
