// Secure aggregation against an active server (Bonawitz et al. 2017, §4, the malicious-server
// additions), over the semi-honest protocol of secagg.h, with the signatures of
// key_signing.h:
//
//   0 AdvertiseKeys   device → server  SignedKeys: its keys, its certificate, and its signature
//                                      over (session, identity, c^PK, s^PK)
//                     server → devices SignedKeyDirectory: the KeyDirectory and each entry's
//                                      certificate and signature; every device checks every
//                                      entry (the certificate chains to the CA it trusts, its
//                                      CN is the entry's identity, the signature is over
//                                      exactly those keys and this session) and refuses the
//                                      round at the first bad one: a substituted key is found
//   1, 2              as secagg.h
//   3 Consistency     server → devices SurvivorList U3, as before
//                     device → server  ConsistencySignature: its signature over (session, U3)
//                     server → devices ConsistencySignatures: the signatures it gathered
//   4 Unmasking       a device answers only when it holds at least t valid signatures, all
//                     over the list it was given, from distinct devices of that list, and no
//                     invalid one; a server that told two devices different lists would need
//                     t signatures over each, and t > n/2 honest signers cannot sign both.
//
// SignedSecAggDevice wraps SecAggDevice and holds the order: no share of a secret leaves it
// before the consistency check passed. ConsistencyRound is the server's step 3 (it checks
// each signature too, so that one device's bad signature does not make everyone refuse).
//
// Messages (ours, the header of secagg_messages.h): type bytes 20..23 (apart from 1..6 and
// whatever else secagg_messages.h adds); a certificate is DER of 1..4096 bytes and a
// signature 1..1024 bytes, each after its length (2 bytes LE).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "privacy/key_signing.h"
#include "privacy/secagg.h"

namespace edgetrain::privacy {

inline constexpr std::uint8_t kSignedKeysType = 20;
inline constexpr std::uint8_t kSignedKeyDirectoryType = 21;
inline constexpr std::uint8_t kConsistencySignatureType = 22;
inline constexpr std::uint8_t kConsistencySignaturesType = 23;
inline constexpr std::size_t kMaxCertificateBytes = 4096;
inline constexpr std::size_t kMaxSignatureBytes = 1024;

struct KeyCredential {
  std::vector<std::uint8_t> certificate;  // DER
  std::vector<std::uint8_t> signature;    // over signed_keys_bytes(keys)
  bool operator==(const KeyCredential&) const = default;
};
struct SignedKeys {
  AdvertiseKeys keys;
  KeyCredential credential;
};
struct SignedKeyDirectory {
  KeyDirectory directory;
  std::vector<KeyCredential> credentials;  // one per directory.devices entry, same order
};
struct ConsistencySignature {
  std::uint64_t round = 0;  // the session
  std::string identity;
  std::vector<std::uint8_t> signature;  // over signed_survivors_bytes(round, U3)
};
struct ConsistencySignatures {
  std::uint64_t round = 0;
  std::vector<ConsistencySignature> signatures;  // ordered by identity, each .round = round
};

std::vector<std::uint8_t> serialize(const SignedKeys& message);
std::vector<std::uint8_t> serialize(const SignedKeyDirectory& message);
std::vector<std::uint8_t> serialize(const ConsistencySignature& message);
std::vector<std::uint8_t> serialize(const ConsistencySignatures& message);
// Parsers of untrusted bytes: exactly one well-formed message, or SecAggError.
SignedKeys parse_signed_keys(std::span<const std::uint8_t> bytes);
SignedKeyDirectory parse_signed_key_directory(std::span<const std::uint8_t> bytes);
ConsistencySignature parse_consistency_signature(std::span<const std::uint8_t> bytes);
ConsistencySignatures parse_consistency_signatures(std::span<const std::uint8_t> bytes);

// Checks one posted entry: its certificate (check_peer_certificate, for keys.identity) and
// its signature over the keys. Throws SecAggError naming the identity. The server calls it on
// every SignedKeys it takes; devices on every directory entry.
PeerCertificate check_signed_keys(const CertificateAuthority& ca, const AdvertiseKeys& keys,
                                  const KeyCredential& credential);

// One device's side of one round against an active server. Each step once, in order, as
// SecAggDevice; the credentials' CN must be the identity (the one its DTLS handshake proves).
class SignedSecAggDevice {
 public:
  SignedSecAggDevice(std::string identity, std::uint64_t round, SecureRandom& random,
                     std::shared_ptr<DeviceCredentials> credentials, std::shared_ptr<const CertificateAuthority> ca);

  SignedKeys advertise_keys();
  // Checks every entry before anything else (SecAggError at the first bad one, naming it;
  // nothing is sent), then SecAggDevice::share_keys.
  EncryptedShares share_keys(const SignedKeyDirectory& directory);
  MaskedInput masked_input(const EncryptedShares& received, std::span<const std::uint32_t> input);
  // Step 3: the signature over the survivor list, after the checks SecAggDevice makes of it
  // (this device in it, only devices of U2, no repeats, at least t). Once: the list it signs
  // is the only one it will ever unmask for.
  ConsistencySignature sign_survivors(const SurvivorList& survivors);
  // Step 4: refuses, revealing nothing, unless the signatures are all valid over the list
  // this device signed, from distinct devices of that list, at least t of them.
  UnmaskingShares unmasking_shares(const ConsistencySignatures& signatures);

 private:
  SecAggDevice device_;
  std::uint64_t round_;
  SecureRandom& random_;
  std::shared_ptr<DeviceCredentials> credentials_;
  std::shared_ptr<const CertificateAuthority> ca_;
  std::uint32_t threshold_ = 0;
  std::map<std::string, PeerCertificate, std::less<>> peers_;  // U1's checked certificates
  std::set<std::string, std::less<>> shared_;                  // U2: who sent this device shares, and itself
  std::optional<SurvivorList> signed_list_;
  bool answered_ = false;
};

// The server's step 3: gathers the survivors' signatures over U3, each checked with the
// sender's certificate from its SignedKeys (checked when they came).
class ConsistencyRound {
 public:
  ConsistencyRound(SurvivorList survivors, std::uint32_t threshold);
  // Refuses a signature of another session, from outside U3, twice, or one that does not
  // verify with `certificate` (the sender's, which the caller looked up).
  void receive(std::string_view from, const ConsistencySignature& signature, const PeerCertificate& certificate);
  // Fixes the set; refuses with fewer than t signatures.
  ConsistencySignatures close() const;
  std::size_t received() const { return signatures_.size(); }
  bool signed_by(std::string_view identity) const { return signatures_.count(identity) > 0; }
  const SurvivorList& survivors() const { return survivors_; }

 private:
  SurvivorList survivors_;
  std::vector<std::uint8_t> message_;
  std::uint32_t threshold_;
  std::map<std::string, std::vector<std::uint8_t>, std::less<>> signatures_;
};

}  // namespace edgetrain::privacy
