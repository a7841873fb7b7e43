// The edgetrain-server program behind its settings: set-up (keystore, state directory and
// recovery, CoAP resources, the DTLS endpoint, metrics, evaluator), the serving loop until
// SIGTERM/SIGINT, and the orderly shutdown (answer staged updates, plot, checkpoint).
// server_main.cc declares the settings table and calls run_server().
#pragma once

#include <cstdint>
#include <string>

#include "common/number_text.h"
#include "server/parameter_store.h"
#include "transport/coap_dtls.h"

namespace edgetrain::server {

// Every setting of edgetrain-server (server/README.md has the table of flags and keys).
struct ServerSettings {
  std::string listen = "0.0.0.0";
  int port = 5684;
  std::string model = "paper-cnn";
  std::string state_dir;
  std::string keystore;
  double lr = 0.1;
  std::uint32_t max_staleness = kDefaultMaxStaleness;
  // Offline updates (server/parameter_store.h): the most local steps an update's claim is
  // credited with; 0: claims ignored.
  std::uint32_t offline_step_credit = 0;
  // --lr-decay-at and --lr-decay-factor: ParameterStoreOptions::lr_schedule (async mode).
  std::string lr_decay_at;
  double lr_decay_factor = 0.1;
  bool offline_average = false;  // ParameterStoreOptions::offline_average
  std::uint64_t checkpoint_every = 1000;
  std::string eval_data = "none";
  double eval_interval = 10;  // seconds
  std::uint64_t max_update_bytes = std::uint64_t{4} << 20;
  std::uint64_t seed = 1;
  // The published model (model/published_model.h): 0 = workers pull the exact model.
  std::uint32_t publish_every = 0;
  double publish_fraction = 0.01;
  std::uint32_t publish_min_entries = 32;
  // The cheap pull (server/replica_records.h): 0 = exact pulls.
  double pull_fraction = 0;
  std::uint32_t pull_min_entries = 32;
  std::uint32_t pull_max_devices = 256;
  // fp32, or fp16-increment: devices that ask get the cheap pull's values as fp16 increments.
  std::string pull_values = "fp32";
  // σ per entry (ours): with the cheap pull, each entry's σ counts from the version the
  // device's copy holds it since (server/replica_records.h); recorded in the WAL.
  bool entry_staleness = false;
  // Bad updates (server/README.md, "Bad updates"): the bound on parameters, optional
  // per-tensor norm clipping, quarantine of devices that keep failing, and recovery of a
  // state directory that reached a non-finite parameter.
  double max_parameter_magnitude = kDefaultMaxParameterMagnitude;
  double clip_update_norm = 0;
  std::uint32_t quarantine_after = 0;
  double quarantine_seconds = 0;
  bool rollback_non_finite = false;
  // Transport (transport/README.md): plain CoAP only with insecure, X.509 as an option,
  // CoAP timing for a WAN.
  bool insecure = false;
  int insecure_port = 5683;
  std::string cert, cert_key, ca;
  transport::CoapTiming timing = transport::CoapTiming::wan();
  std::uint32_t datagrams_per_pass = 32;       // transport::CoapDtlsServer::Options
  std::uint64_t max_bodies_in_progress = 256;  // transport::CoapDtlsServer::Options
  // Event-loop threads, each with its own CoapDtlsServer on the one port (SO_REUSEPORT);
  // 0: the cores this process may run on. --mode rounds and gan use one. The default is
  // one: two measured slower than one on the 2-core machines so far (server/README.md,
  // "Several event-loop threads").
  std::uint32_t loop_threads = 1;
  transport::HandshakeLimits handshake;  // likewise (transport/README.md, "Handshake floods")
  // Training mode (docs/training-modes.md): "async" (asynchronous SGD, POST /update) or
  // "rounds" (federated rounds, server/round_coordinator.h; /update then answers 4.05), or
  // "gan" (MD-GAN, server/gan_coordinator.h; /update likewise).
  std::string mode = "async";
  // Sharded server (server/README.md, "Sharded server"): "I/N" serves range I of N of the
  // model's parameters (model/model_shards.h); empty: the whole model.
  std::string shard;
  std::string round_policy = "drop-stragglers";
  std::string aggregation = "masked";
  double trim_fraction = 0.2;    // trimmed-mean's β (server::kDefaultTrimFraction)
  double round_clip_norm = 0;    // per-device L2 norm of a round delta; 0: no clipping
  double dp_noise_multiplier = 0, dp_expected_devices = 0, dp_delta = 1e-5,
         dp_target_epsilon = 0;  // --aggregation dp-fedavg
  // dp-fedavg's adaptive clipping (server/adaptive_clipping.h): γ (0: fixed), η, σ_b (0: m/20)
  double dp_adaptive_clip_quantile = 0, dp_clip_learning_rate = 0.2, dp_clip_count_stddev = 0;
  // Secure aggregation in rounds (server/secure_round.h): on, and t as a fraction of U1.
  bool secure_aggregation = false;
  std::string dp_noise = "gaussian";  // with secure aggregation: gaussian or skellam (privacy/skellam.h)
  double secagg_threshold = 0.6;
  double secagg_subset = 0;  // the share of entries a secure round sends (privacy/subset.h); 0: all
  // Keys signed by the devices' certificates and the consistency round (privacy/secagg_signed.h):
  // against an active server; needs --ca, the CA the devices' certificates chain to.
  bool secagg_signed_keys = false;
  std::uint32_t secagg_neighbours = 0;  // SecAgg+'s k (privacy/secagg_graph.h); 0: every device
  double round_deadline = 30;  // seconds
  double client_fraction = 1.0;
  std::uint32_t min_clients = 1;
  std::uint32_t local_steps = 10;
  std::uint32_t local_epochs = 0;
  double server_lr = 1.0;
  // MD-GAN (--mode gan, server/gan_coordinator.h): the generator lives here, a
  // discriminator on every worker; its state goes to <state-dir>/gan/.
  std::uint32_t gan_workers = 0;  // N; required with --mode gan
  std::string gan_arch = "mlp";   // the generator's: mlp or cnn (model/gan_network.h)
  std::uint32_t gan_k = 1;
  std::uint32_t gan_batch = 10;
  double gan_deadline = 10;          // seconds
  std::uint32_t gan_swap_every = 0;  // iterations; 0: no swaps
  bool gan_fp16 = false;
  double gan_lr = 2e-4;
  double gan_max_feedback = 1000;  // per value, beyond it 4.22 (kDefaultMaxGanFeedbackMagnitude)
  double gan_clip_feedback = 0;    // per-device L2 norm of a feedback; 0: no clipping
  std::uint32_t gan_checkpoint_every = 100;
  // Every gan_eval_every iterations (0: never): a grid of samples in <state-dir>/gan/samples.png
  // and, with a classifier checkpoint, the MNIST score, Fréchet distance and conditional
  // accuracy of gan_eval_samples samples in gan/metrics.csv (against --eval-data's test images).
  std::uint32_t gan_eval_every = 200;
  std::uint32_t gan_eval_samples = 500;
  std::string gan_classifier, gan_classifier_model = "paper-cnn";
  // Files for scripts (server/README.md): the bound DTLS port; a JSON stats object.
  std::string port_file, stats_file;
  // Start-up and end of a run (server/startup_checks.h, server/run_end.h): missing
  // evaluation data turns evaluation off instead of refusing to start; a warm start of a
  // new state directory; the stop conditions (0: off).
  bool eval_data_optional = false;
  std::string init_from;
  double stop_at_accuracy = 0;
  std::uint64_t stop_after_updates = 0;
  double stop_after_seconds = 0;
  // Watching a fleet (server/README.md): log level and collapsed repeats, per-device health,
  // Observe on /status, the metrics endpoint (empty: none).
  std::string log_level = "info";
  std::uint32_t log_repeat_burst = 10;
  double log_repeat_interval = 10;  // seconds
  double silent_after = 60;         // seconds
  std::uint64_t max_devices = 10000;
  double observe_interval = 5;  // seconds
  std::string metrics_listen;
};

// Runs the server until SIGTERM or SIGINT (installs handlers for both); returns the exit
// status. Throws std::exception for settings that do not work together or a state
// directory it cannot use (before serving).
int run_server(const ServerSettings& settings);

// "2024-05-01T12:34:56.789Z message" on stderr at level info (common/logging.h); callable
// from any thread.
void log_line(const std::string& message);
using common::short_number;  // common/number_text.h

}  // namespace edgetrain::server
