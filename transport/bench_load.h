// Benchmark-only: many concurrent DTLS-PSK client sessions in one libcoap context, each
// posting bodies to one resource, driven asynchronously by one thread. CoapDtlsClient is
// blocking and one request at a time, which cannot load a server with a thousand devices
// from one process; this can. Used by tests/bench/ (edgetrain-loadgen), never by the worker
// or the server, and built as its own library (edgetrain::transport_bench) so that nothing
// else links it.
//
// Datagram counting: a program linked with edgetrain::transport_bench is linked with
// `--wrap` for send, sendmsg, recv and recvmsg (the only calls libcoap 4.3.1 moves
// datagrams with), so datagram_counts() sees every datagram this process's libcoap sends
// or receives: DTLS records, CoAP headers, block-wise overhead, retransmissions and
// handshakes included. On loopback what this process sends is what reaches the server's
// socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "transport/coap_dtls.h"

namespace edgetrain::transport::bench {

struct DatagramCounts {
  std::uint64_t sent_datagrams = 0, sent_bytes = 0;
  std::uint64_t received_datagrams = 0, received_bytes = 0;
  DatagramCounts operator-(const DatagramCounts& earlier) const;
};
// Totals for this process since start (zeros if the program was not linked with the wraps).
DatagramCounts datagram_counts();

struct UpdateLoadOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::string path = "update";
  std::vector<PskCredentials> devices;  // one DTLS session each, all held open together
  // libcoap servers drop the oldest half-open session beyond 100 (its default
  // max_handshake_sessions), so handshakes are started in waves below that.
  std::size_t max_handshakes_in_flight = 50;
  double handshake_budget_seconds = 60;
  // Posts in progress at once (each on its own session). A server's socket receive buffer
  // holds a few hundred 1 kB blocks; far more in flight only turns into drops and 2-3 s
  // CoAP retransmission timeouts.
  std::size_t max_posts_in_flight = 32;
  // RFC 9177 Q-Block1 for bodies of more than one block, as the worker sends them
  // (QBlock1Sender, shared with CoapDtlsClient): bursts of `max_payloads` blocks answered
  // once. False: RFC 7959 Block1, one block per exchange (libcoap's own), as before Q-Block.
  bool q_block = true;
  std::size_t max_payloads = 10;       // MAX_PAYLOADS, as the worker's default
  double ack_timeout_seconds = 1;      // the worker's default: NON_RECEIVE_TIMEOUT is twice it
  std::uint64_t max_posts = 10000;
  double max_post_seconds = 30;
  // Body of post number `sequence` (1, 2, ...) of device `device`.
  std::function<std::vector<std::uint8_t>(std::size_t device, std::uint64_t sequence)> make_body;
  // Called with the payload of every 2.xx answer (e.g. to follow the server's version).
  std::function<void(std::span<const std::uint8_t> payload)> on_success;
  // Called right before the first post and right after the last answer (or give-up), e.g.
  // to read the server's CPU time around the posting phase alone.
  std::function<void()> on_posts_starting, on_posts_finished;
};

struct UpdateLoadReport {
  std::size_t sessions_established = 0;
  std::size_t sessions_failed = 0;
  double handshake_seconds = 0;  // until every session was established or had failed
  DatagramCounts handshake_traffic;
  std::uint64_t posts_acknowledged = 0;                // answered 2.xx
  std::map<int, std::uint64_t> posts_refused_by_code;  // answered 4.xx / 5.xx
  std::uint64_t posts_unanswered = 0;                  // retransmissions exhausted, session lost
  std::uint64_t q_block1_refused = 0;  // answered 4.02 to Q-Block1: the server has --q-block=false
  std::uint64_t acknowledged_body_bytes = 0;
  std::uint64_t posted_body_bytes = 0;  // every body handed to libcoap, answered or not
  double post_seconds = 0;              // first post sent until the last answer arrived
  DatagramCounts post_traffic;
};

// Establishes a session per device, then keeps up to max_posts_in_flight posts going on
// idle sessions until max_posts were sent or max_post_seconds passed, and waits (bounded)
// for the answers of the posts in progress. Throws TransportError on set-up failure.
UpdateLoadReport run_update_load(const UpdateLoadOptions& options);

}  // namespace edgetrain::transport::bench
