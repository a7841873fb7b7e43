// What a client's DTLS handshake heard from the server (transport-internal; not for use
// outside transport/).
//
// libcoap 4.3.1 reports a failed client handshake only as COAP_NACK_TLS_FAILED, after it has
// freed the Mbed TLS context: whether the server ever answered, and with which alert, is
// lost by then, yet that is the difference between a firewall (nothing came back), a wrong
// key (alert bad_record_mac) and an identity the server does not know (alert
// unknown_psk_identity). So the link wraps Mbed TLS's handshake call
// (`-Wl,--wrap=mbedtls_ssl_handshake`, set on the transport library like socket_ingress.h's
// recvmsg): after every handshake step of a client session that is being watched, the
// wrapper notes what arrived. Server-side handshakes pass through untouched.
#pragma once

#include <optional>
#include <string>

struct mbedtls_ssl_context;

namespace edgetrain::transport::detail {

struct HandshakeProgress {
  // Set by the client before the handshake: the CN the server's certificate must carry
  // (CoapDtlsClient::Options::expected_peer_name); empty: any. A finished handshake with
  // another name is turned into a failure (local_error) before any request is sent, and the
  // name shown is kept in wrong_peer_name.
  std::string expected_peer_name;
  std::optional<std::string> wrong_peer_name;
  bool heard_from_server =
      false;  // a DTLS record from the server arrived (HelloVerifyRequest, ServerHello, an alert)
  bool completed = false;  // the handshake finished: the session was established
  int alert = -1;          // the fatal alert the server sent (MBEDTLS_SSL_ALERT_MSG_*), or -1
  int local_error = 0;     // Mbed TLS's error when this side gave up (say, the server's
                           // certificate failed verification), or 0
};

// From now on, handshake steps of the libcoap session `session` (a coap_session_t*, which
// libcoap hands to Mbed TLS as its I/O context) are noted in `progress`, which must outlive
// the registration. Written under the registry's lock, from the thread that drives the
// session (the client's own), so the client may read `progress` between its calls into
// libcoap without locking.
void watch_handshake(const void* session, HandshakeProgress* progress);
void stop_watching_handshake(const void* session);

// The subject CN of the certificate the peer of `ssl` presented (verified against the CA in
// the handshake); nullopt if it presented none, empty if it has no CN.
std::optional<std::string> peer_certificate_name(const mbedtls_ssl_context& ssl);

}  // namespace edgetrain::transport::detail
