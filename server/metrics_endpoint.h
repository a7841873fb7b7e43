// The metrics endpoint (edgetrain-server --metrics-listen ADDRESS:PORT): GET /metrics over
// plain HTTP/1.1 answers with the text exposition format that Prometheus and other
// OpenMetrics scrapers read; any other path gets 404, any other method 405. It only reads:
// the body is whatever `render` returns (the server hands it a copy the CoAP thread
// refreshes every second), so a scrape never touches the training state.
//
// One thread, one connection at a time (a scraper, not a crowd): each connection gets
// two seconds to send its request head (at most 8 KiB) and is closed after the answer.
// Listens nowhere unless constructed; the destructor stops the thread within ~200 ms.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace edgetrain::server {

class MetricsEndpoint {
 public:
  // `listen` is "ADDRESS:PORT" (IPv4, or [IPv6]:PORT; port 0: any free port, see port()).
  // Throws std::invalid_argument for a malformed address, std::runtime_error when the
  // socket cannot be bound. `render` is called on the endpoint's thread.
  MetricsEndpoint(const std::string& listen, std::function<std::string()> render);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  std::uint16_t port() const { return port_; }
  std::uint64_t scrapes() const { return scrapes_.load(std::memory_order_relaxed); }

 private:
  void serve();
  void answer(int connection);

  std::function<std::string()> render_;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_ = false;
  std::atomic<std::uint64_t> scrapes_ = 0;
  std::thread thread_;
};

// Splits "ADDRESS:PORT" / "[ADDRESS]:PORT"; throws std::invalid_argument saying what is wrong.
std::pair<std::string, std::uint16_t> split_listen_address(const std::string& listen);

}  // namespace edgetrain::server
