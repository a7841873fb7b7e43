// emulation::LinkImpairer on loopback: a "worker" socket and a "server" socket talk through
// one link. Checks that datagrams are relayed both ways with at least the configured delay,
// that loss draws repeat for a seed (and differ for another), that the bandwidth cap spaces
// datagrams by their serialization time, that a full queue drops, that jitter keeps order,
// that a down window drops every datagram both ways and the link comes back after it
// (down_schedule.h, whose times and parsing are checked on their own here too), and that bad
// profiles are refused. Time bounds are lower bounds (a loaded machine only
// makes things later) plus generous upper bounds.
#include "emulation/link_impairer.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <set>
#include <thread>

namespace edgetrain::emulation {
namespace {

using Clock = std::chrono::steady_clock;

class UdpSocket {
 public:
  UdpSocket() {
    fd_ = ::socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in address = parse_ipv4_endpoint("127.0.0.1", 0);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    const int buffer = 1 << 20;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  }
  ~UdpSocket() { ::close(fd_); }
  std::uint16_t port() const {
    sockaddr_in address{};
    socklen_t length = sizeof address;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    return ntohs(address.sin_port);
  }
  void send_to(std::uint16_t port, const std::vector<std::uint8_t>& bytes) {
    sockaddr_in to = parse_ipv4_endpoint("127.0.0.1", port);
    ASSERT_EQ(
        ::sendto(fd_, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
        static_cast<ssize_t>(bytes.size()));
  }
  // One datagram within `timeout`, or an empty vector; `from_port` gets the sender's port.
  std::vector<std::uint8_t> receive(std::chrono::milliseconds timeout,
                                    std::uint16_t* from_port = nullptr) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return {};
    std::vector<std::uint8_t> buffer(65536);
    sockaddr_in from{};
    socklen_t length = sizeof from;
    const ssize_t n = ::recvfrom(fd_, buffer.data(), buffer.size(), 0,
                                 reinterpret_cast<sockaddr*>(&from), &length);
    if (n < 0) return {};
    if (from_port) *from_port = ntohs(from.sin_port);
    buffer.resize(static_cast<std::size_t>(n));
    return buffer;
  }

 private:
  int fd_ = -1;
};

LinkSpec link_to(std::uint16_t server_port, LinkProfile profile, std::uint64_t seed = 1) {
  LinkSpec spec;
  spec.name = "test";
  spec.upstream_port = server_port;
  spec.profile = profile;
  spec.seed = seed;
  return spec;
}

std::vector<std::uint8_t> numbered(std::uint32_t number, std::size_t size = 64) {
  std::vector<std::uint8_t> bytes(size, 0xab);
  std::memcpy(bytes.data(), &number, sizeof number);
  return bytes;
}

std::uint32_t number_of(const std::vector<std::uint8_t>& bytes) {
  if (bytes.size() < 4) return UINT32_MAX;  // nothing arrived
  std::uint32_t number = 0;
  std::memcpy(&number, bytes.data(), sizeof number);
  return number;
}

TEST(LinkImpairer, RelaysBothWaysWithTheDelayAndOneSourcePerLink) {
  UdpSocket worker, server;
  LinkImpairer impairer({link_to(server.port(), {.delay_ms = 80})});
  const auto sent = Clock::now();
  worker.send_to(impairer.listen_port(0), numbered(7));
  std::uint16_t impairer_port = 0;
  const auto request = server.receive(std::chrono::seconds(5), &impairer_port);
  const auto arrived = Clock::now();
  ASSERT_EQ(request.size(), 64u);
  EXPECT_EQ(number_of(request), 7u);
  EXPECT_GE(arrived - sent, std::chrono::milliseconds(80));
  EXPECT_LT(arrived - sent, std::chrono::seconds(3));
  EXPECT_NE(impairer_port, impairer.listen_port(0));  // the link's own upstream socket

  server.send_to(impairer_port, numbered(8, 900));
  const auto answer = worker.receive(std::chrono::seconds(5));
  ASSERT_EQ(answer.size(), 900u);
  EXPECT_EQ(number_of(answer), 8u);
  EXPECT_GE(Clock::now() - sent, std::chrono::milliseconds(160));

  // The relay counts a datagram once its send() has returned, which can be after the
  // receiver already has it: wait for the count rather than read it at once.
  LinkCounters c = impairer.counters(0);
  for (const auto deadline = Clock::now() + std::chrono::seconds(5);
       c.to_worker.datagrams_out == 0 && Clock::now() < deadline; c = impairer.counters(0))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(c.to_server.datagrams_out, 1u);
  EXPECT_EQ(c.to_server.bytes_out, 64u);
  EXPECT_EQ(c.to_worker.datagrams_out, 1u);
  EXPECT_EQ(c.to_worker.bytes_out, 900u);
}

// Sends `count` numbered datagrams through a lossy link; returns the numbers that arrived.
std::set<std::uint32_t> delivered_through_lossy_link(std::uint64_t seed, int count,
                                                     LinkCounters& counters) {
  UdpSocket worker, server;
  LinkImpairer impairer({link_to(server.port(), {.loss = 0.3}, seed)});
  std::set<std::uint32_t> delivered;
  for (int i = 0; i < count; i++) {
    worker.send_to(impairer.listen_port(0), numbered(static_cast<std::uint32_t>(i)));
    // One at a time, so no kernel buffer can drop anything: only the loss draw decides.
    const auto got = server.receive(std::chrono::milliseconds(30));
    if (!got.empty()) delivered.insert(number_of(got));
  }
  // Late arrivals (a loaded machine): wait until everything the link let through is here.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    const LinkCounters c = impairer.counters(0);
    if (c.to_server.datagrams_in == static_cast<std::uint64_t>(count) &&
        delivered.size() == c.to_server.datagrams_out)
      break;
    const auto got = server.receive(std::chrono::milliseconds(50));
    if (!got.empty()) delivered.insert(number_of(got));
  }
  counters = impairer.counters(0);
  return delivered;
}

TEST(LinkImpairer, LossDrawsRepeatForASeedAndDifferForAnother) {
  constexpr int kCount = 300;
  LinkCounters first_counters, again_counters, other_counters;
  const auto first = delivered_through_lossy_link(42, kCount, first_counters);
  const auto again = delivered_through_lossy_link(42, kCount, again_counters);
  const auto other = delivered_through_lossy_link(43, kCount, other_counters);
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  // 30% loss: 90 expected drops, standard deviation ~8.
  EXPECT_GT(first_counters.to_server.dropped_loss, 50u);
  EXPECT_LT(first_counters.to_server.dropped_loss, 130u);
  EXPECT_EQ(first_counters.to_server.dropped_loss + first.size(), static_cast<std::size_t>(kCount));
  EXPECT_EQ(first_counters.to_server.datagrams_out, first.size());
}

TEST(LinkImpairer, BandwidthCapSpacesDatagramsByTheirSerializationTime) {
  UdpSocket worker, server;
  // 200 kbit/s: a 1000-byte datagram takes 40 ms; 20 of them 800 ms.
  LinkImpairer impairer({link_to(server.port(), {.bandwidth_kbps = 200})});
  const auto sent = Clock::now();
  for (std::uint32_t i = 0; i < 20; i++) worker.send_to(impairer.listen_port(0), numbered(i, 1000));
  std::vector<std::uint32_t> order;
  Clock::time_point last;
  while (order.size() < 20) {
    const auto got = server.receive(std::chrono::seconds(5));
    ASSERT_FALSE(got.empty()) << "only " << order.size() << " datagrams arrived";
    order.push_back(number_of(got));
    last = Clock::now();
  }
  EXPECT_GE(last - sent, std::chrono::milliseconds(800));
  EXPECT_LT(last - sent, std::chrono::seconds(10));
  for (std::uint32_t i = 0; i < 20; i++) EXPECT_EQ(order[i], i);
}

TEST(LinkImpairer, AFullQueueDropsTheTail) {
  UdpSocket worker, server;
  // 8 kbit/s: each 1000-byte datagram holds the line for a second, and the queue takes
  // 2500 bytes: the first two are queued, the other three are dropped.
  LinkImpairer impairer({link_to(server.port(), {.bandwidth_kbps = 8, .queue_limit_bytes = 2500})});
  for (std::uint32_t i = 0; i < 5; i++) worker.send_to(impairer.listen_port(0), numbered(i, 1000));
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (impairer.counters(0).to_server.datagrams_in < 5 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const LinkCounters c = impairer.counters(0);
  EXPECT_EQ(c.to_server.datagrams_in, 5u);
  EXPECT_EQ(c.to_server.dropped_queue_full, 3u);
  EXPECT_EQ(number_of(server.receive(std::chrono::seconds(5))), 0u);
}

TEST(LinkImpairer, AnAsymmetricLinkCapsEachDirectionOnItsOwn) {
  UdpSocket worker, server;
  // Up 8 kbit/s: the first datagram, 1000 bytes, holds the line for a second. Down
  // unlimited (downlink_kbps 0): five answers of 2000 bytes, which at 8 kbit/s would take
  // ten seconds, arrive within five.
  LinkImpairer impairer({link_to(
      server.port(), {.bandwidth_kbps = 8, .downlink_kbps = 0, .queue_limit_bytes = 20000})});
  const auto sent = Clock::now();
  worker.send_to(impairer.listen_port(0), numbered(0, 1000));
  std::uint16_t impairer_port = 0;
  ASSERT_FALSE(server.receive(std::chrono::seconds(5), &impairer_port).empty());
  EXPECT_GE(Clock::now() - sent, std::chrono::milliseconds(800)) << "the uplink was not capped";
  const auto answers_sent = Clock::now();
  for (std::uint32_t i = 0; i < 5; i++) server.send_to(impairer_port, numbered(i, 2000));
  for (std::uint32_t i = 0; i < 5; i++) {
    const auto got = worker.receive(std::chrono::seconds(5));
    ASSERT_FALSE(got.empty()) << "answer " << i << " was dropped";
    EXPECT_EQ(number_of(got), i);
  }
  EXPECT_LT(Clock::now() - answers_sent, std::chrono::seconds(5))
      << "the answers were held to the uplink's rate";
  EXPECT_EQ(impairer.counters(0).to_worker.dropped_queue_full, 0u);
}

TEST(LinkImpairer, JitterNeverReorders) {
  UdpSocket worker, server;
  LinkImpairer impairer({link_to(server.port(), {.delay_ms = 5, .jitter_ms = 30})});
  for (std::uint32_t i = 0; i < 50; i++) worker.send_to(impairer.listen_port(0), numbered(i));
  for (std::uint32_t i = 0; i < 50; i++) {
    const auto got = server.receive(std::chrono::seconds(5));
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(number_of(got), i);
  }
}

// Down windows (issue 38 part 1): times against a brute-force reading of the schedule.
TEST(DownSchedule, DownTimesMatchASampledReading) {
  DownSchedule s;
  s.windows = parse_down_windows("5+10,12+4,40+1.5", "test");
  ASSERT_EQ(s.windows.size(), 3u);
  EXPECT_DOUBLE_EQ(s.windows[2].length_s, 1.5);
  EXPECT_FALSE(s.down_at(4.99));
  EXPECT_TRUE(s.down_at(5));
  EXPECT_TRUE(s.down_at(15.5));  // the second window, overlapping the first
  EXPECT_FALSE(s.down_at(16));
  EXPECT_NEAR(s.down_seconds_until(100), 11 + 1.5, 1e-9);  // [5, 16) once, and 1.5
  DownSchedule periodic;  // up for 30 s, then down 45 of every 120 from phase 50
  periodic.period_s = 120;
  periodic.down_s = 45;
  periodic.phase_s = 50;
  periodic.from_s = 30;
  EXPECT_FALSE(periodic.down_at(29));
  EXPECT_FALSE(periodic.down_at(49.9));
  EXPECT_TRUE(periodic.down_at(50));
  EXPECT_TRUE(periodic.down_at(94.9));
  EXPECT_FALSE(periodic.down_at(95));
  EXPECT_TRUE(periodic.down_at(170));
  DownSchedule early = periodic;  // a down part under way at from_s: down from it on
  early.phase_s = 0;
  EXPECT_FALSE(early.down_at(29));
  EXPECT_TRUE(early.down_at(30));
  EXPECT_TRUE(early.down_at(44.9));
  EXPECT_FALSE(early.down_at(45));
  for (const DownSchedule* schedule : {&s, &periodic, &early}) {
    for (double t : {0.0, 31.0, 60.0, 333.3, 1000.0}) {
      double sampled = 0;
      const double dt = 0.001;
      for (double x = dt / 2; x < t; x += dt) sampled += schedule->down_at(x) ? dt : 0;
      EXPECT_NEAR(schedule->down_seconds_until(t), sampled, 0.01) << "t = " << t;
    }
  }
  EXPECT_NEAR(periodic.down_seconds_until(30 + 1200), 10 * 45, 1e-6);  // 45 of every 120
}

TEST(DownSchedule, RefusesBadTextAndPatterns) {
  for (const char* bad : {"5", "5+0", "-1+3", "a+3", "5+3,", "5+3,,7+1", "5+inf", "5+3x"}) {
    try {
      parse_down_windows(bad, "link w0: down");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("link w0: down"), std::string::npos) << e.what();
    }
  }
  DownSchedule s;
  s.down_s = 10;  // no period
  EXPECT_THROW(s.check("w0"), std::invalid_argument);
  s.period_s = 10;  // never up
  EXPECT_THROW(s.check("w0"), std::invalid_argument);
  s.period_s = 20;
  EXPECT_NO_THROW(s.check("w0"));
  EXPECT_THROW(LinkImpairer({link_to(5684, {.down = s}), link_to(5684, {.down = {{}, 5, 5}})}),
               std::invalid_argument);
}

// A window from 1 s to 2 s after the impairer starts: a request and its answer go through
// before it, nothing goes either way inside it (counted as dropped while down), and the
// link carries both ways again after it.
TEST(LinkImpairer, ADownWindowDropsEveryDatagramBothWays) {
  UdpSocket worker, server;
  LinkProfile profile;
  profile.down.windows = {{1.0, 1.0}};
  const auto start = Clock::now();
  LinkImpairer impairer({link_to(server.port(), profile)});
  auto at = [&](double seconds) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(seconds)));
  };
  worker.send_to(impairer.listen_port(0), numbered(1));
  std::uint16_t impairer_port = 0;
  ASSERT_EQ(number_of(server.receive(std::chrono::milliseconds(800), &impairer_port)), 1u);
  server.send_to(impairer_port, numbered(2));
  ASSERT_EQ(number_of(worker.receive(std::chrono::milliseconds(800))), 2u);
  ASSERT_LT(Clock::now() - start, std::chrono::milliseconds(1000))
      << "too slow to test before the window";
  at(1.2);
  EXPECT_TRUE(impairer.down_now(0));
  worker.send_to(impairer.listen_port(0), numbered(3));
  server.send_to(impairer_port, numbered(4));
  EXPECT_TRUE(server.receive(std::chrono::milliseconds(300)).empty());
  EXPECT_TRUE(worker.receive(std::chrono::milliseconds(100)).empty());
  at(2.1);
  EXPECT_FALSE(impairer.down_now(0));
  worker.send_to(impairer.listen_port(0), numbered(5));
  ASSERT_EQ(number_of(server.receive(std::chrono::seconds(5))), 5u);
  server.send_to(impairer_port, numbered(6));
  ASSERT_EQ(number_of(worker.receive(std::chrono::seconds(5))), 6u);
  const LinkCounters c = impairer.counters(0);
  EXPECT_EQ(c.to_server.dropped_down, 1u);
  EXPECT_EQ(c.to_worker.dropped_down, 1u);
  EXPECT_EQ(c.to_server.datagrams_in, 3u);
  EXPECT_NEAR(impairer.down_seconds(0), 1.0, 1e-9);
}

TEST(LinkImpairer, RefusesBadProfilesAndAddresses) {
  EXPECT_THROW(LinkImpairer({link_to(5684, {.loss = 1.5})}), std::invalid_argument);
  EXPECT_THROW(LinkImpairer({link_to(5684, {.delay_ms = -1})}), std::invalid_argument);
  LinkSpec bad_host = link_to(5684, {});
  bad_host.listen_host = "not-an-address";
  EXPECT_THROW(LinkImpairer({bad_host}), std::invalid_argument);
  // Two links cannot listen on the same port.
  UdpSocket taken;
  LinkSpec clash = link_to(5684, {});
  clash.listen_port = taken.port();
  EXPECT_THROW(LinkImpairer({clash}), std::runtime_error);
}

}  // namespace
}  // namespace edgetrain::emulation
