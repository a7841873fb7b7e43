// A throwaway PKI in memory for the tests of keys signed by device certificates
// (privacy/key_signing.h): a CA and device certificates, EC P-256 like
// boards/fleet-certificates.sh makes them, written with Mbed TLS's certificate writer, so
// that a test needs neither openssl nor files. A test that includes it links
// edgetrain_deps::mbedx509.
#pragma once

#include <mbedtls/ecp.h>
#include <mbedtls/pk.h>
#include <mbedtls/x509_crt.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "privacy/key_signing.h"

namespace edgetrain::privacy::test_pki {

inline void require(int status, const char* what) {  // no gtest: the secagg bench uses it too
  if (status != 0) throw std::runtime_error(std::string(what) + " failed: Mbed TLS error " + std::to_string(status));
}

struct Pk {
  mbedtls_pk_context key;
  Pk() { mbedtls_pk_init(&key); }
  ~Pk() { mbedtls_pk_free(&key); }
};

inline void generate_p256(Pk& pk, SecureRandom& random) {
  require(mbedtls_pk_setup(&pk.key, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY)), "mbedtls_pk_setup");
  require(mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(pk.key), &SecureRandom::mbedtls_callback, &random),
          "mbedtls_ecp_gen_key");
}

inline std::string key_pem(Pk& pk) {
  std::vector<unsigned char> out(4096);
  require(mbedtls_pk_write_key_pem(&pk.key, out.data(), out.size()), "mbedtls_pk_write_key_pem");
  return reinterpret_cast<const char*>(out.data());
}

// A certificate for `subject_key` named CN=`cn`, signed by `issuer_key` named CN=`issuer_cn`
// (the same key and name: self-signed, a CA).
inline std::string certificate_pem(Pk& subject_key, const std::string& cn, Pk& issuer_key, const std::string& issuer_cn,
                            bool is_ca, SecureRandom& random, int serial) {
  mbedtls_x509write_cert writer;
  mbedtls_x509write_crt_init(&writer);
  mbedtls_mpi number;
  mbedtls_mpi_init(&number);
  mbedtls_mpi_lset(&number, serial);
  mbedtls_x509write_crt_set_version(&writer, MBEDTLS_X509_CRT_VERSION_3);
  mbedtls_x509write_crt_set_md_alg(&writer, MBEDTLS_MD_SHA256);
  mbedtls_x509write_crt_set_serial(&writer, &number);
  mbedtls_x509write_crt_set_validity(&writer, "20200101000000", "20991231235959");
  mbedtls_x509write_crt_set_subject_name(&writer, ("CN=" + cn).c_str());
  mbedtls_x509write_crt_set_issuer_name(&writer, ("CN=" + issuer_cn).c_str());
  mbedtls_x509write_crt_set_subject_key(&writer, &subject_key.key);
  mbedtls_x509write_crt_set_issuer_key(&writer, &issuer_key.key);
  mbedtls_x509write_crt_set_basic_constraints(&writer, is_ca ? 1 : 0, -1);
  std::vector<unsigned char> out(4096);
  const int written = mbedtls_x509write_crt_pem(&writer, out.data(), out.size(), &SecureRandom::mbedtls_callback, &random);
  mbedtls_mpi_free(&number);
  mbedtls_x509write_crt_free(&writer);
  require(written, "mbedtls_x509write_crt_pem");
  return reinterpret_cast<const char*>(out.data());
}

struct Pki {
  SecureRandom random;
  Pk ca_key;
  std::string ca_cn;
  std::string ca_pem;
  std::shared_ptr<const CertificateAuthority> ca;
  int serial = 1;
  explicit Pki(std::string name) : ca_cn(std::move(name)) {
    generate_p256(ca_key, random);
    ca_pem = certificate_pem(ca_key, ca_cn, ca_key, ca_cn, true, random, serial++);
    ca = CertificateAuthority::from_pem(ca_pem);
  }
  // A certificate CN=`cn` from this CA and its key, as PEM (what a device's files hold).
  struct Issued {
    std::string certificate, key;
  };
  Issued issue_pem(const std::string& cn) {
    Pk key;
    generate_p256(key, random);
    return {certificate_pem(key, cn, ca_key, ca_cn, false, random, ++serial), key_pem(key)};
  }
  std::shared_ptr<DeviceCredentials> issue(const std::string& cn) {
    const Issued issued = issue_pem(cn);
    return DeviceCredentials::from_pem(issued.certificate, issued.key);
  }
};

inline Pki& fleet() {
  static Pki pki("edgetrain-test-ca");
  return pki;
}

}  // namespace edgetrain::privacy::test_pki
