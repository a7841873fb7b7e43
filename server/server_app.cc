#include "server/server_app.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/atomic_file.h"
#include "common/svg_plot.h"
#include "runtime/dataset.h"
#include "server/evaluator.h"
#include "server/handshake_failure_log.h"
#include "server/keystore.h"
#include "server/resources.h"
#include "server/round_coordinator.h"
#include "server/server_state.h"
#include "transport/untrusted_text.h"

namespace edgetrain::server {

namespace {

std::atomic<bool> g_stop_requested = false;
void request_stop(int) { g_stop_requested = true; }
std::mutex g_log_mutex;

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

void check_settings(const ServerSettings& s) {
  if (s.state_dir.empty()) throw std::invalid_argument("--state-dir (or state_dir in the config) is required");
  const bool certificates = !s.cert.empty() || !s.cert_key.empty() || !s.ca.empty();
  if (certificates && (s.cert.empty() || s.cert_key.empty() || s.ca.empty()))
    throw std::invalid_argument("X.509 needs all three of --cert, --cert-key and --ca (cert, cert_key, ca in the config)");
  if (s.keystore.empty() && !certificates)
    throw std::invalid_argument("--keystore (or keystore in the config) is required unless --cert/--cert-key/--ca are given");
  transport::check_timing(s.timing);
  transport::check_handshake_limits(s.handshake);
}

// What one dense (ASGD) update of this model costs on the wire, to show how much less the
// updates actually received carried.
std::uint64_t dense_update_bytes(const runtime::Model& model) {
  transport::SparseUpdate dense;
  dense.model_id = model.layout_id();
  for (std::size_t t = 0; t < model.tensors().size(); t++) {
    const auto n = static_cast<std::uint32_t>(model.tensors()[t].size);
    transport::SparseTensor tensor{static_cast<std::uint32_t>(t), n, std::vector<std::uint32_t>(n), std::vector<float>(n)};
    for (std::uint32_t i = 0; i < n; i++) tensor.indices[i] = i;
    dense.tensors.push_back(std::move(tensor));
  }
  auto encoded = transport::encode_sparse_update(dense);
  return encoded ? static_cast<std::uint64_t>(encoded.value().size()) : 0;
}

class ServerApp {
 public:
  explicit ServerApp(const ServerSettings& s) : s_(s) {
    check_settings(s_);
    open_keystore();
    open_state();
    open_endpoint();
    start_evaluator();
  }
  void serve();
  void shutdown();

 private:
  void open_keystore();
  void open_state();
  void open_endpoint();
  void open_rounds(ResourceOptions& resource_options);
  void start_evaluator();
  void report_evaluation(const EvaluationResult& r);
  void write_stats(bool running);
  std::string dtls_modes() const {
    const bool certificates = !s_.cert.empty();
    return std::string(keystore_ ? "PSK" : "") + (keystore_ && certificates ? " and " : "") + (certificates ? "X.509" : "");
  }

  const ServerSettings& s_;
  std::optional<LiveKeystore> keystore_;  // none: every PSK handshake is refused (certificates only)
  std::optional<runtime::Model> evaluation_model_;
  std::unique_ptr<ServerState> state_;
  RecoveryReport recovery_;
  std::uint64_t version_after_recovery_ = 0;
  std::unique_ptr<ServerResources> resources_;
  std::unique_ptr<RoundCoordinator> rounds_;  // --mode rounds only
  // Before server_: the server's failure callback writes to it until the server is gone.
  HandshakeFailureLog handshake_failures_{log_line};  // used by the serving thread only
  std::unique_ptr<transport::CoapDtlsServer> server_;
  std::uint64_t dense_update_bytes_ = 0;
  // One row per evaluation in <state-dir>/metrics.csv; the rows of this run are plotted at exit.
  std::ofstream metrics_;
  std::mutex metrics_mutex_;  // metrics_, accuracy_by_ingress_, last_evaluation_ (evaluator thread)
  plot::PlotSeries accuracy_by_ingress_{"this run", {}, {}};
  std::optional<EvaluationResult> last_evaluation_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::unique_ptr<BackgroundEvaluator> evaluator_;
};

void ServerApp::open_keystore() {
  if (s_.keystore.empty()) return;
  keystore_.emplace(s_.keystore, log_line);
  log_line("keystore " + s_.keystore + ": " + std::to_string(keystore_->size()) + " devices");
}

void ServerApp::open_state() {
  runtime::Model model(runtime::model_spec_from_argument(s_.model));
  model.initialize(s_.seed);
  ServerStateOptions options;
  options.state_dir = s_.state_dir;
  options.store.learning_rate = static_cast<float>(s_.lr);
  options.store.max_staleness = s_.max_staleness;
  options.checkpoint_every = s_.checkpoint_every;
  options.max_update_bytes = s_.max_update_bytes;
  options.store.max_parameter_magnitude = static_cast<float>(s_.max_parameter_magnitude);
  options.clip_update_norm = s_.clip_update_norm;
  options.quarantine_after = s_.quarantine_after;
  options.quarantine_seconds = s_.quarantine_seconds;
  options.rollback_non_finite = s_.rollback_non_finite;
  evaluation_model_ = model;
  state_ = std::make_unique<ServerState>(std::move(model), options);
  recovery_ = state_->recovery();
  version_after_recovery_ = state_->version();
  dense_update_bytes_ = dense_update_bytes(state_->model());
  for (const std::string& note : recovery_.notes) log_line(note);
  if (recovery_.fresh) {
    log_line("new state in " + s_.state_dir + ": model " + state_->model().spec().name + ", " +
             std::to_string(state_->model().parameter_count()) + " parameters, seed " + std::to_string(s_.seed));
  } else {
    log_line("recovered from " + s_.state_dir + ": " +
             (recovery_.used_previous_checkpoint ? "previous checkpoint" : "checkpoint") + " at version " +
             std::to_string(recovery_.checkpoint_version) +
             ", " + std::to_string(recovery_.replayed_updates) + " updates replayed from the WAL" +
             (recovery_.rollback ? ", ROLLED BACK before version " + std::to_string(recovery_.rollback->first_bad_version)
                                 : std::string()) +
             (recovery_.dropped_wal_bytes ? ", a torn tail of " + std::to_string(recovery_.dropped_wal_bytes) + " bytes dropped"
                                          : std::string()) +
             "; version " + std::to_string(state_->version()));
  }
}

// --mode rounds: the round coordinator, and POST /update refused (a round's model changes
// only at its close).
void ServerApp::open_rounds(ResourceOptions& resource_options) {
  RoundOptions o;
  o.policy = parse_round_policy(s_.round_policy);
  o.aggregation = parse_aggregation(s_.aggregation);
  o.deadline_seconds = s_.round_deadline;
  o.client_fraction = s_.client_fraction;
  o.min_clients = s_.min_clients;
  o.local_steps = s_.local_steps;
  o.server_lr = static_cast<float>(s_.server_lr);
  o.store_learning_rate = static_cast<float>(s_.lr);
  o.seed = s_.seed;
  o.log = log_line;
  rounds_ = std::make_unique<RoundCoordinator>(*state_, o);
  resource_options.updates_refused_because = "--mode rounds: post model deltas to /round/update";
  resource_options.extra_status = [this] { return rounds_->status_json(); };
  log_line("federated rounds: round " + std::to_string(rounds_->round()) + ", policy " + s_.round_policy + ", " +
           s_.aggregation + " aggregation, deadline " + number(s_.round_deadline) + " s, client fraction " +
           number(s_.client_fraction) + ", " + std::to_string(s_.local_steps) + " local steps, server lr " +
           number(s_.server_lr));
}

void ServerApp::open_endpoint() {
  ResourceOptions resource_options;
  resource_options.is_authorized = [this](std::string_view identity) { return keystore_ && keystore_->contains(identity); };
  resource_options.log = log_line;
  resource_options.facts = {{"eval_data", s_.eval_data}, {"state_dir", s_.state_dir}};
  resource_options.facts["security"] =
      "DTLS (" + dtls_modes() + ")" +
      (!s_.insecure         ? std::string()
       : s_.insecure_port   ? " and INSECURE plain CoAP on port " + std::to_string(s_.insecure_port)
                            : std::string(" and INSECURE plain CoAP on a free port (logged at start-up)"));
  if (s_.mode == "rounds") open_rounds(resource_options);
  resources_ = std::make_unique<ServerResources>(*state_, resource_options);

  transport::CoapDtlsServer::Options o;
  o.bind_address = s_.listen;
  o.port = static_cast<std::uint16_t>(s_.port);
  o.psk_lookup = [this](std::string_view identity) -> std::optional<std::vector<std::uint8_t>> {
    if (keystore_) return keystore_->handshake_key(identity);
    log_line("refused a DTLS handshake from unknown identity '" + transport::escape_untrusted(identity) + "'");
    return std::nullopt;
  };
  if (!s_.cert.empty()) o.certificates = transport::CertificateFiles{s_.cert, s_.cert_key, s_.ca};
  if (s_.insecure) o.plaintext_port = static_cast<std::uint16_t>(s_.insecure_port);
  o.timing = s_.timing;
  o.datagrams_per_pass = s_.datagrams_per_pass;
  o.max_body_bytes = s_.max_update_bytes;  // a larger POST body is refused block by block, never held whole
  o.max_bodies_in_progress = s_.max_bodies_in_progress;
  o.handshake = s_.handshake;
  o.on_handshake_failure = [this](const transport::HandshakeFailure& failure) {
    handshake_failures_.record(failure, HandshakeFailureLog::Clock::now());
  };
  server_ = std::make_unique<transport::CoapDtlsServer>(o);
  resources_->attach(*server_);
  if (rounds_) rounds_->attach(*server_);
  if (!s_.port_file.empty()) common::write_file_atomically(s_.port_file, std::to_string(server_->port()) + "\n");
  log_line("listening on " + s_.listen + ":" + std::to_string(server_->port()) + " (CoAP over DTLS, " + dtls_modes() +
           "), lr " + number(s_.lr) + ", max staleness " + std::to_string(s_.max_staleness) + ", checkpoint every " +
           std::to_string(s_.checkpoint_every) + " updates, parameters within ±" + number(s_.max_parameter_magnitude) +
           (s_.clip_update_norm > 0 ? ", update norms clipped at " + number(s_.clip_update_norm) : std::string()) +
           (s_.quarantine_after > 0 ? ", quarantine after " + std::to_string(s_.quarantine_after) + " bad updates" : std::string()));
  log_line("CoAP timing: ACK_TIMEOUT " + number(s_.timing.ack_timeout_seconds) + " s, ACK_RANDOM_FACTOR " +
           number(s_.timing.ack_random_factor) + ", MAX_RETRANSMIT " + std::to_string(s_.timing.max_retransmit) +
           ", NSTART " + std::to_string(s_.timing.nstart));
  log_line("DTLS handshakes: stateless cookie first; at most " + std::to_string(s_.handshake.max_pending) +
           " pending (" + std::to_string(s_.handshake.max_pending_per_address) + " per source address), " +
           number(s_.handshake.rate_per_address) + " new per second per source address, " +
           number(s_.handshake.timeout_seconds) + " s to finish");
  if (s_.insecure) {
    log_line("WARNING: --insecure: plain CoAP on " + s_.listen + ":" + std::to_string(server_->plaintext_port()) +
             " with NO encryption and NO authentication. Anyone who can reach that port can read the model and "
             "post updates; updates there are keyed on the name the sender declares (?id=NAME), logged and shown "
             "in /status as 'unauthenticated:NAME'. Use it only on a network you trust.");
  }
}

void ServerApp::start_evaluator() {
  const std::filesystem::path metrics_path = std::filesystem::path(s_.state_dir) / "metrics.csv";
  const bool new_metrics = !std::filesystem::exists(metrics_path);
  metrics_.open(metrics_path, std::ios::app);
  if (new_metrics) {
    metrics_ << "unix_time,version,updates_applied_this_run,ingress_payload_bytes,ingress_socket_bytes,"
                "dense_equivalent_bytes,test_accuracy,test_loss\n";
  }
  if (s_.eval_data == "none") return;
  const runtime::DatasetFiles files = runtime::dataset_files(s_.eval_data, runtime::DataSplit::kTest);
  runtime::Dataset test = runtime::load_dataset(files.images, files.labels);
  log_line("evaluating on " + s_.eval_data + " (" + std::to_string(test.size()) + " test images) every " +
           number(s_.eval_interval) + " s when the version changed");
  evaluator_ = std::make_unique<BackgroundEvaluator>(
      *evaluation_model_, std::move(test), [this] { return state_->snapshot(); },
      [this](const EvaluationResult& r) { report_evaluation(r); },
      std::chrono::milliseconds(static_cast<long long>(s_.eval_interval * 1000)));
}

// On the evaluator thread.
void ServerApp::report_evaluation(const EvaluationResult& r) {
  resources_->report_accuracy(r.version, r.accuracy);
  const std::uint64_t applied = resources_->updates_applied();
  const std::uint64_t ingress = resources_->ingress_payload_bytes();
  const std::uint64_t socket = resources_->ingress_socket_bytes();
  const double dense = static_cast<double>(applied) * static_cast<double>(dense_update_bytes_);
  char line[320];
  std::snprintf(line, sizeof(line),
                "test accuracy %.4f, loss %.4f at version %llu (%.1f s); %s; dense updates would be %.1f MB: "
                "%.0fx the payload",
                r.accuracy, r.loss, static_cast<unsigned long long>(r.version), r.seconds,
                resources_->ingress_summary().c_str(), dense / 1e6, ingress ? dense / static_cast<double>(ingress) : 0.0);
  log_line(line);
  std::lock_guard lock(metrics_mutex_);
  metrics_ << std::time(nullptr) << ',' << r.version << ',' << applied << ',' << ingress << ',' << socket << ','
           << static_cast<std::uint64_t>(dense) << ',' << r.accuracy << ',' << r.loss << std::endl;
  accuracy_by_ingress_.x.push_back(static_cast<double>(ingress));
  accuracy_by_ingress_.y.push_back(r.accuracy);
  last_evaluation_ = r;
}

// The --stats-file object (server/README.md documents its keys).
void ServerApp::write_stats(bool running) {
  if (s_.stats_file.empty()) return;
  nlohmann::json j;
  j["state"] = running ? "running" : "stopped";
  j["version"] = state_->version();
  j["port"] = server_->port();
  j["insecure_port"] = s_.insecure ? nlohmann::json(server_->plaintext_port()) : nlohmann::json(nullptr);
  j["recovery"] = {{"fresh", recovery_.fresh},
                   {"checkpoint_version", recovery_.checkpoint_version},
                   {"replayed_updates", recovery_.replayed_updates},
                   {"dropped_wal_bytes", recovery_.dropped_wal_bytes},
                   {"used_previous_checkpoint", recovery_.used_previous_checkpoint},
                   {"rollback", recovery_.rollback ? nlohmann::json{{"first_bad_version", recovery_.rollback->first_bad_version},
                                                                    {"dropped_updates", recovery_.rollback->dropped_updates},
                                                                    {"kept_files", recovery_.rollback->kept_files}}
                                                   : nlohmann::json(nullptr)},
                   {"version", version_after_recovery_}};
  j["updates_applied"] = resources_->updates_applied();
  j["updates_clipped"] = state_->updates_clipped();
  j["devices_refused"] = nlohmann::json::parse(device_refusals_json(*state_));
  j["ingress_payload_bytes"] = resources_->ingress_payload_bytes();
  j["ingress_socket_bytes"] = resources_->ingress_socket_bytes();
  j["ingress_socket_datagrams"] = resources_->ingress_socket_datagrams();
  const transport::HandshakeStats handshakes = server_->handshake_stats();
  j["handshakes"] = {{"hello_verify_requests", handshakes.hello_verify_requests},
                     {"client_hellos_admitted", handshakes.client_hellos_admitted},
                     {"refused_rate_limited", handshakes.refused_rate_limited},
                     {"refused_too_many_pending", handshakes.refused_too_many_pending},
                     {"malformed_client_hellos", handshakes.malformed_client_hellos},
                     {"timed_out", handshakes.handshakes_timed_out},
                     {"pending", handshakes.pending}};
  {
    std::lock_guard lock(metrics_mutex_);
    j["last_evaluation"] = last_evaluation_ ? nlohmann::json{{"version", last_evaluation_->version},
                                                             {"accuracy", last_evaluation_->accuracy},
                                                             {"loss", last_evaluation_->loss}}
                                            : nlohmann::json(nullptr);
  }
  j["mode"] = s_.mode;
  if (rounds_) j["rounds"] = nlohmann::json::parse(rounds_->status_json());
  common::write_file_atomically(s_.stats_file, j.dump(2) + "\n");
}

void ServerApp::serve() {
  struct sigaction action {};
  action.sa_handler = request_stop;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  write_stats(true);  // a path that cannot be written fails here, before serving
  // Handlers run to completion inside serve_once, so a stop request is seen between
  // requests. Updates are group-committed: while some wait for their WAL sync (on the sync
  // thread), the loop looks for finished syncs every millisecond and sends their answers.
  auto next_stats = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!g_stop_requested) {
    resources_->serve_once(*server_, 200);  // returns within 200 ms, so the stats file is at most ~1.2 s old
    if (rounds_) rounds_->poll();  // a round's deadline passes without a request
    if (std::chrono::steady_clock::now() < next_stats) continue;
    handshake_failures_.flush(HandshakeFailureLog::Clock::now());
    try {
      write_stats(true);
    } catch (const std::exception& e) {  // a full disk must not stop training
      log_line(std::string("stats file not updated: ") + e.what());
    }
    next_stats = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  }
  resources_->answer_durable_updates(true);  // staged updates are answered before the checkpoint
}

void ServerApp::shutdown() {
  log_line("stopping: " + resources_->ingress_summary() + " since start; writing a checkpoint at version " +
           std::to_string(state_->version()));
  evaluator_.reset();
  if (!accuracy_by_ingress_.x.empty()) {
    plot::PlotOptions plot;
    const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    plot.title = "edgetrain-server: test accuracy against ingress (" + state_->model().spec().name + ", " +
                 std::to_string(static_cast<int>(seconds)) + " s)";
    plot.x_label = "update payload bytes received";
    plot.y_label = "test accuracy";
    plot.log_x = true;
    const auto svg_path = std::filesystem::path(s_.state_dir) / "accuracy-vs-ingress.svg";
    std::ofstream(svg_path) << plot::render_svg_line_chart({accuracy_by_ingress_}, plot);
    log_line("plot written to " + svg_path.string());
  }
  state_->checkpoint();
  write_stats(false);
  log_line("checkpoint written to " + state_->checkpoint_path().string() + "; bye");
}

}  // namespace

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

int run_server(const ServerSettings& settings) {
  ServerApp app(settings);
  app.serve();
  app.shutdown();
  return 0;
}

}  // namespace edgetrain::server
