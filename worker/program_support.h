// What every mode of edgetrain-worker shares as a program (worker/worker_program.h): its
// log lines, the stop flag its signals set, the stats file kept current from a thread, the
// progress line, and the peer endpoint of the modes that serve other boards (gossip, and
// MD-GAN's discriminator swaps). Private to the worker library.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "worker/gossip.h"
#include "worker/gossip_peer.h"
#include "worker/worker_program.h"
#include "transport/coap_dtls.h"

namespace edgetrain::runtime {
// The filter dropout in force, in the stats files of async and rounds.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DropoutStatus, drop_rates, selections, full_step_estimate_ms,
                                   budget_ms)
}  // namespace edgetrain::runtime

namespace edgetrain::runtime::program {

// The process's peak resident memory so far, in bytes: VmHWM of /proc/self/status (Linux;
// getrusage's ru_maxrss where that cannot be read). Every mode's stats file carries it as
// "peak_rss_bytes". Under qemu-aarch64 it is the whole qemu process's (QEMU does not
// emulate that file): the translator and its code cache included.
std::uint64_t peak_rss_bytes();

// Set by SIGTERM and SIGINT (install_stop_signals()); every loop checks it.
extern std::atomic<bool> stop_requested;
void install_stop_signals();

// The worker's own lines on stderr, with the time; the loops filter theirs by --log-level
// (logging::enabled) before they get here, and log_line/log_warning filter by it too.
void write_line(const std::string& line);
void log_line(const std::string& line);
void log_warning(const std::string& line);
void log_error(const std::string& line);

// The first line of a worker that talks to a server (async and rounds).
void log_server_worker_start(const WorkerSettings& s, const WorkerConfig& config,
                             const Dataset& train);
// " (images of its N loaded)" for a partial load (the shard's), else nothing: for the
// start line.
std::string held_images(const Dataset& train);

// Keeps a --stats-file current: the loop changes what render() reads through update(), and
// a thread rewrites the file (atomically) at most every 0.2 s when it changed, so a worker
// stuck in retries still has a fresh file; finish() writes the last state, "stopped".
// render(running) runs under the writer's lock. An empty path writes nothing. The first
// write happens in the constructor, so that a bad path fails early (it throws).
class StatsFileWriter {
 public:
  StatsFileWriter(std::string path, std::function<std::string(bool running)> render);
  ~StatsFileWriter();
  StatsFileWriter(const StatsFileWriter&) = delete;
  StatsFileWriter& operator=(const StatsFileWriter&) = delete;

  // From the loop: `change` updates what render() reads, under the lock.
  void update(const std::function<void()>& change);
  // Stops the thread, applies `change` (if any) and writes the final state.
  void finish(const std::function<void()>& change = {});

 private:
  void run();
  void write(bool running);

  std::string path_;
  std::function<std::string(bool)> render_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool changed_ = false, finished_ = false;
  std::thread thread_;
};

// The progress line: every second on a terminal (rewritten in place), every 10 s in a log.
class ProgressLine {
 public:
  explicit ProgressLine(bool quiet);
  ~ProgressLine();
  // Whether a line is due now (false when quiet); when it is, the caller shows one.
  bool due();
  void show(const std::string& line);

 private:
  bool quiet_, tty_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// The peer side of --mode gossip and gan: a CoAP/DTLS server on this peer's topology
// address (or --listen) with the fleet's X.509 identities (plain CoAP with --insecure),
// a client to each peer with the same identity, and a thread that serves while the mode's
// loop runs (start_serving()).
class PeerEndpoint {
 public:
  // Throws std::invalid_argument for a bad address, TransportError when it cannot bind.
  PeerEndpoint(const WorkerSettings& s, const GossipTopology& topology, std::uint32_t self,
               std::size_t max_body_bytes);
  ~PeerEndpoint();
  PeerEndpoint(const PeerEndpoint&) = delete;
  PeerEndpoint& operator=(const PeerEndpoint&) = delete;

  transport::CoapDtlsServer& server() { return *server_; }
  CoapPeerChannel& channel() { return *channel_; }
  const std::string& host() const { return host_; }
  std::uint16_t port() const;
  // Serves on a thread of its own until stop_serving() (or the endpoint goes); writes
  // --port-file first. Stop serving before the handlers' owner (the mode's loop) goes.
  void start_serving(const std::string& port_file);
  void stop_serving();

 private:
  bool insecure_;
  std::string host_;
  std::unique_ptr<transport::CoapDtlsServer> server_;
  std::unique_ptr<CoapPeerChannel> channel_;
  std::atomic<bool> serving_{false};
  std::thread thread_;
};

// The gossip or GAN worker's own entry in the topology (--peer-name, default --identity);
// throws std::invalid_argument naming what is missing.
std::uint32_t find_self(const GossipTopology& topology, const std::string& name,
                        const std::string& topology_file);

}  // namespace edgetrain::runtime::program
