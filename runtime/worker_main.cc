// edgetrain-worker: trains on this device's shard and sends AdaComp updates to an
// edgetrain-server over CoAP/DTLS. Settings come from a TOML file (--config), overridden
// by flags; see runtime/README.md.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "runtime/worker.h"

namespace {

std::atomic<bool> stop_requested{false};
extern "C" void on_signal(int) { stop_requested = true; }

void log_line(const std::string& line) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::fprintf(stderr, "%s edgetrain-worker: %s\n", stamp, line.c_str());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The --stats-file object (runtime/README.md): every WorkerStats field by its name, the
// server versions acknowledged (2.04) in this run in order, and whether the worker runs.
std::string stats_json(const edgetrain::runtime::WorkerStats& s, const std::vector<std::uint64_t>& acknowledged,
                       bool running) {
  nlohmann::json j;
  j["state"] = running ? "running" : "stopped";
  j["steps"] = s.steps;
  j["updates_accepted"] = s.updates_accepted;
  j["updates_refused"] = s.updates_refused;
  j["updates_rejected"] = s.updates_rejected;
  j["pulls"] = s.pulls;
  j["delta_pulls"] = s.delta_pulls;
  j["delta_mismatches"] = s.delta_mismatches;
  j["bytes_sent"] = s.bytes_sent;
  j["bytes_received"] = s.bytes_received;
  j["server_version"] = s.server_version;
  j["retries"] = s.retries;
  j["non_finite_steps"] = s.non_finite_steps;
  j["last_loss"] = s.last_loss;
  j["acknowledged_versions"] = acknowledged;
  return j.dump(2) + "\n";
}

// Keeps the --stats-file current: the worker loop hands over its stats after every step
// (update()), a thread rewrites the file at most every 0.2 s when they changed, so a worker
// stuck in retries still has a fresh file; finish() writes the last state, "stopped".
class StatsFileWriter {
 public:
  explicit StatsFileWriter(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    edgetrain::common::write_file_atomically(path_, stats_json(stats_, acknowledged_, true));  // fails early on a bad path
    thread_ = std::thread([this] { run(); });
  }
  ~StatsFileWriter() { finish(std::nullopt); }
  StatsFileWriter(const StatsFileWriter&) = delete;
  StatsFileWriter& operator=(const StatsFileWriter&) = delete;

  // From the worker loop. One push per step, so at most one new acknowledgement per call.
  void update(const edgetrain::runtime::WorkerStats& s) {
    std::lock_guard lock(mutex_);
    if (s.updates_accepted > stats_.updates_accepted) acknowledged_.push_back(s.server_version);
    stats_ = s;
    changed_ = true;
  }
  // Stops the thread and writes the final stats (the last update()'s when none are given).
  void finish(const std::optional<edgetrain::runtime::WorkerStats>& final_stats) {
    if (path_.empty() || finished_) return;
    {
      std::lock_guard lock(mutex_);
      finished_ = true;
      if (final_stats && final_stats->updates_accepted > stats_.updates_accepted)
        acknowledged_.push_back(final_stats->server_version);
      if (final_stats) stats_ = *final_stats;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    try {
      edgetrain::common::write_file_atomically(path_, stats_json(stats_, acknowledged_, false));
    } catch (const std::exception& e) {
      log_line(e.what());
    }
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!finished_) {
      wake_.wait_for(lock, std::chrono::milliseconds(200), [this] { return finished_; });
      if (finished_ || !changed_) continue;
      changed_ = false;
      const std::string text = stats_json(stats_, acknowledged_, true);
      lock.unlock();
      try {
        edgetrain::common::write_file_atomically(path_, text);
      } catch (const std::exception& e) {
        log_line(e.what());
      }
      lock.lock();
    }
  }

  std::string path_;
  std::mutex mutex_;
  std::condition_variable wake_;
  edgetrain::runtime::WorkerStats stats_;
  std::vector<std::uint64_t> acknowledged_;
  bool changed_ = false, finished_ = false;
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace edgetrain;
  CLI::App app{"edgetrain-worker: trains a model on this device's data shard and sends AdaComp-compressed\n"
               "gradients to an edgetrain-server over CoAP/DTLS (PSK, or X.509 with --cert/--key/--ca).\n"
               "Flags override the --config file."};
  std::string config_file, server = "coaps://127.0.0.1:5684", identity, key_file, key_hex, data = "mnist",
                           compressor = "adacomp", data_dir;
  runtime::WorkerConfig config;
  double rate = 0.01;
  bool error_feedback = false, fp16 = false, sign_scale = false, quiet = false, log_acks = false, version = false;
  bool insecure = false;
  std::string cert_file, cert_key_file, ca_file;
  app.add_option("--config", config_file, "TOML file with any of the settings below (same names, '-' as '_')");
  app.add_option("--server", server, "coaps://HOST[:PORT] (coap://HOST[:PORT] only with --insecure)")
      ->capture_default_str();
  app.add_option("--identity", identity,
                 "this device's PSK identity (with --cert: only for logs; with --insecure: declared, unproven)");
  app.add_option("--key-file", key_file, "file holding this device's PSK as hex");
  app.add_option("--data", data, "mnist, fashion-mnist, or a directory with train-images-idx3-ubyte[.gz] and labels")
      ->capture_default_str();
  app.add_option("--worker-id", config.worker_id, "this worker's shard number")->capture_default_str();
  app.add_option("--workers", config.worker_count, "number of shards")->capture_default_str();
  app.add_flag("--label-skew", config.label_skewed, "label-skewed shard instead of i.i.d.");
  app.add_option("--model", config.model, "paper-cnn, mlp or a spec; must match the server's")->capture_default_str();
  app.add_option("--batch", config.batch, "minibatch size")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--threads", config.threads, "compute threads")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--compressor", compressor, "adacomp (the paper's top-k) or none (dense ASGD)")
      ->capture_default_str()
      ->check(CLI::IsMember({"adacomp", "none"}));
  app.add_option("--rate", rate, "AdaComp compression rate c")->capture_default_str()->check(CLI::Range(1e-6, 1.0));
  app.add_flag("--error-feedback", error_feedback, "keep unsent values for the next step (option)");
  auto* fp16_flag = app.add_flag("--fp16", fp16, "send values as fp16 (option)");
  app.add_flag("--sign-scale", sign_scale,
               "send each tensor's values as one fp32 scale (their mean |v|) and one sign bit per entry\n"
               "(option; with --error-feedback the quantization error is fed back; excludes --fp16)")
      ->excludes(fp16_flag);
  app.add_option("--pull-every", config.pull_every, "steps per model pull (1: the paper's)")->capture_default_str();
  app.add_flag("--dense-pull", config.dense_pull,
               "always download the whole model (default: only the parameters changed since the version held, "
               "GET /model?since=V; same parameters bit for bit)");
  app.add_option("--steps", config.max_steps, "stop after this many steps (0: run until stopped)")->capture_default_str();
  app.add_option("--duration", config.max_seconds, "stop after this many seconds (0: run until stopped)")
      ->capture_default_str();
  app.add_option("--slowdown", config.slowdown,
                 "emulate a slower device: sleep F times each step's compute time (0: full speed)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1000.0));
  double request_timeout_seconds = config.request_timeout_ms / 1000.0;
  app.add_option("--request-timeout", request_timeout_seconds,
                 "seconds one request (handshake and every block included) may take before the worker retries;\n"
                 "behind a WAN that drops the server's ICMP errors this is how long a restarted server goes unnoticed")
      ->capture_default_str()
      ->check(CLI::Range(0.5, 3600.0));
  app.add_option("--seed", config.seed, "shuffling seed (same on every worker of a run)")->capture_default_str();
  app.add_flag("--quiet", quiet, "no progress line");
  app.add_flag("--log-acks", log_acks, "log the server version of every acknowledged (2.04) update");
  std::string stats_file;
  app.add_option("--stats-file", stats_file,
                 "JSON file of this worker's counters and every acknowledged server version, rewritten atomically\n"
                 "at most every 0.2 s while they change, and at exit");
  app.add_flag("--version", version, "print the version and exit");
  app.add_flag("--insecure", insecure,
               "allow a coap:// server URI: plain CoAP, NO encryption, NO authentication (the server must run --insecure)");
  app.add_option("--cert", cert_file, "X.509 instead of PSK: this device's certificate (PEM); with --key and --ca");
  app.add_option("--key", cert_key_file, "X.509: the certificate's private key (PEM)");
  app.add_option("--ca", ca_file, "X.509: CA (PEM) that must have signed the server's certificate");
  app.add_option("--coap-ack-timeout", config.timing.ack_timeout_seconds, "CoAP ACK_TIMEOUT in seconds (1..60)")
      ->capture_default_str();
  app.add_option("--coap-ack-random-factor", config.timing.ack_random_factor, "CoAP ACK_RANDOM_FACTOR (1..4)")
      ->capture_default_str();
  app.add_option("--coap-max-retransmit", config.timing.max_retransmit, "CoAP MAX_RETRANSMIT (1..10)")
      ->capture_default_str();
  app.add_option("--coap-nstart", config.timing.nstart, "CoAP NSTART (1..16)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (version) {
    std::printf("edgetrain-worker 0.1.0\n");
    return 0;
  }

  try {
    if (!config_file.empty()) {
      toml::table t = toml::parse_file(config_file);
      // A setting from the file applies unless the same setting was given as a flag.
      auto str = [&](const char* key, const char* flag, std::string& into) {
        if (auto v = t[key].value<std::string>(); v && app.count(flag) == 0) into = *v;
      };
      str("server", "--server", server);
      str("identity", "--identity", identity);
      str("key_file", "--key-file", key_file);
      if (auto v = t["key_hex"].value<std::string>()) key_hex = *v;  // what edgetrain-server add-device prints
      if (auto v = t["key"].value<std::string>()) key_hex = *v;
      str("data", "--data", data);
      str("model", "--model", config.model);
      str("compressor", "--compressor", compressor);
      if (auto v = t["worker_id"].value<std::int64_t>(); v && !app.count("--worker-id")) config.worker_id = static_cast<std::uint32_t>(*v);
      if (auto v = t["workers"].value<std::int64_t>(); v && !app.count("--workers")) config.worker_count = static_cast<std::uint32_t>(*v);
      if (auto v = t["batch"].value<std::int64_t>(); v && !app.count("--batch")) config.batch = static_cast<int>(*v);
      if (auto v = t["threads"].value<std::int64_t>(); v && !app.count("--threads")) config.threads = static_cast<int>(*v);
      if (auto v = t["rate"].value<double>(); v && !app.count("--rate")) rate = *v;
      if (auto v = t["pull_every"].value<std::int64_t>(); v && !app.count("--pull-every")) config.pull_every = static_cast<int>(*v);
      if (auto v = t["error_feedback"].value<bool>(); v && !app.count("--error-feedback")) error_feedback = *v;
      if (auto v = t["fp16"].value<bool>(); v && !app.count("--fp16")) fp16 = *v;
      if (auto v = t["sign_scale"].value<bool>(); v && !app.count("--sign-scale")) sign_scale = *v;
      if (auto v = t["dense_pull"].value<bool>(); v && !app.count("--dense-pull")) config.dense_pull = *v;
      if (auto v = t["insecure"].value<bool>(); v && !app.count("--insecure")) insecure = *v;
      str("cert_file", "--cert", cert_file);
      str("cert_key_file", "--key", cert_key_file);
      str("ca_file", "--ca", ca_file);
      if (auto v = t["coap_ack_timeout"].value<double>(); v && !app.count("--coap-ack-timeout")) config.timing.ack_timeout_seconds = *v;
      if (auto v = t["coap_ack_random_factor"].value<double>(); v && !app.count("--coap-ack-random-factor")) config.timing.ack_random_factor = *v;
      if (auto v = t["coap_max_retransmit"].value<std::int64_t>(); v && !app.count("--coap-max-retransmit")) config.timing.max_retransmit = static_cast<int>(*v);
      if (auto v = t["coap_nstart"].value<std::int64_t>(); v && !app.count("--coap-nstart")) config.timing.nstart = static_cast<int>(*v);
    }
    if (fp16 && sign_scale)
      throw std::invalid_argument("fp16 and sign-scale values exclude each other (--fp16 / fp16 and --sign-scale / "
                                  "sign_scale in --config): choose one value encoding");
    bool plaintext = false;
    runtime::parse_server_uri(server, config.server_host, config.server_port, plaintext);
    if (plaintext && !insecure)
      throw std::invalid_argument("refusing plain CoAP to " + server +
                                  ": no encryption, no authentication. Use a coaps:// URI, or give --insecure "
                                  "(insecure = true in --config) if you really mean it");
    if (insecure && !plaintext)
      throw std::invalid_argument("--insecure is only for coap:// server URIs; " + server + " is DTLS");
    transport::check_timing(config.timing);
    const bool certificates = !cert_file.empty() || !cert_key_file.empty() || !ca_file.empty();
    if (certificates && (cert_file.empty() || cert_key_file.empty() || ca_file.empty()))
      throw std::invalid_argument("X.509 needs all three of --cert, --key and --ca (or cert_file, cert_key_file, ca_file)");
    if (plaintext && certificates) throw std::invalid_argument("--cert/--key/--ca are for coaps://, not coap://");
    if (certificates) {
      config.certificates = transport::CertificateFiles{cert_file, cert_key_file, ca_file};
      if (identity.empty()) identity = "(certificate)";
    } else if (plaintext) {
      if (identity.empty()) throw std::invalid_argument("plain CoAP needs a name to declare: give --identity");
      config.insecure_plaintext = true;
      log_line("WARNING: --insecure: plain CoAP to " + server +
               ", NO encryption and NO authentication; the server keys this worker's updates on the declared "
               "name 'unauthenticated:" + identity + "'");
    } else {
      if (identity.empty()) throw std::invalid_argument("no PSK identity: give --identity or identity in --config");
      if (!key_file.empty()) key_hex = read_file(key_file);
      if (key_hex.empty()) throw std::invalid_argument("no PSK: give --key-file or key/key_file in --config");
      config.key = runtime::parse_hex_key(key_hex);
    }
    config.request_timeout_ms = static_cast<int>(request_timeout_seconds * 1000);
    config.identity = identity;
    config.compressor.method = compressor == "none" ? runtime::CompressionMethod::kNone : runtime::CompressionMethod::kTopK;
    config.compressor.compression_rate = rate;
    config.compressor.error_feedback = error_feedback;
    config.compressor.fp16_values = fp16;
    config.compressor.sign_scale_values = sign_scale;
    config.value_encoding = fp16         ? transport::ValueEncoding::kFp16
                            : sign_scale ? transport::ValueEncoding::kSignScale
                                         : transport::ValueEncoding::kFp32;

    std::string images, labels;
    const char* deps = std::getenv("EDGETRAIN_DEPS");
    if (data == "mnist") data_dir = std::string(deps ? deps : "/var/cache/edgetrain") + "/mnist";
    else if (data == "fashion-mnist") data_dir = "/usr/share/datasets/fashion-mnist";
    else data_dir = data;
    images = data_dir + "/train-images-idx3-ubyte";
    labels = data_dir + "/train-labels-idx1-ubyte";
    if (access(images.c_str(), R_OK) != 0) images += ".gz", labels += ".gz";
    runtime::Dataset train = runtime::load_dataset(images, labels);

    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    log_line("worker " + std::to_string(config.worker_id) + "/" + std::to_string(config.worker_count) + " (" + identity +
             ") -> " + server + ", model " + config.model + ", " + compressor + ", " + std::to_string(train.size()) +
             " examples in the data set");
    const bool tty = isatty(STDERR_FILENO);
    auto last_report = std::chrono::steady_clock::now();
    std::uint64_t acks_logged = 0;
    StatsFileWriter stats_file_writer(stats_file);
    auto progress = [&](const runtime::WorkerStats& s) {
      stats_file_writer.update(s);
      // One push per step, so at most one new acknowledgement per call. The line lets
      // anyone check afterwards that the server never went back behind a version it
      // acknowledged (tests/integration/server_crash_recovery.sh does).
      if (log_acks && s.updates_accepted > acks_logged) {
        acks_logged = s.updates_accepted;
        log_line("acknowledged: server version " + std::to_string(s.server_version));
      }
      if (quiet) return;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_report < std::chrono::seconds(tty ? 1 : 10)) return;
      last_report = now;
      char line[240];
      std::snprintf(line, sizeof line,
                    "step %llu  loss %.3f  server version %llu  accepted %llu  refused %llu  sent %.2f MB  pulled %.1f MB",
                    static_cast<unsigned long long>(s.steps), s.last_loss,
                    static_cast<unsigned long long>(s.server_version),
                    static_cast<unsigned long long>(s.updates_accepted), static_cast<unsigned long long>(s.updates_refused),
                    s.bytes_sent / 1e6, s.bytes_received / 1e6);
      if (tty) std::fprintf(stderr, "\r%-120s", line);
      else log_line(line);
    };
    runtime::WorkerStats stats = runtime::run_worker(config, train, stop_requested, log_line, progress);
    stats_file_writer.finish(stats);
    if (tty && !quiet) std::fprintf(stderr, "\n");
    log_line("stopped after " + std::to_string(stats.steps) + " steps: " + std::to_string(stats.updates_accepted) +
             " updates accepted, " + std::to_string(stats.updates_refused) + " refused as stale, " +
             std::to_string(stats.bytes_sent) + " bytes sent, " + std::to_string(stats.retries) + " retries; " +
             std::to_string(stats.pulls) + " pulls (" + std::to_string(stats.delta_pulls) + " as deltas), " +
             std::to_string(stats.bytes_received) + " bytes pulled");
    return 0;
  } catch (const toml::parse_error& e) {
    std::fprintf(stderr, "edgetrain-worker: %s: %s\n", config_file.c_str(), std::string(e.description()).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgetrain-worker: %s\n", e.what());
  }
  return 1;
}
