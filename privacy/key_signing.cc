#include "privacy/key_signing.h"

#include <mbedtls/md.h>
#include <mbedtls/oid.h>
#include <mbedtls/pk.h>
#include <mbedtls/x509_crt.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace edgetrain::privacy {
namespace {

std::string mbedtls_text(int status) {
  return "Mbed TLS error -0x" + [status] {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%04x", static_cast<unsigned>(-status));
    return std::string(hex);
  }();
}

std::array<std::uint8_t, 32> sha256(std::span<const std::uint8_t> message) {
  std::array<std::uint8_t, 32> hash{};
  const int status = mbedtls_md(mbedtls_md_info_from_type(MBEDTLS_MD_SHA256), message.data(), message.size(),
                                hash.data());
  if (status != 0) throw CryptoError("SHA-256 failed (" + mbedtls_text(status) + ")");
  return hash;
}

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}
void put_u64(std::vector<std::uint8_t>& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}
void put_text(std::vector<std::uint8_t>& out, std::string_view text) {
  put_u32(out, static_cast<std::uint32_t>(text.size()));
  out.insert(out.end(), text.begin(), text.end());
}

// The subject's CN, or "" when it has none.
std::string common_name_of(const mbedtls_x509_crt& certificate) {
  for (const mbedtls_x509_name* name = &certificate.subject; name != nullptr; name = name->next) {
    if (name->oid.p != nullptr && MBEDTLS_OID_CMP(MBEDTLS_OID_AT_CN, &name->oid) == 0)
      return {reinterpret_cast<const char*>(name->val.p), name->val.len};
  }
  return {};
}

// Printable, bounded: a CN comes from the network.
std::string shown(std::string_view text) {
  std::string out = "'";
  for (const char c : text.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > 64) out += "...";
  return out + "'";
}

}  // namespace

// ---------------------------------------------------------------------------- the CA

struct CertificateAuthority::State {
  mbedtls_x509_crt chain;
  State() { mbedtls_x509_crt_init(&chain); }
  ~State() { mbedtls_x509_crt_free(&chain); }
};

CertificateAuthority::CertificateAuthority() : state_(std::make_unique<State>()) {}
CertificateAuthority::~CertificateAuthority() = default;

std::shared_ptr<const CertificateAuthority> CertificateAuthority::from_file(const std::string& path) {
  std::shared_ptr<CertificateAuthority> ca(new CertificateAuthority());
  const int status = mbedtls_x509_crt_parse_file(&ca->state_->chain, path.c_str());
  if (status != 0)
    throw std::invalid_argument("the CA file " + path + " is not a readable PEM or DER certificate (" +
                                mbedtls_text(status) + ")");
  return ca;
}

std::shared_ptr<const CertificateAuthority> CertificateAuthority::from_pem(std::string_view pem) {
  std::shared_ptr<CertificateAuthority> ca(new CertificateAuthority());
  const std::string text(pem);  // mbedtls_x509_crt_parse wants the terminating NUL counted
  const int status = mbedtls_x509_crt_parse(&ca->state_->chain, reinterpret_cast<const unsigned char*>(text.c_str()),
                                            text.size() + 1);
  if (status != 0) throw std::invalid_argument("the CA is not a PEM certificate (" + mbedtls_text(status) + ")");
  return ca;
}

// ---------------------------------------------------------------------------- a peer's certificate

struct PeerCertificate::State {
  mbedtls_x509_crt certificate;
  State() { mbedtls_x509_crt_init(&certificate); }
  ~State() { mbedtls_x509_crt_free(&certificate); }
};

PeerCertificate::PeerCertificate() : state_(std::make_unique<State>()) {}
PeerCertificate::~PeerCertificate() = default;
PeerCertificate::PeerCertificate(PeerCertificate&&) noexcept = default;
PeerCertificate& PeerCertificate::operator=(PeerCertificate&&) noexcept = default;

bool PeerCertificate::verifies(std::span<const std::uint8_t> message, std::span<const std::uint8_t> signature) const {
  if (signature.empty()) return false;
  const auto hash = sha256(message);
  // mbedtls_pk_verify takes a non-const context but only reads it.
  return mbedtls_pk_verify(&state_->certificate.pk, MBEDTLS_MD_SHA256, hash.data(), hash.size(), signature.data(),
                           signature.size()) == 0;
}

PeerCertificate check_peer_certificate(const CertificateAuthority& ca, std::span<const std::uint8_t> der,
                                       std::string_view identity) {
  const std::string who = shown(identity);
  PeerCertificate out;
  mbedtls_x509_crt& certificate = out.state_->certificate;
  if (int status = mbedtls_x509_crt_parse_der(&certificate, der.data(), der.size()); status != 0)
    throw SecAggError("the certificate posted for " + who + " does not parse (" + mbedtls_text(status) + ")");
  if (certificate.next != nullptr)
    throw SecAggError("the certificate posted for " + who + " is more than one certificate");
  std::uint32_t flags = 0;
  // Read-only use of the CA's chain; Mbed TLS's signature is not const.
  auto& trusted = const_cast<mbedtls_x509_crt&>(ca.state().chain);
  if (mbedtls_x509_crt_verify(&certificate, &trusted, nullptr, nullptr, &flags, nullptr, nullptr) != 0) {
    char why[256] = {};
    mbedtls_x509_crt_verify_info(why, sizeof why, "", flags);
    std::string reason(why);
    while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
    for (char& c : reason) if (c == '\n') c = ';';
    throw SecAggError("the certificate posted for " + who + " is not one of the fleet's CA (" + reason + ")");
  }
  const std::string cn = common_name_of(certificate);
  if (cn != identity)
    throw SecAggError("the certificate posted for " + who + " is " + shown(cn) + "'s (its subject CN)");
  if (mbedtls_x509_crt_check_key_usage(&certificate, MBEDTLS_X509_KU_DIGITAL_SIGNATURE) != 0)
    throw SecAggError("the certificate of " + who + " does not allow digital signatures (key usage)");
  return out;
}

// ---------------------------------------------------------------------------- this device's key

struct DeviceCredentials::State {
  mbedtls_x509_crt certificate;
  mbedtls_pk_context key;
  State() {
    mbedtls_x509_crt_init(&certificate);
    mbedtls_pk_init(&key);
  }
  ~State() {
    mbedtls_pk_free(&key);  // zeroizes the private key
    mbedtls_x509_crt_free(&certificate);
  }
};

DeviceCredentials::DeviceCredentials() : state_(std::make_unique<State>()) {}
DeviceCredentials::~DeviceCredentials() = default;

namespace {
void finish_credentials(DeviceCredentials::State& state, std::string& common_name, std::vector<std::uint8_t>& der,
                        const std::string& where) {
  if (mbedtls_pk_check_pair(&state.certificate.pk, &state.key) != 0)
    throw std::invalid_argument("the private key " + where + " is not the certificate's");
  if (!mbedtls_pk_can_do(&state.key, MBEDTLS_PK_ECDSA) && !mbedtls_pk_can_do(&state.key, MBEDTLS_PK_RSA))
    throw std::invalid_argument("the private key " + where + " is neither EC nor RSA: it cannot sign");
  common_name = common_name_of(state.certificate);
  der.assign(state.certificate.raw.p, state.certificate.raw.p + state.certificate.raw.len);
}
}  // namespace

std::shared_ptr<DeviceCredentials> DeviceCredentials::from_files(const std::string& certificate_file,
                                                                 const std::string& private_key_file) {
  std::shared_ptr<DeviceCredentials> out(new DeviceCredentials());
  if (int status = mbedtls_x509_crt_parse_file(&out->state_->certificate, certificate_file.c_str()); status != 0)
    throw std::invalid_argument("the certificate file " + certificate_file + " is not a readable certificate (" +
                                mbedtls_text(status) + ")");
  if (int status = mbedtls_pk_parse_keyfile(&out->state_->key, private_key_file.c_str(), nullptr); status != 0)
    throw std::invalid_argument("the private key file " + private_key_file +
                                " is not a readable unencrypted key (" + mbedtls_text(status) + ")");
  finish_credentials(*out->state_, out->common_name_, out->certificate_der_, "in " + private_key_file);
  return out;
}

std::shared_ptr<DeviceCredentials> DeviceCredentials::from_pem(std::string_view certificate_pem,
                                                               std::string_view key_pem) {
  std::shared_ptr<DeviceCredentials> out(new DeviceCredentials());
  const std::string certificate(certificate_pem), key(key_pem);
  if (int status = mbedtls_x509_crt_parse(&out->state_->certificate,
                                          reinterpret_cast<const unsigned char*>(certificate.c_str()),
                                          certificate.size() + 1);
      status != 0)
    throw std::invalid_argument("the certificate is not PEM (" + mbedtls_text(status) + ")");
  if (int status = mbedtls_pk_parse_key(&out->state_->key, reinterpret_cast<const unsigned char*>(key.c_str()),
                                        key.size() + 1, nullptr, 0);
      status != 0)
    throw std::invalid_argument("the private key is not an unencrypted PEM key (" + mbedtls_text(status) + ")");
  finish_credentials(*out->state_, out->common_name_, out->certificate_der_, "given");
  return out;
}

std::vector<std::uint8_t> DeviceCredentials::sign(std::span<const std::uint8_t> message, SecureRandom& random) {
  const auto hash = sha256(message);
  std::vector<std::uint8_t> signature(MBEDTLS_PK_SIGNATURE_MAX_SIZE);
  std::size_t length = 0;
  const int status = mbedtls_pk_sign(&state_->key, MBEDTLS_MD_SHA256, hash.data(), hash.size(), signature.data(),
                                     &length, &SecureRandom::mbedtls_callback, &random);
  if (status != 0) throw CryptoError("signing with the device's key failed (" + mbedtls_text(status) + ")");
  signature.resize(length);
  return signature;
}

// ---------------------------------------------------------------------------- what is signed

std::vector<std::uint8_t> signed_keys_bytes(const AdvertiseKeys& keys) {
  static constexpr std::string_view kLabel = "edgetrain-secagg-v1 signed keys";
  std::vector<std::uint8_t> out(kLabel.begin(), kLabel.end());
  put_u64(out, keys.round);
  put_text(out, keys.identity);
  out.insert(out.end(), keys.cipher_public_key.begin(), keys.cipher_public_key.end());
  out.insert(out.end(), keys.mask_public_key.begin(), keys.mask_public_key.end());
  return out;
}

std::vector<std::uint8_t> signed_survivors_bytes(std::uint64_t session, std::span<const std::string> survivors) {
  static constexpr std::string_view kLabel = "edgetrain-secagg-v1 consistency";
  std::vector<std::uint8_t> out(kLabel.begin(), kLabel.end());
  put_u64(out, session);
  put_u32(out, static_cast<std::uint32_t>(survivors.size()));
  for (const std::string& identity : survivors) put_text(out, identity);
  return out;
}

}  // namespace edgetrain::privacy
