#include "privacy/subset.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace edgetrain::privacy {
namespace {

// SplitMix64's output function (Steele, Lea, Flood 2014): a bijection of 64-bit words.
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return mix(state_ += 0x9e3779b97f4a7c15ull); }
  // In [0, bound): the high word of x · bound (no division; the bias is below bound / 2^64).
  std::uint64_t below(std::uint64_t bound) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next()) * bound) >> 64);
  }

 private:
  std::uint64_t state_;
};

}  // namespace

std::uint32_t subset_length(double fraction, std::uint32_t vector_length) {
  if (!(fraction > 0 && fraction <= 1))
    throw std::invalid_argument("the subset fraction must be in (0, 1], not " + std::to_string(fraction));
  if (vector_length == 0) throw std::invalid_argument("a subset of a zero-length vector");
  const double wanted = std::round(fraction * static_cast<double>(vector_length));
  if (wanted < 1) return 1;
  if (wanted >= vector_length) return vector_length;
  return static_cast<std::uint32_t>(wanted);
}

std::uint64_t subset_seed(std::uint64_t model_id, std::uint64_t session) { return mix(model_id ^ mix(session)); }

std::vector<std::uint32_t> subset_indices(std::uint64_t seed, std::uint32_t vector_length, std::uint32_t length) {
  if (length == 0 || length > vector_length)
    throw std::invalid_argument("a subset of " + std::to_string(length) + " entries of a vector of " +
                                std::to_string(vector_length));
  std::vector<std::uint32_t> out;
  out.reserve(length);
  SplitMix64 random(seed);
  // Algorithm S: entry i is taken with probability (still needed) / (entries left).
  for (std::uint32_t i = 0; i < vector_length && out.size() < length; ++i) {
    const std::uint64_t needed = length - out.size();
    if (random.below(vector_length - i) < needed) out.push_back(i);
  }
  return out;
}

}  // namespace edgetrain::privacy
