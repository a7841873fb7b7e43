// mbedtls_ssl_handshake() wrapper and registry behind handshake_watch.h. One entry per
// client in the process (a worker has one); server handshakes return before the lock.
#include "transport/handshake_watch.h"

#include <mbedtls/oid.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crt.h>

#include <cstring>
#include <mutex>
#include <vector>

namespace edgetrain::transport::detail {
namespace {

struct Watch {
  const void* session;
  HandshakeProgress* progress;
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<Watch>& registry() {
  static std::vector<Watch> watches;
  return watches;
}

// Notes the step's outcome; returns it, or a verification failure when the handshake has
// finished with a server whose certificate names another peer than the expected one.
int note(const mbedtls_ssl_context& ssl, int result) {
  std::lock_guard lock(registry_mutex());
  for (const Watch& w : registry()) {
    if (w.session != ssl.p_bio) continue;
    HandshakeProgress& p = *w.progress;
    if (result == 0 && !p.expected_peer_name.empty()) {
      const std::optional<std::string> name = peer_certificate_name(ssl);
      if (name != p.expected_peer_name) {
        p.wrong_peer_name = name.value_or("");
        result = MBEDTLS_ERR_X509_CERT_VERIFY_FAILED;
      }
    }
    // in_msgtype is set by the first record read from the peer; past SERVER_HELLO the
    // client has read the server's hello.
    if (ssl.in_msgtype != 0 || ssl.state > MBEDTLS_SSL_SERVER_HELLO) p.heard_from_server = true;
    if (result == 0) p.completed = true;
    if (result == MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE && ssl.in_msg) {
      p.heard_from_server = true;
      p.alert = ssl.in_msg[1];
    } else if (result < 0 && result != MBEDTLS_ERR_SSL_WANT_READ &&
               result != MBEDTLS_ERR_SSL_WANT_WRITE && result != MBEDTLS_ERR_SSL_TIMEOUT) {
      p.local_error = result;
    }
    return result;
  }
  return result;
}

}  // namespace

std::optional<std::string> peer_certificate_name(const mbedtls_ssl_context& ssl) {
  const mbedtls_x509_crt* certificate = mbedtls_ssl_get_peer_cert(&ssl);
  if (!certificate) return std::nullopt;
  for (const mbedtls_x509_name* name = &certificate->subject; name; name = name->next) {
    if (MBEDTLS_OID_CMP(MBEDTLS_OID_AT_CN, &name->oid) == 0)
      return std::string(reinterpret_cast<const char*>(name->val.p), name->val.len);
  }
  return std::string();
}

void watch_handshake(const void* session, HandshakeProgress* progress) {
  std::lock_guard lock(registry_mutex());
  for (Watch& w : registry()) {
    if (w.session == session) {
      w.progress = progress;
      return;
    }
  }
  registry().push_back({session, progress});
}

void stop_watching_handshake(const void* session) {
  std::lock_guard lock(registry_mutex());
  auto& all = registry();
  for (auto it = all.begin(); it != all.end(); ++it) {
    if (it->session == session) {
      all.erase(it);
      return;
    }
  }
}

}  // namespace edgetrain::transport::detail

// The link maps libcoap's calls of mbedtls_ssl_handshake() here
// (--wrap=mbedtls_ssl_handshake); __real_mbedtls_ssl_handshake is Mbed TLS's.
extern "C" int __real_mbedtls_ssl_handshake(mbedtls_ssl_context* ssl);
extern "C" int __wrap_mbedtls_ssl_handshake(mbedtls_ssl_context* ssl) {
  const int result = __real_mbedtls_ssl_handshake(ssl);
  if (ssl && ssl->conf && ssl->conf->endpoint == MBEDTLS_SSL_IS_CLIENT)
    return edgetrain::transport::detail::note(*ssl, result);
  return result;
}
