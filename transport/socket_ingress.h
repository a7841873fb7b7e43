// Counting the UDP bytes that reach a server socket, and those it sends (transport-internal;
// not for use outside transport/).
//
// DESIGN.md's figure of merit is every byte that reaches the server's UDP socket: DTLS
// records, CoAP headers, block-wise overhead, retransmissions and handshakes. libcoap
// 4.3.1 has no hook on the datagrams its endpoint receives, and it keeps the endpoint's
// socket private. So the link wraps recvmsg() (`-Wl,--wrap=recvmsg`, set on the transport
// library): libcoap reads every datagram of an unconnected (server) socket with recvmsg(),
// and the wrapper adds the bytes to the counters registered for that descriptor. Client
// sockets are connected and read with recv(), so they are never counted. What the server
// sends is counted the same way: libcoap sends on an unconnected socket with sendmsg()
// (`-Wl,--wrap=sendmsg`; client sockets are connected and use send()).
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <span>

namespace edgetrain::transport::detail {

struct IngressCounters {
  std::atomic<std::uint64_t> bytes{0};  // UDP payload bytes as recvmsg() returned them
  std::atomic<std::uint64_t> datagrams{0};
  std::atomic<std::uint64_t> sent_bytes{0};  // UDP payload bytes sendmsg() sent from the socket
  std::atomic<std::uint64_t> sent_datagrams{0};
};

// Every sendmsg() of this process, registered socket or not (the load generator's count of
// what it sends: tests/bench/).
struct SendTotals {
  std::uint64_t datagrams = 0, bytes = 0;
};
SendTotals sendmsg_totals();

// Decides whether libcoap gets a datagram read from a registered socket. Called on the
// thread that reads the socket, inside its recvmsg(); may send on `fd`.
class DatagramFilter {
 public:
  virtual ~DatagramFilter() = default;
  // `received` is the message as recvmsg() filled it (source address, control data).
  virtual bool admit(int fd, const msghdr& received, std::span<const std::uint8_t> datagram) = 0;
};

// Most datagrams one recvmsg() call drops for a filter before it gives up with EAGAIN
// (libcoap then returns to its loop, which walks its sessions' timeouts; the socket stays
// readable, so the next pass goes on).
inline constexpr int kMaxFilteredPerRead = 64;

// From now on, datagrams that libcoap reads from `fd` are added to `counters`, and, given a
// `filter`, handed to libcoap only when it admits them. Both must outlive the registration
// (stop_counting_ingress() before destroying them).
void count_ingress(int fd, IngressCounters* counters, DatagramFilter* filter = nullptr);
void stop_counting_ingress(int fd);

// The descriptor of this process's UDP socket bound to exactly `address`, skipping those
// already registered with count_ingress(); -1 if there is none. Scans /proc/self/fd.
int find_bound_udp_socket(const sockaddr* address, socklen_t length);

// While an instance lives, the UDP sockets this thread binds (libcoap's endpoints, through
// the bind() wrap, -Wl,--wrap=bind) get SO_REUSEPORT first: libcoap 4.3.1 sets only
// SO_REUSEADDR and has no hook between socket() and bind().
class ReusePortWhileBinding {
 public:
  ReusePortWhileBinding();
  ~ReusePortWhileBinding();
  ReusePortWhileBinding(const ReusePortWhileBinding&) = delete;
  ReusePortWhileBinding& operator=(const ReusePortWhileBinding&) = delete;
};

// While an instance lives, this thread's calls of libcoap's coap_io_prepare_epoll() (the walk
// of every session that coap_io_do_epoll() ends with; -Wl,--wrap=coap_io_prepare_epoll) are
// skipped, and skipped() says whether one was: CoapDtlsServer::run_once() defers the walk
// (coap_server.cc, kWalkDeferral). Every other call walks.
class SkipSessionWalks {
 public:
  SkipSessionWalks();
  ~SkipSessionWalks();
  bool skipped() const;
  SkipSessionWalks(const SkipSessionWalks&) = delete;
  SkipSessionWalks& operator=(const SkipSessionWalks&) = delete;
};

}  // namespace edgetrain::transport::detail
