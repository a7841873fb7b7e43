#include "server/server_app.h"

#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/number_text.h"
#include "common/png_image.h"
#include "common/svg_plot.h"
#include "model/classifier_readout.h"
#include "model/dataset.h"
#include "model/model_shards.h"
#include "server/evaluator.h"
#include "server/handshake_failure_log.h"
#include "server/keystore.h"
#include "server/metrics_endpoint.h"
#include "server/resources.h"
#include "server/run_end.h"
#include "server/startup_checks.h"
#include "server/server_mode.h"
#include "server/server_state.h"
#include "transport/untrusted_text.h"

namespace edgetrain::server {

namespace {

std::atomic<bool> g_stop_requested = false;
void request_stop(int) { g_stop_requested = true; }

void check_settings(const ServerSettings& s) {
  if (s.state_dir.empty())
    throw std::invalid_argument("--state-dir (or state_dir in the config) is required");
  const bool certificates = !s.cert.empty() || !s.cert_key.empty() || !s.ca.empty();
  if (certificates && (s.cert.empty() || s.cert_key.empty() || s.ca.empty()))
    throw std::invalid_argument(
        "X.509 needs all three of --cert, --cert-key and --ca (cert, cert_key, ca in the config)");
  if (s.keystore.empty() && !certificates)
    throw std::invalid_argument(
        "--keystore (or keystore in the config) is required unless --cert/--cert-key/--ca are "
        "given");
  if (!logging::parse_level(s.log_level))
    throw std::invalid_argument("--log-level must be error, warn, info or debug");
  if (!s.metrics_listen.empty())
    split_listen_address(s.metrics_listen);  // a malformed address fails before serving
  transport::check_timing(s.timing);
  transport::check_handshake_limits(s.handshake);
  if (s.mode == "gan" && s.gan_workers == 0)
    throw std::invalid_argument("--mode gan needs --gan-workers N");
  if (!s.shard.empty()) {
    if (!runtime::parse_shard_id(s.shard))
      throw std::invalid_argument("--shard " + s.shard + ": give I/N with 0 <= I < N, e.g. 0/3");
    // A shard holds a range of the parameters: it cannot evaluate the model, and rounds,
    // MD-GAN and the published model are not split (server/README.md, "Sharded server").
    if (s.mode != "async")
      throw std::invalid_argument("--shard works with --mode async only, not " + s.mode);
    if (s.eval_data != "none")
      throw std::invalid_argument(
          "--shard: a shard holds part of the model and cannot evaluate it; give --eval-data "
          "none (evaluate a checkpoint assembled from the shards instead)");
    if (!s.init_from.empty())
      throw std::invalid_argument(
          "--shard: --init-from is not supported (it holds the whole model)");
    if (s.publish_every > 0)
      throw std::invalid_argument("--shard: --publish-every is not supported");
  }
  // The cheap pull (server/replica_records.h) keeps a record of each device's copy of the
  // asynchronous model (a shard: of its slice); rounds and MD-GAN serve other models, the
  // published model is another way to cut the same pulls.
  if (s.pull_fraction > 0) {
    if (s.mode != "async")
      throw std::invalid_argument("--pull-fraction (the cheap pull) works with --mode async only, not " +
                                  s.mode);
    if (s.publish_every > 0)
      throw std::invalid_argument(
          "--pull-fraction and --publish-every are two ways to cut pulls: choose one");
  }
  // The schedule is the staleness-aware store's (server/parameter_store.h): rounds close
  // with --server-lr, MD-GAN steps with --gan-lr.
  if (s.lr_decay_at.empty() && s.lr_decay_factor != ServerSettings{}.lr_decay_factor)
    throw std::invalid_argument("--lr-decay-factor needs --lr-decay-at (the versions to decay at)");
  if (!s.lr_decay_at.empty()) {
    if (s.mode != "async")
      throw std::invalid_argument("--lr-decay-at works with --mode async only, not " + s.mode +
                                  (s.mode == "rounds" ? " (rounds use --server-lr)" : ""));
    check_learning_rate_schedule(
        {parse_lr_decay_at(s.lr_decay_at), static_cast<float>(s.lr_decay_factor)});
  }
  if (s.pull_values != "fp32" && !(s.pull_fraction > 0))
    throw std::invalid_argument("--pull-values " + s.pull_values +
                                " is for the cheap pull: it needs --pull-fraction above 0");
  check_replica_record_options(
      {{s.pull_fraction, s.pull_min_entries, s.entry_staleness}, s.pull_max_devices});
  // --clip-update-norm would clip the round's close (one update through the store) per
  // tensor, which is not what a user of rounds means by clipping.
  if (s.mode == "rounds" && s.clip_update_norm > 0)
    throw std::invalid_argument(
        "--clip-update-norm clips asynchronous updates; with --mode rounds use "
        "--round-clip-norm (each device's delta)");
  if (s.mode != "rounds" && (s.round_clip_norm > 0 || s.aggregation != "masked"))
    throw std::invalid_argument("--aggregation and --round-clip-norm are settings of --mode rounds");
  if (s.aggregation == "dp-fedavg" &&
      !(s.round_clip_norm > 0 && s.dp_noise_multiplier > 0 && s.dp_expected_devices > 0))
    throw std::invalid_argument(
        "--aggregation dp-fedavg needs --round-clip-norm S, --dp-noise-multiplier z and "
        "--dp-expected-devices m, each above 0");
  if (s.aggregation != "dp-fedavg" &&
      (s.dp_noise_multiplier > 0 || s.dp_expected_devices > 0 || s.dp_target_epsilon > 0 ||
       s.dp_adaptive_clip_quantile > 0 || s.dp_clip_count_stddev > 0 || s.dp_noise != "gaussian"))
    throw std::invalid_argument("the --dp-* settings go with --aggregation dp-fedavg");
  if (s.secagg_subset > 0 && !(s.mode == "rounds" && s.secure_aggregation))
    throw std::invalid_argument(
        "--secagg-subset needs --mode rounds --secure-aggregation: plain rounds compress each "
        "device's delta with its own compressor (the worker's --compressor and --rate)");
  if (s.secagg_signed_keys && !(s.mode == "rounds" && s.secure_aggregation && !s.ca.empty()))
    throw std::invalid_argument(
        "--secagg-signed-keys needs --mode rounds --secure-aggregation and --ca (with --cert and "
        "--cert-key): the devices sign their keys with certificates from that CA");
  if (s.secagg_neighbours > 0 && !(s.mode == "rounds" && s.secure_aggregation))
    throw std::invalid_argument("--secagg-neighbours needs --mode rounds --secure-aggregation");
  if (s.secagg_neighbours % 2 != 0)
    throw std::invalid_argument("--secagg-neighbours " + std::to_string(s.secagg_neighbours) +
                                ": an even number (the neighbour graph is a Harary graph H(n, k)), or 0 for every device");
  if (s.secagg_signed_keys && s.secagg_neighbours > 0)
    throw std::invalid_argument(
        "--secagg-signed-keys with --secagg-neighbours is not built yet: signed key directories "
        "carry every device's keys, SecAgg+'s carry each device's neighbours only");
  if (s.mode != "gan" && s.gan_clip_feedback > 0)
    throw std::invalid_argument("--gan-clip-feedback is a setting of --mode gan");
  // The round and GAN coordinators are driven by the serving loop and share its thread.
  if (s.mode != "async" && s.loop_threads > 1)
    throw std::invalid_argument("--loop-threads above 1 needs --mode async");
}

// --loop-threads: 0 means the cores this process may run on (its CPU affinity, which
// taskset and cpusets narrow), at least one.
std::size_t loop_thread_count(const ServerSettings& s) {
  if (s.mode != "async") return 1;
  if (s.loop_threads > 0) return s.loop_threads;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0)
    return static_cast<std::size_t>(std::max(1, CPU_COUNT(&cpus)));
  return std::max(1u, std::thread::hardware_concurrency());
}

transport::HandshakeStats& operator+=(transport::HandshakeStats& sum,
                                      const transport::HandshakeStats& more) {
  sum.hello_verify_requests += more.hello_verify_requests;
  sum.client_hellos_admitted += more.client_hellos_admitted;
  sum.refused_rate_limited += more.refused_rate_limited;
  sum.refused_too_many_pending += more.refused_too_many_pending;
  sum.malformed_client_hellos += more.malformed_client_hellos;
  sum.handshakes_timed_out += more.handshakes_timed_out;
  sum.pending += more.pending;
  return sum;
}

// What one dense (ASGD) update of this model costs on the wire, to show how much less the
// updates actually received carried.
std::uint64_t dense_update_bytes(const runtime::Model& model) {
  transport::SparseUpdate dense;
  dense.model_id = model.layout_id();
  for (std::size_t t = 0; t < model.tensors().size(); t++) {
    const auto n = static_cast<std::uint32_t>(model.tensors()[t].size);
    transport::SparseTensor tensor{static_cast<std::uint32_t>(t), n, std::vector<std::uint32_t>(n),
                                   std::vector<float>(n)};
    for (std::uint32_t i = 0; i < n; i++) tensor.indices[i] = i;
    dense.tensors.push_back(std::move(tensor));
  }
  auto encoded = transport::encode_sparse_update(dense);
  return encoded ? static_cast<std::uint64_t>(encoded.value().size()) : 0;
}

class ServerApp {
 public:
  explicit ServerApp(const ServerSettings& s) : s_(s) {
    try {
      check_settings(s_);
    } catch (const std::invalid_argument& e) {
      throw StartupError(e.what());
    }
    start_ = check_startup(s_);  // everything checked before the state directory and the socket
    open_keystore();
    open_state();
    open_endpoint();
    start_evaluator();
    start_metrics();
  }
  ~ServerApp() = default;
  void serve();
  void shutdown();

 private:
  void open_keystore();
  void open_state();
  void note_warm_start();
  void open_endpoint();
  void start_evaluator();
  void report_evaluation(const EvaluationResult& r);
  void write_stats(bool running);
  void add_run_end_stats(nlohmann::json& j) const;
  bool stop_condition_met();
  void start_metrics();
  void refresh_metrics();
  std::string dtls_modes() const {
    const bool certificates = !s_.cert.empty();
    return std::string(keystore_ ? "PSK" : "") + (keystore_ && certificates ? " and " : "") +
           (certificates ? "X.509" : "");
  }

  const ServerSettings& s_;
  StartPlan start_;
  // Ending a run and keeping the model (server/run_end.h).
  StopConditions stop_{{s_.stop_at_accuracy, s_.stop_after_updates, s_.stop_after_seconds}};
  std::optional<StopReason> stopped_because_;
  std::unique_ptr<BestCheckpoint> best_;
  std::optional<LiveKeystore>
      keystore_;  // none: every PSK handshake is refused (certificates only)
  std::optional<runtime::Model> evaluation_model_;
  std::unique_ptr<ServerState> state_;
  RecoveryReport recovery_;
  std::uint64_t version_after_recovery_ = 0;
  std::unique_ptr<ServerResources> resources_;
  // The mode's server side (server/server_mode.h); none for async.
  std::unique_ptr<ServerMode> mode_;
  // Before servers_: the servers' failure callback writes to it until they are gone.
  HandshakeFailureLog handshake_failures_{log_line};
  std::mutex handshake_failures_mutex_;  // the loops record, the main thread flushes
  std::mutex keystore_mutex_;            // keystore_: LiveKeystore is for one thread at a time
  // One per event loop (--loop-threads), all on one port; servers_[0] is driven by the main
  // thread (serve()), which also does the process-wide work: stop conditions, the stats
  // file, the metrics text, collapsed log lines. The others each by a thread of their own.
  std::vector<std::unique_ptr<transport::CoapDtlsServer>> servers_;
  // The handshake guard's counters of each loop, as its thread last copied them (the guard
  // is read on its own thread only).
  std::mutex loop_handshakes_mutex_;
  std::vector<transport::HandshakeStats> loop_handshakes_;
  void serve_loop(std::size_t n, const std::atomic<bool>& stop);
  std::uint64_t dense_update_bytes_ = 0;
  // One row per evaluation in <state-dir>/metrics.csv; the rows of this run are plotted at exit.
  std::ofstream metrics_;
  std::mutex metrics_mutex_;  // metrics_, accuracy_by_ingress_, last_evaluation_ (evaluator thread)
  plot::PlotSeries accuracy_by_ingress_{"this run", {}, {}};
  std::optional<EvaluationResult> last_evaluation_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::unique_ptr<BackgroundEvaluator> evaluator_;
  // The metrics endpoint serves a copy of the exposition the serving loop renders every second.
  std::mutex metrics_text_mutex_;
  std::string metrics_text_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
};

void ServerApp::open_keystore() {
  if (s_.keystore.empty()) return;
  keystore_.emplace(s_.keystore, log_line);
  log_line("keystore " + s_.keystore + ": " + std::to_string(keystore_->size()) + " devices");
}

void ServerApp::open_state() {
  runtime::Model model(runtime::model_spec_from_argument(s_.model));
  model.initialize(s_.seed);
  if (start_.initial_parameters)
    std::copy(start_.initial_parameters->begin(), start_.initial_parameters->end(),
              model.parameters().begin());
  // A shard starts from its range of the whole model's initial parameters, so an N-shard run
  // starts where a 1-server run does.
  if (const auto shard = runtime::parse_shard_id(s_.shard))
    model = runtime::shard_model(model, *shard);
  ServerStateOptions options;
  options.state_dir = s_.state_dir;
  options.store.learning_rate = static_cast<float>(s_.lr);
  options.store.max_staleness = s_.max_staleness;
  options.store.offline_step_credit = s_.offline_step_credit;
  options.store.offline_average = s_.offline_average;
  options.store.lr_schedule = {parse_lr_decay_at(s_.lr_decay_at),
                               static_cast<float>(s_.lr_decay_factor)};
  options.checkpoint_every = s_.checkpoint_every;
  options.max_update_bytes = s_.max_update_bytes;
  options.store.max_parameter_magnitude = static_cast<float>(s_.max_parameter_magnitude);
  options.clip_update_norm = s_.clip_update_norm;
  options.quarantine_after = s_.quarantine_after;
  options.quarantine_seconds = s_.quarantine_seconds;
  options.rollback_non_finite = s_.rollback_non_finite;
  if (s_.mode == "async")
    options.publish = {s_.publish_every, s_.publish_fraction, s_.publish_min_entries};
  options.replica_pull.pull.fraction = s_.pull_fraction;
  options.replica_pull.pull.min_entries = s_.pull_min_entries;
  options.replica_pull.max_devices = s_.pull_max_devices;
  options.replica_pull.pull.entry_staleness = s_.entry_staleness;
  if (s_.pull_values == "fp16-increment")
    options.replica_pull.pull.values = transport::ValueEncoding::kFp16Increment;
  evaluation_model_ = model;
  state_ = std::make_unique<ServerState>(std::move(model), options);
  recovery_ = state_->recovery();
  version_after_recovery_ = state_->version();
  dense_update_bytes_ = dense_update_bytes(state_->model());
  for (const std::string& note : recovery_.notes) log_line(note);
  note_warm_start();
  if (recovery_.fresh) {
    log_line("new state in " + s_.state_dir + ": model " + state_->model().spec().name + ", " +
             std::to_string(state_->model().parameter_count()) + " parameters, seed " +
             std::to_string(s_.seed));
  } else {
    log_line(
        "recovered from " + s_.state_dir + ": " +
        (recovery_.used_previous_checkpoint ? "previous checkpoint" : "checkpoint") +
        " at version " + std::to_string(recovery_.checkpoint_version) + ", " +
        std::to_string(recovery_.replayed_updates) + " updates replayed from the WAL" +
        (recovery_.rollback ? ", ROLLED BACK before version " +
                                  std::to_string(recovery_.rollback->first_bad_version)
                            : std::string()) +
        (recovery_.dropped_wal_bytes
             ? ", a torn tail of " + std::to_string(recovery_.dropped_wal_bytes) + " bytes dropped"
             : std::string()) +
        "; version " + std::to_string(state_->version()));
  }
}

// The warm start of a new state directory, recorded in it so that a restart with the same
// --init-from resumes the run instead of refusing.
void ServerApp::note_warm_start() {
  if (s_.init_from.empty()) return;
  if (start_.init_from_already_applied) {
    log_line("this state directory began from " + s_.init_from + " (--init-from): resuming it");
    return;
  }
  if (!recovery_.fresh) throw StartupError("--init-from: the state directory already holds a run");
  common::write_file_atomically(
      std::filesystem::path(s_.state_dir) / kInitFromRecordName,
      nlohmann::json{{"source", start_.init_from_identity}}.dump() + "\n");
  if (start_.init_from_unsealed)
    log_line("warning: --init-from " + s_.init_from + " has no edgetrain.crc32 in its metadata (a plain "
             "safetensors file, not written by edgetrain-server nor tools/onnx_to_edgetrain.py): its "
             "tensors' names and shapes were checked, its bytes were not checked against damage");
  log_line("warm start: the new state begins with the parameters of " + s_.init_from);
}

void ServerApp::open_endpoint() {
  ResourceOptions resource_options;
  resource_options.is_authorized = [this](std::string_view identity) {
    std::lock_guard lock(keystore_mutex_);
    return keystore_ && keystore_->contains(identity);
  };
  resource_options.log = log_line;
  resource_options.log_at = logging::write;
  resource_options.health.silent_after_seconds = s_.silent_after;
  resource_options.health.max_devices = static_cast<std::size_t>(s_.max_devices);
  resource_options.observe_interval_seconds = s_.observe_interval;
  resource_options.repeats.burst = s_.log_repeat_burst;
  resource_options.repeats.interval =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(s_.log_repeat_interval));
  resource_options.facts = {{"eval_data", s_.eval_data}, {"state_dir", s_.state_dir}};
  resource_options.facts["security"] =
      "DTLS (" + dtls_modes() + ")" +
      (!s_.insecure ? std::string()
       : s_.insecure_port
           ? " and INSECURE plain CoAP on port " + std::to_string(s_.insecure_port)
           : std::string(" and INSECURE plain CoAP on a free port (logged at start-up)"));
  mode_ = make_server_mode(s_, *state_, resource_options);
  resources_ = std::make_unique<ServerResources>(*state_, resource_options);

  transport::CoapDtlsServer::Options o;
  o.bind_address = s_.listen;
  o.port = static_cast<std::uint16_t>(s_.port);
  o.psk_lookup = [this](std::string_view identity) -> std::optional<std::vector<std::uint8_t>> {
    std::lock_guard lock(keystore_mutex_);
    if (keystore_) return keystore_->handshake_key(identity);
    log_line("refused a DTLS handshake from unknown identity '" +
             transport::escape_untrusted(identity) + "'");
    return std::nullopt;
  };
  // rotate-key and remove-device end a device's open sessions at its next request.
  o.current_psk = [this](std::string_view identity) -> std::optional<std::vector<std::uint8_t>> {
    std::lock_guard lock(keystore_mutex_);
    return keystore_ ? keystore_->key_for(identity) : std::nullopt;
  };
  if (!s_.cert.empty()) o.certificates = transport::CertificateFiles{s_.cert, s_.cert_key, s_.ca};
  if (s_.insecure) o.plaintext_port = static_cast<std::uint16_t>(s_.insecure_port);
  o.timing = s_.timing;
  o.datagrams_per_pass = s_.datagrams_per_pass;
  o.max_body_bytes =
      s_.max_update_bytes;  // a larger POST body is refused block by block, never held whole
  o.max_bodies_in_progress = s_.max_bodies_in_progress;
  o.handshake = s_.handshake;
  o.on_handshake_failure = [this](const transport::HandshakeFailure& failure) {
    std::lock_guard lock(handshake_failures_mutex_);
    handshake_failures_.record(failure, HandshakeFailureLog::Clock::now());
  };
  // Several loops: every endpoint joins one SO_REUSEPORT group. The first binds the port
  // asked for (0: the kernel picks one) and the others bind the port it got, so the port
  // file and the log name the one port all loops serve.
  const std::size_t loops = loop_thread_count(s_);
  o.reuse_port = loops > 1;
  // The limits that bound memory hold for the process: each loop gets its share (a session
  // counts against its own loop's). The per-address handshake limits and rate hold per
  // loop: one address's sessions from several ports may land on several loops.
  o.max_bodies_in_progress = std::max<std::size_t>(1, o.max_bodies_in_progress / loops);
  o.handshake.max_pending =
      std::max<std::uint32_t>(1, o.handshake.max_pending / static_cast<std::uint32_t>(loops));
  for (std::size_t n = 0; n < loops; ++n) {
    servers_.push_back(std::make_unique<transport::CoapDtlsServer>(o));
    o.port = servers_[0]->port();
    if (s_.insecure) o.plaintext_port = servers_[0]->plaintext_port();
    resources_->attach(*servers_.back());
  }
  loop_handshakes_.resize(loops);
  transport::CoapDtlsServer& server = *servers_[0];
  if (mode_)
    mode_->attach(server,
                  [this](const transport::CoapRequest& r) { resources_->note_request(r, true); });
  if (!s_.port_file.empty())
    common::write_file_atomically(s_.port_file, std::to_string(server.port()) + "\n");
  log_line("listening on " + s_.listen + ":" + std::to_string(server.port()) +
           " (CoAP over DTLS, " + dtls_modes() + "), " + std::to_string(loops) +
           " event-loop thread" + (loops == 1 ? "" : "s") + ", lr " + short_number(s_.lr) +
           (s_.lr_decay_at.empty() ? std::string()
                                   : " (x" + short_number(s_.lr_decay_factor) + " at versions " +
                                         s_.lr_decay_at + ", now " +
                                         short_number(state_->current_learning_rate()) + ")") +
           ", max staleness " + std::to_string(s_.max_staleness) + ", checkpoint every " +
           std::to_string(s_.checkpoint_every) + " updates, parameters within ±" +
           short_number(s_.max_parameter_magnitude) +
           (s_.clip_update_norm > 0
                ? ", update norms clipped at " + short_number(s_.clip_update_norm)
                : std::string()) +
           (s_.quarantine_after > 0
                ? ", quarantine after " + std::to_string(s_.quarantine_after) + " bad updates"
                : std::string()) +
           (state_->published()
                ? ", workers pull the published model (every " + std::to_string(s_.publish_every) +
                      " updates, " + short_number(s_.publish_fraction) + " of each tensor)"
                : std::string()));
  if (state_->replica_records()) {
    const double record_mb = static_cast<double>(state_->model().parameter_count()) *
                             (s_.entry_staleness ? 12 : 4) / 1e6;
    log_line("cheap pull: each pull sends " + short_number(s_.pull_fraction) +
             " of each tensor (at least " + std::to_string(s_.pull_min_entries) +
             " entries); records of at most " + std::to_string(s_.pull_max_devices) +
             " devices' copies, " + short_number(record_mb) + " MB each (at most " +
             short_number(record_mb * s_.pull_max_devices) +
             " MB), not durable: after a restart a device's next pull is dense, unless it "
             "holds the model built from --seed (version 0: a worker's seeded first pull)" +
             (s_.pull_values == "fp16-increment"
                  ? "; values as fp16 increments to devices that ask (values=fp16-increment)"
                  : "") +
             (s_.entry_staleness
                  ? "; σ per entry (--entry-staleness): each record keeps its entries' versions, "
                    "the WAL each update's older entries"
                  : ""));
  }
  log_line("CoAP timing: ACK_TIMEOUT " + short_number(s_.timing.ack_timeout_seconds) +
           " s, ACK_RANDOM_FACTOR " + short_number(s_.timing.ack_random_factor) +
           ", MAX_RETRANSMIT " + std::to_string(s_.timing.max_retransmit) + ", NSTART " +
           std::to_string(s_.timing.nstart) + "; Q-Block " +
           (s_.timing.q_block ? "on, MAX_PAYLOADS " + std::to_string(s_.timing.max_payloads)
                              : std::string("off")));
  log_line("DTLS handshakes: stateless cookie first; at most " +
           std::to_string(s_.handshake.max_pending) + " pending (" +
           std::to_string(s_.handshake.max_pending_per_address) + " per source address), " +
           short_number(s_.handshake.rate_per_address) + " new per second per source address, " +
           short_number(s_.handshake.timeout_seconds) + " s to finish");
  if (s_.insecure) {
    log_line("WARNING: --insecure: plain CoAP on " + s_.listen + ":" +
             std::to_string(server.plaintext_port()) +
             " with NO encryption and NO authentication. Anyone who can reach that port can read "
             "the model and "
             "post updates; updates there are keyed on the name the sender declares (?id=NAME), "
             "logged and shown "
             "in /status as 'unauthenticated:NAME'. Use it only on a network you trust.");
  }
}

void ServerApp::start_evaluator() {
  const std::filesystem::path metrics_path = std::filesystem::path(s_.state_dir) / "metrics.csv";
  const bool new_metrics = !std::filesystem::exists(metrics_path);
  metrics_.open(metrics_path, std::ios::app);
  if (new_metrics) {
    metrics_
        << "unix_time,version,updates_applied_this_run,ingress_payload_bytes,ingress_socket_bytes,"
           "dense_equivalent_bytes,test_accuracy,test_loss\n";
  }
  if (!start_.eval_note.empty()) log_line(start_.eval_note);
  if (!start_.eval_data) return;
  if (mode_ && !mode_->evaluates_classifier())
    return;  // e.g. --mode gan trains no classifier: --eval-data is the generator's judge's
  runtime::Dataset test = std::move(*start_.eval_data);  // loaded by check_startup
  best_ =
      std::make_unique<BestCheckpoint>(s_.state_dir, *evaluation_model_, s_.eval_data, log_line);
  log_line("evaluating on " + s_.eval_data + " (" + std::to_string(test.size()) +
           " test images) every " + short_number(s_.eval_interval) + " s when the version changed");
  evaluator_ = std::make_unique<BackgroundEvaluator>(
      *evaluation_model_, std::move(test), [this] { return state_->snapshot(); },
      [this](const EvaluationResult& r) { report_evaluation(r); },
      std::chrono::milliseconds(static_cast<long long>(s_.eval_interval * 1000)));
}

void ServerApp::start_metrics() {
  refresh_metrics();
  if (s_.metrics_listen.empty()) return;
  metrics_endpoint_ = std::make_unique<MetricsEndpoint>(s_.metrics_listen, [this] {
    std::lock_guard lock(metrics_text_mutex_);
    return metrics_text_;
  });
  log_line("metrics: GET http://" + s_.metrics_listen.substr(0, s_.metrics_listen.rfind(':')) +
           ":" + std::to_string(metrics_endpoint_->port()) + "/metrics (Prometheus text format)");
}

// On the serving thread, which owns what the exposition reads.
void ServerApp::refresh_metrics() {
  std::string text;
  {
    const auto hold = resources_->hold();  // the other loops' handlers write what it reads
    text = resources_->metrics_text();
  }
  std::lock_guard lock(metrics_text_mutex_);
  metrics_text_ = std::move(text);
}

// On the evaluator thread.
void ServerApp::report_evaluation(const EvaluationResult& r) {
  if (best_) best_->offer(r);
  stop_.note_evaluation(r);
  resources_->report_accuracy(r.version, r.accuracy);
  const std::uint64_t applied = resources_->updates_applied();
  const std::uint64_t ingress = resources_->ingress_payload_bytes();
  const std::uint64_t socket = resources_->ingress_socket_bytes();
  const double dense = static_cast<double>(applied) * static_cast<double>(dense_update_bytes_);
  char line[320];
  std::snprintf(
      line, sizeof(line),
      "test accuracy %.4f, loss %.4f at version %llu (%.1f s); %s; dense updates would be %.1f MB: "
      "%.0fx the payload",
      r.accuracy, r.loss, static_cast<unsigned long long>(r.version), r.seconds,
      resources_->ingress_summary().c_str(), dense / 1e6,
      ingress ? dense / static_cast<double>(ingress) : 0.0);
  log_line(line);
  std::lock_guard lock(metrics_mutex_);
  metrics_ << std::time(nullptr) << ',' << r.version << ',' << applied << ',' << ingress << ','
           << socket << ',' << static_cast<std::uint64_t>(dense) << ',' << r.accuracy << ','
           << r.loss << std::endl;
  accuracy_by_ingress_.x.push_back(static_cast<double>(ingress));
  accuracy_by_ingress_.y.push_back(r.accuracy);
  last_evaluation_ = r;
  last_evaluation_->parameters.clear();
}

// The --stats-file object (server/README.md documents its keys).
void ServerApp::write_stats(bool running) {
  if (s_.stats_file.empty()) return;
  std::unique_lock hold = resources_->hold();  // the other loops' handlers write what it reads
  nlohmann::json j;
  j["state"] = running ? "running" : "stopped";
  j["version"] = state_->version();
  j["learning_rate"] = common::float_as_written(state_->current_learning_rate());  // --lr-decay-at's lr(t) for the next update
  j["port"] = servers_[0]->port();
  j["insecure_port"] =
      s_.insecure ? nlohmann::json(servers_[0]->plaintext_port()) : nlohmann::json(nullptr);
  j["loops"] = nlohmann::json::parse(resources_->loops_json());
  j["recovery"] = {
      {"fresh", recovery_.fresh},
      {"checkpoint_version", recovery_.checkpoint_version},
      {"replayed_updates", recovery_.replayed_updates},
      {"dropped_wal_bytes", recovery_.dropped_wal_bytes},
      {"used_previous_checkpoint", recovery_.used_previous_checkpoint},
      {"rollback",
       recovery_.rollback
           ? nlohmann::json{{"first_bad_version", recovery_.rollback->first_bad_version},
                            {"dropped_updates", recovery_.rollback->dropped_updates},
                            {"kept_files", recovery_.rollback->kept_files}}
           : nlohmann::json(nullptr)},
      {"version", version_after_recovery_}};
  j["updates_applied"] = resources_->updates_applied();
  if (const runtime::PublishedModel* published = state_->published()) {
    j["published_model"] = {{"version", published->version()},
                            {"steps", published->steps()},
                            {"relative_lag", published->relative_lag()}};
  } else {
    j["published_model"] = nullptr;
  }
  // The cheap pull (--pull-fraction): its records and counters (server/README.md, "Cheap pull").
  j["cheap_pull"] = state_->replica_records()
                        ? nlohmann::json::parse(state_->replica_records()->stats_json())
                        : nlohmann::json(nullptr);
  j["model_pulls"] = resources_->model_pulls();
  j["model_delta_pulls"] = resources_->model_delta_pulls();
  j["model_pull_cpu_seconds"] = resources_->model_pull_cpu_seconds();
  j["updates_clipped"] = state_->updates_clipped();
  j["devices_refused"] = nlohmann::json::parse(device_refusals_json(*state_));
  j["devices"] = nlohmann::json::parse(resources_->devices_json());
  j["monitors"] = nlohmann::json::parse(resources_->monitors_json());
  j["devices_silent"] = resources_->device_health().silent_workers();
  j["metrics_port"] =
      metrics_endpoint_ ? nlohmann::json(metrics_endpoint_->port()) : nlohmann::json(nullptr);
  j["ingress_payload_bytes"] = resources_->ingress_payload_bytes();
  j["ingress_socket_bytes"] = resources_->ingress_socket_bytes();
  j["ingress_socket_datagrams"] = resources_->ingress_socket_datagrams();
  j["egress_socket_bytes"] = resources_->egress_socket_bytes();
  j["egress_socket_datagrams"] = resources_->egress_socket_datagrams();
  transport::HandshakeStats handshakes = servers_[0]->handshake_stats();  // loop 0 is this thread's
  {
    std::lock_guard lock(loop_handshakes_mutex_);
    for (std::size_t n = 1; n < loop_handshakes_.size(); ++n) handshakes += loop_handshakes_[n];
  }
  j["handshakes"] = {{"hello_verify_requests", handshakes.hello_verify_requests},
                     {"client_hellos_admitted", handshakes.client_hellos_admitted},
                     {"refused_rate_limited", handshakes.refused_rate_limited},
                     {"refused_too_many_pending", handshakes.refused_too_many_pending},
                     {"malformed_client_hellos", handshakes.malformed_client_hellos},
                     {"timed_out", handshakes.handshakes_timed_out},
                     {"pending", handshakes.pending}};
  {
    std::lock_guard lock(metrics_mutex_);
    j["last_evaluation"] = last_evaluation_
                               ? nlohmann::json{{"version", last_evaluation_->version},
                                                {"accuracy", last_evaluation_->accuracy},
                                                {"loss", last_evaluation_->loss}}
                               : nlohmann::json(nullptr);
  }
  add_run_end_stats(j);
  j["mode"] = s_.mode;
  if (mode_) j[std::string(mode_->name())] = nlohmann::json::parse(mode_->status_json());
  hold.unlock();
  common::write_file_atomically(s_.stats_file, j.dump(2) + "\n");
}

// stop: why the run ended (null while running; "signal" after SIGTERM or SIGINT, else the
// stop condition); best: the best checkpoint so far (null without evaluation).
void ServerApp::add_run_end_stats(nlohmann::json& j) const {
  j["stop"] = stopped_because_ ? nlohmann::json{{"condition", stopped_because_->condition},
                                                {"detail", stopped_because_->detail}}
                               : nlohmann::json(nullptr);
  const auto best = best_ ? best_->best() : std::nullopt;
  j["best"] = best ? nlohmann::json{{"version", best->version},
                                    {"accuracy", best->accuracy},
                                    {"loss", best->loss},
                                    {"path", best_->path().string()}}
                   : nlohmann::json(nullptr);
}

// Loop n > 0: passes of its server until `stop`; every second it copies its handshake
// guard's counters for the stats file.
void ServerApp::serve_loop(std::size_t n, const std::atomic<bool>& stop) {
  auto next_copy = std::chrono::steady_clock::now();
  while (!stop.load(std::memory_order_relaxed)) {
    resources_->serve_once(*servers_[n], 200);
    if (std::chrono::steady_clock::now() < next_copy) continue;
    const transport::HandshakeStats stats = servers_[n]->handshake_stats();
    std::lock_guard lock(loop_handshakes_mutex_);
    loop_handshakes_[n] = stats;
    next_copy = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  }
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
  // thread), the loops look for finished syncs every millisecond and send their answers.
  // Loops 1.. run on threads of their own; a failure in one stops them all and is thrown
  // here, as one of loop 0 is.
  std::atomic<bool> loops_stop = false;
  std::mutex failure_mutex;
  std::exception_ptr loop_failure;
  std::vector<std::thread> loop_threads;
  struct JoinLoops {  // also when loop 0 throws: no thread may outlive the servers
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~JoinLoops() {
      stop = true;
      for (std::thread& t : threads)
        if (t.joinable()) t.join();
    }
  } join_loops{loops_stop, loop_threads};
  for (std::size_t n = 1; n < servers_.size(); ++n) {
    loop_threads.emplace_back([this, n, &loops_stop, &failure_mutex, &loop_failure] {
      try {
        serve_loop(n, loops_stop);
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!loop_failure) loop_failure = std::current_exception();
        loops_stop = true;
      }
    });
  }
  auto next_stats = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  if (stop_.any()) log_line("stop conditions: " + stop_.describe());
  while (!g_stop_requested && !loops_stop && !stop_condition_met()) {
    resources_->serve_once(*servers_[0],
                           200);  // returns within 200 ms, so the stats file is at most ~1.2 s old
    if (mode_) mode_->poll();     // a round's or an iteration's deadline passes without a request
    if (std::chrono::steady_clock::now() < next_stats) continue;
    {
      std::lock_guard lock(handshake_failures_mutex_);
      handshake_failures_.flush(HandshakeFailureLog::Clock::now());
    }
    refresh_metrics();
    try {
      write_stats(true);
    } catch (const std::exception& e) {  // a full disk must not stop training
      log_line(std::string("stats file not updated: ") + e.what());
    }
    next_stats = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  }
  loops_stop = true;
  for (std::thread& t : loop_threads) t.join();
  if (loop_failure) std::rethrow_exception(loop_failure);
  // No loop runs now: this thread sends every loop's answers (joining the threads hands it
  // their servers). Staged updates are answered before the checkpoint.
  resources_->answer_durable_updates(true);
  resources_->flush_collapsed_lines();
}

bool ServerApp::stop_condition_met() {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  // The run's progress is the model version, or what the mode counts instead (MD-GAN: the
  // generator's iterations, which --stop-after-updates then counts).
  std::uint64_t progress = 0;
  {
    const auto hold = resources_->hold();  // the other loops apply updates
    progress = (mode_ ? mode_->progress() : std::nullopt).value_or(state_->version());
  }
  stopped_because_ = stop_.check(progress, seconds);
  if (!stopped_because_ && mode_) stopped_because_ = mode_->stop_reason();
  if (stopped_because_) log_line("stop condition met: " + stopped_because_->detail);
  return stopped_because_.has_value();
}

void ServerApp::shutdown() {
  if (!stopped_because_) stopped_because_ = StopReason{"signal", "SIGTERM or SIGINT"};
  log_line("stopping: " + resources_->ingress_summary() +
           " since start; writing a checkpoint at version " + std::to_string(state_->version()));
  evaluator_.reset();
  if (!accuracy_by_ingress_.x.empty()) {
    plot::PlotOptions plot;
    const auto seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    plot.title = "edgetrain-server: test accuracy against ingress (" + state_->model().spec().name +
                 ", " + std::to_string(static_cast<int>(seconds)) + " s)";
    plot.x_label = "update payload bytes received";
    plot.y_label = "test accuracy";
    plot.log_x = true;
    const auto svg_path = std::filesystem::path(s_.state_dir) / "accuracy-vs-ingress.svg";
    std::ofstream(svg_path) << plot::render_svg_line_chart({accuracy_by_ingress_}, plot);
    log_line("plot written to " + svg_path.string());
  }
  state_->checkpoint();
  if (mode_) mode_->shutdown();
  write_stats(false);
  log_line("checkpoint written to " + state_->checkpoint_path().string() + "; bye");
}

}  // namespace

void log_line(const std::string& message) { logging::write(logging::Level::kInfo, message); }

int run_server(const ServerSettings& settings) {
  logging::set_level(logging::parse_level(settings.log_level).value_or(logging::Level::kInfo));
  ServerApp app(settings);
  app.serve();
  app.shutdown();
  return 0;  // a stop condition, like SIGTERM, ends the run normally
}

}  // namespace edgetrain::server
