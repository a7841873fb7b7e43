#include "privacy/secagg_signed.h"

#include <algorithm>
#include <utility>

#include "privacy/message_bytes.h"

namespace edgetrain::privacy {
namespace {

std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

using Writer = MessageWriter;  // message_bytes.h: the layout the plain messages share
using Reader = MessageReader;

void write_keys(Writer& w, const AdvertiseKeys& keys) {
  w.identity(keys.identity);
  w.raw(keys.cipher_public_key);
  w.raw(keys.mask_public_key);
}
AdvertiseKeys read_keys(Reader& r, std::uint64_t round) {
  AdvertiseKeys out;
  out.round = round;
  out.identity = r.identity();
  out.cipher_public_key = r.key();
  out.mask_public_key = r.key();
  return out;
}
void write_credential(Writer& w, const KeyCredential& credential) {
  w.blob(credential.certificate, kMaxCertificateBytes, "certificate");
  w.blob(credential.signature, kMaxSignatureBytes, "signature");
}
KeyCredential read_credential(Reader& r) {
  KeyCredential out;
  out.certificate = r.blob(kMaxCertificateBytes, "certificate");
  out.signature = r.blob(kMaxSignatureBytes, "signature");
  return out;
}

// Smallest encodings, to bound counts: identity 2, keys 64, two blobs of 3.
constexpr std::size_t kMinSignedEntryBytes = 2 + 64 + 3 + 3;
constexpr std::size_t kMinSignatureEntryBytes = 2 + 3;

}  // namespace

// ---------------------------------------------------------------------------- messages

std::vector<std::uint8_t> serialize(const SignedKeys& message) {
  Writer w(kSignedKeysType, message.keys.round);
  write_keys(w, message.keys);
  write_credential(w, message.credential);
  return w.take();
}

SignedKeys parse_signed_keys(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, kSignedKeysType, "SignedKeys");
  SignedKeys out;
  out.keys = read_keys(r, r.round());
  out.credential = read_credential(r);
  r.finish();
  return out;
}

std::vector<std::uint8_t> serialize(const SignedKeyDirectory& message) {
  if (message.credentials.size() != message.directory.devices.size())
    throw SecAggError("a signed key directory needs one credential per device");
  Writer w(kSignedKeyDirectoryType, message.directory.config.round);
  w.u32(message.directory.config.threshold);
  w.u32(message.directory.config.vector_length);
  w.u32(static_cast<std::uint32_t>(message.directory.devices.size()));
  for (std::size_t i = 0; i < message.directory.devices.size(); ++i) {
    const AdvertiseKeys& device = message.directory.devices[i];
    if (device.round != message.directory.config.round) throw SecAggError("a directory entry of another session");
    write_keys(w, device);
    write_credential(w, message.credentials[i]);
  }
  return w.take();
}

SignedKeyDirectory parse_signed_key_directory(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, kSignedKeyDirectoryType, "SignedKeyDirectory");
  SignedKeyDirectory out;
  out.directory.config.round = r.round();
  out.directory.config.threshold = r.u32();
  out.directory.config.vector_length = r.u32();
  const std::uint32_t n = r.count(kMaxSecAggDevices, kMinSignedEntryBytes);
  for (std::uint32_t i = 0; i < n; ++i) {
    out.directory.devices.push_back(read_keys(r, r.round()));
    out.credentials.push_back(read_credential(r));
  }
  r.finish();
  return out;
}

std::vector<std::uint8_t> serialize(const ConsistencySignature& message) {
  Writer w(kConsistencySignatureType, message.round);
  w.identity(message.identity);
  w.blob(message.signature, kMaxSignatureBytes, "signature");
  return w.take();
}

ConsistencySignature parse_consistency_signature(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, kConsistencySignatureType, "ConsistencySignature");
  ConsistencySignature out;
  out.round = r.round();
  out.identity = r.identity();
  out.signature = r.blob(kMaxSignatureBytes, "signature");
  r.finish();
  return out;
}

std::vector<std::uint8_t> serialize(const ConsistencySignatures& message) {
  Writer w(kConsistencySignaturesType, message.round);
  w.u32(static_cast<std::uint32_t>(message.signatures.size()));
  for (const ConsistencySignature& s : message.signatures) {
    w.identity(s.identity);
    w.blob(s.signature, kMaxSignatureBytes, "signature");
  }
  return w.take();
}

ConsistencySignatures parse_consistency_signatures(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, kConsistencySignaturesType, "ConsistencySignatures");
  ConsistencySignatures out;
  out.round = r.round();
  const std::uint32_t n = r.count(kMaxSecAggDevices, kMinSignatureEntryBytes);
  for (std::uint32_t i = 0; i < n; ++i) {
    ConsistencySignature s;
    s.round = out.round;
    s.identity = r.identity();
    s.signature = r.blob(kMaxSignatureBytes, "signature");
    out.signatures.push_back(std::move(s));
  }
  r.finish();
  return out;
}

PeerCertificate check_signed_keys(const CertificateAuthority& ca, const AdvertiseKeys& keys,
                                  const KeyCredential& credential) {
  PeerCertificate certificate = check_peer_certificate(ca, credential.certificate, keys.identity);
  if (!certificate.verifies(signed_keys_bytes(keys), credential.signature))
    throw SecAggError("the signature over the keys of " + quoted(keys.identity) + " in session " +
                      std::to_string(keys.round) +
                      " does not verify with its certificate: keys substituted or the signature forged");
  return certificate;
}

// ---------------------------------------------------------------------------- the device

SignedSecAggDevice::SignedSecAggDevice(std::string identity, std::uint64_t round, SecureRandom& random,
                                       std::shared_ptr<DeviceCredentials> credentials,
                                       std::shared_ptr<const CertificateAuthority> ca)
    : device_(std::move(identity), round, random),
      round_(round),
      random_(random),
      credentials_(std::move(credentials)),
      ca_(std::move(ca)) {
  if (!credentials_ || !ca_) throw SecAggError("signed keys need this device's certificate and the fleet's CA");
  if (credentials_->common_name() != device_.identity())
    throw SecAggError("this device's certificate is " + quoted(credentials_->common_name()) +
                      "'s (its CN), not " + quoted(device_.identity()) + "'s");
}

SignedKeys SignedSecAggDevice::advertise_keys() {
  SignedKeys out{device_.advertise_keys(), {}};
  out.credential.certificate = credentials_->certificate_der();
  out.credential.signature = credentials_->sign(signed_keys_bytes(out.keys), random_);
  return out;
}

EncryptedShares SignedSecAggDevice::share_keys(const SignedKeyDirectory& directory) {
  const std::string& self = device_.identity();
  if (directory.credentials.size() != directory.directory.devices.size())
    throw SecAggError(self + ": the key directory has " + std::to_string(directory.credentials.size()) +
                      " credentials for " + std::to_string(directory.directory.devices.size()) + " devices");
  if (!peers_.empty()) throw SecAggError(self + ": share_keys called twice");
  std::map<std::string, PeerCertificate, std::less<>> peers;
  for (std::size_t i = 0; i < directory.directory.devices.size(); ++i) {
    const AdvertiseKeys& entry = directory.directory.devices[i];
    if (entry.round != round_)
      throw SecAggError(self + ": the keys of " + quoted(entry.identity) + " are of another session");
    try {
      peers.insert_or_assign(entry.identity, check_signed_keys(*ca_, entry, directory.credentials[i]));
    } catch (const SecAggError& error) {
      throw SecAggError(self + ": refusing the round, the key directory's entry is bad: " + error.what());
    }
  }
  EncryptedShares out = device_.share_keys(directory.directory);  // its own checks (order, self, t)
  peers_ = std::move(peers);
  threshold_ = directory.directory.config.threshold;
  return out;
}

MaskedInput SignedSecAggDevice::masked_input(const EncryptedShares& received, std::span<const std::uint32_t> input) {
  MaskedInput out = device_.masked_input(received, input);  // refuses bad shares before anything
  shared_.clear();
  shared_.insert(device_.identity());
  for (const EncryptedShare& share : received.shares) shared_.insert(share.sender);
  return out;
}

ConsistencySignature SignedSecAggDevice::sign_survivors(const SurvivorList& survivors) {
  const std::string& self = device_.identity();
  if (shared_.empty()) throw SecAggError(self + ": sign_survivors before the masked input");
  if (signed_list_) throw SecAggError(self + ": sign_survivors called twice (one list per session)");
  if (survivors.round != round_) throw SecAggError(self + ": a survivor list of another session");
  std::set<std::string, std::less<>> seen;
  for (const std::string& survivor : survivors.survivors) {
    if (!shared_.count(survivor))
      throw SecAggError(self + ": the survivor list names " + quoted(survivor) + ", which did not share its keys");
    if (!seen.insert(survivor).second) throw SecAggError(self + ": the survivor list repeats " + quoted(survivor));
  }
  if (!seen.count(self)) throw SecAggError(self + ": the survivor list leaves out this device, which sent its masked input");
  if (seen.size() < threshold_)
    throw SecAggError(self + ": " + std::to_string(seen.size()) + " survivors, fewer than t = " + std::to_string(threshold_));
  // Signed in byte order whatever order the server sent: the same set gives the same bytes.
  SurvivorList ordered{round_, {seen.begin(), seen.end()}};
  ConsistencySignature out{round_, self, credentials_->sign(signed_survivors_bytes(round_, ordered.survivors), random_)};
  signed_list_ = std::move(ordered);
  return out;
}

UnmaskingShares SignedSecAggDevice::unmasking_shares(const ConsistencySignatures& signatures) {
  const std::string& self = device_.identity();
  if (!signed_list_) throw SecAggError(self + ": unmasking before signing a survivor list");
  if (answered_) throw SecAggError(self + ": unmasking_shares called twice");
  if (signatures.round != round_) throw SecAggError(self + ": consistency signatures of another session");
  const std::vector<std::uint8_t> message = signed_survivors_bytes(round_, signed_list_->survivors);
  std::set<std::string, std::less<>> signers;
  for (const ConsistencySignature& s : signatures.signatures) {
    if (!std::binary_search(signed_list_->survivors.begin(), signed_list_->survivors.end(), s.identity))
      throw SecAggError(self + ": a consistency signature from " + quoted(s.identity) +
                        ", not in the survivor list this device was given");
    if (!signers.insert(s.identity).second)
      throw SecAggError(self + ": two consistency signatures from " + quoted(s.identity));
    const auto peer = peers_.find(s.identity);
    if (peer == peers_.end() || !peer->second.verifies(message, s.signature))
      throw SecAggError(self + ": the consistency signature of " + quoted(s.identity) +
                        " is not over the survivor list this device was given: the server told devices "
                        "different lists, or forged it; revealing nothing");
  }
  if (signers.size() < threshold_)
    throw SecAggError(self + ": " + std::to_string(signers.size()) +
                      " devices signed the survivor list, fewer than t = " + std::to_string(threshold_) +
                      "; revealing nothing");
  answered_ = true;
  return device_.unmasking_shares(*signed_list_);
}

// ---------------------------------------------------------------------------- the server

ConsistencyRound::ConsistencyRound(SurvivorList survivors, std::uint32_t threshold)
    : survivors_(std::move(survivors)),
      message_(signed_survivors_bytes(survivors_.round, survivors_.survivors)),
      threshold_(threshold) {}

void ConsistencyRound::receive(std::string_view from, const ConsistencySignature& signature,
                               const PeerCertificate& certificate) {
  if (signature.round != survivors_.round)
    throw SecAggError("a consistency signature of session " + std::to_string(signature.round) + " in session " +
                      std::to_string(survivors_.round));
  if (signature.identity != from)
    throw SecAggError("a consistency signature for " + quoted(signature.identity) + " from " + quoted(from));
  if (!std::binary_search(survivors_.survivors.begin(), survivors_.survivors.end(), from))
    throw SecAggError("a consistency signature from " + quoted(from) + ", which is not a survivor");
  if (signatures_.count(from)) throw SecAggError(quoted(from) + " signed the survivor list twice");
  if (!certificate.verifies(message_, signature.signature))
    throw SecAggError("the consistency signature of " + quoted(from) + " is not over this survivor list");
  signatures_.emplace(std::string(from), signature.signature);
}

ConsistencySignatures ConsistencyRound::close() const {
  if (signatures_.size() < threshold_)
    throw SecAggError(std::to_string(signatures_.size()) + " devices signed the survivor list, fewer than t = " +
                      std::to_string(threshold_));
  ConsistencySignatures out{survivors_.round, {}};
  for (const auto& [identity, signature] : signatures_) out.signatures.push_back({survivors_.round, identity, signature});
  return out;
}

}  // namespace edgetrain::privacy
