// Shared inside transport/ only (it exposes libcoap): what coap_session.cc provides to the
// server (coap_server.cc), the client (coap_client.cc) and the benchmark load client
// (bench_load.cc). Nothing outside transport/ can include it: it is a PRIVATE header of
// the transport libraries.
#pragma once

#include <coap3/coap.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "transport/coap_dtls.h"

namespace edgetrain::transport {

// coap_startup() and the log levels, once per process. libcoap logs to stderr at error
// level; EDGETRAIN_COAP_LOG=7 turns on its debug output (syslog levels).
void coap_library_startup();

// libcoap 4.3.1 logs the RST that answers a ping it did not send for its keepalive as an
// alert ("got RST for mid=..."); the client's liveness probe (coap_client.cc) announces its
// ping's message ID here so that the log handler drops that one line.
void expect_probe_reset(int mid);

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

// RFC 9177's block options (transport/README.md, "Q-Block"). libcoap 4.3.1 does not know
// them: a context that does not register them (coap_register_option) answers a confirmable
// request carrying one 4.02 Bad Option and drops a response carrying one.
inline constexpr coap_option_num_t kOptionQBlock1 = 19;
inline constexpr coap_option_num_t kOptionQBlock2 = 31;
// An option's value, laid out as Block1/Block2's (RFC 7959 2.2): NUM, M and SZX (block size
// 2^(SZX + 4)).
struct QBlockValue {
  std::uint32_t num = 0;
  bool more = false;
  std::uint32_t szx = 6;
};
// nullopt for a value longer than 3 bytes or SZX 7 (BERT: not on UDP).
std::optional<QBlockValue> decode_q_block(const coap_opt_t* option);
std::size_t encode_q_block(std::uint8_t (&buffer)[4], const QBlockValue& block);

// The release callback of libcoap's *_large_* calls for a payload handed over as a
// heap-allocated std::vector<std::uint8_t> (app_ptr): libcoap owns it until it calls this.
void release_payload(coap_session_t* session, void* app_ptr);

}  // namespace edgetrain::transport
