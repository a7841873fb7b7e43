#include "privacy/secagg_crypto.h"

#include <mbedtls/bignum.h>
#include <mbedtls/chacha20.h>
#include <mbedtls/chachapoly.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecdh.h>
#include <mbedtls/ecp.h>
#include <mbedtls/entropy.h>
#include <mbedtls/hkdf.h>
#include <mbedtls/md.h>
#include <mbedtls/platform_util.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace edgetrain::privacy {
namespace {

void check(int status, const char* what) {
  if (status != 0) throw CryptoError(std::string(what) + " failed (Mbed TLS error " + std::to_string(status) + ")");
}

// RAII holders of the Mbed TLS structures one X25519 operation needs.
struct Curve {
  mbedtls_ecp_group group;
  Curve() {
    mbedtls_ecp_group_init(&group);
    check(mbedtls_ecp_group_load(&group, MBEDTLS_ECP_DP_CURVE25519), "mbedtls_ecp_group_load(Curve25519)");
  }
  ~Curve() { mbedtls_ecp_group_free(&group); }
  Curve(const Curve&) = delete;
  Curve& operator=(const Curve&) = delete;
};
struct Point {
  mbedtls_ecp_point point;
  Point() { mbedtls_ecp_point_init(&point); }
  ~Point() { mbedtls_ecp_point_free(&point); }
  Point(const Point&) = delete;
  Point& operator=(const Point&) = delete;
};
struct Number {
  mbedtls_mpi value;
  Number() { mbedtls_mpi_init(&value); }
  ~Number() { mbedtls_mpi_free(&value); }  // mbedtls_mpi_free zeroizes
  Number(const Number&) = delete;
  Number& operator=(const Number&) = delete;
};
struct KeyPair {
  mbedtls_ecp_keypair pair;
  KeyPair() { mbedtls_ecp_keypair_init(&pair); }
  ~KeyPair() { mbedtls_ecp_keypair_free(&pair); }
  KeyPair(const KeyPair&) = delete;
  KeyPair& operator=(const KeyPair&) = delete;
};

// mbedtls_ecp_read_key clamps a Montgomery private key as RFC 7748 says (bits 0-2 and 255
// cleared, bit 254 set), so any 32 random bytes make a valid key.
void read_private_key(KeyPair& key, const Key32& private_key) {
  check(mbedtls_ecp_read_key(MBEDTLS_ECP_DP_CURVE25519, &key.pair, private_key.data(), private_key.size()),
        "mbedtls_ecp_read_key");
}

Key32 write_point(const mbedtls_ecp_group& group, const mbedtls_ecp_point& point) {
  Key32 out{};
  std::size_t length = 0;
  check(mbedtls_ecp_point_write_binary(&group, &point, MBEDTLS_ECP_PF_UNCOMPRESSED, &length, out.data(), out.size()),
        "mbedtls_ecp_point_write_binary");
  if (length != out.size()) throw CryptoError("an X25519 public key is not 32 bytes");
  return out;
}

// The key stream in blocks of this many bytes, added into the ring as it comes.
constexpr std::size_t kStreamChunk = 4096;

template <bool kSubtract>
void apply_mask(std::span<std::uint32_t> ring, const Key32& seed) {
  mbedtls_chacha20_context chacha;
  mbedtls_chacha20_init(&chacha);
  const Nonce12 nonce{};  // all zero: the seed is used for this one stream only
  int status = mbedtls_chacha20_setkey(&chacha, seed.data());
  if (status == 0) status = mbedtls_chacha20_starts(&chacha, nonce.data(), 0);
  static constexpr std::uint8_t kZeros[kStreamChunk] = {};
  std::uint8_t stream[kStreamChunk];
  for (std::size_t done = 0; status == 0 && done < ring.size();) {
    const std::size_t values = std::min(kStreamChunk / 4, ring.size() - done);
    // Whole chunks keep the stream's position a multiple of 4 bytes: value i is always
    // bytes 4i..4i+3 of the stream, however the ring is split.
    status = mbedtls_chacha20_update(&chacha, values * 4, kZeros, stream);
    for (std::size_t i = 0; i < values; ++i) {
      const std::uint32_t word = std::uint32_t{stream[4 * i]} | std::uint32_t{stream[4 * i + 1]} << 8 |
                                 std::uint32_t{stream[4 * i + 2]} << 16 | std::uint32_t{stream[4 * i + 3]} << 24;
      if constexpr (kSubtract) {
        ring[done + i] -= word;
      } else {
        ring[done + i] += word;
      }
    }
    done += values;
  }
  mbedtls_platform_zeroize(stream, sizeof stream);
  mbedtls_chacha20_free(&chacha);
  check(status, "ChaCha20 mask expansion");
}

}  // namespace

struct SecureRandom::State {
  mbedtls_entropy_context entropy;
  mbedtls_ctr_drbg_context drbg;
};

SecureRandom::SecureRandom() : state_(std::make_unique<State>()) {
  mbedtls_entropy_init(&state_->entropy);
  mbedtls_ctr_drbg_init(&state_->drbg);
  static constexpr char kPersonalization[] = "edgetrain-secagg-v1 random";
  const int status = mbedtls_ctr_drbg_seed(&state_->drbg, mbedtls_entropy_func, &state_->entropy,
                                           reinterpret_cast<const unsigned char*>(kPersonalization),
                                           sizeof kPersonalization - 1);
  if (status != 0) {
    mbedtls_ctr_drbg_free(&state_->drbg);
    mbedtls_entropy_free(&state_->entropy);
    check(status, "mbedtls_ctr_drbg_seed");
  }
}

SecureRandom::~SecureRandom() {
  mbedtls_ctr_drbg_free(&state_->drbg);
  mbedtls_entropy_free(&state_->entropy);
}

void SecureRandom::fill(std::span<std::uint8_t> out) {
  // CTR_DRBG serves at most MBEDTLS_CTR_DRBG_MAX_REQUEST bytes per call.
  for (std::size_t done = 0; done < out.size();) {
    const std::size_t n = std::min<std::size_t>(MBEDTLS_CTR_DRBG_MAX_REQUEST, out.size() - done);
    check(mbedtls_ctr_drbg_random(&state_->drbg, out.data() + done, n), "mbedtls_ctr_drbg_random");
    done += n;
  }
}

Key32 SecureRandom::key() {
  Key32 out{};
  fill(out);
  return out;
}

int SecureRandom::mbedtls_callback(void* self, unsigned char* out, std::size_t length) {
  try {
    static_cast<SecureRandom*>(self)->fill({out, length});
    return 0;
  } catch (const CryptoError&) {
    return MBEDTLS_ERR_CTR_DRBG_ENTROPY_SOURCE_FAILED;
  }
}

X25519KeyPair x25519_generate(SecureRandom& random) {
  Key32 bytes = random.key();
  KeyPair key;
  read_private_key(key, bytes);
  mbedtls_platform_zeroize(bytes.data(), bytes.size());
  X25519KeyPair out;
  check(mbedtls_ecp_write_key(&key.pair, out.private_key.data(), out.private_key.size()), "mbedtls_ecp_write_key");
  out.public_key = x25519_public_key(out.private_key, random);
  return out;
}

Key32 x25519_public_key(const Key32& private_key, SecureRandom& random) {
  KeyPair key;
  read_private_key(key, private_key);
  Point q;
  check(mbedtls_ecp_mul(&key.pair.grp, &q.point, &key.pair.d, &key.pair.grp.G, SecureRandom::mbedtls_callback, &random),
        "mbedtls_ecp_mul");
  return write_point(key.pair.grp, q.point);
}

Key32 x25519_shared_secret(const Key32& private_key, const Key32& peer_public_key, SecureRandom& random) {
  KeyPair key;
  read_private_key(key, private_key);
  Point peer;
  if (mbedtls_ecp_point_read_binary(&key.pair.grp, &peer.point, peer_public_key.data(), peer_public_key.size()) != 0 ||
      mbedtls_ecp_check_pubkey(&key.pair.grp, &peer.point) != 0) {
    throw std::invalid_argument("not an X25519 public key");
  }
  Number z;
  check(mbedtls_ecdh_compute_shared(&key.pair.grp, &z.value, &peer.point, &key.pair.d, SecureRandom::mbedtls_callback,
                                    &random),
        "mbedtls_ecdh_compute_shared");
  if (mbedtls_mpi_cmp_int(&z.value, 0) == 0) {
    throw std::invalid_argument("X25519 gave the all-zero shared secret (a low-order public key)");
  }
  Key32 out{};
  check(mbedtls_mpi_write_binary_le(&z.value, out.data(), out.size()), "mbedtls_mpi_write_binary_le");
  return out;
}

Key32 derive_pair_seed(const Key32& shared_secret, SeedPurpose purpose, std::uint64_t round,
                       std::string_view identity_a, std::string_view identity_b) {
  if (identity_b < identity_a) std::swap(identity_a, identity_b);
  static constexpr std::string_view kLabel = "edgetrain-secagg-v1";
  std::vector<std::uint8_t> info(kLabel.begin(), kLabel.end());
  info.push_back(static_cast<std::uint8_t>(purpose));
  for (int i = 0; i < 8; ++i) info.push_back(static_cast<std::uint8_t>(round >> (8 * i)));
  for (std::string_view identity : {identity_a, identity_b}) {
    const auto length = static_cast<std::uint32_t>(identity.size());
    for (int i = 0; i < 4; ++i) info.push_back(static_cast<std::uint8_t>(length >> (8 * i)));
    info.insert(info.end(), identity.begin(), identity.end());
  }
  Key32 out{};
  check(mbedtls_hkdf(mbedtls_md_info_from_type(MBEDTLS_MD_SHA256), nullptr, 0, shared_secret.data(),
                     shared_secret.size(), info.data(), info.size(), out.data(), out.size()),
        "mbedtls_hkdf");
  return out;
}

void add_mask(std::span<std::uint32_t> ring, const Key32& seed) { apply_mask<false>(ring, seed); }
void subtract_mask(std::span<std::uint32_t> ring, const Key32& seed) { apply_mask<true>(ring, seed); }

std::vector<std::uint32_t> expand_mask(const Key32& seed, std::size_t count) {
  std::vector<std::uint32_t> out(count, 0);
  add_mask(out, seed);
  return out;
}

std::vector<std::uint8_t> aead_seal(const Key32& key, const Nonce12& nonce, std::span<const std::uint8_t> aad,
                                    std::span<const std::uint8_t> plaintext) {
  std::vector<std::uint8_t> out(plaintext.size() + kAeadTagBytes);
  mbedtls_chachapoly_context context;
  mbedtls_chachapoly_init(&context);
  int status = mbedtls_chachapoly_setkey(&context, key.data());
  if (status == 0) {
    status = mbedtls_chachapoly_encrypt_and_tag(&context, plaintext.size(), nonce.data(), aad.data(), aad.size(),
                                                plaintext.data(), out.data(), out.data() + plaintext.size());
  }
  mbedtls_chachapoly_free(&context);
  check(status, "ChaCha20-Poly1305 encryption");
  return out;
}

std::vector<std::uint8_t> aead_open(const Key32& key, const Nonce12& nonce, std::span<const std::uint8_t> aad,
                                    std::span<const std::uint8_t> sealed) {
  if (sealed.size() < kAeadTagBytes) throw std::invalid_argument("a sealed share is shorter than its tag");
  const std::size_t length = sealed.size() - kAeadTagBytes;
  std::vector<std::uint8_t> out(length);
  mbedtls_chachapoly_context context;
  mbedtls_chachapoly_init(&context);
  int status = mbedtls_chachapoly_setkey(&context, key.data());
  if (status == 0) {
    status = mbedtls_chachapoly_auth_decrypt(&context, length, nonce.data(), aad.data(), aad.size(),
                                             sealed.data() + length, sealed.data(), out.data());
  }
  mbedtls_chachapoly_free(&context);
  if (status == MBEDTLS_ERR_CHACHAPOLY_AUTH_FAILED) {
    throw std::invalid_argument("a sealed share failed authentication (forged, damaged or not addressed to us)");
  }
  check(status, "ChaCha20-Poly1305 decryption");
  return out;
}

}  // namespace edgetrain::privacy
