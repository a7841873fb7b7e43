#include "privacy/secagg_graph.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace edgetrain::privacy {
namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, bound): draws above the largest multiple of bound are rejected.
std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t bound) {
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  for (;;) {
    const std::uint64_t x = splitmix64(state);
    if (x < limit) return x % bound;
  }
}

// P[Bin(trials, p) < needed], summed in log space (trials ≤ 2^16).
double binomial_below(std::uint32_t trials, double p, std::uint32_t needed) {
  if (needed == 0) return 0;
  if (p <= 0) return 1;
  double total = 0;
  for (std::uint32_t j = 0; j < needed && j <= trials; ++j) {
    const double log_term = std::lgamma(trials + 1.0) - std::lgamma(j + 1.0) - std::lgamma(trials - j + 1.0) +
                            j * std::log(p) + (trials - j) * std::log1p(-p);
    total += std::exp(log_term);
  }
  return std::min(total, 1.0);
}

}  // namespace

NeighbourGraph::NeighbourGraph(std::uint32_t devices, std::uint32_t neighbours, std::uint64_t seed) {
  if (devices < 2 || devices > kMaxNeighbourGraphDevices) {
    throw std::invalid_argument("a neighbour graph of " + std::to_string(devices) + " devices: it takes 2 to " +
                                std::to_string(kMaxNeighbourGraphDevices));
  }
  if (neighbours == 0 || neighbours >= devices - 1) {
    degree_ = devices - 1;
  } else if (neighbours % 2 != 0) {
    throw std::invalid_argument(std::to_string(neighbours) + " neighbours for " + std::to_string(devices) +
                                " devices: below n − 1 the number of neighbours must be even (a Harary graph)");
  } else {
    degree_ = neighbours;
  }
  order_.resize(devices);
  for (std::uint32_t i = 0; i < devices; ++i) order_[i] = i;
  std::uint64_t state = seed;
  for (std::uint32_t i = devices - 1; i > 0; --i) {
    std::swap(order_[i], order_[uniform_below(state, std::uint64_t{i} + 1)]);
  }
  position_.resize(devices);
  for (std::uint32_t p = 0; p < devices; ++p) position_[order_[p]] = p;
}

bool NeighbourGraph::adjacent(std::uint32_t a, std::uint32_t b) const {
  const std::uint32_t n = devices();
  if (a >= n || b >= n || a == b) return false;
  if (complete()) return true;
  const std::uint32_t gap = position_[a] > position_[b] ? position_[a] - position_[b] : position_[b] - position_[a];
  return std::min(gap, n - gap) <= degree_ / 2;
}

std::vector<std::uint32_t> NeighbourGraph::neighbours(std::uint32_t device) const {
  const std::uint32_t n = devices();
  if (device >= n) throw std::invalid_argument("device " + std::to_string(device) + " of a graph of " + std::to_string(n));
  std::vector<std::uint32_t> out;
  out.reserve(degree_);
  if (complete()) {
    for (std::uint32_t v = 0; v < n; ++v) {
      if (v != device) out.push_back(v);
    }
    return out;
  }
  const std::uint32_t p = position_[device];
  for (std::uint32_t j = 1; j <= degree_ / 2; ++j) {
    out.push_back(order_[(p + j) % n]);
    out.push_back(order_[(p + n - j) % n]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::uint32_t> NeighbourGraph::holders(std::uint32_t device) const {
  std::vector<std::uint32_t> out = neighbours(device);
  out.insert(std::upper_bound(out.begin(), out.end(), device), device);
  return out;
}

std::uint8_t NeighbourGraph::share_point(std::uint32_t owner, std::uint32_t holder) const {
  if (owner != holder && !adjacent(owner, holder)) return 0;
  if (complete()) return static_cast<std::uint8_t>(holder + 1);
  const std::vector<std::uint32_t> around = holders(owner);
  return static_cast<std::uint8_t>(std::lower_bound(around.begin(), around.end(), holder) - around.begin() + 1);
}

std::size_t NeighbourGraph::components(const std::vector<bool>& present) const {
  const std::uint32_t n = devices();
  if (present.size() != n) throw std::invalid_argument("components: one flag per device");
  std::vector<bool> seen(n, false);
  std::vector<std::uint32_t> stack;
  std::size_t count = 0;
  for (std::uint32_t start = 0; start < n; ++start) {
    if (!present[start] || seen[start]) continue;
    ++count;
    seen[start] = true;
    stack.push_back(start);
    while (!stack.empty()) {
      const std::uint32_t u = stack.back();
      stack.pop_back();
      for (std::uint32_t v : neighbours(u)) {
        if (present[v] && !seen[v]) {
          seen[v] = true;
          stack.push_back(v);
        }
      }
    }
  }
  return count;
}

std::uint32_t neighbourhood_majority(std::uint32_t neighbours) { return (neighbours + 1) / 2 + 1; }

NeighbourParameters choose_neighbour_parameters(std::uint32_t devices, double dropout_rate, double failure_probability) {
  if (devices < 2) throw std::invalid_argument("neighbour parameters for " + std::to_string(devices) + " devices");
  if (!(dropout_rate >= 0 && dropout_rate < 0.5)) {
    throw std::invalid_argument("a dropout rate of " + std::to_string(dropout_rate) +
                                ": it must be in [0, 0.5), a majority of each neighbourhood must stay");
  }
  if (!(failure_probability > 0 && failure_probability < 1)) {
    throw std::invalid_argument("a failure probability of " + std::to_string(failure_probability) +
                                ": it must be in (0, 1)");
  }
  for (std::uint32_t k = 2; k + 1 < devices; k += 2) {
    const std::uint32_t t = neighbourhood_majority(k);
    if (devices * binomial_below(k, 1 - dropout_rate, t) <= failure_probability) return {k, t};
  }
  return {devices - 1, devices / 2 + 1};
}

}  // namespace edgetrain::privacy
