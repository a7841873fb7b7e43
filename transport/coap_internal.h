// Shared inside transport/ only (it exposes libcoap): what coap_session.cc provides to the
// server (coap_server.cc), the client (coap_client.cc) and the benchmark load client
// (bench_load.cc). Nothing outside transport/ can include it: it is a PRIVATE header of
// the transport libraries.
#pragma once

#include <coap3/coap.h>

#include <cstdint>
#include <string>
#include <vector>

#include "transport/coap_dtls.h"

namespace edgetrain::transport {

// coap_startup() and the log levels, once per process. libcoap logs to stderr at error
// level; EDGETRAIN_COAP_LOG=7 turns on its debug output (syslog levels).
void coap_library_startup();

// getaddrinfo() for UDP; throws TransportError naming the host when it cannot be resolved.
coap_address_t resolve_udp_address(const std::string& host, std::uint16_t port);

// CoAP's transmission parameters (checked by check_timing()) on one session.
void apply_timing(coap_session_t* session, const CoapTiming& timing);

// libcoap parses the PEM files only during a handshake (and then only logs what went
// wrong), so a missing or unreadable file is reported up front, by name: TransportError.
void check_certificate_files(const CertificateFiles& files);

// Both sides verify the peer's certificate against the CA file; libcoap copies this
// struct but not the strings it points to, which `files` must keep alive.
coap_dtls_pki_t pki_setup(const CertificateFiles& files);

// The release callback of libcoap's *_large_* calls for a payload handed over as a
// heap-allocated std::vector<std::uint8_t> (app_ptr): libcoap owns it until it calls this.
void release_payload(coap_session_t* session, void* app_ptr);

}  // namespace edgetrain::transport
