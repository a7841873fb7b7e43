#include "server/metrics_endpoint.h"

#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <charconv>
#include <cstring>
#include <stdexcept>

namespace edgetrain::server {
namespace {

constexpr std::size_t kMaxRequestHead = 8192;

void send_all(int fd, const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // the scraper went away: nothing to do
    sent += static_cast<std::size_t>(n);
  }
}

std::string http_response(const char* status, const char* content_type, const std::string& body) {
  return std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

}  // namespace

std::pair<std::string, std::uint16_t> split_listen_address(const std::string& listen) {
  const std::size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size())
    throw std::invalid_argument("--metrics-listen needs ADDRESS:PORT (e.g. 127.0.0.1:9464), got '" +
                                listen + "'");
  std::string host = listen.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned port = 0;
  const char* digits = listen.data() + colon + 1;
  const auto [end, error] = std::from_chars(digits, listen.data() + listen.size(), port);
  if (error != std::errc() || end != listen.data() + listen.size() || port > 65535)
    throw std::invalid_argument("--metrics-listen: the port of '" + listen +
                                "' is not a number 0..65535");
  return {host, static_cast<std::uint16_t>(port)};
}

MetricsEndpoint::MetricsEndpoint(const std::string& listen, std::function<std::string()> render)
    : render_(std::move(render)) {
  const auto [host, port] = split_listen_address(listen);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int e = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); e != 0)
    throw std::invalid_argument("--metrics-listen: '" + host + "' is not a numeric IP address (" +
                                gai_strerror(e) + ")");
  listener_ = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (listener_ >= 0) setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = listener_ >= 0 && ::bind(listener_, found->ai_addr, found->ai_addrlen) == 0 &&
                     ::listen(listener_, 8) == 0;
  const int bind_errno = errno;
  freeaddrinfo(found);
  if (!bound) {
    if (listener_ >= 0) ::close(listener_);
    throw std::runtime_error("--metrics-listen " + listen +
                             ": cannot listen: " + std::strerror(bind_errno));
  }
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  getsockname(listener_, reinterpret_cast<sockaddr*>(&local), &length);
  port_ = ntohs(local.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&local)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  thread_ = std::thread([this] { serve(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  ::close(listener_);
}

void MetricsEndpoint::serve() {
  while (!stop_) {
    pollfd ready{listener_, POLLIN, 0};
    if (::poll(&ready, 1, 200) <= 0) continue;  // looks at stop_ every 200 ms
    const int connection = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    answer(connection);
    ::close(connection);
  }
}

void MetricsEndpoint::answer(int connection) {
  timeval two_seconds{2, 0};
  setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &two_seconds, sizeof(two_seconds));
  std::string head;
  char buffer[1024];
  // Two seconds for the whole head, not per read: a client trickling bytes cannot hold the
  // one thread longer.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < kMaxRequestHead) {
    if (std::chrono::steady_clock::now() >= deadline) return;
    const ssize_t n = ::recv(connection, buffer, sizeof(buffer), 0);
    if (n <= 0) return;  // closed, or too slow
    head.append(buffer, static_cast<std::size_t>(n));
  }
  const std::string line = head.substr(0, head.find("\r\n"));
  const std::size_t space = line.find(' ');
  const std::size_t second =
      space == std::string::npos ? std::string::npos : line.find(' ', space + 1);
  if (second == std::string::npos) {
    send_all(connection,
             http_response("400 Bad Request", "text/plain; charset=utf-8", "bad request line\n"));
    return;
  }
  const std::string method = line.substr(0, space);
  std::string path = line.substr(space + 1, second - space - 1);
  path = path.substr(0, path.find('?'));
  if (path != "/metrics") {
    send_all(connection, http_response("404 Not Found", "text/plain; charset=utf-8",
                                       "only /metrics is served here\n"));
  } else if (method != "GET") {
    send_all(connection, http_response("405 Method Not Allowed", "text/plain; charset=utf-8",
                                       "only GET /metrics\n"));
  } else {
    scrapes_.fetch_add(1, std::memory_order_relaxed);
    send_all(connection,
             http_response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_()));
  }
}

}  // namespace edgetrain::server
