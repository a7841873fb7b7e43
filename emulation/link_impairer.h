// A user-space UDP link impairer: the emulator's stand-in for netem (not available on our
// machines). Each link relays one worker's datagrams to the server and back through a
// queue that adds delay, jitter, random loss and a bandwidth cap, in both directions:
//
//   worker ──▶ listen address ──[loss, bandwidth, delay+jitter]──▶ upstream (server)
//   worker ◀────────────────────[loss, bandwidth, delay+jitter]──── upstream
//
// One epoll thread serves every link. Each link has its own upstream socket, so the server
// sees one source address per worker. Datagrams stay in order on a link (jitter never
// reorders: a datagram leaves no earlier than the one before it). Loss draws come from a
// seeded generator per link and direction, so a seed gives the same drop pattern for the
// same sequence of datagrams. A full queue (queue_limit_bytes) drops the datagram (tail
// drop), as a router's buffer would. While a link's down schedule (down_schedule.h; issue 38
// part 1) says it is down, every datagram on it is dropped, both ways: those that arrive,
// and those queued whose release falls in the window (they were on the line when it went).
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/splitmix64.h"
#include "emulation/down_schedule.h"

namespace edgetrain::emulation {

struct LinkProfile {
  double delay_ms = 0;        // one-way, added in each direction
  double jitter_ms = 0;       // uniform extra delay in [0, jitter_ms]
  double loss = 0;            // probability a datagram is dropped, each direction
  double bandwidth_kbps = 0;  // serialization rate of each direction; 0: unlimited
  // Toward the worker only, for asymmetric links (broadband and LTE download faster than
  // they upload); < 0 (the default): bandwidth_kbps, 0: unlimited.
  double downlink_kbps = -1;
  std::size_t queue_limit_bytes = 256 * 1024;
  // Times (from the impairer's start) the link is down; empty: always up.
  DownSchedule down;
};

struct LinkSpec {
  std::string name;
  std::string listen_host = "127.0.0.1";
  std::uint16_t listen_port = 0;  // 0: any free port
  std::string upstream_host = "127.0.0.1";
  std::uint16_t upstream_port = 0;
  LinkProfile profile;
  std::uint64_t seed = 1;
};

struct DirectionCounters {
  std::uint64_t datagrams_in = 0, bytes_in = 0;            // arrived at the impairer
  std::uint64_t datagrams_out = 0, bytes_out = 0;          // delivered onwards
  std::uint64_t dropped_loss = 0, dropped_queue_full = 0;  // datagrams
  std::uint64_t dropped_down = 0;  // datagrams dropped while the link was down
};

struct LinkCounters {
  DirectionCounters to_server, to_worker;
};

// Parses "host:port" (IPv4) into a sockaddr; throws std::invalid_argument.
sockaddr_in parse_ipv4_endpoint(const std::string& host, std::uint16_t port);

class LinkImpairer {
 public:
  // Binds every link's listen socket (throws std::runtime_error naming the link on failure)
  // and starts the relay thread.
  explicit LinkImpairer(const std::vector<LinkSpec>& links);
  ~LinkImpairer();  // stops the thread; datagrams still queued are dropped
  LinkImpairer(const LinkImpairer&) = delete;
  LinkImpairer& operator=(const LinkImpairer&) = delete;

  std::size_t size() const { return links_.size(); }
  const LinkSpec& spec(std::size_t link) const { return links_[link]->spec; }
  std::uint16_t listen_port(std::size_t link) const { return links_[link]->bound_port; }
  // A consistent copy of one link's counters (taken from the relay thread's atomics).
  LinkCounters counters(std::size_t link) const;
  // Seconds the link has been down since the impairer started (its down schedule).
  double down_seconds(std::size_t link) const;
  bool down_now(std::size_t link) const;
  // A NAT rebinding (issue 38 part 4): every link's upstream socket is replaced by a new one
  // with a new source port, so the server sees each worker's datagrams come from a new
  // address; datagrams still queued go out through the new socket. Done by the relay
  // thread soon after the call; rebinds() counts the ones done.
  void rebind_upstreams();
  std::uint64_t rebinds() const { return rebinds_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Datagram {
    Clock::time_point release;
    std::vector<std::uint8_t> bytes;
  };
  struct AtomicCounters {
    std::atomic<std::uint64_t> datagrams_in{0}, bytes_in{0}, datagrams_out{0}, bytes_out{0},
        dropped_loss{0}, dropped_queue_full{0}, dropped_down{0};
  };
  struct Direction {
    std::deque<Datagram> queue;
    std::size_t queued_bytes = 0;
    Clock::time_point line_free;     // when the bandwidth cap lets the next datagram start
    Clock::time_point last_release;  // keeps the link in order
    runtime::SplitMix64 random{0};
    AtomicCounters counters;
  };
  struct Link {
    LinkSpec spec;
    int worker_side = -1;    // bound to the listen address
    int upstream_side = -1;  // connected to the server
    std::uint16_t bound_port = 0;
    sockaddr_in worker_address{};
    bool worker_known = false;
    Direction to_server, to_worker;
  };

  void relay();
  void rebind(std::size_t link);
  void receive(Link& link, bool from_worker);
  void enqueue(const LinkProfile& profile, double bandwidth_kbps, Direction& direction,
               std::vector<std::uint8_t> bytes, Clock::time_point now);
  // Sends every datagram whose time has come; returns the earliest pending release.
  Clock::time_point flush(Link& link, Clock::time_point now);

  std::vector<std::unique_ptr<Link>> links_;
  int epoll_ = -1;
  int wake_ = -1;  // eventfd that stops the thread
  std::atomic<bool> stop_{false};
  std::atomic<bool> rebind_requested_{false};
  std::atomic<std::uint64_t> rebinds_{0};
  Clock::time_point start_ = Clock::now();  // time 0 of the down schedules
  double seconds_since_start(Clock::time_point t) const {
    return std::chrono::duration<double>(t - start_).count();
  }
  std::thread thread_;
};

}  // namespace edgetrain::emulation
