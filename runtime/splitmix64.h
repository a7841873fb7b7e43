// splitmix64: a tiny pseudo-random generator whose output is the same on every platform
// and standard library for a seed, so initializations, shuffles and simulations repeat
// exactly on the host and on the boards.
#pragma once

#include <cstdint>

namespace edgetrain::runtime {

struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // [0, 1) with 24 random bits (every float step) and 53 (every double step).
  float uniform_float() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  double uniform_double() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
};

}  // namespace edgetrain::runtime
