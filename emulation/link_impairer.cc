#include "emulation/link_impairer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace edgetrain::emulation {
namespace {

constexpr std::size_t kMaxDatagram = 65536;

std::runtime_error system_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

int udp_socket() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw system_error("socket");
  // Bursts of block-wise transfers from many links: a larger receive buffer avoids drops
  // the profile did not ask for (the kernel caps it at rmem_max).
  const int buffer = 1 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  return fd;
}

// Link index and direction packed into the epoll cookie.
std::uint64_t cookie(std::size_t link, bool worker_side) {
  return (static_cast<std::uint64_t>(link) << 1) | (worker_side ? 1 : 0);
}

}  // namespace

sockaddr_in parse_ipv4_endpoint(const std::string& host, std::uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    throw std::invalid_argument("not an IPv4 address: '" + host + "'");
  }
  return address;
}

LinkImpairer::LinkImpairer(const std::vector<LinkSpec>& links) {
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) throw system_error("epoll_create1");
  wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_ < 0) throw system_error("eventfd");
  epoll_event wake_event{};
  wake_event.events = EPOLLIN;
  wake_event.data.u64 = ~std::uint64_t{0};
  ::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &wake_event);
  try {
    for (std::size_t i = 0; i < links.size(); i++) {
      auto link = std::make_unique<Link>();
      link->spec = links[i];
      const LinkProfile& p = link->spec.profile;
      if (!(p.delay_ms >= 0 && p.jitter_ms >= 0 && p.loss >= 0 && p.loss <= 1 &&
            p.bandwidth_kbps >= 0)) {
        throw std::invalid_argument("link " + link->spec.name +
                                    ": delay, jitter and bandwidth must be >= 0, loss in [0, 1]");
      }
      p.down.check("link " + link->spec.name);
      const sockaddr_in listen_address =
          parse_ipv4_endpoint(link->spec.listen_host, link->spec.listen_port);
      const sockaddr_in upstream =
          parse_ipv4_endpoint(link->spec.upstream_host, link->spec.upstream_port);
      link->worker_side = udp_socket();
      if (::bind(link->worker_side, reinterpret_cast<const sockaddr*>(&listen_address),
                 sizeof listen_address) != 0) {
        throw system_error("link " + link->spec.name + ": bind " + link->spec.listen_host + ":" +
                           std::to_string(link->spec.listen_port));
      }
      sockaddr_in bound{};
      socklen_t length = sizeof bound;
      ::getsockname(link->worker_side, reinterpret_cast<sockaddr*>(&bound), &length);
      link->bound_port = ntohs(bound.sin_port);
      link->upstream_side = udp_socket();
      if (::connect(link->upstream_side, reinterpret_cast<const sockaddr*>(&upstream),
                    sizeof upstream) != 0) {
        throw system_error("link " + link->spec.name + ": connect to the upstream " +
                           link->spec.upstream_host);
      }
      // Independent, reproducible loss draws per link and direction.
      link->to_server.random = runtime::SplitMix64{link->spec.seed * 2 + 1};
      link->to_worker.random = runtime::SplitMix64{link->spec.seed * 2 + 2};
      for (bool worker_side : {true, false}) {
        epoll_event event{};
        event.events = EPOLLIN;
        event.data.u64 = cookie(i, worker_side);
        if (::epoll_ctl(epoll_, EPOLL_CTL_ADD,
                        worker_side ? link->worker_side : link->upstream_side, &event) != 0) {
          throw system_error("epoll_ctl");
        }
      }
      links_.push_back(std::move(link));
    }
  } catch (...) {
    for (auto& link : links_) ::close(link->worker_side), ::close(link->upstream_side);
    ::close(epoll_);
    ::close(wake_);
    throw;
  }
  thread_ = std::thread([this] { relay(); });
}

LinkImpairer::~LinkImpairer() {
  stop_ = true;
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto written = ::write(wake_, &one, sizeof one);
  thread_.join();
  for (auto& link : links_) ::close(link->worker_side), ::close(link->upstream_side);
  ::close(epoll_);
  ::close(wake_);
}

LinkCounters LinkImpairer::counters(std::size_t link) const {
  auto copy = [](const AtomicCounters& c) {
    return DirectionCounters{c.datagrams_in.load(),  c.bytes_in.load(),
                             c.datagrams_out.load(), c.bytes_out.load(),
                             c.dropped_loss.load(),  c.dropped_queue_full.load(),
                             c.dropped_down.load()};
  };
  return {copy(links_[link]->to_server.counters), copy(links_[link]->to_worker.counters)};
}

double LinkImpairer::down_seconds(std::size_t link) const {
  return links_[link]->spec.profile.down.down_seconds_until(seconds_since_start(Clock::now()));
}

bool LinkImpairer::down_now(std::size_t link) const {
  return links_[link]->spec.profile.down.down_at(seconds_since_start(Clock::now()));
}

void LinkImpairer::enqueue(const LinkProfile& profile, double bandwidth_kbps, Direction& direction,
                           std::vector<std::uint8_t> bytes, Clock::time_point now) {
  auto& c = direction.counters;
  c.datagrams_in++;
  c.bytes_in += bytes.size();
  // The loss draw happens for every datagram, dropped or not, so the pattern depends only
  // on the seed and the datagram count.
  const double draw = direction.random.uniform_double();
  const double jitter_draw = direction.random.uniform_double();
  if (profile.down.down_at(seconds_since_start(now))) {
    c.dropped_down++;
    return;
  }
  if (draw < profile.loss) {
    c.dropped_loss++;
    return;
  }
  if (direction.queued_bytes + bytes.size() > profile.queue_limit_bytes) {
    c.dropped_queue_full++;
    return;
  }
  Clock::time_point sent = now;
  if (bandwidth_kbps > 0) {
    // The datagram occupies the line for its serialization time, after those before it.
    const double seconds = static_cast<double>(bytes.size()) * 8.0 / (bandwidth_kbps * 1000.0);
    sent = std::max(now, direction.line_free) +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    direction.line_free = sent;
  }
  const double delay_ms = profile.delay_ms + profile.jitter_ms * jitter_draw;
  Clock::time_point release = sent + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double, std::milli>(delay_ms));
  release = std::max(release, direction.last_release);
  direction.last_release = release;
  direction.queued_bytes += bytes.size();
  direction.queue.push_back({release, std::move(bytes)});
}

void LinkImpairer::receive(Link& link, bool from_worker) {
  std::uint8_t buffer[kMaxDatagram];
  for (int burst = 0; burst < 64; burst++) {  // bounded, so one busy link cannot starve the rest
    sockaddr_in source{};
    socklen_t length = sizeof source;
    const ssize_t n = from_worker ? ::recvfrom(link.worker_side, buffer, sizeof buffer, 0,
                                               reinterpret_cast<sockaddr*>(&source), &length)
                                  : ::recv(link.upstream_side, buffer, sizeof buffer, 0);
    if (n < 0) return;  // EAGAIN, or an ICMP error from a server that is down: nothing to relay
    if (from_worker) {
      // The worker may restart with a new source port: answers go to whoever spoke last.
      link.worker_address = source;
      link.worker_known = true;
    }
    const LinkProfile& profile = link.spec.profile;
    const double kbps =
        from_worker || profile.downlink_kbps < 0 ? profile.bandwidth_kbps : profile.downlink_kbps;
    enqueue(profile, kbps, from_worker ? link.to_server : link.to_worker,
            std::vector<std::uint8_t>(buffer, buffer + n), Clock::now());
  }
}

LinkImpairer::Clock::time_point LinkImpairer::flush(Link& link, Clock::time_point now) {
  Clock::time_point next = Clock::time_point::max();
  for (bool to_server : {true, false}) {
    Direction& d = to_server ? link.to_server : link.to_worker;
    while (!d.queue.empty() && d.queue.front().release <= now) {
      Datagram& datagram = d.queue.front();
      ssize_t sent = -1;
      if (!link.spec.profile.down.empty() &&
          link.spec.profile.down.down_at(seconds_since_start(datagram.release))) {
        d.counters.dropped_down++;  // the link went down while it was on the line
      } else if (to_server) {
        sent = ::send(link.upstream_side, datagram.bytes.data(), datagram.bytes.size(), 0);
      } else {
        sent = link.worker_known
                   ? ::sendto(link.worker_side, datagram.bytes.data(), datagram.bytes.size(), 0,
                              reinterpret_cast<const sockaddr*>(&link.worker_address),
                              sizeof link.worker_address)
                   : -1;
      }
      if (sent >= 0 && sent == static_cast<ssize_t>(datagram.bytes.size())) {
        d.counters.datagrams_out++;
        d.counters.bytes_out += datagram.bytes.size();
      }
      // A failed send (server down: ECONNREFUSED) loses the datagram, as the network would.
      d.queued_bytes -= datagram.bytes.size();
      d.queue.pop_front();
    }
    if (!d.queue.empty()) next = std::min(next, d.queue.front().release);
  }
  return next;
}

void LinkImpairer::rebind_upstreams() {
  rebind_requested_ = true;
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto written = ::write(wake_, &one, sizeof one);
}

// On the relay thread. A socket that cannot be made leaves the link on its old one (the
// rebinding is an experiment's event, not something to fail the relay over).
void LinkImpairer::rebind(std::size_t index) {
  Link& link = *links_[index];
  const int fresh = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fresh < 0) return;
  const sockaddr_in upstream = parse_ipv4_endpoint(link.spec.upstream_host, link.spec.upstream_port);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = cookie(index, false);
  if (::connect(fresh, reinterpret_cast<const sockaddr*>(&upstream), sizeof upstream) != 0 ||
      ::epoll_ctl(epoll_, EPOLL_CTL_ADD, fresh, &event) != 0) {
    ::close(fresh);
    return;
  }
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, link.upstream_side, nullptr);
  ::close(link.upstream_side);
  link.upstream_side = fresh;
}

void LinkImpairer::relay() {
  std::vector<epoll_event> events(256);
  Clock::time_point next_release = Clock::time_point::max();
  while (!stop_) {
    int timeout_ms = 200;
    if (next_release != Clock::time_point::max()) {
      const auto wait =
          std::chrono::ceil<std::chrono::milliseconds>(next_release - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(wait, 0, 200));
    }
    const int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), timeout_ms);
    for (int i = 0; i < n; i++) {
      const std::uint64_t c = events[i].data.u64;
      if (c == ~std::uint64_t{0}) {  // the wake event: stop, or a rebinding
        std::uint64_t count = 0;
        [[maybe_unused]] const auto read = ::read(wake_, &count, sizeof count);
        if (rebind_requested_.exchange(false)) {
          for (std::size_t l = 0; l < links_.size(); l++) rebind(l);
          rebinds_++;
        }
        continue;
      }
      receive(*links_[c >> 1], (c & 1) != 0);
    }
    const auto now = Clock::now();
    next_release = Clock::time_point::max();
    for (auto& link : links_) next_release = std::min(next_release, flush(*link, now));
  }
}

}  // namespace edgetrain::emulation
