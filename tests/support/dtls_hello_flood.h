// Test and benchmark only: a flood of DTLS ClientHellos as an attacker who can send UDP
// to the server's port sends it (no key needed), from loopback. Each ClientHello leaves from
// a socket of its own, bound to its own address in 127.1.0.0/16 (every 127.x.y.z is local
// on Linux) with a fresh ephemeral port, so the server sees every one from a new source,
// as it would see spoofed ones. The answers (HelloVerifyRequests) are never read.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace edgetrain::testing {

// A DTLS 1.2 ClientHello that Mbed TLS accepts (one PSK and one ECDHE-PSK AES-CCM-8 suite,
// no extensions), in one datagram, with `cookie` (empty in a first ClientHello).
std::vector<std::uint8_t> dtls_client_hello(std::uint64_t record_sequence,
                                            std::span<const std::uint8_t> cookie = {},
                                            std::uint32_t random_seed = 0);

class HelloFlood {
 public:
  explicit HelloFlood(std::uint16_t server_port);
  // Sends `count` ClientHellos to 127.0.0.1:server_port at `per_second` (0: as fast as it
  // can), or fewer if `stop` becomes true. Returns how many were sent.
  std::size_t send(std::size_t count, double per_second, const std::atomic<bool>* stop = nullptr);
  std::size_t sent() const { return sent_; }

 private:
  bool send_one();
  std::uint16_t port_;
  std::size_t sent_ = 0;
  std::uint32_t next_source_ = 0;
};

}  // namespace edgetrain::testing
