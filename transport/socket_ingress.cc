// recvmsg() and sendmsg() wrappers and registry behind socket_ingress.h: counting, and the hook of
// a server's front filter. The registry is a short list under a mutex: a server process has one or
// two endpoints, and one uncontended lock per datagram costs nothing next to the DTLS record it
// guards.
#include "transport/socket_ingress.h"

#include <dirent.h>
#include <netinet/in.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace edgetrain::transport::detail {
namespace {

struct Registration {
  int fd;
  IngressCounters* counters;
  DatagramFilter* filter;
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<Registration>& registry() {
  static std::vector<Registration> registrations;
  return registrations;
}

bool is_registered(int fd) {
  std::lock_guard lock(registry_mutex());
  for (const Registration& r : registry())
    if (r.fd == fd) return true;
  return false;
}

// Counts a datagram read from `fd` if it is registered; returns its filter (may be null).
// The filter is called outside the lock: it is used only by the thread that reads `fd`,
// which is also the one that unregisters it.
DatagramFilter* count_datagram(int fd, ssize_t bytes) {
  std::lock_guard lock(registry_mutex());
  for (const Registration& r : registry()) {
    if (r.fd == fd) {
      r.counters->bytes.fetch_add(static_cast<std::uint64_t>(bytes), std::memory_order_relaxed);
      r.counters->datagrams.fetch_add(1, std::memory_order_relaxed);
      return r.filter;
    }
  }
  return nullptr;
}

std::atomic<std::uint64_t> g_sendmsg_datagrams{0}, g_sendmsg_bytes{0};

void count_sent_datagram(int fd, ssize_t bytes) {
  g_sendmsg_datagrams.fetch_add(1, std::memory_order_relaxed);
  g_sendmsg_bytes.fetch_add(static_cast<std::uint64_t>(bytes), std::memory_order_relaxed);
  std::lock_guard lock(registry_mutex());
  for (const Registration& r : registry()) {
    if (r.fd == fd) {
      r.counters->sent_bytes.fetch_add(static_cast<std::uint64_t>(bytes),
                                       std::memory_order_relaxed);
      r.counters->sent_datagrams.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
}

bool same_address(const sockaddr* a, socklen_t a_length, const sockaddr* b, socklen_t b_length) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    if (a_length < sizeof(sockaddr_in) || b_length < sizeof(sockaddr_in)) return false;
    const auto* x = reinterpret_cast<const sockaddr_in*>(a);
    const auto* y = reinterpret_cast<const sockaddr_in*>(b);
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    if (a_length < sizeof(sockaddr_in6) || b_length < sizeof(sockaddr_in6)) return false;
    const auto* x = reinterpret_cast<const sockaddr_in6*>(a);
    const auto* y = reinterpret_cast<const sockaddr_in6*>(b);
    return x->sin6_port == y->sin6_port &&
           std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

}  // namespace

SendTotals sendmsg_totals() {
  return {g_sendmsg_datagrams.load(std::memory_order_relaxed),
          g_sendmsg_bytes.load(std::memory_order_relaxed)};
}

void count_ingress(int fd, IngressCounters* counters, DatagramFilter* filter) {
  std::lock_guard lock(registry_mutex());
  for (Registration& r : registry()) {
    if (r.fd == fd) {
      r.counters = counters;
      r.filter = filter;
      return;
    }
  }
  registry().push_back({fd, counters, filter});
}

void stop_counting_ingress(int fd) {
  std::lock_guard lock(registry_mutex());
  auto& all = registry();
  for (auto it = all.begin(); it != all.end(); ++it) {
    if (it->fd == fd) {
      all.erase(it);
      return;
    }
  }
}

int find_bound_udp_socket(const sockaddr* address, socklen_t length) {
  DIR* directory = opendir("/proc/self/fd");
  if (!directory) return -1;
  int found = -1;
  while (dirent* entry = readdir(directory)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(directory)) continue;
    int type = 0;
    socklen_t type_length = sizeof(type);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &type_length) != 0 ||
        type != SOCK_DGRAM)
      continue;
    sockaddr_storage bound{};
    socklen_t bound_length = sizeof(bound);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&bound), &bound_length) != 0)
      continue;
    if (!same_address(reinterpret_cast<const sockaddr*>(&bound), bound_length, address, length))
      continue;
    if (is_registered(static_cast<int>(fd))) continue;
    found = static_cast<int>(fd);
    break;
  }
  closedir(directory);
  return found;
}

namespace {
thread_local bool t_reuse_port = false;  // thread_local: servers may be built on several threads
}  // namespace

ReusePortWhileBinding::ReusePortWhileBinding() { t_reuse_port = true; }
ReusePortWhileBinding::~ReusePortWhileBinding() { t_reuse_port = false; }

}  // namespace edgetrain::transport::detail

// The link maps libcoap's calls of bind() here (--wrap=bind): see ReusePortWhileBinding.
// A socket that refuses SO_REUSEPORT is bound all the same; a second server on the port
// then fails to bind, which says "port in use", as without the option.
extern "C" int __real_bind(int fd, const sockaddr* address, socklen_t length);
extern "C" int __wrap_bind(int fd, const sockaddr* address, socklen_t length) {
  if (edgetrain::transport::detail::t_reuse_port) {
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on));
  }
  return __real_bind(fd, address, length);
}

namespace edgetrain::transport::detail {
namespace {
thread_local bool t_skip_session_walks = false;
thread_local bool t_session_walk_skipped = false;
}  // namespace
SkipSessionWalks::SkipSessionWalks() {
  t_skip_session_walks = true;
  t_session_walk_skipped = false;
}
SkipSessionWalks::~SkipSessionWalks() { t_skip_session_walks = false; }
bool SkipSessionWalks::skipped() const { return t_session_walk_skipped; }
}  // namespace edgetrain::transport::detail

// The link maps libcoap's call of coap_io_prepare_epoll() at the end of coap_io_do_epoll()
// (net.c), and ours, here (--wrap=coap_io_prepare_epoll): see SkipSessionWalks. The
// arguments are libcoap's coap_context_t* and coap_tick_t (uint64_t on POSIX); this file
// does not include libcoap.
extern "C" unsigned int __real_coap_io_prepare_epoll(void* context, std::uint64_t now);
extern "C" unsigned int __wrap_coap_io_prepare_epoll(void* context, std::uint64_t now) {
  if (edgetrain::transport::detail::t_skip_session_walks) {
    edgetrain::transport::detail::t_session_walk_skipped = true;
    return 0;  // coap_io_do_epoll() ignores what it returns
  }
  return __real_coap_io_prepare_epoll(context, now);
}

// The link maps libcoap's calls of recvmsg() here (--wrap=recvmsg); __real_recvmsg is the
// C library's. Only objects in the link are redirected, never the C library itself. A
// datagram that a registered filter refuses is counted and dropped, and the next one read
// in its place (at most kMaxFilteredPerRead per call, then EAGAIN, which libcoap treats as
// "nothing to read").
extern "C" ssize_t __real_recvmsg(int fd, msghdr* message, int flags);
extern "C" ssize_t __wrap_recvmsg(int fd, msghdr* message, int flags) {
  using namespace edgetrain::transport::detail;
  const socklen_t name_capacity = message->msg_namelen;
  const std::size_t control_capacity = message->msg_controllen;
  for (int dropped = 0;; ++dropped) {
    const ssize_t received = __real_recvmsg(fd, message, flags);
    if (received <= 0) return received;
    DatagramFilter* filter = count_datagram(fd, received);
    // Only whole datagrams in one buffer, as libcoap reads them, are filtered.
    if (!filter || (flags & MSG_PEEK) || message->msg_iovlen != 1 ||
        (message->msg_flags & MSG_TRUNC))
      return received;
    const std::span<const std::uint8_t> datagram(
        static_cast<const std::uint8_t*>(message->msg_iov[0].iov_base),
        static_cast<std::size_t>(received));
    if (filter->admit(fd, *message, datagram)) return received;
    if (dropped + 1 >= kMaxFilteredPerRead) {
      errno = EAGAIN;
      return -1;
    }
    message->msg_namelen = name_capacity;
    message->msg_controllen = control_capacity;
    message->msg_flags = 0;
  }
}

// libcoap's sendmsg() calls (--wrap=sendmsg): counted for the registered socket they leave
// from, and in the process's totals.
extern "C" ssize_t __real_sendmsg(int fd, const msghdr* message, int flags);
extern "C" ssize_t __wrap_sendmsg(int fd, const msghdr* message, int flags) {
  const ssize_t sent = __real_sendmsg(fd, message, flags);
  if (sent >= 0) edgetrain::transport::detail::count_sent_datagram(fd, sent);
  return sent;
}
