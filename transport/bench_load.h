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

// A sharded server (server/README.md, "Sharded server"): with `shard_ports` of N > 1
// servers, each device holds a session with every shard, and one update is N posts, one on
// each of its sessions, started together (make_body is asked for each shard's part); the
// update is acknowledged when every part was, as the worker's ShardedServerChannel counts it.
struct UpdateLoadOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  // The shard servers' ports, shard 0 first; empty: one server at `port`.
  std::vector<std::uint16_t> shard_ports;
  std::string path = "update";
  std::vector<PskCredentials> devices;  // one DTLS session each (per shard), all held open together
  // libcoap servers drop the oldest half-open session beyond 100 (its default
  // max_handshake_sessions), so handshakes are started in waves below that.
  std::size_t max_handshakes_in_flight = 50;
  double handshake_budget_seconds = 60;
  // Updates in progress at once (each on its own device's sessions). A server's socket receive buffer
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
  // Body of update number `sequence` (1, 2, ...) of device `device` for shard `shard`
  // (0 without shards). Called for shards 0, 1, ... in order, right after each other.
  std::function<std::vector<std::uint8_t>(std::size_t device, std::size_t shard,
                                          std::uint64_t sequence)>
      make_body;
  // Called with the payload of every 2.xx answer of shard `shard` (e.g. to follow that
  // server's version).
  std::function<void(std::size_t shard, std::span<const std::uint8_t> payload)> on_success;
  // Called right before the first post and right after the last answer (or give-up), e.g.
  // to read the server's CPU time around the posting phase alone.
  std::function<void()> on_posts_starting, on_posts_finished;
};

// One shard's parts of the updates (the only shard without shard_ports).
struct ShardPostCounts {
  std::uint64_t acknowledged = 0;                 // parts answered 2.xx
  std::map<int, std::uint64_t> refused_by_code;  // parts answered 4.xx / 5.xx
  std::uint64_t unanswered = 0;                  // parts whose exchange was given up
};

struct UpdateLoadReport {
  std::size_t sessions_established = 0;  // devices × shards when every one got in
  std::size_t sessions_failed = 0;
  std::size_t devices_posting = 0;  // devices that held a session with every shard
  double handshake_seconds = 0;  // until every session was established or had failed
  DatagramCounts handshake_traffic;
  // Per update (every shard's part): acknowledged when every part was answered 2.xx;
  // otherwise refused with the code of the first shard that refused its part, or unanswered
  // when no shard refused and one did not answer.
  std::uint64_t posts_acknowledged = 0;
  std::map<int, std::uint64_t> posts_refused_by_code;
  std::uint64_t posts_unanswered = 0;  // retransmissions exhausted, session lost
  std::vector<ShardPostCounts> shards;  // one entry per shard (one without shard_ports)
  std::uint64_t q_block1_refused = 0;  // answered 4.02 to Q-Block1: the server has --q-block=false
  std::uint64_t acknowledged_body_bytes = 0;
  std::uint64_t posted_body_bytes = 0;  // every body handed to libcoap (all parts), answered or not
  double post_seconds = 0;              // first post sent until the last answer arrived
  DatagramCounts post_traffic;
};

// Establishes a session per device (and shard), then keeps up to max_posts_in_flight
// updates going on idle devices until max_posts were sent or max_post_seconds passed, and
// waits (bounded) for the answers of the updates in progress. A device one of whose
// sessions failed posts nothing. Throws TransportError on set-up failure.
UpdateLoadReport run_update_load(const UpdateLoadOptions& options);

}  // namespace edgetrain::transport::bench
