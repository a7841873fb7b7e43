// splitmix64: a tiny pseudo-random generator whose output is the same on every platform
// and standard library for a seed, so initializations, shuffles and simulations repeat
// exactly on the host and on the boards.
#pragma once

#include <cmath>
#include <cstddef>
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

// Standard normal draws from a SplitMix64 stream (Box–Muller, both values of a pair used):
// a generator's noise vectors (MD-GAN's z of size 100), the same sequence for a seed. The
// transcendental functions come from the C library, so two platforms may differ in a last
// bit; one platform repeats itself exactly.
class GaussianSampler {
 public:
  explicit GaussianSampler(std::uint64_t seed) : bits_{seed} {}
  float next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1]: log(0) never happens.
    const double u1 = 1.0 - bits_.uniform_double(), u2 = bits_.uniform_double();
    const double radius = std::sqrt(-2.0 * std::log(u1)), angle = 6.283185307179586 * u2;
    spare_ = static_cast<float>(radius * std::sin(angle));
    has_spare_ = true;
    return static_cast<float>(radius * std::cos(angle));
  }
  void fill(float* out, std::size_t n) {
    for (std::size_t i = 0; i < n; i++) out[i] = next();
  }

 private:
  SplitMix64 bits_;
  float spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace edgetrain::runtime
