// Shared inside transport/ only (it exposes libcoap): what coap_session.cc provides to the
// server (coap_server.cc), the client (coap_client.cc) and the benchmark load client
// (bench_load.cc). Nothing outside transport/ can include it: it is a PRIVATE header of
// the transport libraries.
#pragma once

#include <coap3/coap.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
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

// RFC 9177 Q-Block1 sending of one request body, shared by CoapDtlsClient (the worker) and
// the benchmark's load client (bench_load.cc), so the bench posts what workers post: bursts
// of MAX_PAYLOADS non-confirmable 1 KiB blocks under one token, Size1 in every block (ours:
// the server sizes the body from whichever block comes first), the body's last block
// confirmable (ours: the server can answer it once the update is durable, and libcoap
// retransmits it). The next burst goes after a 2.31, the blocks a 4.08 lists go again, and
// after NON_RECEIVE_TIMEOUT (2 × ACK_TIMEOUT) without an answer the burst's last block goes
// again, confirmable (a probe). One body at a time; the caller's thread only.
class QBlock1Sender {
 public:
  // Makes a request of `type` carrying the request's code, token and Uri options, or
  // nullptr when it cannot (the caller's: it knows the method and path).
  using NewRequest = std::function<coap_pdu_t*(coap_pdu_type_t type)>;
  enum class Answer {
    kContinue,  // 2.31: the next burst is due (step() sends it)
    kMissing,   // 4.08 listing blocks of ours: step() sends them again
    kRefused,   // 4.02 before any progress: the server does not know Q-Block1
    kFinal,     // anything else: the answer to the whole body
  };

  // Sends the first burst. `body` (more than one block) and `session` must outlive the
  // transfer; `token` is the one every block carries. False when a block could not be sent.
  bool start(coap_session_t* session, std::span<const std::uint8_t> body,
             std::vector<std::uint8_t> token, std::size_t max_payloads,
             double ack_timeout_seconds, NewRequest new_request);
  // What an answer carrying this transfer's token means (see Answer).
  Answer take_answer(const coap_pdu_t* received);
  // Called while waiting: resends, the next burst, the probe. False when a block could not
  // be sent (failed_block() says which).
  bool step(std::chrono::steady_clock::time_point now);
  void reset() { *this = QBlock1Sender{}; }
  bool active() const { return active_; }
  const std::vector<std::uint8_t>& token() const { return token_; }
  std::uint32_t failed_block() const { return failed_block_; }

 private:
  bool send_block(std::uint32_t num, bool confirmable);
  bool send_burst();

  bool active_ = false;
  coap_session_t* session_ = nullptr;
  NewRequest new_request_;
  std::vector<std::uint8_t> token_;
  std::span<const std::uint8_t> body_;
  std::size_t max_payloads_ = 10;
  std::chrono::duration<double> non_receive_timeout_{2.0};
  std::uint32_t blocks_ = 0;
  std::uint32_t next_unsent_ = 0;
  std::uint32_t burst_end_ = 0;  // the last block sent in the latest burst
  bool continued_ = false;       // a 2.31 came: send the next burst
  bool progressed_ = false;      // a 2.31 or a 4.08 came at all
  std::vector<std::uint32_t> resend_;  // listed by a 4.08
  std::chrono::steady_clock::time_point last_heard_;
  std::uint32_t failed_block_ = 0;
};

// The release callback of libcoap's *_large_* calls for a payload handed over as a
// heap-allocated std::vector<std::uint8_t> (app_ptr): libcoap owns it until it calls this.
void release_payload(coap_session_t* session, void* app_ptr);

}  // namespace edgetrain::transport
