// SecAgg+'s neighbour graph (Bell, Bonawitz, Gascón, Lepoint, Raykova, "Secure Single-Server
// Aggregation with (Poly)Logarithmic Overhead", CCS 2020; docs/privacy.md, "SecAgg+"): instead
// of every device of a round agreeing masks with every other and sharing its secrets with all
// (Bonawitz et al. 2017, secagg.h), each device does so with its k neighbours only, on a
// k-regular graph drawn at random after the keys are fixed, so that a device's work and bytes
// grow with k = O(log n) instead of n.
//
// The graph: the Harary graph H(n, k) (k even: vertex i adjacent to i ± 1, …, i ± k/2 mod n)
// over a permutation π of the devices drawn from a public seed the server announces once U1
// is fixed: devices u and v are neighbours when their positions π⁻¹(u), π⁻¹(v) are at a cyclic
// distance of at most k/2. Devices are numbered by their index in U1 (ordered by identity).
// Bell et al. use the Harary graph over a random permutation as well; these details are ours:
//   - k must be even below n − 1 (H(n, k) for odd k needs an extra "diameter" edge and n
//     even; one more neighbour costs little); k ≥ n − 1, and k = 0, mean the complete graph,
//     which is Bonawitz et al.'s protocol (every device is every other's neighbour);
//   - π: Fisher–Yates driven by SplitMix64 (Steele, Lea, Flood 2014) from the seed, each draw
//     in [0, m) by rejection of the top of the 64-bit range (exactly uniform), integers only,
//     so that an aarch64 worker and an x86-64 server agree bit for bit;
//   - Shamir points: a holder's point for an owner's secrets is 1 + its rank (by U1 index) in
//     the owner's closed neighbourhood {owner} ∪ N(owner); in the complete graph that is
//     today's 1 + index in U1. A neighbourhood has k + 1 ≤ 255 holders (GF(2^8)).
// Pure values: no I/O; a graph of n devices holds 2n integers.
#pragma once

#include <cstdint>
#include <vector>

namespace edgetrain::privacy {

// Most devices a round with neighbours can hold (ours: the graph and the server's state grow
// with n; a neighbourhood, not the round, is bounded by Shamir over GF(2^8)).
inline constexpr std::uint32_t kMaxNeighbourGraphDevices = 1u << 16;

class NeighbourGraph {
 public:
  // Throws std::invalid_argument for fewer than 2 or more than kMaxNeighbourGraphDevices
  // devices, an odd k below n − 1, or k = 1.
  NeighbourGraph(std::uint32_t devices, std::uint32_t neighbours, std::uint64_t seed);

  std::uint32_t devices() const { return static_cast<std::uint32_t>(order_.size()); }
  std::uint32_t degree() const { return degree_; }  // k, or n − 1 when complete
  bool complete() const { return degree_ + 1 == devices(); }
  bool adjacent(std::uint32_t a, std::uint32_t b) const;
  // N(device), ascending; without the device itself.
  std::vector<std::uint32_t> neighbours(std::uint32_t device) const;
  // {device} ∪ N(device), ascending: the holders of the device's shares.
  std::vector<std::uint32_t> holders(std::uint32_t device) const;
  // The Shamir point of `holder`'s shares of `owner`'s secrets: 1 + rank in holders(owner);
  // 0 when holder holds none of them.
  std::uint8_t share_point(std::uint32_t owner, std::uint32_t holder) const;
  // The connected components of the subgraph on the devices marked present (one flag per
  // device). Masks cancel within a component, so a server that unmasked the survivors of a
  // graph in several components could read each component's sum: secagg.h refuses that.
  std::size_t components(const std::vector<bool>& present) const;

 private:
  std::uint32_t degree_ = 0;
  std::vector<std::uint32_t> order_;     // π: position → device
  std::vector<std::uint32_t> position_;  // π⁻¹: device → position
};

// The parameters of a round with neighbours (ours, after Bell et al.'s k = O(log n) for a
// fixed failure probability): t is a majority of a neighbourhood's k + 1 holders, the rule
// that keeps the server from collecting both secrets of one device from two disjoint groups
// (secagg.h); k is the smallest even number for which, with each neighbour dropping
// independently with probability `dropout_rate`, the chance that some neighbourhood of the n
// keeps fewer than t of its k neighbours (so that a dropped device's masks could not be
// removed: the attempt is redone) is at most `failure_probability` (a union bound over the n
// neighbourhoods of the binomial tail). When no k below n − 1 reaches it, the complete graph
// (k = n − 1, t a majority of n). Throws std::invalid_argument for n < 2, a dropout rate
// outside [0, 0.5) (a majority of neighbours must stay) or a failure probability outside (0, 1).
struct NeighbourParameters {
  std::uint32_t neighbours = 0;  // k (n − 1: everyone)
  std::uint32_t threshold = 0;   // t
};
NeighbourParameters choose_neighbour_parameters(std::uint32_t devices, double dropout_rate,
                                                double failure_probability = 1e-4);
// ⌊(k + 1)/2⌋ + 1: the smallest majority of a neighbourhood's k + 1 holders.
std::uint32_t neighbourhood_majority(std::uint32_t neighbours);

}  // namespace edgetrain::privacy
