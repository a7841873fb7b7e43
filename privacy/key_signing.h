// Signatures by the devices' X.509 identities for secure aggregation against an active server
// (Bonawitz et al. 2017, §4's malicious-server variant: round 0 with a PKI and round 3, the
// consistency check). A device signs what it advertises with its certificate's private key
// (the one its DTLS handshake proves), and every other device checks the signature against
// the certificate the server relays: chained to the fleet's CA that it already trusts, with a
// subject CN equal to the identity the entry claims. The server relays but cannot forge: it
// has no device's private key.
//
// A thin wrapper of Mbed TLS 2.28's libmbedx509 and libmbedcrypto (mbedtls_x509_crt_verify,
// mbedtls_pk_sign / mbedtls_pk_verify over SHA-256); no Mbed TLS type in this header. Any key
// type Mbed TLS's pk layer signs with works (the fleet's certificates are EC P-256:
// boards/fleet-certificates.sh; RSA works too). Ours: the CA signs device certificates
// directly (no intermediate: a device posts one certificate); a certificate must allow
// digitalSignature when it has a key-usage extension; it must be within its validity dates.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "privacy/secagg.h"

namespace edgetrain::privacy {

// The fleet's CA, as every device and the server already trust it for DTLS (--ca). Immutable
// once loaded: may be shared by threads.
class CertificateAuthority {
 public:
  // Throws std::invalid_argument naming the file when it is not readable PEM (or DER).
  static std::shared_ptr<const CertificateAuthority> from_file(const std::string& path);
  static std::shared_ptr<const CertificateAuthority> from_pem(std::string_view pem);
  ~CertificateAuthority();
  struct State;
  const State& state() const { return *state_; }

 private:
  CertificateAuthority();
  std::unique_ptr<State> state_;
};

// A certificate another device posted, checked by `check_peer_certificate`: its public key
// verifies that device's signatures. Immutable.
class PeerCertificate {
 public:
  ~PeerCertificate();
  PeerCertificate(PeerCertificate&&) noexcept;
  PeerCertificate& operator=(PeerCertificate&&) noexcept;
  // True when `signature` is this certificate's key's signature over SHA-256(message).
  bool verifies(std::span<const std::uint8_t> message, std::span<const std::uint8_t> signature) const;
  struct State;

 private:
  friend PeerCertificate check_peer_certificate(const CertificateAuthority&, std::span<const std::uint8_t>,
                                                std::string_view);
  PeerCertificate();
  std::unique_ptr<State> state_;
};

// Parses a DER certificate from the network and checks it: chained to `ca` (signature and
// validity dates), subject CN equal to `identity`, digitalSignature allowed. Throws
// SecAggError naming the identity and what failed.
PeerCertificate check_peer_certificate(const CertificateAuthority& ca, std::span<const std::uint8_t> der,
                                       std::string_view identity);

// This device's certificate and private key (the DTLS ones: --cert and --cert-key). Not
// thread-safe to sign from two threads at once; the worker has one thread.
class DeviceCredentials {
 public:
  // Throws std::invalid_argument naming the file that does not read, or when the key is not
  // the certificate's.
  static std::shared_ptr<DeviceCredentials> from_files(const std::string& certificate_file,
                                                       const std::string& private_key_file);
  static std::shared_ptr<DeviceCredentials> from_pem(std::string_view certificate_pem, std::string_view key_pem);
  ~DeviceCredentials();
  const std::string& common_name() const { return common_name_; }  // the certificate's subject CN
  const std::vector<std::uint8_t>& certificate_der() const { return certificate_der_; }
  // The signature over SHA-256(message) with the private key (ECDSA: DER, at most 72 bytes
  // for P-256); `random` blinds it. Throws CryptoError when Mbed TLS fails.
  std::vector<std::uint8_t> sign(std::span<const std::uint8_t> message, SecureRandom& random);
  struct State;

 private:
  DeviceCredentials();
  std::unique_ptr<State> state_;
  std::string common_name_;
  std::vector<std::uint8_t> certificate_der_;
};

// What is signed (ours), each beginning with its own label so that one signature can never
// stand for the other:
//   the keys:     "edgetrain-secagg-v1 signed keys" ‖ session (8 bytes LE) ‖ identity (its
//                 length as 4 bytes LE, its bytes) ‖ c^PK (32) ‖ s^PK (32)
//   the survivors: "edgetrain-secagg-v1 consistency" ‖ session ‖ |U3| (4 bytes LE) ‖ each
//                 identity of U3 in byte order, length-prefixed as above
// The session is the round's field of the messages (server/secure_round.h: round and attempt).
std::vector<std::uint8_t> signed_keys_bytes(const AdvertiseKeys& keys);
std::vector<std::uint8_t> signed_survivors_bytes(std::uint64_t session, std::span<const std::string> survivors);

}  // namespace edgetrain::privacy
