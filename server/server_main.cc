// edgetrain-server: the parameter server executable.
//
//   edgetrain-server --state-dir DIR --keystore KEYS [--config server.toml] [flags]
//   edgetrain-server --state-dir DIR --cert C --key K --ca CA [--keystore KEYS] [flags]
//   edgetrain-server add-device NAME --keystore KEYS [--server-uri coaps://host:5684]
//
// Flags override the TOML config file, which overrides the defaults. SIGTERM/SIGINT: the
// request being handled finishes, a checkpoint is written, exit status 0.
#include <CLI/CLI.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ctime>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "common/atomic_file.h"
#include "runtime/dataset.h"
#include "server/evaluator.h"
#include "server/keystore.h"
#include "server/resources.h"
#include "server/server_state.h"
#include "common/svg_plot.h"
#include "transport/coap_dtls.h"

namespace {

using namespace edgetrain;

std::atomic<bool> g_stop_requested = false;
void request_stop(int) { g_stop_requested = true; }

std::mutex g_log_mutex;
// "2024-05-01T12:34:56.789Z message" on stderr; callable from any thread.
void log_line(const std::string& message) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  std::lock_guard lock(g_log_mutex);
  std::fprintf(stderr, "%s.%03dZ %s\n", stamp, static_cast<int>(millis), message.c_str());
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

struct Settings {
  std::string listen = "0.0.0.0";
  int port = 5684;
  std::string model = "paper-cnn";
  std::string state_dir;
  std::string keystore;
  double lr = 0.1;
  std::uint32_t max_staleness = 64;
  std::uint64_t checkpoint_every = 1000;
  std::string eval_data = "none";
  double eval_interval_seconds = 30;
  std::size_t max_update_bytes = std::size_t{4} << 20;
  std::uint64_t seed = 1;
  // Transport (transport/README.md): plain CoAP only with insecure, X.509 as an option,
  // CoAP timing for a WAN.
  bool insecure = false;
  int insecure_port = 5683;
  std::string cert_file, cert_key_file, ca_file;
  transport::CoapTiming timing = transport::CoapTiming::wan();
  std::uint32_t datagrams_per_pass = 32;  // transport::CoapDtlsServer::Options
  // Files for scripts (server/README.md): the bound DTLS port; a JSON stats object.
  std::string port_file, stats_file;
};

// The --stats-file object (server/README.md documents its keys).
std::string stats_json(bool running, const server::ServerState& state, const server::RecoveryReport& recovery,
                       std::uint64_t version_after_recovery, const server::ServerResources& resources,
                       const transport::CoapDtlsServer& server, bool insecure,
                       const std::optional<server::EvaluationResult>& last_evaluation) {
  nlohmann::json j;
  j["state"] = running ? "running" : "stopped";
  j["version"] = state.version();
  j["port"] = server.port();
  j["insecure_port"] = insecure ? nlohmann::json(server.plaintext_port()) : nlohmann::json(nullptr);
  j["recovery"] = {{"fresh", recovery.fresh},
                   {"checkpoint_version", recovery.checkpoint_version},
                   {"replayed_updates", recovery.replayed_updates},
                   {"dropped_wal_bytes", recovery.dropped_wal_bytes},
                   {"version", version_after_recovery}};
  j["updates_applied"] = resources.updates_applied();
  j["ingress_payload_bytes"] = resources.ingress_payload_bytes();
  j["ingress_socket_bytes"] = resources.ingress_socket_bytes();
  j["last_evaluation"] = last_evaluation ? nlohmann::json{{"version", last_evaluation->version},
                                                          {"accuracy", last_evaluation->accuracy},
                                                          {"loss", last_evaluation->loss}}
                                         : nlohmann::json(nullptr);
  return j.dump(2) + "\n";
}

// Values from the TOML file for every setting not given on the command line.
void apply_config_file(const std::string& path, const CLI::App& app, Settings& s) {
  toml::table config;
  try {
    config = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw std::runtime_error("config " + path + ": " + std::string(e.description()));
  }
  static const std::set<std::string> known = {"listen", "port", "model", "state_dir", "keystore", "lr", "max_staleness",
                                              "checkpoint_every", "eval_data", "eval_interval_seconds",
                                              "max_update_bytes", "seed"};
  static const std::set<std::string> transport_keys = {
      "insecure", "insecure_port", "cert_file", "cert_key_file", "ca_file",
      "coap_ack_timeout", "coap_ack_random_factor", "coap_max_retransmit", "coap_nstart", "datagrams_per_pass"};
  for (const auto& [key, value] : config)
    if (!known.count(std::string(key.str())) && !transport_keys.count(std::string(key.str())))
      throw std::runtime_error("config " + path + ": unknown key '" + std::string(key.str()) + "'");
  auto take = [&](const char* key, const char* flag, auto& target) {
    if (app.count(flag) || !config.contains(key)) return;
    using T = std::decay_t<decltype(target)>;
    std::optional<T> value;
    if constexpr (std::is_same_v<T, std::string>) value = config[key].value<std::string>();
    else if constexpr (std::is_same_v<T, bool>) value = config[key].value<bool>();
    else if constexpr (std::is_floating_point_v<T>) value = config[key].value<double>();
    else {
      auto number = config[key].value<std::int64_t>();
      if (number && *number >= 0) value = static_cast<T>(*number);
    }
    if (!value) throw std::runtime_error("config " + path + ": '" + key + "' has the wrong type or is negative");
    target = *value;
  };
  take("listen", "--listen", s.listen);
  take("port", "--port", s.port);
  take("model", "--model", s.model);
  take("state_dir", "--state-dir", s.state_dir);
  take("keystore", "--keystore", s.keystore);
  take("lr", "--lr", s.lr);
  take("max_staleness", "--max-staleness", s.max_staleness);
  take("checkpoint_every", "--checkpoint-every", s.checkpoint_every);
  take("eval_data", "--eval-data", s.eval_data);
  take("eval_interval_seconds", "--eval-interval", s.eval_interval_seconds);
  take("max_update_bytes", "--max-update-bytes", s.max_update_bytes);
  take("seed", "--seed", s.seed);
  take("insecure", "--insecure", s.insecure);
  take("insecure_port", "--insecure-port", s.insecure_port);
  take("cert_file", "--cert", s.cert_file);
  take("cert_key_file", "--key", s.cert_key_file);
  take("ca_file", "--ca", s.ca_file);
  take("coap_ack_timeout", "--coap-ack-timeout", s.timing.ack_timeout_seconds);
  take("coap_ack_random_factor", "--coap-ack-random-factor", s.timing.ack_random_factor);
  take("coap_max_retransmit", "--coap-max-retransmit", s.timing.max_retransmit);
  take("coap_nstart", "--coap-nstart", s.timing.nstart);
  take("datagrams_per_pass", "--datagrams-per-pass", s.datagrams_per_pass);
}

std::optional<runtime::Dataset> load_test_set(const std::string& name) {
  if (name == "none") return std::nullopt;
  const char* deps_env = std::getenv("EDGETRAIN_DEPS");
  const std::string deps = deps_env ? deps_env : "/var/cache/edgetrain";
  if (name == "mnist")
    return runtime::load_dataset(deps + "/mnist/t10k-images-idx3-ubyte", deps + "/mnist/t10k-labels-idx1-ubyte");
  if (name == "fashion-mnist")
    return runtime::load_dataset("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz",
                                 "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
  throw std::invalid_argument("unknown --eval-data '" + name + "' (mnist, fashion-mnist or none)");
}

// The keystore, re-read when its file changes, so add-device takes effect without a restart.
class LiveKeystore {
 public:
  explicit LiveKeystore(std::string path) : path_(std::move(path)) { reload(); }
  std::optional<std::vector<std::uint8_t>> key_for(std::string_view identity) {
    reload_if_changed();
    return keystore_.key_for(identity);
  }
  bool contains(std::string_view identity) {
    reload_if_changed();
    return keystore_.contains(identity);
  }
  std::size_t size() const { return keystore_.size(); }

 private:
  void reload() {
    struct stat info {};
    if (::stat(path_.c_str(), &info) == 0) modified_ = info.st_mtim.tv_sec * 1000000000LL + info.st_mtim.tv_nsec;
    keystore_ = server::Keystore::load(path_);
  }
  void reload_if_changed() {
    struct stat info {};
    if (::stat(path_.c_str(), &info) != 0) return;
    if (info.st_mtim.tv_sec * 1000000000LL + info.st_mtim.tv_nsec == modified_) return;
    try {
      reload();
      log_line("keystore reloaded: " + std::to_string(keystore_.size()) + " devices");
    } catch (const std::exception& e) {
      log_line(std::string("keystore not reloaded, keeping the previous one: ") + e.what());
    }
  }
  std::string path_;
  long long modified_ = 0;
  server::Keystore keystore_;
};

int run_server(const Settings& s) {
  if (s.state_dir.empty()) throw std::invalid_argument("--state-dir (or state_dir in the config) is required");
  const bool certificates = !s.cert_file.empty() || !s.cert_key_file.empty() || !s.ca_file.empty();
  if (certificates && (s.cert_file.empty() || s.cert_key_file.empty() || s.ca_file.empty()))
    throw std::invalid_argument("X.509 needs all three of --cert, --key and --ca (or cert_file, cert_key_file, ca_file)");
  if (s.keystore.empty() && !certificates)
    throw std::invalid_argument("--keystore (or keystore in the config) is required unless --cert/--key/--ca are given");
  if (s.port < 0 || s.port > 65535) throw std::invalid_argument("--port must be 0..65535");
  if (s.insecure_port < 0 || s.insecure_port > 65535) throw std::invalid_argument("--insecure-port must be 0..65535");
  transport::check_timing(s.timing);
  if (s.datagrams_per_pass < 1 || s.datagrams_per_pass > 1024)
    throw std::invalid_argument("--datagrams-per-pass (datagrams_per_pass) must be 1..1024");

  // Without a keystore (certificates only) every PSK handshake is refused.
  std::optional<LiveKeystore> keystore;
  if (!s.keystore.empty()) {
    keystore.emplace(s.keystore);
    log_line("keystore " + s.keystore + ": " + std::to_string(keystore->size()) + " devices");
  }

  runtime::Model model(runtime::model_spec_from_argument(s.model));
  model.initialize(s.seed);
  server::ServerStateOptions options;
  options.state_dir = s.state_dir;
  options.store.learning_rate = static_cast<float>(s.lr);
  options.store.max_staleness = s.max_staleness;
  options.checkpoint_every = s.checkpoint_every;
  options.max_update_bytes = s.max_update_bytes;
  const runtime::Model evaluation_model = model;
  server::ServerState state(std::move(model), options);
  const auto& recovery = state.recovery();
  const std::uint64_t version_after_recovery = state.version();
  if (recovery.fresh) {
    log_line("new state in " + s.state_dir + ": model " + state.model().spec().name + ", " +
             std::to_string(state.model().parameter_count()) + " parameters, seed " + std::to_string(s.seed));
  } else {
    log_line("recovered from " + s.state_dir + ": checkpoint at version " + std::to_string(recovery.checkpoint_version) +
             ", " + std::to_string(recovery.replayed_updates) + " updates replayed from the WAL" +
             (recovery.dropped_wal_bytes ? ", a torn tail of " + std::to_string(recovery.dropped_wal_bytes) +
                                               " bytes dropped"
                                         : std::string()) +
             "; version " + std::to_string(state.version()));
  }

  server::ResourceOptions resource_options;
  resource_options.is_authorized = [&keystore](std::string_view identity) {
    return keystore && keystore->contains(identity);
  };
  resource_options.log = log_line;
  resource_options.facts = {{"eval_data", s.eval_data}, {"state_dir", s.state_dir}};
  const std::string dtls_modes =
      std::string(keystore ? "PSK" : "") + (keystore && certificates ? " and " : "") + (certificates ? "X.509" : "");
  resource_options.facts["security"] =
      "DTLS (" + dtls_modes + ")" +
      (!s.insecure         ? std::string()
       : s.insecure_port  ? " and INSECURE plain CoAP on port " + std::to_string(s.insecure_port)
                          : std::string(" and INSECURE plain CoAP on a free port (logged at start-up)"));
  server::ServerResources resources(state, resource_options);

  transport::CoapDtlsServer::Options server_options;
  server_options.bind_address = s.listen;
  server_options.port = static_cast<std::uint16_t>(s.port);
  server_options.psk_lookup = [&keystore](std::string_view identity) -> std::optional<std::vector<std::uint8_t>> {
    auto key = keystore ? keystore->key_for(identity) : std::nullopt;
    if (!key) log_line("refused a DTLS handshake from unknown identity '" + std::string(identity) + "'");
    return key;
  };
  if (certificates) server_options.certificates = transport::CertificateFiles{s.cert_file, s.cert_key_file, s.ca_file};
  if (s.insecure) server_options.plaintext_port = static_cast<std::uint16_t>(s.insecure_port);
  server_options.timing = s.timing;
  server_options.datagrams_per_pass = s.datagrams_per_pass;
  transport::CoapDtlsServer server(server_options);
  resources.attach(server);
  if (!s.port_file.empty()) common::write_file_atomically(s.port_file, std::to_string(server.port()) + "\n");
  log_line("listening on " + s.listen + ":" + std::to_string(server.port()) + " (CoAP over DTLS, " + dtls_modes +
           "), lr " + number(s.lr) + ", max staleness " + std::to_string(s.max_staleness) + ", checkpoint every " +
           std::to_string(s.checkpoint_every) + " updates");
  log_line("CoAP timing: ACK_TIMEOUT " + number(s.timing.ack_timeout_seconds) + " s, ACK_RANDOM_FACTOR " +
           number(s.timing.ack_random_factor) + ", MAX_RETRANSMIT " + std::to_string(s.timing.max_retransmit) +
           ", NSTART " + std::to_string(s.timing.nstart));
  if (s.insecure) {
    log_line("WARNING: --insecure: plain CoAP on " + s.listen + ":" + std::to_string(server.plaintext_port()) +
             " with NO encryption and NO authentication. Anyone who can reach that port can read the model and "
             "post updates; updates there are keyed on the name the sender declares (?id=NAME), logged and shown "
             "in /status as 'unauthenticated:NAME'. Use it only on a network you trust.");
  }

  // What one dense (ASGD) update of this model costs on the wire, to show how much less
  // the updates actually received carried.
  const std::uint64_t dense_update_bytes = [&] {
    transport::SparseUpdate dense;
    dense.model_id = state.model().layout_id();
    for (std::size_t t = 0; t < state.model().tensors().size(); t++) {
      const auto n = static_cast<std::uint32_t>(state.model().tensors()[t].size);
      transport::SparseTensor tensor{static_cast<std::uint32_t>(t), n, std::vector<std::uint32_t>(n), std::vector<float>(n)};
      for (std::uint32_t i = 0; i < n; i++) tensor.indices[i] = i;
      dense.tensors.push_back(std::move(tensor));
    }
    auto encoded = transport::encode_sparse_update(dense);
    return encoded ? static_cast<std::uint64_t>(encoded.value().size()) : 0;
  }();
  // One row per evaluation in <state-dir>/metrics.csv; the rows of this run are plotted at exit.
  const std::filesystem::path metrics_path = std::filesystem::path(s.state_dir) / "metrics.csv";
  const bool new_metrics = !std::filesystem::exists(metrics_path);
  std::ofstream metrics(metrics_path, std::ios::app);
  if (new_metrics) {
    metrics << "unix_time,version,updates_applied_this_run,ingress_payload_bytes,ingress_socket_bytes,dense_equivalent_bytes,test_accuracy,test_loss\n";
  }
  std::mutex metrics_mutex;  // also guards last_evaluation
  std::optional<server::EvaluationResult> last_evaluation;
  plot::PlotSeries accuracy_by_ingress{"this run", {}, {}};
  const auto started = std::chrono::steady_clock::now();

  std::unique_ptr<server::BackgroundEvaluator> evaluator;
  if (auto test = load_test_set(s.eval_data)) {
    log_line("evaluating on " + s.eval_data + " (" + std::to_string(test->size()) + " test images) every " +
             number(s.eval_interval_seconds) + " s when the version changed");
    evaluator = std::make_unique<server::BackgroundEvaluator>(
        evaluation_model, std::move(*test), [&state] { return state.snapshot(); },
        [&](const server::EvaluationResult& r) {
          resources.report_accuracy(r.version, r.accuracy);
          const std::uint64_t applied = resources.updates_applied();
          const std::uint64_t ingress = resources.ingress_payload_bytes();
          const std::uint64_t socket = resources.ingress_socket_bytes();
          const double dense = static_cast<double>(applied) * static_cast<double>(dense_update_bytes);
          char line[320];
          std::snprintf(line, sizeof(line),
                        "test accuracy %.4f, loss %.4f at version %llu (%.1f s); %s; dense updates would be %.1f MB: "
                        "%.0fx the payload",
                        r.accuracy, r.loss, static_cast<unsigned long long>(r.version), r.seconds,
                        resources.ingress_summary().c_str(), dense / 1e6,
                        ingress ? dense / static_cast<double>(ingress) : 0.0);
          log_line(line);
          std::lock_guard lock(metrics_mutex);
          metrics << std::time(nullptr) << ',' << r.version << ',' << applied << ',' << ingress << ',' << socket << ','
                  << static_cast<std::uint64_t>(dense) << ',' << r.accuracy << ',' << r.loss << std::endl;
          accuracy_by_ingress.x.push_back(static_cast<double>(ingress));
          accuracy_by_ingress.y.push_back(r.accuracy);
          last_evaluation = r;
        },
        std::chrono::milliseconds(static_cast<long long>(s.eval_interval_seconds * 1000)));
  }

  struct sigaction action {};
  action.sa_handler = request_stop;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  // Handlers run to completion inside run_once, so a stop request is seen between requests.
  // Updates are group-committed: while some wait for their WAL sync (on the sync thread),
  // the loop looks for finished syncs every millisecond and sends their answers.
  auto write_stats = [&](bool running) {
    if (s.stats_file.empty()) return;
    std::optional<server::EvaluationResult> evaluation;
    {
      std::lock_guard lock(metrics_mutex);
      evaluation = last_evaluation;
    }
    common::write_file_atomically(s.stats_file, stats_json(running, state, recovery, version_after_recovery, resources,
                                                           server, s.insecure, evaluation));
  };
  write_stats(true);
  auto next_stats = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!g_stop_requested) {
    resources.serve_once(server, 200);  // returns within 200 ms, so the stats file is at most ~1.2 s old
    if (std::chrono::steady_clock::now() >= next_stats) {
      try {
        write_stats(true);
      } catch (const std::exception& e) {  // a full disk must not stop training; the start-up write proved the path
        log_line(std::string("stats file not updated: ") + e.what());
      }
      next_stats = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    }
  }
  resources.answer_durable_updates(true);  // staged updates are answered before the checkpoint

  log_line("stopping: " + resources.ingress_summary() + " since start; writing a checkpoint at version " +
           std::to_string(state.version()));
  evaluator.reset();
  if (!accuracy_by_ingress.x.empty()) {
    plot::PlotOptions plot;
    plot.title = "edgetrain-server: test accuracy against ingress (" + state.model().spec().name + ", " +
                 std::to_string(static_cast<int>(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count())) +
                 " s)";
    plot.x_label = "update payload bytes received";
    plot.y_label = "test accuracy";
    plot.log_x = true;
    const auto svg_path = std::filesystem::path(s.state_dir) / "accuracy-vs-ingress.svg";
    std::ofstream(svg_path) << plot::render_svg_line_chart({accuracy_by_ingress}, plot);
    log_line("plot written to " + svg_path.string());
  }
  state.checkpoint();
  write_stats(false);
  log_line("checkpoint written to " + state.checkpoint_path().string() + "; bye");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"edgetrain-server: the parameter server (CoAP over DTLS with PSK or X.509, WAL, checkpoints, evaluator)"};
  Settings s;
  std::string config_path;
  app.add_option("--config", config_path, "TOML file with any of the settings below (flags win)")->check(CLI::ExistingFile);
  app.add_option("--listen", s.listen, "address to bind")->capture_default_str();
  app.add_option("--port", s.port, "UDP port")->capture_default_str();
  app.add_option("--model", s.model, "built-in model name or model spec")->capture_default_str();
  app.add_option("--state-dir", s.state_dir, "directory for the WAL and checkpoints");
  app.add_option("--keystore", s.keystore, "TOML file of device PSKs (mode 0600)");
  app.add_option("--lr", s.lr, "learning rate")->capture_default_str();
  app.add_option("--max-staleness", s.max_staleness, "largest delay accepted (D)")->capture_default_str();
  app.add_option("--checkpoint-every", s.checkpoint_every, "updates between checkpoints (0: only at exit)")
      ->capture_default_str();
  app.add_option("--eval-data", s.eval_data, "test set for the background evaluator: mnist, fashion-mnist, none")
      ->capture_default_str();
  app.add_option("--eval-interval", s.eval_interval_seconds, "seconds between evaluations")->capture_default_str();
  app.add_option("--max-update-bytes", s.max_update_bytes, "larger POST /update bodies get 4.13")->capture_default_str();
  app.add_option("--seed", s.seed, "initial parameters of a new state directory")->capture_default_str();
  app.add_flag("--insecure", s.insecure,
               "ALSO serve plain CoAP (no DTLS: no encryption, no authentication) on --insecure-port");
  app.add_option("--insecure-port", s.insecure_port, "UDP port of the plain CoAP endpoint (0: any free port)")
      ->capture_default_str();
  app.add_option("--cert", s.cert_file, "X.509: this server's certificate (PEM); with --key and --ca");
  app.add_option("--key", s.cert_key_file, "X.509: the certificate's private key (PEM)");
  app.add_option("--ca", s.ca_file, "X.509: CA (PEM) that must have signed every client certificate");
  app.add_option("--coap-ack-timeout", s.timing.ack_timeout_seconds, "CoAP ACK_TIMEOUT in seconds (1..60)")
      ->capture_default_str();
  app.add_option("--coap-ack-random-factor", s.timing.ack_random_factor, "CoAP ACK_RANDOM_FACTOR (1..4)")
      ->capture_default_str();
  app.add_option("--coap-max-retransmit", s.timing.max_retransmit, "CoAP MAX_RETRANSMIT (1..10)")->capture_default_str();
  app.add_option("--coap-nstart", s.timing.nstart, "CoAP NSTART (1..16)")->capture_default_str();
  app.add_option("--datagrams-per-pass", s.datagrams_per_pass,
                 "most datagrams read per pass of the event loop, which walks every session once per pass "
                 "(1..1024; 1 = libcoap's own loop)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--port-file", s.port_file,
                 "once the DTLS port is bound: write it (decimal digits and a newline) to this file, atomically");
  app.add_option("--stats-file", s.stats_file,
                 "JSON object (state, version, ports, recovery, updates, ingress, last evaluation) rewritten "
                 "atomically at start, every second and at exit");

  auto* add = app.add_subcommand("add-device", "add a device with a random key to the keystore and print its worker configuration");
  std::string device, add_keystore, server_uri;
  add->add_option("name", device, "device name = PSK identity ([A-Za-z0-9._-], up to 64)")->required();
  add->add_option("--keystore", add_keystore, "keystore file (created mode 0600 if missing)")->required();
  add->add_option("--server-uri", server_uri, "URI the worker should use (default coaps://<this host>:5684)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (add->parsed()) {
      if (server_uri.empty()) {
        char host[256] = "localhost";
        gethostname(host, sizeof(host) - 1);
        server_uri = std::string("coaps://") + host + ":5684";
      }
      const auto key = server::add_device(add_keystore, device, 32);
      std::cout << server::worker_config_toml(server_uri, device, key);
      log_line("added '" + device + "' to " + add_keystore);
      return 0;
    }
    if (!config_path.empty()) apply_config_file(config_path, app, s);
    return run_server(s);
  } catch (const std::exception& e) {
    log_line(std::string("error: ") + e.what());
    return 1;
  }
}
