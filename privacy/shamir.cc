#include "privacy/shamir.h"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "privacy/secagg_crypto.h"

namespace edgetrain::privacy {
namespace {

// Multiplication in GF(2^8) modulo x^8 + x^4 + x^3 + x + 1, without branches on the
// operands' values (a secret's bytes go through here).
std::uint8_t gf_mul(std::uint8_t a, std::uint8_t b) {
  std::uint8_t product = 0;
  for (int i = 0; i < 8; ++i) {
    product ^= static_cast<std::uint8_t>(-(b & 1) & a);
    const auto carry = static_cast<std::uint8_t>(-(a >> 7) & 0x1b);
    a = static_cast<std::uint8_t>((a << 1) ^ carry);
    b >>= 1;
  }
  return product;
}

// a^254 = a^-1 for a ≠ 0 (the multiplicative group has order 255).
std::uint8_t gf_inverse(std::uint8_t a) {
  std::uint8_t result = 1;
  std::uint8_t power = a;
  for (int e = 254; e > 0; e >>= 1) {
    if (e & 1) result = gf_mul(result, power);
    power = gf_mul(power, power);
  }
  return result;
}

void check_points(std::span<const std::uint8_t> xs) {
  std::array<bool, 256> seen{};
  for (std::uint8_t x : xs) {
    if (x == 0) throw std::invalid_argument("Shamir: share point 0 is the secret itself, never a share");
    if (seen[x]) throw std::invalid_argument("Shamir: share point " + std::to_string(x) + " given twice");
    seen[x] = true;
  }
}

}  // namespace

std::vector<ShamirShare> shamir_split(std::span<const std::uint8_t> secret, unsigned threshold,
                                      std::span<const std::uint8_t> xs, SecureRandom& random) {
  if (threshold < 1) throw std::invalid_argument("Shamir: the threshold must be at least 1");
  if (xs.size() < threshold) {
    throw std::invalid_argument("Shamir: " + std::to_string(xs.size()) + " holders for a threshold of " +
                                std::to_string(threshold));
  }
  check_points(xs);
  std::vector<ShamirShare> shares(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    shares[i].x = xs[i];
    shares[i].y.resize(secret.size());
  }
  std::vector<std::uint8_t> coefficients(threshold);
  for (std::size_t byte = 0; byte < secret.size(); ++byte) {
    coefficients[0] = secret[byte];
    random.fill(std::span(coefficients).subspan(1));
    for (ShamirShare& share : shares) {  // Horner, highest degree first
      std::uint8_t value = 0;
      for (std::size_t k = threshold; k-- > 0;) value = static_cast<std::uint8_t>(gf_mul(value, share.x) ^ coefficients[k]);
      share.y[byte] = value;
    }
  }
  std::fill(coefficients.begin(), coefficients.end(), 0);
  return shares;
}

std::vector<std::uint8_t> shamir_interpolate(std::span<const ShamirShare> shares) {
  if (shares.empty()) throw std::invalid_argument("Shamir: no shares");
  std::vector<std::uint8_t> xs;
  for (const ShamirShare& share : shares) {
    if (share.y.size() != shares[0].y.size()) throw std::invalid_argument("Shamir: shares of unequal length");
    xs.push_back(share.x);
  }
  check_points(xs);
  // Lagrange basis at 0: l_i(0) = Π_{j≠i} x_j / (x_j − x_i), and − is ^ in GF(2^8).
  std::vector<std::uint8_t> secret(shares[0].y.size(), 0);
  for (std::size_t i = 0; i < shares.size(); ++i) {
    std::uint8_t numerator = 1;
    std::uint8_t denominator = 1;
    for (std::size_t j = 0; j < shares.size(); ++j) {
      if (j == i) continue;
      numerator = gf_mul(numerator, shares[j].x);
      denominator = gf_mul(denominator, static_cast<std::uint8_t>(shares[j].x ^ shares[i].x));
    }
    const std::uint8_t basis = gf_mul(numerator, gf_inverse(denominator));
    for (std::size_t byte = 0; byte < secret.size(); ++byte) secret[byte] ^= gf_mul(basis, shares[i].y[byte]);
  }
  return secret;
}

std::vector<std::uint8_t> shamir_reconstruct(std::span<const ShamirShare> shares, unsigned threshold) {
  if (threshold < 1) throw std::invalid_argument("Shamir: the threshold must be at least 1");
  if (shares.size() < threshold) {
    throw std::invalid_argument("Shamir: " + std::to_string(shares.size()) + " shares, fewer than the threshold " +
                                std::to_string(threshold));
  }
  std::vector<ShamirShare> sorted(shares.begin(), shares.end());
  std::sort(sorted.begin(), sorted.end(), [](const ShamirShare& a, const ShamirShare& b) { return a.x < b.x; });
  // Refuse a repeated point among all of them, not only among the first t.
  std::vector<std::uint8_t> xs;
  for (const ShamirShare& share : sorted) xs.push_back(share.x);
  check_points(xs);
  sorted.resize(threshold);
  return shamir_interpolate(sorted);
}

}  // namespace edgetrain::privacy
