#include "tests/support/udp_delay_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace edgetrain::testing {
namespace {

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("udp delay proxy: " + what + ": " + std::strerror(errno));
}

}  // namespace

UdpDelayProxy::UdpDelayProxy(std::uint16_t upstream_port, std::chrono::milliseconds one_way_delay,
                             double loss_rate, std::uint64_t seed)
    : delay_(one_way_delay), loss_rate_(loss_rate), seed_(seed) {
  if (!(loss_rate >= 0 && loss_rate < 1))
    throw std::invalid_argument("udp delay proxy: loss rate must be in [0, 1)");
  client_side_ = ::socket(AF_INET, SOCK_DGRAM, 0);
  server_side_ = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (client_side_ < 0 || server_side_ < 0) fail("socket");
  sockaddr_in listen_address = loopback(0);
  if (::bind(client_side_, reinterpret_cast<sockaddr*>(&listen_address), sizeof(listen_address)) !=
      0)
    fail("bind");
  socklen_t length = sizeof(listen_address);
  if (::getsockname(client_side_, reinterpret_cast<sockaddr*>(&listen_address), &length) != 0)
    fail("getsockname");
  port_ = ntohs(listen_address.sin_port);
  sockaddr_in upstream = loopback(upstream_port);
  if (::connect(server_side_, reinterpret_cast<sockaddr*>(&upstream), sizeof(upstream)) != 0)
    fail("connect");
  thread_ = std::thread([this] { relay(); });
}

UdpDelayProxy::~UdpDelayProxy() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  ::close(client_side_);
  ::close(server_side_);
}

void UdpDelayProxy::relay() {
  using Clock = std::chrono::steady_clock;
  struct Held {
    Clock::time_point due;
    bool to_server;
    std::vector<std::uint8_t> bytes;
  };
  // Same delay both ways, so arrival order is release order: one FIFO suffices.
  std::deque<Held> held;
  sockaddr_in client{};
  bool have_client = false;
  std::vector<std::uint8_t> buffer(65536);
  std::mt19937_64 random(seed_);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  auto hold = [&](bool to_server, ssize_t n) {
    const double loss_rate = loss_rate_;
    if (loss_rate > 0 && uniform(random) < loss_rate) {
      ++dropped_;
      return;
    }
    held.push_back({Clock::now() + delay_, to_server, {buffer.begin(), buffer.begin() + n}});
  };
  while (!stop_) {
    const auto now = Clock::now();
    while (!held.empty() && held.front().due <= now) {
      Held& next = held.front();
      if (next.to_server) {
        ::sendto(server_side_, next.bytes.data(), next.bytes.size(), 0, nullptr, 0);
        ++to_server_;
        bytes_to_server_ += next.bytes.size();
      } else if (have_client) {
        ::sendto(client_side_, next.bytes.data(), next.bytes.size(), 0,
                 reinterpret_cast<sockaddr*>(&client), sizeof(client));
        ++to_client_;
        bytes_to_client_ += next.bytes.size();
      }
      held.pop_front();
    }
    int wait_ms = 50;  // also how quickly the destructor is noticed
    if (!held.empty()) {
      const auto until =
          std::chrono::duration_cast<std::chrono::milliseconds>(held.front().due - Clock::now());
      wait_ms =
          static_cast<int>(std::max<long long>(0, std::min<long long>(until.count(), wait_ms)));
    }
    pollfd fds[2] = {{client_side_, POLLIN, 0}, {server_side_, POLLIN, 0}};
    if (::poll(fds, 2, wait_ms) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      sockaddr_in from{};
      socklen_t from_length = sizeof(from);
      const ssize_t n = ::recvfrom(client_side_, buffer.data(), buffer.size(), 0,
                                   reinterpret_cast<sockaddr*>(&from), &from_length);
      if (n >= 0) {
        client = from;
        have_client = true;
        hold(true, n);
      }
    }
    if (fds[1].revents & POLLIN) {
      const ssize_t n = ::recvfrom(server_side_, buffer.data(), buffer.size(), 0, nullptr, nullptr);
      if (n >= 0) hold(false, n);
    }
  }
}

}  // namespace edgetrain::testing
