// SecAgg+'s neighbour graph (privacy/secagg_graph.h): the Harary graph H(n, k) over a seeded
// permutation is k-regular, symmetric, the same for the same seed (and another for another),
// connected, and its Shamir points number each neighbourhood's holders 1..k+1; the choice of
// k and t from n and the dropout rate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <queue>
#include <set>
#include <stdexcept>
#include <vector>

#include "privacy/secagg_graph.h"

namespace edgetrain::privacy {
namespace {

// Breadth-first search from device 0 over neighbours(): how many devices it reaches, and
// how many stay reachable with `removed` taken out.
std::size_t reachable(const NeighbourGraph& graph, const std::set<std::uint32_t>& removed = {}) {
  std::uint32_t start = 0;
  while (removed.count(start)) ++start;
  std::vector<bool> seen(graph.devices(), false);
  std::queue<std::uint32_t> next;
  seen[start] = true;
  next.push(start);
  std::size_t count = 1;
  while (!next.empty()) {
    const std::uint32_t u = next.front();
    next.pop();
    for (std::uint32_t v : graph.neighbours(u)) {
      if (seen[v] || removed.count(v)) continue;
      seen[v] = true;
      ++count;
      next.push(v);
    }
  }
  return count;
}

TEST(NeighbourGraph, IsRegularSymmetricAndConnected) {
  for (std::uint32_t n : {5u, 20u, 100u, 500u}) {
    for (std::uint32_t k : {2u, 4u, 10u, 16u}) {
      if (k + 1 >= n) continue;
      const NeighbourGraph graph(n, k, 12345 + n * 31 + k);
      ASSERT_FALSE(graph.complete());
      std::size_t edges = 0;
      for (std::uint32_t u = 0; u < n; ++u) {
        const std::vector<std::uint32_t> around = graph.neighbours(u);
        ASSERT_EQ(around.size(), k) << "n " << n << " k " << k << " device " << u;
        ASSERT_TRUE(std::is_sorted(around.begin(), around.end()));
        ASSERT_EQ(std::set<std::uint32_t>(around.begin(), around.end()).size(), k) << "repeated neighbour";
        for (std::uint32_t v : around) {
          ASSERT_NE(v, u);
          ASSERT_TRUE(graph.adjacent(u, v));
          const std::vector<std::uint32_t> back = graph.neighbours(v);
          ASSERT_TRUE(std::binary_search(back.begin(), back.end(), u)) << u << " → " << v << " but not back";
        }
        for (std::uint32_t v = 0; v < n; ++v) {
          ASSERT_EQ(graph.adjacent(u, v), std::binary_search(around.begin(), around.end(), v)) << u << ", " << v;
        }
        edges += around.size();
      }
      EXPECT_EQ(edges, std::size_t{n} * k);
      EXPECT_EQ(reachable(graph), n) << "n " << n << " k " << k;
    }
  }
}

// H(n, k) is k-connected (Harary 1962): it stays connected with any k − 1 devices gone. A
// sample of removals, including a block of consecutive positions' devices.
TEST(NeighbourGraph, StaysConnectedWithFewerThanKRemoved) {
  const NeighbourGraph graph(60, 6, 99);
  std::set<std::uint32_t> removed;
  const std::vector<std::uint32_t> around = graph.neighbours(7);
  for (std::size_t i = 0; i < 5; ++i) removed.insert(around[i]);  // 5 of device 7's 6 neighbours
  EXPECT_EQ(reachable(graph, removed), 60u - 5);
  removed.insert(around[5]);  // all 6: device 7 is cut off, as k-connectivity allows
  EXPECT_EQ(reachable(graph, removed), 60u - 6 - 1);
}

TEST(NeighbourGraph, CountsTheComponentsOfThePresentDevices) {
  const NeighbourGraph cycle(12, 2, 4);
  std::vector<bool> present(12, true);
  EXPECT_EQ(cycle.components(present), 1u);
  const std::vector<std::uint32_t> around = cycle.neighbours(5);
  present[around[0]] = present[around[1]] = false;  // 5 alone, the other 9 in one arc
  EXPECT_EQ(cycle.components(present), 2u);
  EXPECT_EQ(cycle.components(std::vector<bool>(12, false)), 0u);
  EXPECT_EQ(reachable(cycle), 12u);
  EXPECT_THROW(cycle.components(std::vector<bool>(11, true)), std::invalid_argument);
}

TEST(NeighbourGraph, IsTheSameForTheSameSeedAndAnotherForAnother) {
  const NeighbourGraph a(200, 12, 777), b(200, 12, 777), c(200, 12, 778);
  std::size_t differ = 0;
  for (std::uint32_t u = 0; u < 200; ++u) {
    EXPECT_EQ(a.neighbours(u), b.neighbours(u));
    differ += a.neighbours(u) != c.neighbours(u);
  }
  EXPECT_GT(differ, 190u);  // a new seed redraws nearly every neighbourhood
}

// Pinned against an independent computation (Python: SplitMix64, Fisher–Yates with rejection,
// H(n, k) over the permutation, as secagg_graph.h describes it), so that an aarch64 worker
// (this test under QEMU in the aarch64 tree) and an x86-64 server draw the same graph.
TEST(NeighbourGraph, IsPinnedForOneSeed) {
  const NeighbourGraph graph(10, 2, 1);
  std::vector<std::vector<std::uint32_t>> all;
  for (std::uint32_t u = 0; u < 10; ++u) all.push_back(graph.neighbours(u));
  // Each device's two neighbours are those beside it on one cycle through all ten.
  std::vector<std::uint32_t> cycle{0};
  std::uint32_t previous = 0, current = all[0][0];
  while (current != 0) {
    cycle.push_back(current);
    const std::uint32_t next = all[current][0] == previous ? all[current][1] : all[current][0];
    previous = current;
    current = next;
  }
  EXPECT_EQ(cycle.size(), 10u);
  EXPECT_EQ(all, (std::vector<std::vector<std::uint32_t>>{
                     {3, 6}, {8, 9}, {4, 8}, {0, 9}, {2, 5}, {4, 7}, {0, 7}, {5, 6}, {1, 2}, {1, 3}}))
      << "the seeded permutation changed";
  const NeighbourGraph larger(500, 8, 0xdeadbeef);
  EXPECT_EQ(larger.neighbours(0), (std::vector<std::uint32_t>{94, 139, 151, 189, 196, 217, 227, 370}));
  EXPECT_EQ(larger.neighbours(499), (std::vector<std::uint32_t>{65, 125, 155, 180, 190, 271, 364, 422}));
}

TEST(NeighbourGraph, KOfNMinusOneOrZeroIsEveryone) {
  for (std::uint32_t k : {0u, 19u, 25u}) {
    const NeighbourGraph graph(20, k, 5);
    EXPECT_TRUE(graph.complete());
    EXPECT_EQ(graph.degree(), 19u);
    EXPECT_EQ(graph.neighbours(3).size(), 19u);
    EXPECT_EQ(graph.share_point(3, 7), 8);  // 1 + index, as without neighbours
  }
  EXPECT_TRUE(NeighbourGraph(4, 3, 5).complete());  // odd k = n − 1 is complete, allowed
}

TEST(NeighbourGraph, RefusesOddKBelowNMinusOneAndTooFewDevices) {
  EXPECT_THROW(NeighbourGraph(20, 5, 1), std::invalid_argument);
  EXPECT_THROW(NeighbourGraph(1, 0, 1), std::invalid_argument);
  EXPECT_THROW(NeighbourGraph(kMaxNeighbourGraphDevices + 1, 10, 1), std::invalid_argument);
  try {
    NeighbourGraph(20, 7, 1);
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("must be even"), std::string::npos) << error.what();
  }
}

TEST(NeighbourGraph, SharePointsNumberEachNeighbourhood) {
  const NeighbourGraph graph(50, 8, 3);
  for (std::uint32_t owner = 0; owner < 50; ++owner) {
    const std::vector<std::uint32_t> holders = graph.holders(owner);
    ASSERT_EQ(holders.size(), 9u);
    std::set<std::uint8_t> points;
    for (std::uint32_t holder : holders) points.insert(graph.share_point(owner, holder));
    EXPECT_EQ(points, (std::set<std::uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9})) << owner;
    for (std::uint32_t other = 0; other < 50; ++other) {
      if (!std::binary_search(holders.begin(), holders.end(), other)) {
        EXPECT_EQ(graph.share_point(owner, other), 0);
      }
    }
  }
}

// The rule (secagg_graph.h): t a majority of k + 1, k the smallest even number whose union
// bound of the binomial tail is within the failure probability. Checked against a direct sum
// of the tail, and for monotonicity in n and the dropout rate.
TEST(NeighbourParameters, FollowTheBinomialRule) {
  auto tail = [](std::uint32_t k, double stay, std::uint32_t t) {
    double total = 0;
    for (std::uint32_t j = 0; j < t; ++j) {
      double choose = 1;
      for (std::uint32_t i = 0; i < j; ++i) choose = choose * (k - i) / (i + 1);
      total += choose * std::pow(stay, j) * std::pow(1 - stay, k - j);
    }
    return total;
  };
  for (std::uint32_t n : {100u, 500u, 1000u, 10000u}) {
    for (double dropout : {0.05, 0.1, 0.3}) {
      const NeighbourParameters chosen = choose_neighbour_parameters(n, dropout, 1e-4);
      SCOPED_TRACE(testing::Message() << "n " << n << " dropout " << dropout << " k " << chosen.neighbours);
      ASSERT_EQ(chosen.threshold, neighbourhood_majority(chosen.neighbours));
      if (chosen.neighbours + 1 == n) continue;  // the complete graph: nothing smaller met it
      ASSERT_EQ(chosen.neighbours % 2, 0u);
      EXPECT_LE(n * tail(chosen.neighbours, 1 - dropout, chosen.threshold), 1e-4);
      if (chosen.neighbours > 2) {
        const std::uint32_t smaller = chosen.neighbours - 2;
        EXPECT_GT(n * tail(smaller, 1 - dropout, neighbourhood_majority(smaller)), 1e-4);
      }
    }
  }
  // More devices or more dropouts never need fewer neighbours; a fleet of 10,000 needs far
  // fewer than everyone.
  EXPECT_LE(choose_neighbour_parameters(1000, 0.1).neighbours, choose_neighbour_parameters(10000, 0.1).neighbours);
  EXPECT_LE(choose_neighbour_parameters(1000, 0.1).neighbours, choose_neighbour_parameters(1000, 0.3).neighbours);
  EXPECT_LT(choose_neighbour_parameters(10000, 0.1).neighbours, 200u);
  // 20 devices at 30% dropouts: no graph below everyone meets 1e-4.
  EXPECT_EQ(choose_neighbour_parameters(20, 0.3).neighbours, 19u);
  EXPECT_EQ(choose_neighbour_parameters(20, 0.3).threshold, 11u);
  EXPECT_THROW(choose_neighbour_parameters(100, 0.5), std::invalid_argument);
  EXPECT_THROW(choose_neighbour_parameters(1, 0.1), std::invalid_argument);
  EXPECT_THROW(choose_neighbour_parameters(100, 0.1, 0), std::invalid_argument);
}

TEST(NeighbourParameters, MajorityOfTheHolders) {
  EXPECT_EQ(neighbourhood_majority(2), 2u);   // 3 holders
  EXPECT_EQ(neighbourhood_majority(10), 6u);  // 11 holders
  EXPECT_EQ(neighbourhood_majority(19), 11u); // 20 holders: as check_threshold's t > n/2
}

}  // namespace
}  // namespace edgetrain::privacy
