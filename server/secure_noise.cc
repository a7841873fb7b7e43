#include "server/secure_noise.h"

#include <sys/random.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace edgetrain::server {
namespace {

// Uniform doubles in (0, 1) from getrandom, a buffer at a time.
class SecureUniform {
 public:
  double next() {
    if (at_ == buffer_.size()) refill();
    const std::uint64_t bits = buffer_[at_++] >> 11;            // 53 bits
    return (static_cast<double>(bits) + 0.5) * 0x1.0p-53;        // never 0 or 1
  }

 private:
  void refill() {
    auto* bytes = reinterpret_cast<unsigned char*>(buffer_.data());
    std::size_t got = 0;
    const std::size_t wanted = buffer_.size() * sizeof(std::uint64_t);
    while (got < wanted) {
      const ssize_t n = getrandom(bytes + got, wanted - got, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
      }
      got += static_cast<std::size_t>(n);
    }
    at_ = 0;
  }
  std::vector<std::uint64_t> buffer_ = std::vector<std::uint64_t>(4096);
  std::size_t at_ = 4096;
};

}  // namespace

void add_secure_gaussian_noise(std::span<float> values, double stddev) {
  if (!(stddev >= 0) || !std::isfinite(stddev))
    throw std::invalid_argument("the noise's standard deviation must be finite and >= 0");
  if (stddev == 0) return;
  SecureUniform uniform;
  for (std::size_t i = 0; i < values.size(); i += 2) {
    const double radius = std::sqrt(-2 * std::log(uniform.next()));
    const double angle = 2 * M_PI * uniform.next();
    values[i] = static_cast<float>(values[i] + stddev * radius * std::cos(angle));
    if (i + 1 < values.size())
      values[i + 1] = static_cast<float>(values[i + 1] + stddev * radius * std::sin(angle));
  }
}

}  // namespace edgetrain::server
