// The cryptographic primitives of secure aggregation (privacy/README.md), each a thin
// wrapper of Mbed TLS 2.28's libmbedcrypto so that the protocol code (secagg.h) never sees
// an Mbed TLS type: X25519 key agreement (mbedtls_ecp / mbedtls_ecdh on
// MBEDTLS_ECP_DP_CURVE25519), HKDF-SHA256 seeds, ChaCha20 as the mask generator and
// ChaCha20-Poly1305 for the shares devices send each other through the server. Every
// random byte comes from SecureRandom (CTR_DRBG seeded by the kernel's entropy).
//
// What is ours and not Bonawitz et al.'s (they leave the instantiation open): the HKDF
// context strings, the all-zero nonce of the mask generator, the nonce rule of the share
// encryption and the little-endian reading of the key stream as uint32 values.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace edgetrain::privacy {

inline constexpr std::size_t kKeyBytes = 32;  // X25519 keys and secrets, seeds, AEAD keys
using Key32 = std::array<std::uint8_t, kKeyBytes>;

// A failure of Mbed TLS itself (out of memory, no entropy): not the peer's fault.
class CryptoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// CTR_DRBG (AES-256) seeded from mbedtls_entropy, whose Linux source is getrandom(2); the
// only source of keys, self-mask seeds, Shamir coefficients and stochastic rounding. Not
// thread-safe: one per thread (a device has one).
class SecureRandom {
 public:
  SecureRandom();  // throws CryptoError when the kernel gives no entropy
  ~SecureRandom();
  SecureRandom(const SecureRandom&) = delete;
  SecureRandom& operator=(const SecureRandom&) = delete;

  void fill(std::span<std::uint8_t> out);
  Key32 key();
  // Mbed TLS's f_rng signature, with this object as p_rng.
  static int mbedtls_callback(void* self, unsigned char* out, std::size_t length);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// X25519 (RFC 7748). A private key is the 32-byte string of RFC 7748 as Mbed TLS writes it
// (mbedtls_ecp_write_key: the clamped scalar, little-endian); a public key the 32-byte
// u-coordinate.
struct X25519KeyPair {
  Key32 private_key{};
  Key32 public_key{};
};
X25519KeyPair x25519_generate(SecureRandom& random);
// The public key of a private key (the server checks a reconstructed mask key with it).
Key32 x25519_public_key(const Key32& private_key, SecureRandom& random);
// The shared secret. Throws std::invalid_argument for a public key that is not a curve
// point's u-coordinate or that gives the all-zero secret (a low-order point: RFC 7748 §6.1
// says to check; ours to refuse rather than go on with a known seed).
Key32 x25519_shared_secret(const Key32& private_key, const Key32& peer_public_key, SecureRandom& random);

// What a pair's seed is for: the same shared secret must never give the same seed twice.
enum class SeedPurpose : std::uint8_t {
  kPairwiseMask = 1,     // s_uv: the pairwise mask of devices u and v
  kShareEncryption = 2,  // k_uv: the key of the shares u and v send each other
};
// HKDF-SHA256 (RFC 5869), no salt, over the shared secret, with info = "edgetrain-secagg-v1",
// the purpose byte, the round (8 bytes, little-endian) and both identities in byte order
// (each after its length as 4 bytes, little-endian), so that both sides derive the same seed
// and a seed is bound to its round and pair (ours).
Key32 derive_pair_seed(const Key32& shared_secret, SeedPurpose purpose, std::uint64_t round,
                       std::string_view identity_a, std::string_view identity_b);

// The mask generator: ChaCha20 (RFC 8439) keyed by the seed, nonce all zero, block counter
// from 0; the key stream read as little-endian uint32 values (ours). A seed is only ever
// used for one stream: pairwise seeds are bound to their round and pair, self-mask seeds are
// fresh per round.
//   add_mask:      ring[i] += PRG(seed)[i]  (mod 2^32)
//   subtract_mask: ring[i] -= PRG(seed)[i]  (mod 2^32)
void add_mask(std::span<std::uint32_t> ring, const Key32& seed);
void subtract_mask(std::span<std::uint32_t> ring, const Key32& seed);
std::vector<std::uint32_t> expand_mask(const Key32& seed, std::size_t count);

// ChaCha20-Poly1305 (RFC 8439): the ciphertext followed by its 16-byte tag.
inline constexpr std::size_t kAeadTagBytes = 16;
using Nonce12 = std::array<std::uint8_t, 12>;
std::vector<std::uint8_t> aead_seal(const Key32& key, const Nonce12& nonce, std::span<const std::uint8_t> aad,
                                    std::span<const std::uint8_t> plaintext);
// Throws std::invalid_argument when the tag does not match (a forged, damaged or misaddressed
// ciphertext) or the input is shorter than a tag.
std::vector<std::uint8_t> aead_open(const Key32& key, const Nonce12& nonce, std::span<const std::uint8_t> aad,
                                    std::span<const std::uint8_t> sealed);

}  // namespace edgetrain::privacy
