#include "worker/program_support.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <ctime>

#include "common/atomic_file.h"
#include "common/logging.h"
#include "worker/worker.h"

namespace edgetrain::runtime::program {

std::atomic<bool> stop_requested{false};

namespace {
extern "C" void on_stop_signal(int) { stop_requested = true; }
}  // namespace

std::uint64_t peak_rss_bytes() {
  if (std::FILE* status = std::fopen("/proc/self/status", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, status))
      found = std::sscanf(line, "VmHWM: %llu kB", &kib) == 1;
    std::fclose(status);
    if (found) return static_cast<std::uint64_t>(kib) * 1024;
  }
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux counts KiB
}

void install_stop_signals() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

void write_line(const std::string& line) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::fprintf(stderr, "%s edgetrain-worker: %s\n", stamp, line.c_str());
}
void log_line(const std::string& line) {
  if (logging::enabled(logging::Level::kInfo)) write_line(line);
}
void log_warning(const std::string& line) {
  if (logging::enabled(logging::Level::kWarn)) write_line(line);
}
void log_error(const std::string& line) { write_line(line); }

std::string held_images(const Dataset& train) {
  return train.held ? " (images of its " + std::to_string(train.held->size()) + " loaded)" : "";
}

void log_server_worker_start(const WorkerSettings& s, const WorkerConfig& config,
                             const Dataset& train) {
  log_line(
      "worker " + std::to_string(config.worker_id) + "/" + std::to_string(config.worker_count) +
      " (" + config.identity + ") -> " +
      (s.shards.empty() ? s.server : std::to_string(config.shards.size()) + " shards " + s.shards) +
      ", model " + config.model + ", " + s.compression.compressor + ", " +
      std::to_string(train.size()) + " examples in the data set" + held_images(train));
}

// ---- StatsFileWriter ---------------------------------------------------------------------

StatsFileWriter::StatsFileWriter(std::string path, std::function<std::string(bool)> render)
    : path_(std::move(path)), render_(std::move(render)) {
  if (path_.empty()) return;
  common::write_file_atomically(path_, render_(true));  // fails early on a bad path
  thread_ = std::thread([this] { run(); });
}

StatsFileWriter::~StatsFileWriter() { finish(); }

void StatsFileWriter::update(const std::function<void()>& change) {
  std::lock_guard lock(mutex_);
  change();
  changed_ = true;
}

void StatsFileWriter::finish(const std::function<void()>& change) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    finished_ = true;
    if (change) change();
  }
  if (path_.empty()) return;
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  write(false);
}

void StatsFileWriter::write(bool running) {
  std::string text;
  {
    std::lock_guard lock(mutex_);
    text = render_(running);
  }
  try {
    common::write_file_atomically(path_, text);
  } catch (const std::exception& e) {
    log_error(e.what());
  }
}

void StatsFileWriter::run() {
  std::unique_lock lock(mutex_);
  while (!finished_) {
    wake_.wait_for(lock, std::chrono::milliseconds(200), [this] { return finished_; });
    if (finished_ || !changed_) continue;
    changed_ = false;
    const std::string text = render_(true);
    lock.unlock();
    try {
      common::write_file_atomically(path_, text);
    } catch (const std::exception& e) {
      log_error(e.what());
    }
    lock.lock();
  }
}

// ---- ProgressLine ------------------------------------------------------------------------

ProgressLine::ProgressLine(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO)) {}

ProgressLine::~ProgressLine() {
  if (tty_ && shown_) std::fprintf(stderr, "\n");
}

bool ProgressLine::due() {
  if (quiet_) return false;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::seconds(tty_ ? 1 : 10)) return false;
  last_ = now;
  return true;
}

void ProgressLine::show(const std::string& line) {
  shown_ = true;
  if (tty_)
    std::fprintf(stderr, "\r%-130s", line.c_str());
  else
    log_line(line);
}

// ---- PeerEndpoint ------------------------------------------------------------------------

PeerEndpoint::PeerEndpoint(const WorkerSettings& s, const GossipTopology& topology,
                           std::uint32_t self, std::size_t max_body_bytes)
    : insecure_(s.insecure) {
  std::uint16_t port = 0;
  bool plaintext = false;
  // The overload that takes coap:// too: with --insecure the address is served in plain CoAP.
  parse_server_uri((s.insecure ? "coap://" : "coaps://") +
                       (s.listen.empty() ? topology.peers[self].address : s.listen),
                   host_, port, plaintext);
  transport::CoapDtlsServer::Options o;
  o.bind_address = host_;
  if (s.insecure) {
    o.port = 0;
    o.plaintext_port = port;
  } else {
    o.port = port;
    o.certificates = transport::CertificateFiles{s.cert, s.cert_key, s.ca};
  }
  o.timing = s.config.timing;
  o.max_body_bytes = std::max(o.max_body_bytes, max_body_bytes);
  server_ = std::make_unique<transport::CoapDtlsServer>(o);
  CoapPeerChannel::Options channel_options;
  if (!s.insecure)
    channel_options.certificates = transport::CertificateFiles{s.cert, s.cert_key, s.ca};
  channel_options.plaintext = s.insecure;
  channel_options.declared_identity = topology.peers[self].name;
  channel_options.timing = s.config.timing;
  channel_options.timeout_ms = static_cast<int>(s.request_timeout * 1000);
  channel_options.stop = &stop_requested;
  channel_ = std::make_unique<CoapPeerChannel>(topology, channel_options);
}

PeerEndpoint::~PeerEndpoint() { stop_serving(); }

void PeerEndpoint::stop_serving() {
  serving_ = false;
  if (thread_.joinable()) thread_.join();
}

std::uint16_t PeerEndpoint::port() const {
  return insecure_ ? server_->plaintext_port() : server_->port();
}

void PeerEndpoint::start_serving(const std::string& port_file) {
  if (!port_file.empty()) common::write_file_atomically(port_file, std::to_string(port()) + "\n");
  serving_ = true;
  thread_ = std::thread([this] {
    while (serving_) server_->run_once(100);
  });
}

std::uint32_t find_self(const GossipTopology& topology, const std::string& name,
                        const std::string& topology_file) {
  const auto self = topology.find(name);
  if (!self)
    throw std::invalid_argument("peer '" + name + "' is not in the topology " + topology_file +
                                " (--peer-name)");
  return *self;
}

}  // namespace edgetrain::runtime::program
