#include "tests/support/dtls_hello_flood.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace edgetrain::testing {
namespace {

void put_u16(std::vector<std::uint8_t>& out, std::size_t value) {
  out.push_back(static_cast<std::uint8_t>(value >> 8));
  out.push_back(static_cast<std::uint8_t>(value));
}
void put_u24(std::vector<std::uint8_t>& out, std::size_t value) {
  out.push_back(static_cast<std::uint8_t>(value >> 16));
  put_u16(out, value & 0xffff);
}

}  // namespace

std::vector<std::uint8_t> dtls_client_hello(std::uint64_t record_sequence,
                                            std::span<const std::uint8_t> cookie,
                                            std::uint32_t random_seed) {
  std::vector<std::uint8_t> body = {254, 253};  // client_version DTLS 1.2
  std::uint32_t state = random_seed * 2654435761u + 1;
  for (int i = 0; i < 32; ++i) {
    state = state * 1664525u + 1013904223u;
    body.push_back(static_cast<std::uint8_t>(state >> 24));
  }
  body.push_back(0);  // no session id
  body.push_back(static_cast<std::uint8_t>(cookie.size()));
  body.insert(body.end(), cookie.begin(), cookie.end());
  put_u16(body, 4);       // cipher suites:
  put_u16(body, 0xC0A8);  //   TLS_PSK_WITH_AES_128_CCM_8
  put_u16(body, 0xC0FF);  //   TLS_ECJPAKE_WITH_AES_128_CCM_8 (ignored by a PSK server)
  body.push_back(1);      // compression methods:
  body.push_back(0);      //   null
  std::vector<std::uint8_t> out = {22, 254, 253};  // handshake, DTLS 1.2
  put_u16(out, 0);                                 // epoch
  put_u16(out, (record_sequence >> 32) & 0xffff);
  put_u16(out, (record_sequence >> 16) & 0xffff);
  put_u16(out, record_sequence & 0xffff);
  put_u16(out, 12 + body.size());
  out.push_back(1);  // client_hello
  put_u24(out, body.size());
  put_u16(out, cookie.empty() ? 0 : 1);  // message_seq
  put_u24(out, 0);
  put_u24(out, body.size());
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

HelloFlood::HelloFlood(std::uint16_t server_port) : port_(server_port) {}

bool HelloFlood::send_one() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  // 127.1.0.1 .. 127.1.255.254, then around again (with new ports).
  const std::uint32_t host = next_source_++ % 65534 + 1;
  sockaddr_in source{};
  source.sin_family = AF_INET;
  source.sin_addr.s_addr = htonl((127u << 24) | (1u << 16) | host);
  sockaddr_in server{};
  server.sin_family = AF_INET;
  server.sin_port = htons(port_);
  server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool sent = false;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&source), sizeof(source)) == 0) {
    const auto hello = dtls_client_hello(sent_, {}, static_cast<std::uint32_t>(sent_));
    sent = ::sendto(fd, hello.data(), hello.size(), 0, reinterpret_cast<const sockaddr*>(&server),
                    sizeof(server)) == static_cast<ssize_t>(hello.size());
  }
  ::close(fd);
  if (sent) ++sent_;
  return sent;
}

std::size_t HelloFlood::send(std::size_t count, double per_second, const std::atomic<bool>* stop) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  std::size_t done = 0;
  while (done < count && !(stop && stop->load())) {
    if (per_second > 0) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      if (static_cast<double>(done) >= elapsed * per_second) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
    }
    if (send_one())
      ++done;
    else
      std::this_thread::sleep_for(
          std::chrono::milliseconds(1));  // out of buffers: let the server read
  }
  return done;
}

}  // namespace edgetrain::testing
