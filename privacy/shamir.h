// Shamir's t-of-n secret sharing (Shamir 1979) over GF(2^8), byte by byte: each byte of the
// secret is the constant term of its own random polynomial of degree t − 1, and share x holds
// the polynomial values at x. Secure aggregation shares each device's mask private key and
// self-mask seed this way (privacy/README.md).
//
// Ours: GF(2^8) with the AES polynomial x^8 + x^4 + x^3 + x + 1 (Bonawitz et al. use a prime
// field; a byte field shares a 32-byte key as 32 one-byte secrets with no encoding), so a
// round has at most 255 share holders (x = 1..255; x = 0 would be the secret itself).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace edgetrain::privacy {

class SecureRandom;

struct ShamirShare {
  std::uint8_t x = 0;             // the holder's point, 1..255
  std::vector<std::uint8_t> y;    // one value per byte of the secret
  bool operator==(const ShamirShare&) const = default;
};

// One share per point of `xs` (distinct, nonzero), any `threshold` of which give the secret
// back. Throws std::invalid_argument for threshold < 1, fewer points than the threshold,
// a zero or repeated point.
std::vector<ShamirShare> shamir_split(std::span<const std::uint8_t> secret, unsigned threshold,
                                      std::span<const std::uint8_t> xs, SecureRandom& random);

// Lagrange interpolation at 0 through all the shares given, whatever their number: with fewer
// than the threshold it returns a value unrelated to the secret (what the tests show). Throws
// std::invalid_argument for no shares, a zero or repeated point, or shares of unequal length.
std::vector<std::uint8_t> shamir_interpolate(std::span<const ShamirShare> shares);

// The secret from at least `threshold` shares (the first `threshold` of them by point, which
// any consistent set agrees on). Throws std::invalid_argument with fewer, and for the
// interpolation's refusals.
std::vector<std::uint8_t> shamir_reconstruct(std::span<const ShamirShare> shares, unsigned threshold);

}  // namespace edgetrain::privacy
