// A user-space UDP relay on loopback that holds every datagram for a fixed time in each
// direction: a stand-in for a WAN's one-way latency when measuring lock-step block-wise
// transfers (no network namespaces, no root, no tc/netem). One client at a time: the
// address the last client datagram came from gets the server's answers.
//
//   client ──▶ 127.0.0.1:port() ──(delay)──▶ upstream server
//   client ◀──────────(delay)────────────── upstream server
//
// Datagrams are never reordered or duplicated (constant delay, FIFO); with a loss rate,
// each one is dropped independently with that probability (seeded, so a run repeats). It
// uses sendto/recvfrom, not the send/recv calls the load generator counts.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace edgetrain::testing {

class UdpDelayProxy {
 public:
  // Listens on 127.0.0.1 (a free port) and relays to 127.0.0.1:upstream_port with
  // `one_way_delay` added in each direction. Throws std::runtime_error on socket errors.
  UdpDelayProxy(std::uint16_t upstream_port, std::chrono::milliseconds one_way_delay,
                double loss_rate = 0, std::uint64_t seed = 1);
  ~UdpDelayProxy();  // stops the relay thread; datagrams still held are dropped
  UdpDelayProxy(const UdpDelayProxy&) = delete;
  UdpDelayProxy& operator=(const UdpDelayProxy&) = delete;

  std::uint16_t port() const { return port_; }
  std::uint64_t datagrams_to_server() const { return to_server_; }
  std::uint64_t datagrams_to_client() const { return to_client_; }
  // UDP payload bytes relayed each way (what reached the server's socket, and the client's).
  std::uint64_t bytes_to_server() const { return bytes_to_server_; }
  std::uint64_t bytes_to_client() const { return bytes_to_client_; }
  std::uint64_t datagrams_dropped() const { return dropped_; }
  // Changes the loss rate from now on (e.g. a lossless handshake, then a lossy transfer).
  void set_loss_rate(double loss_rate) { loss_rate_ = loss_rate; }  // 1: drop everything

 private:
  void relay();

  int client_side_ = -1;  // bound to 127.0.0.1:port_
  int server_side_ = -1;  // connected to the upstream server
  std::uint16_t port_ = 0;
  std::chrono::milliseconds delay_;
  std::atomic<double> loss_rate_{0};
  std::uint64_t seed_ = 1;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> to_server_{0}, to_client_{0}, dropped_{0};
  std::atomic<std::uint64_t> bytes_to_server_{0}, bytes_to_client_{0};
  std::thread thread_;
};

}  // namespace edgetrain::testing
