// edgetrain-worker: trains on this device's shard and sends AdaComp updates to an
// edgetrain-server over CoAP/DTLS. Its settings are one table (common/settings.h): flags,
// or the same names in a TOML file (--config); see runtime/README.md.
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/settings.h"
#include "worker/compression_settings.h"
#include "worker/gan_worker.h"
#include "worker/gossip_peer.h"
#include "model/model.h"
#include "worker/round_worker.h"
#include "worker/worker.h"
#include "worker/worker_exit_codes.h"
#include "transport/codec.h"

namespace {

std::atomic<bool> stop_requested{false};
extern "C" void on_signal(int) { stop_requested = true; }

// The worker's own lines; the worker loops filter theirs by --log-level (logging::enabled)
// before they get here.
void write_line(const std::string& line) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::fprintf(stderr, "%s edgetrain-worker: %s\n", stamp, line.c_str());
}
void log_line(const std::string& line) {
  if (edgetrain::logging::enabled(edgetrain::logging::Level::kInfo)) write_line(line);
}
void log_warning(const std::string& line) {
  if (edgetrain::logging::enabled(edgetrain::logging::Level::kWarn)) write_line(line);
}
void log_error(const std::string& line) { write_line(line); }

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

namespace edgetrain::runtime {
// Every WorkerStats field under its own name, for the --stats-file object.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DropoutStatus, drop_rates, selections, full_step_estimate_ms,
                                   budget_ms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(WorkerStats, steps, updates_accepted, updates_refused,
                                   updates_rejected, pulls, delta_pulls, delta_mismatches,
                                   bytes_sent, bytes_received, server_version, retries,
                                   non_finite_steps, last_loss, dropout)
}  // namespace edgetrain::runtime

namespace {

// The --stats-file object (runtime/README.md): every WorkerStats field by its name, the
// server versions acknowledged (2.04) in this run in order, and whether the worker runs.
std::string stats_json(const edgetrain::runtime::WorkerStats& s,
                       const std::vector<std::uint64_t>& acknowledged, bool running) {
  nlohmann::json j = s;
  j["state"] = running ? "running" : "stopped";
  j["acknowledged_versions"] = acknowledged;
  if (!s.shard_versions.empty())
    j["shard_versions"] = s.shard_versions;  // sharded: per shard, the highest acknowledged
  return j.dump(2) + "\n";
}

// Keeps the --stats-file current: the worker loop hands over its stats after every step
// (update()), a thread rewrites the file at most every 0.2 s when they changed, so a worker
// stuck in retries still has a fresh file; finish() writes the last state, "stopped".
class StatsFileWriter {
 public:
  explicit StatsFileWriter(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    edgetrain::common::write_file_atomically(
        path_, stats_json(stats_, acknowledged_, true));  // fails early on a bad path
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
      log_error(e.what());
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
        log_error(e.what());
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

// What the settings table fills: runtime::WorkerConfig's own fields where they fit, and
// the settings that worker_config() turns into the rest.
struct WorkerSettings {
  edgetrain::runtime::WorkerConfig config;
  std::string server = "coaps://127.0.0.1:5684", identity, key_file, key_hex, data = "mnist";
  // A sharded server: every shard's URI, comma-separated, in shard order; server_given says
  // whether --server was set too (which is refused with it).
  std::string shards;
  bool server_given = false;
  edgetrain::runtime::CompressionSettings compression;
  bool insecure = false, quiet = false, log_acks = false;
  std::string log_level = "info";
  std::string cert, cert_key, ca, stats_file;
  // Filter dropout (DISTREAL): static rates, or a table and a budget in ms.
  std::string drop_rates, dropout_rescale = "inverted";
  double step_time_budget_ms = 0;
  double request_timeout = 60;
  // Federated rounds (worker/round_worker.h).
  std::string mode = "async";
  double lr = 0.05, deadline_share = 0.8;
  std::uint64_t max_rounds = 0;
  // Gossip (peer mode, worker/gossip_peer.h).
  edgetrain::runtime::GossipPeerConfig gossip;
  std::string topology_file, peer_name, listen, gossip_algorithm = "d-psgd", state_dir, port_file;
  double balance_target = 0, consensus_step = 0;
  // MD-GAN (worker/gan_worker.h).
  int gan_discriminator_steps = 1;
  std::string gan_arch = "mlp";
  bool gan_fp16 = false;
  double gan_swap_wait = 10;
};

void declare_settings(edgetrain::settings::Table& t, WorkerSettings& s) {
  edgetrain::runtime::WorkerConfig& c = s.config;
  t.group("Server and identity");
  t.add("server", s.server, "coaps://HOST[:PORT] (coap://HOST[:PORT] only with --insecure)");
  t.add("shards", s.shards,
        "a sharded server instead of --server: URI,URI,... of shard 0, 1, ... (each an "
        "edgetrain-server --shard I/N with the same keystore; async mode only)");
  t.add("identity", s.identity,
        "this device's PSK identity (with --cert: only for logs; with --insecure: declared, "
        "unproven)");
  t.add("key-file", s.key_file, "file holding this device's PSK as hex");
  t.add("key-hex", s.key_hex,
        "this device's PSK as hex (what edgetrain-server add-device prints); --key-file wins");
  t.add("cert", s.cert,
        "X.509 instead of PSK: this device's certificate (PEM); with --cert-key and --ca");
  t.add("cert-key", s.cert_key, "X.509: the certificate's private key (PEM)");
  t.add("ca", s.ca, "X.509: CA (PEM) that must have signed the server's certificate");
  t.add("insecure", s.insecure,
        "allow a coap:// server URI: plain CoAP, NO encryption, NO authentication (the server must "
        "run --insecure)");
  t.group("Data and model");
  t.add("data", s.data,
        "mnist (full, 60k), mnist-small (its 8k subset), fashion-mnist, or a directory with "
        "train-images-idx3-ubyte[.gz] and labels");
  t.add("worker-id", c.worker_id, "this worker's shard number");
  t.add("workers", c.worker_count, "number of shards").range(1, 1e6);
  t.add("label-skew", c.label_skewed, "label-skewed shard instead of i.i.d.");
  t.add("seed", c.seed, "shuffling seed (same on every worker of a run)");
  t.add("model", c.model, "paper-cnn, mlp or a spec; must match the server's");
  t.group("Training and compression");
  t.add("batch", c.batch, "minibatch size").range(1, 4096);
  t.add("threads", c.threads, "compute threads").range(1, 64);
  edgetrain::runtime::declare_compression_settings(t, c.compressor, s.compression,
                                                   {"adacomp", "none"});
  t.add("pull-every", c.pull_every, "steps per model pull (1: the paper's)")
      .range(1, 1e6)
      .unit("steps");
  t.add("dense-pull", c.dense_pull,
        "always download the whole model (default: only the parameters changed since "
        "the version held, GET /model?since=V; same parameters bit for bit)");
  t.add("steps", c.max_steps, "stop after this many steps (0: run until stopped)").unit("steps");
  t.add("duration", c.max_seconds, "stop after this long (0: run until stopped)")
      .range(0, 1e9)
      .unit("seconds");
  t.add("slowdown", c.slowdown,
        "emulate a slower device: sleep F times each step's compute time (0: full speed)")
      .range(0, 1000);
  t.group("Filter dropout (DISTREAL: runtime/README.md)");
  t.add("drop-rates", s.drop_rates,
        "train a thinner sub-network at every step: one drop rate per conv layer, e.g. "
        "0.25,0.5 (each in [0, 1); empty: the full model)");
  t.add("dropout-rescale", s.dropout_rescale,
        "with --drop-rates: inverted (ours: kept filters' outputs times "
        "1/keep) or none")
      .choices({"inverted", "none"});
  t.add("dropout-table", c.dropout.table_path,
        "choose the drop rates at run time from this dropout table "
        "(edgetrain-dse's JSON): the most accurate point whose step fits the budget at the speed "
        "measured now");
  t.add("step-time-budget", s.step_time_budget_ms,
        "async with --dropout-table: the time a step may take (in "
        "rounds the round's deadline sets it)")
      .range(0, 1e9)
      .unit("ms");
  t.add("deadline-share", s.deadline_share,
        "rounds with --dropout-table: share of the time left before the "
        "round's deadline (after the pull, less the send's expected time) the local steps may take")
      .range(0.01, 1);
  t.group("Training mode (federated rounds: runtime/README.md)");
  t.add("mode", s.mode,
        "async: send a gradient per step (POST /update); rounds: federated rounds (GET /round, "
        "local SGD, POST /round/update); must match the server's; gossip: no server, average "
        "models with the "
        "topology's neighbours (peer mode, below); gan: MD-GAN, train a discriminator and send the "
        "server's generator "
        "its error feedback (below)")
      .choices({"async", "rounds", "gossip", "gan"});
  t.add("lr", s.lr,
        "rounds and gossip: the local SGD learning rate (gossip with --balance-target: at --batch)")
      .range(1e-9, 100);
  t.add("rounds", s.max_rounds,
        "rounds: stop after this many accepted deltas (0: run until stopped)")
      .unit("rounds");
  t.group("Gossip (--mode gossip, no server: runtime/README.md \"Gossip\")");
  t.add("topology", s.topology_file,
        "the fleet's topology file (edgetrain-topology writes one): peers, their "
        "addresses and the edges; this peer's shard is its index in it");
  t.add("peer-name", s.peer_name,
        "this peer's name in the topology: the CN of its certificate (with --insecure, "
        "declared); default --identity");
  t.add("listen", s.listen,
        "HOST:PORT to serve this peer's model on (default: its address in the topology; port 0: "
        "any, see --port-file)");
  t.add("port-file", s.port_file, "write the UDP port this peer listens on here once it does");
  t.add("gossip", s.gossip_algorithm,
        "d-psgd (each iteration: a step, then average with every neighbour's model of "
        "that iteration) or ad-psgd (a step, then a pairwise average with one random neighbour, no "
        "barrier)")
      .choices({"d-psgd", "ad-psgd"});
  t.add("publish-fraction", s.gossip.publish_fraction,
        "d-psgd: share of each tensor's entries a neighbour's copy "
        "of this model moves by per iteration (1: dense; e.g. 0.01: compressed gossip with error "
        "feedback)")
      .range(1e-6, 1);
  t.add("consensus-step", s.consensus_step,
        "d-psgd: gamma, how far a peer moves toward its neighbours' "
        "copies per iteration (0: 1 with dense gossip, 0.1 with compressed)")
      .range(0, 1);
  t.add("neighbour-wait", s.gossip.neighbour_wait_seconds,
        "d-psgd: how long to wait for a neighbour that is "
        "behind before averaging without it")
      .range(0, 3600)
      .unit("seconds");
  t.add("wait-steps", s.gossip.wait_steps,
        "d-psgd: while a neighbour is behind, take up to this many more local "
        "steps per iteration instead of idling at the barrier (a fast peer's way to use its speed; "
        "0: off)")
      .range(0, 1000);
  t.add("balance-target", s.balance_target,
        "workload balancing: size each step's batch so that it takes this long "
        "at the speed measured now, lr scaled with the batch (0: off)")
      .range(0, 3600)
      .unit("seconds");
  t.add("min-batch", s.gossip.balance.min_batch, "with --balance-target: the least batch")
      .range(1, 4096);
  t.add("max-batch", s.gossip.balance.max_batch, "with --balance-target: the largest batch")
      .range(1, 4096);
  t.add("max-lr-factor", s.gossip.balance.max_lr_factor,
        "with --balance-target: the lr follows the batch linearly "
        "up to this many times --lr (a fast peer's large batch with a linear lr can make the fleet "
        "diverge)")
      .range(1, 64);
  t.add("plateau-patience", s.gossip.plateau.patience,
        "accuracy-aware training: validations without improvement "
        "before the lr halves (twice), then local training stops (0: off)")
      .range(0, 1000);
  t.add("validation-fraction", s.gossip.validation_fraction,
        "share of the shard held out for validation")
      .range(0, 0.49);
  t.add("validate-every", s.gossip.validate_every, "iterations between validations")
      .range(1, 1e6)
      .unit("iterations");
  t.add("iterations", s.gossip.max_iterations,
        "gossip: stop at this iteration; gan: after this many feedbacks "
        "accepted (0: run until stopped or --duration)")
      .unit("iterations");
  t.add("state-dir", s.state_dir,
        "checkpoint this peer's model here (peer.safetensors, every --checkpoint-every "
        "iterations and at exit) and resume from it at start");
  t.add("checkpoint-every", s.gossip.checkpoint_every, "iterations between checkpoints")
      .range(1, 1e9)
      .unit("iterations");
  t.group(
      "MD-GAN (--mode gan: runtime/README.md \"MD-GAN\"; --batch must be the server's "
      "--gan-batch)");
  t.add("gan-arch", s.gan_arch,
        "this worker's discriminator architecture (model/gan_network.h); the peers it "
        "swaps with must have the same")
      .choices({"mlp", "cnn"});
  t.add("gan-discriminator-steps", s.gan_discriminator_steps,
        "L: discriminator steps per iteration, each on a "
        "real batch of this worker's shard and the server's X_d")
      .range(1, 100);
  t.add("gan-fp16", s.gan_fp16, "send the error feedback as fp16 (half the bytes)");
  t.add("gan-swap-wait", s.gan_swap_wait,
        "in a discriminator swap round: how long to wait for the discriminator "
        "a peer sends (none came: train on this one). Peers are the --topology file's, reached "
        "with --cert/--cert-key/"
        "--ca (or --insecure); without --topology swaps are skipped")
      .range(0, 3600)
      .unit("seconds");
  t.group("Network");
  t.add("request-timeout", s.request_timeout,
        "time one request (handshake and every block included) may take before "
        "the worker retries; behind a WAN that drops the server's ICMP errors, how long a "
        "restarted server goes "
        "unnoticed")
      .range(0.5, 3600)
      .unit("seconds");
  t.add("coap-ack-timeout", c.timing.ack_timeout_seconds, "CoAP ACK_TIMEOUT")
      .range(1, 60)
      .unit("seconds");
  t.add("coap-ack-random-factor", c.timing.ack_random_factor, "CoAP ACK_RANDOM_FACTOR").range(1, 4);
  t.add("coap-max-retransmit", c.timing.max_retransmit, "CoAP MAX_RETRANSMIT").range(1, 10);
  t.add("coap-nstart", c.timing.nstart, "CoAP NSTART").range(1, 16);
  t.add("give-up-after", c.give_up_after_seconds,
        "exit (status 10, or 14 once the server had answered) when the "
        "server has not answered for this long, checked after each failed request (0: retry "
        "forever)")
      .range(0, 1e9)
      .unit("seconds");
  t.add("max-refusals", c.max_refusals,
        "exit after this many refusals in a row that retrying cannot fix: DTLS "
        "handshake refused (status 11), identity unknown (12), another model (13)")
      .range(1, 1000);
  t.group("Output");
  t.add("quiet", s.quiet, "no progress line");
  t.add("log-level", s.log_level,
        "least severe log lines written (warn: retries and refusals; error: only why "
        "the worker stopped)")
      .choices({"error", "warn", "info", "debug"});
  t.add("log-acks", s.log_acks, "log the server version of every acknowledged (2.04) update");
  t.add("stats-file", s.stats_file,
        "JSON file of this worker's counters and every acknowledged server version, "
        "rewritten atomically at most every 0.2 s while they change, and at exit");
}

// The transport part of the configuration: PSK, X.509 or (declared) plain CoAP.
void set_security(WorkerSettings& s, edgetrain::runtime::WorkerConfig& config) {
  bool plaintext = false;
  edgetrain::runtime::parse_server_uri(s.server, config.server_host, config.server_port, plaintext);
  if (plaintext && !s.insecure)
    throw std::invalid_argument(
        "refusing plain CoAP to " + s.server +
        ": no encryption, no authentication. Use a coaps:// URI, or give --insecure "
        "(insecure = true in --config) if you really mean it");
  if (s.insecure && !plaintext)
    throw std::invalid_argument("--insecure is only for coap:// server URIs; " + s.server +
                                " is DTLS");
  const bool certificates = !s.cert.empty() || !s.cert_key.empty() || !s.ca.empty();
  if (certificates && (s.cert.empty() || s.cert_key.empty() || s.ca.empty()))
    throw std::invalid_argument(
        "X.509 needs all three of --cert, --cert-key and --ca (cert, cert_key, ca in --config)");
  if (plaintext && certificates)
    throw std::invalid_argument("--cert/--cert-key/--ca are for coaps://, not coap://");
  if (certificates) {
    config.certificates = edgetrain::transport::CertificateFiles{s.cert, s.cert_key, s.ca};
    if (s.identity.empty()) s.identity = "(certificate)";
  } else if (plaintext) {
    if (s.identity.empty())
      throw std::invalid_argument("plain CoAP needs a name to declare: give --identity");
    config.insecure_plaintext = true;
    log_warning("WARNING: --insecure: plain CoAP to " + s.server +
                ", NO encryption and NO authentication; the server keys this worker's updates on "
                "the declared "
                "name 'unauthenticated:" +
                s.identity + "'");
  } else {
    if (s.identity.empty())
      throw std::invalid_argument("no PSK identity: give --identity or identity in --config");
    if (!s.key_file.empty()) s.key_hex = read_text_file(s.key_file);
    if (s.key_hex.empty())
      throw std::invalid_argument(
          "no PSK: give --key-file or --key-hex (key_file, key_hex in --config)");
    config.key = edgetrain::runtime::parse_hex_key(s.key_hex);
  }
  config.identity = s.identity;
}

// --shards: every URI, all DTLS or all plain CoAP (set_security() checks the first's scheme
// against --insecure like a --server URI's).
void set_shards(WorkerSettings& s, edgetrain::runtime::WorkerConfig& config) {
  if (s.shards.empty()) return;
  if (s.server_given) throw std::invalid_argument("give either --server or --shards, not both");
  if (s.mode != "async")
    throw std::invalid_argument("--shards works with --mode async only, not " + s.mode);
  std::vector<std::string> uris;
  for (std::size_t start = 0;;) {
    const std::size_t comma = s.shards.find(',', start);
    uris.push_back(
        s.shards.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  bool first_plaintext = false;
  for (std::size_t i = 0; i < uris.size(); i++) {
    if (uris[i].empty())
      throw std::invalid_argument("--shards " + s.shards + ": an empty URI (shard " +
                                  std::to_string(i) + ")");
    std::string host;
    std::uint16_t port = 0;
    bool plaintext = false;
    edgetrain::runtime::parse_server_uri(uris[i], host, port, plaintext);
    if (i == 0) first_plaintext = plaintext;
    if (plaintext != first_plaintext)
      throw std::invalid_argument(
          "--shards: mixes coaps:// and coap:// URIs; every shard is reached the same way");
    config.shards.emplace_back(host, port);
  }
  s.server = uris.front();  // for set_security() and the log
}

// The worker's configuration from its settings; throws std::invalid_argument.
edgetrain::runtime::WorkerConfig worker_config(WorkerSettings& s) {
  edgetrain::runtime::WorkerConfig config = s.config;
  config.compressor = edgetrain::runtime::compressor_options(config.compressor, s.compression);
  set_shards(s, config);
  set_security(s, config);
  edgetrain::transport::check_timing(config.timing);
  config.request_timeout_ms = static_cast<int>(s.request_timeout * 1000);
  if (!s.drop_rates.empty())
    config.dropout.drop_rates = edgetrain::runtime::parse_drop_rates(s.drop_rates);
  config.dropout.rescale = edgetrain::runtime::parse_dropout_rescale(s.dropout_rescale);
  config.dropout.step_budget_seconds = s.step_time_budget_ms / 1000;
  // The drop rates or table against the model, before any data is loaded.
  edgetrain::runtime::check_worker_dropout(
      config.dropout,
      edgetrain::runtime::Model(edgetrain::runtime::model_spec_from_argument(config.model)),
      s.mode == "rounds" ? edgetrain::runtime::DropoutPacing::kPerRound
                         : edgetrain::runtime::DropoutPacing::kPerStep);
  return config;
}

// The progress line (every second on a terminal, every 10 s in a log) and --log-acks.
class ProgressReport {
 public:
  ProgressReport(bool quiet, bool log_acks)
      : quiet_(quiet), log_acks_(log_acks), tty_(isatty(STDERR_FILENO)) {}
  ~ProgressReport() {
    if (tty_ && !quiet_) std::fprintf(stderr, "\n");
  }
  void operator()(const edgetrain::runtime::WorkerStats& s) {
    // One push per step, so at most one new acknowledgement per call. The line lets
    // anyone check afterwards that the server never went back behind a version it
    // acknowledged.
    if (log_acks_ && s.updates_accepted > acks_logged_) {
      acks_logged_ = s.updates_accepted;
      log_line("acknowledged: server version " + std::to_string(s.server_version));
    }
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_report_ < std::chrono::seconds(tty_ ? 1 : 10)) return;
    last_report_ = now;
    char line[300];
    int used = std::snprintf(line, sizeof line,
                             "step %llu  loss %.3f  server version %llu  accepted %llu  refused "
                             "%llu  sent %.2f MB  pulled %.1f MB",
                             static_cast<unsigned long long>(s.steps), s.last_loss,
                             static_cast<unsigned long long>(s.server_version),
                             static_cast<unsigned long long>(s.updates_accepted),
                             static_cast<unsigned long long>(s.updates_refused), s.bytes_sent / 1e6,
                             s.bytes_received / 1e6);
    if (!s.dropout.drop_rates.empty() && used > 0 && static_cast<std::size_t>(used) < sizeof line)
      std::snprintf(line + used, sizeof line - used, "  drop %s", s.dropout.drop_rates.c_str());
    if (tty_)
      std::fprintf(stderr, "\r%-120s", line);
    else
      log_line(line);
  }

 private:
  bool quiet_, log_acks_, tty_;
  std::uint64_t acks_logged_ = 0;
  std::chrono::steady_clock::time_point last_report_ = std::chrono::steady_clock::now();
};

// --mode rounds: the RoundWorker; its counters go to --stats-file at start and at exit.
int run_rounds(const WorkerSettings& s, const edgetrain::runtime::WorkerConfig& config,
               const edgetrain::runtime::Dataset& train) {
  using namespace edgetrain;
  runtime::RoundWorkerConfig round_config;
  round_config.worker = config;
  round_config.lr = static_cast<float>(s.lr);
  round_config.max_rounds = s.max_rounds;
  round_config.deadline_share = s.deadline_share;
  auto write_stats = [&](const runtime::RoundWorkerStats& st, bool running) {
    if (s.stats_file.empty()) return;
    const nlohmann::json j = {{"state", running ? "running" : "stopped"},
                              {"mode", "rounds"},
                              {"rounds_trained", st.rounds_trained},
                              {"deltas_refused", st.deltas_refused},
                              {"deltas_rejected", st.deltas_rejected},
                              {"polls", st.polls},
                              {"pulls", st.pulls},
                              {"steps", st.steps},
                              {"retries", st.retries},
                              {"bytes_sent", st.bytes_sent},
                              {"bytes_received", st.bytes_received},
                              {"last_round", st.last_round},
                              {"last_loss", st.last_loss},
                              {"dropout", st.dropout},
                              // the rounds acknowledged: round r is model version r, so the
                              // emulator's checks of acknowledged versions hold for them too
                              {"acknowledged_versions", st.acknowledged_rounds}};
    common::write_file_atomically(s.stats_file, j.dump(2) + "\n");
  };
  write_stats({}, true);
  // A round takes seconds to minutes: the file is rewritten after every delta sent.
  const runtime::RoundWorkerRun result = runtime::run_round_worker(
      round_config, train, stop_requested, write_line, [&](const runtime::RoundWorkerStats& st) {
        try {
          write_stats(st, true);
        } catch (const std::exception& e) {
          log_error(e.what());
        }
      });
  write_stats(result.stats, false);
  log_line("stopped after " + std::to_string(result.stats.rounds_trained) + " rounds (" +
           std::to_string(result.stats.deltas_refused) + " deltas refused, " +
           std::to_string(result.stats.bytes_sent) + " bytes sent, " +
           std::to_string(result.stats.bytes_received) + " bytes pulled)");
  if (result.exit != runtime::WorkerExit::kStopped)
    log_error("exit status " + std::to_string(runtime::exit_status(result.exit)) + ": " +
              result.reason);
  return runtime::exit_status(result.exit);
}

// --mode gossip: the peer's configuration from its settings; throws std::invalid_argument.
edgetrain::runtime::GossipPeerConfig gossip_config(WorkerSettings& s) {
  using namespace edgetrain;
  runtime::GossipPeerConfig g = s.gossip;
  if (s.topology_file.empty())
    throw std::invalid_argument(
        "--mode gossip needs --topology FILE (edgetrain-topology writes one)");
  g.topology = runtime::read_topology_file(s.topology_file);
  if (s.peer_name.empty()) s.peer_name = s.identity;
  if (s.peer_name.empty())
    throw std::invalid_argument(
        "--mode gossip needs --peer-name (this peer's name in the topology)");
  const auto self = g.topology.find(s.peer_name);
  if (!self)
    throw std::invalid_argument("peer '" + s.peer_name + "' is not in the topology " +
                                s.topology_file);
  g.self = *self;
  const bool certificates = !s.cert.empty() || !s.cert_key.empty() || !s.ca.empty();
  if (s.insecure && certificates)
    throw std::invalid_argument("--insecure gossip is plain CoAP: no --cert/--cert-key/--ca");
  if (!s.insecure && (s.cert.empty() || s.cert_key.empty() || s.ca.empty()))
    throw std::invalid_argument(
        "gossip peers prove who they are with X.509 certificates from the fleet's CA: give "
        "--cert, --cert-key and --ca (or --insecure on every peer for plain CoAP)");
  if (s.insecure)
    log_warning(
        "WARNING: --insecure: plain CoAP between peers, NO encryption and NO authentication; "
        "neighbours are "
        "known by the names they declare");
  const runtime::WorkerConfig& c = s.config;
  g.model = c.model;
  g.seed = c.seed;
  g.threads = c.threads;
  g.label_skewed = c.label_skewed;
  g.slowdown = c.slowdown;
  g.max_seconds = c.max_seconds;
  g.algorithm = runtime::parse_gossip_algorithm(s.gossip_algorithm);
  g.balance.base_batch = c.batch;
  g.balance.base_lr = s.lr;
  g.balance.target_seconds = s.balance_target;
  g.consensus_step =
      s.consensus_step > 0 ? s.consensus_step : runtime::default_consensus_step(g.publish_fraction);
  if (g.balance.target_seconds == 0) g.balance.min_batch = g.balance.max_batch = c.batch;
  if (!s.state_dir.empty()) {
    std::filesystem::create_directories(s.state_dir);
    g.checkpoint_path = (std::filesystem::path(s.state_dir) / "peer.safetensors").string();
  }
  runtime::check_gossip_peer_config(g);
  runtime::Model(
      runtime::model_spec_from_argument(g.model));  // a bad model spec fails here, before any data
  return g;
}

std::string gossip_stats_json(const edgetrain::runtime::GossipPeerStats& st,
                              const std::string& name, bool running) {
  const nlohmann::json j = {{"state", running ? "running" : "stopped"},
                            {"mode", "gossip"},
                            {"peer", name},
                            {"iteration", st.iteration},
                            {"resumed_iteration", st.resumed_iteration},
                            {"steps", st.steps},
                            {"wait_steps", st.wait_steps},
                            {"examples", st.examples},
                            {"exchanges", st.exchanges},
                            {"neighbours_skipped", st.neighbours_skipped},
                            {"models_refused", st.models_refused},
                            {"requests_refused", st.requests_refused},
                            {"bytes_sent", st.bytes_sent},
                            {"bytes_received", st.bytes_received},
                            {"batch", st.batch},
                            {"learning_rate", st.learning_rate},
                            {"examples_per_second", st.examples_per_second},
                            {"last_iteration_seconds", st.last_iteration_seconds},
                            {"validation_accuracy", st.validation_accuracy},
                            {"training_stopped", st.training_stopped},
                            {"last_loss", st.last_loss},
                            {"refused", st.refused}};
  return j.dump(2) + "\n";
}

// The peer side of --mode gossip and gan: a CoAP/DTLS server on this peer's topology address
// (or --listen) with the fleet's X.509 identities (plain CoAP with --insecure), and a client
// to each peer with the same identity.
struct PeerEndpoint {
  std::string host;
  std::unique_ptr<edgetrain::transport::CoapDtlsServer> server;
  std::unique_ptr<edgetrain::runtime::CoapPeerChannel> channel;
  std::uint16_t port(bool insecure) const {
    return insecure ? server->plaintext_port() : server->port();
  }
};

PeerEndpoint open_peer_endpoint(const WorkerSettings& s,
                                const edgetrain::runtime::GossipTopology& topology,
                                std::uint32_t self, std::size_t max_body_bytes) {
  using namespace edgetrain;
  PeerEndpoint endpoint;
  std::uint16_t port = 0;
  runtime::parse_server_uri((s.insecure ? "coap://" : "coaps://") +
                                (s.listen.empty() ? topology.peers[self].address : s.listen),
                            endpoint.host, port);
  transport::CoapDtlsServer::Options o;
  o.bind_address = endpoint.host;
  if (s.insecure) {
    o.port = 0;
    o.plaintext_port = port;
  } else {
    o.port = port;
    o.certificates = transport::CertificateFiles{s.cert, s.cert_key, s.ca};
  }
  o.timing = s.config.timing;
  o.max_body_bytes = std::max(o.max_body_bytes, max_body_bytes);
  endpoint.server = std::make_unique<transport::CoapDtlsServer>(o);
  runtime::CoapPeerChannel::Options channel_options;
  if (!s.insecure)
    channel_options.certificates = transport::CertificateFiles{s.cert, s.cert_key, s.ca};
  channel_options.plaintext = s.insecure;
  channel_options.declared_identity = topology.peers[self].name;
  channel_options.timing = s.config.timing;
  channel_options.timeout_ms = static_cast<int>(s.request_timeout * 1000);
  channel_options.stop = &stop_requested;
  endpoint.channel = std::make_unique<runtime::CoapPeerChannel>(topology, channel_options);
  return endpoint;
}

// --mode gossip: serve this peer's model on its own CoAP/DTLS endpoint (a thread) while the
// training loop runs here.
int run_gossip(const WorkerSettings& s, const edgetrain::runtime::GossipPeerConfig& config,
               const edgetrain::runtime::Dataset& train) {
  using namespace edgetrain;
  const std::string& name = config.topology.peers[config.self].name;
  // AD-PSGD posts whole models: the body limit must hold one, whatever the model.
  std::size_t model_bytes = 0;
  {
    const runtime::Model model(runtime::model_spec_from_argument(config.model));
    std::vector<std::uint32_t> sizes;
    for (const auto& t : model.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
    model_bytes = transport::dense_model_bytes(sizes) + 1024;
  }
  PeerEndpoint endpoint = open_peer_endpoint(s, config.topology, config.self, model_bytes);
  transport::CoapDtlsServer& server = *endpoint.server;
  runtime::CoapPeerChannel& channel = *endpoint.channel;
  const std::string& host = endpoint.host;
  runtime::GossipPeer peer(config, train, channel, stop_requested,
                           [](const std::string& line) { log_line(line); });
  peer.attach(server);
  std::atomic<bool> serving{true};
  std::thread server_thread([&] {
    while (serving) server.run_once(100);
  });
  const std::uint16_t bound = endpoint.port(s.insecure);
  if (!s.port_file.empty())
    common::write_file_atomically(s.port_file, std::to_string(bound) + "\n");
  log_line("gossip peer " + name + " (" + std::to_string(config.self) + " of " +
           std::to_string(config.topology.size()) + ", " +
           runtime::gossip_algorithm_name(config.algorithm) + ", " +
           std::to_string(config.topology.neighbours[config.self].size()) +
           " neighbours) serving on " + host + ":" + std::to_string(bound) + ", from iteration " +
           std::to_string(peer.stats().iteration));
  auto write_stats = [&](const runtime::GossipPeerStats& st, bool running) {
    if (!s.stats_file.empty())
      common::write_file_atomically(s.stats_file, gossip_stats_json(st, name, running));
  };
  runtime::GossipPeerStats final_stats;
  int status = 0;
  try {
    write_stats(peer.stats(), true);
    auto last_write = std::chrono::steady_clock::now(), last_line = last_write;
    const bool tty = isatty(STDERR_FILENO);
    final_stats = peer.run([&](const runtime::GossipPeerStats& st) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last_write >= std::chrono::milliseconds(200)) {
        last_write = now;
        write_stats(st, true);
      }
      if (s.quiet || now - last_line < std::chrono::seconds(tty ? 1 : 10)) return;
      last_line = now;
      char line[300];
      std::snprintf(line, sizeof line,
                    "iteration %llu  loss %.3f  batch %d  lr %.4f  %.0f ex/s  exchanges %llu  "
                    "skipped %llu  sent %.2f MB"
                    "  received %.2f MB%s",
                    static_cast<unsigned long long>(st.iteration), st.last_loss, st.batch,
                    st.learning_rate, st.examples_per_second,
                    static_cast<unsigned long long>(st.exchanges),
                    static_cast<unsigned long long>(st.neighbours_skipped), st.bytes_sent / 1e6,
                    st.bytes_received / 1e6, st.training_stopped ? "  (training stopped)" : "");
      if (tty)
        std::fprintf(stderr, "\r%-130s", line);
      else
        log_line(line);
    });
  } catch (const std::exception& e) {
    log_error(std::string("gossip peer failed: ") + e.what());
    final_stats = peer.stats();
    status = 1;
  }
  serving = false;
  server_thread.join();
  write_stats(final_stats, false);
  log_line("stopped at iteration " + std::to_string(final_stats.iteration) + ": " +
           std::to_string(final_stats.exchanges) + " exchanges, " +
           std::to_string(final_stats.neighbours_skipped) + " neighbours skipped, " +
           std::to_string(final_stats.models_refused + final_stats.requests_refused) +
           " models or requests refused, " + std::to_string(final_stats.bytes_sent) +
           " bytes sent");
  return status;
}

// --mode gan: the MD-GAN worker; with --topology, its peer endpoint for discriminator swaps
// runs on a thread of its own, as a gossip peer's does.
int run_gan(WorkerSettings& s, const edgetrain::runtime::WorkerConfig& config,
            const edgetrain::runtime::Dataset& train) {
  using namespace edgetrain;
  runtime::GanWorkerConfig gan_config;
  gan_config.worker = config;
  gan_config.gan.batch = config.batch;
  gan_config.gan.seed = config.seed;
  gan_config.gan.discriminator_steps = s.gan_discriminator_steps;
  gan_config.gan.architecture = runtime::parse_gan_architecture(s.gan_arch);
  gan_config.feedback_encoding =
      s.gan_fp16 ? transport::ValueEncoding::kFp16 : transport::ValueEncoding::kFp32;
  gan_config.max_iterations = s.gossip.max_iterations;
  gan_config.swap_wait_seconds = s.gan_swap_wait;
  std::optional<runtime::GossipTopology> topology;
  PeerEndpoint endpoint;
  std::string name = s.peer_name.empty() ? s.identity : s.peer_name;
  if (!s.topology_file.empty()) {
    if (s.peer_name.empty() && !s.cert.empty()) {
      std::fprintf(
          stderr,
          "edgetrain-worker: with --topology give --peer-name: this worker's name there (its "
          "certificate's CN, the name the server announces to its peers)\n");
      return runtime::exit_status(runtime::WorkerExit::kBadSettings);
    }
    topology = runtime::read_topology_file(s.topology_file);
    const auto self = topology->find(name);
    if (!self) {
      std::fprintf(stderr, "edgetrain-worker: peer '%s' is not in the topology %s (--peer-name)\n",
                   name.c_str(), s.topology_file.c_str());
      return runtime::exit_status(runtime::WorkerExit::kBadSettings);
    }
    const bool certificates = !s.cert.empty() && !s.cert_key.empty() && !s.ca.empty();
    if (!s.insecure && !certificates) {
      std::fprintf(
          stderr,
          "edgetrain-worker: discriminator swaps between peers use X.509 certificates from the "
          "fleet's CA: give --cert, --cert-key and --ca (or --insecure)\n");
      return runtime::exit_status(runtime::WorkerExit::kBadSettings);
    }
    endpoint = open_peer_endpoint(s, *topology, *self, 16u << 20);  // a discriminator (MLP: 2.7 MB)
  }
  runtime::CoapServerChannel channel(runtime::coap_client_options(config, stop_requested));
  runtime::GanWorker worker(gan_config, train, channel, endpoint.channel.get(),
                            topology ? &*topology : nullptr, stop_requested,
                            [](const std::string& line) { log_line(line); });
  std::atomic<bool> serving{true};
  std::thread peer_thread;
  if (endpoint.server) {
    worker.attach(*endpoint.server);
    const std::uint16_t bound = endpoint.port(s.insecure);
    if (!s.port_file.empty())
      common::write_file_atomically(s.port_file, std::to_string(bound) + "\n");
    log_line("MD-GAN peer endpoint of " + name + " on port " + std::to_string(bound));
    peer_thread = std::thread([&] {
      while (serving) endpoint.server->run_once(100);
    });
  }
  auto stats_json = [&](const runtime::GanWorkerStats& st, bool running) {
    return nlohmann::json{{"state", running ? "running" : "stopped"},
                          {"mode", "gan"},
                          {"iterations", st.iterations},
                          {"feedbacks_refused", st.feedbacks_refused},
                          {"waits", st.waits},
                          {"retries", st.retries},
                          {"swaps_sent", st.swaps_sent},
                          {"swaps_received", st.swaps_received},
                          {"swaps_missed", st.swaps_missed},
                          {"peer_requests_refused", st.peer_requests_refused},
                          {"bytes_sent", st.bytes_sent},
                          {"bytes_received", st.bytes_received},
                          {"peer_bytes_sent", st.peer_bytes_sent},
                          {"peer_bytes_received", st.peer_bytes_received},
                          {"last_iteration", st.last_iteration},
                          {"d_loss_real", st.d_loss_real},
                          {"d_loss_fake", st.d_loss_fake},
                          {"g_loss", st.g_loss},
                          {"compute_seconds", st.compute_seconds}}
               .dump(2) +
           "\n";
  };
  auto write_stats = [&](const runtime::GanWorkerStats& st, bool running) {
    if (!s.stats_file.empty()) common::write_file_atomically(s.stats_file, stats_json(st, running));
  };
  runtime::GanWorkerRun result;
  try {
    write_stats({}, true);
    auto last_write = std::chrono::steady_clock::now(), last_line = last_write;
    const bool tty = isatty(STDERR_FILENO);
    result.stats = worker.run([&](const runtime::GanWorkerStats& st) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last_write >= std::chrono::milliseconds(200)) {
        last_write = now;
        write_stats(st, true);
      }
      if (s.quiet || now - last_line < std::chrono::seconds(tty ? 1 : 10)) return;
      last_line = now;
      char line[300];
      std::snprintf(line, sizeof line,
                    "iteration %llu  D loss real %.3f fake %.3f  G loss %.3f  swaps %llu/%llu  "
                    "sent %.2f MB  received %.2f MB",
                    static_cast<unsigned long long>(st.last_iteration), st.d_loss_real,
                    st.d_loss_fake, st.g_loss, static_cast<unsigned long long>(st.swaps_received),
                    static_cast<unsigned long long>(st.swaps_received + st.swaps_missed),
                    st.bytes_sent / 1e6, st.bytes_received / 1e6);
      if (tty)
        std::fprintf(stderr, "\r%-130s", line);
      else
        log_line(line);
    });
  } catch (const runtime::WorkerFailure& e) {
    result.stats = worker.stats();
    result.exit = e.exit();
    result.reason = e.what();
  }
  serving = false;
  if (peer_thread.joinable()) peer_thread.join();
  write_stats(result.stats, false);
  log_line("stopped after " + std::to_string(result.stats.iterations) + " GAN iterations (" +
           std::to_string(result.stats.feedbacks_refused) + " feedbacks refused as late, " +
           std::to_string(result.stats.swaps_received) + " discriminators swapped in, " +
           std::to_string(result.stats.swaps_missed) + " swaps missed, " +
           std::to_string(result.stats.bytes_sent) + " bytes sent)");
  if (result.exit == runtime::WorkerExit::kStopped && result.stats.iterations == 0)
    runtime::end_without_anything_applied(runtime::WorkerExit::kStopped, "", "GAN feedback",
                                          result.exit, result.reason);
  if (result.exit != runtime::WorkerExit::kStopped)
    log_error("exit status " + std::to_string(runtime::exit_status(result.exit)) + ": " +
              result.reason);
  return runtime::exit_status(result.exit);
}

int run(WorkerSettings& s) {
  using namespace edgetrain;
  logging::set_level(logging::parse_level(s.log_level).value_or(logging::Level::kInfo));
  runtime::WorkerConfig config;
  runtime::GossipPeerConfig gossip;
  try {
    if (!s.shards.empty() && s.mode != "async")
      throw std::invalid_argument("--shards works with --mode async only, not " + s.mode);
    if (s.mode == "gossip")
      gossip = gossip_config(s);
    else
      config = worker_config(s);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "edgetrain-worker: %s\n", e.what());
    return runtime::exit_status(runtime::WorkerExit::kBadSettings);
  }
  const runtime::DatasetFiles files = runtime::dataset_files(s.data, runtime::DataSplit::kTrain);
  runtime::Dataset train = runtime::load_dataset(files.images, files.labels);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  if (s.mode == "gossip") return run_gossip(s, gossip, train);
  if (s.mode == "gan") {
    log_line("MD-GAN worker " + std::to_string(config.worker_id) + "/" +
             std::to_string(config.worker_count) + " (" + config.identity + ") -> " + s.server +
             ", batch " + std::to_string(config.batch) + ", L " +
             std::to_string(s.gan_discriminator_steps) + ", " + std::to_string(train.size()) +
             " examples in the data set");
    return run_gan(s, config, train);
  }
  log_line(
      "worker " + std::to_string(config.worker_id) + "/" + std::to_string(config.worker_count) +
      " (" + config.identity + ") -> " +
      (s.shards.empty() ? s.server : std::to_string(config.shards.size()) + " shards " + s.shards) +
      ", model " + config.model + ", " + s.compression.compressor + ", " +
      std::to_string(train.size()) + " examples in the data set");
  if (s.mode == "rounds") return run_rounds(s, config, train);
  StatsFileWriter stats_file(s.stats_file);
  runtime::WorkerRun result;
  {
    ProgressReport report(s.quiet, s.log_acks);
    auto progress = [&](const runtime::WorkerStats& current) {
      stats_file.update(current);
      report(current);
    };
    result = runtime::run_worker(config, train, stop_requested, write_line, progress);
  }
  const runtime::WorkerStats& stats = result.stats;
  stats_file.finish(stats);
  log_line("stopped after " + std::to_string(stats.steps) +
           " steps: " + std::to_string(stats.updates_accepted) + " updates accepted, " +
           std::to_string(stats.updates_refused) + " refused as stale, " +
           std::to_string(stats.bytes_sent) + " bytes sent, " + std::to_string(stats.retries) +
           " retries; " + std::to_string(stats.pulls) + " pulls (" +
           std::to_string(stats.delta_pulls) + " as deltas), " +
           std::to_string(stats.bytes_received) + " bytes pulled");
  if (result.exit != runtime::WorkerExit::kStopped)
    log_error("exit status " + std::to_string(runtime::exit_status(result.exit)) + ": " +
              result.reason);
  return runtime::exit_status(result.exit);
}

}  // namespace

int main(int argc, char** argv) {
  WorkerSettings settings;
  edgetrain::settings::Table table(
      "edgetrain-worker",
      "edgetrain-worker: trains a model on this device's data shard and sends AdaComp-compressed "
      "gradients to an\n"
      "edgetrain-server over CoAP/DTLS (PSK, or X.509 with --cert/--cert-key/--ca).");
  declare_settings(table, settings);
  table.footer(edgetrain::runtime::worker_exit_codes_help());
  return table.run_program(argc, argv, [&] {
    // --shards replaces --server: both as flags, or both in the file, is a mistake; a
    // --shards flag wins over a server in the file (add-device's configuration has one).
    settings.server_given = table.given_on_command_line("server") ||
                            (table.was_set("server") && !table.given_on_command_line("shards"));
    return run(settings);
  });
}
