// edgetrain-server: the parameter server executable.
//
//   edgetrain-server --state-dir DIR --keystore KEYS [--config server.toml] [flags]
//   edgetrain-server --state-dir DIR --cert C --cert-key K --ca CA [--keystore KEYS] [flags]
//   edgetrain-server add-device NAME --keystore KEYS [--server-uri coaps://host:5684]
//   edgetrain-server repair-wal --state-dir DIR [--skip-damaged | --cut-at-damage]
//   edgetrain-server list-devices | remove-device NAME | rotate-key NAME  --keystore KEYS
//   edgetrain-server evaluate CHECKPOINT --data NAME [--model M] [--json]
//
// One table of settings (common/settings.h): flags override the TOML config file, which
// overrides the defaults. The program itself is server/server_app.h.
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "common/logging.h"
#include "common/settings.h"
#include "server/keystore.h"
#include "server/operator_commands.h"
#include "server/startup_checks.h"
#include "server/server_app.h"
#include "server/wal_repair.h"

namespace {

using namespace edgetrain;

void declare_settings(settings::Table& t, server::ServerSettings& s) {
  t.group("Endpoint and security");
  t.add("listen", s.listen, "address to bind");
  t.add("port", s.port, "UDP port of the DTLS endpoint (0: any free port; see --port-file)")
      .range(0, 65535);
  t.add("keystore", s.keystore, "TOML file of device PSKs (mode 0600), re-read when it changes");
  t.add("cert", s.cert, "X.509: this server's certificate (PEM); with --cert-key and --ca");
  t.add("cert-key", s.cert_key, "X.509: the certificate's private key (PEM)");
  t.add("ca", s.ca, "X.509: CA (PEM) that must have signed every client certificate");
  t.add("insecure", s.insecure,
        "ALSO serve plain CoAP (no DTLS: no encryption, no authentication) on --insecure-port");
  t.add("insecure-port", s.insecure_port, "UDP port of the plain CoAP endpoint (0: any free port)")
      .range(0, 65535);
  t.group("DTLS handshake limits (after the stateless cookie exchange)");
  t.add("handshake-timeout", s.handshake.timeout_seconds,
        "a handshake not finished in this time is ended and its "
        "state freed")
      .range(1, 120)
      .unit("seconds");
  t.add("max-pending-handshakes", s.handshake.max_pending,
        "handshakes in progress at once; more ClientHellos are "
        "dropped (clients retransmit)")
      .range(1, 100000);
  t.add("max-pending-handshakes-per-address", s.handshake.max_pending_per_address,
        "handshakes in progress at once "
        "from one source address (IPv4 address, IPv6 /64); above --max-pending-handshakes it is "
        "that")
      .range(1, 100000);
  t.add("handshake-rate-per-address", s.handshake.rate_per_address,
        "new handshakes per second from one source "
        "address (a token bucket holding as many)")
      .range(0.1, 100000)
      .unit("per second");
  t.group("Model and training");
  t.add("model", s.model, "built-in model name (paper-cnn, mlp) or model spec");
  t.add("state-dir", s.state_dir, "directory for the WAL, checkpoints and metrics (required)");
  t.add("lr", s.lr, "learning rate");
  t.add("max-staleness", s.max_staleness, "largest delay accepted (D); older updates get 4.09")
      .unit("updates");
  t.add("checkpoint-every", s.checkpoint_every, "updates between checkpoints (0: only at exit)")
      .unit("updates");
  t.add("max-update-bytes", s.max_update_bytes,
        "larger POST /update bodies get 4.13, as soon as Size1 or the "
        "blocks received pass it")
      .range(1, 1u << 30)
      .unit("bytes");
  t.add("seed", s.seed, "initial parameters of a new state directory");
  t.add("shard", s.shard,
        "I/N: serve shard I (0-based) of N, range I of the model's parameters split in N (workers "
        "give every shard's URI with --shards); async mode only, without evaluation, --init-from "
        "or --publish-every; "
        "empty: the whole model");
  t.add("publish-every", s.publish_every,
        "async: workers pull a published model that follows the true one every "
        "this many applied updates by its --publish-fraction largest differences (small pulls, "
        "each copy still "
        "checked by digest); 0: the exact model")
      .range(0, 1000000)
      .unit("updates");
  t.add("publish-fraction", s.publish_fraction,
        "with --publish-every: share of each tensor's entries a publish "
        "step copies")
      .range(1e-6, 1);
  t.add("publish-min-entries", s.publish_min_entries,
        "with --publish-every: entries a publish step copies at least "
        "per tensor (a whole tensor if smaller: biases)")
      .range(1, 1u << 30);
  t.group("Bad updates");
  t.add("max-parameter-magnitude", s.max_parameter_magnitude,
        "an update that would leave a parameter it touches "
        "beyond ±this (or non-finite) gets 4.22 and changes nothing")
      .range(1e-30, 3.4e38);
  t.add("clip-update-norm", s.clip_update_norm,
        "scale down each tensor of an update whose values' L2 norm exceeds "
        "this (the WAL keeps the clipped update); 0: no clipping")
      .range(0, 3.4e38);
  t.add("quarantine-after", s.quarantine_after,
        "after this many bad updates in a row (4.22 or 4.00) a device's "
        "updates get 4.03; 0: never")
      .range(0, 1000000)
      .unit("updates");
  t.add("quarantine-seconds", s.quarantine_seconds,
        "how long a quarantine lasts; 0: until the server restarts")
      .range(0, 1e9)
      .unit("seconds");
  t.add("rollback-non-finite", s.rollback_non_finite,
        "at start, if the checkpoint or the WAL's replay reaches a "
        "non-finite parameter, resume at the last finite state before it (keeping the logs aside) "
        "instead of refusing");
  t.group("Evaluation");
  t.add("eval-data", s.eval_data,
        "test set for the background evaluator: mnist (10k), mnist-small (2k), fashion-mnist, a "
        "directory, or none");
  t.add("eval-interval", s.eval_interval,
        "time between evaluations (skipped while the version is unchanged)")
      .range(0.01, 1e6)
      .unit("seconds");
  t.group("CoAP");
  t.add("coap-ack-timeout", s.timing.ack_timeout_seconds, "CoAP ACK_TIMEOUT")
      .range(1, 60)
      .unit("seconds");
  t.add("coap-ack-random-factor", s.timing.ack_random_factor, "CoAP ACK_RANDOM_FACTOR").range(1, 4);
  t.add("coap-max-retransmit", s.timing.max_retransmit, "CoAP MAX_RETRANSMIT").range(1, 10);
  t.add("coap-nstart", s.timing.nstart, "CoAP NSTART").range(1, 16);
  t.add("datagrams-per-pass", s.datagrams_per_pass,
        "most datagrams read per pass of the event loop, which walks "
        "every session once per pass (1 = libcoap's own loop)")
      .range(1, 1024);
  t.add("max-bodies-in-progress", s.max_bodies_in_progress,
        "block-wise request bodies assembled at once (one per "
        "session, each at most --max-update-bytes); a body beyond them gets 5.03")
      .range(1, 1u << 20);
  t.add("loop-threads", s.loop_threads,
        "event-loop threads, each with its own DTLS endpoint on the port "
        "(SO_REUSEPORT; a client's session stays on one); 0 = the cores available; --mode rounds "
        "and gan use 1 "
        "(server/README.md, \"Several event-loop threads\")")
      .range(0, 256);
  t.group("Watching a fleet (server/README.md)");
  t.add("log-level", s.log_level, "least severe log lines written")
      .choices({"error", "warn", "info", "debug"});
  t.add("log-repeat-burst", s.log_repeat_burst,
        "lines of one kind (e.g. 'too stale from w1') written per "
        "--log-repeat-interval; the rest become one line with their count")
      .range(0, 1000000);
  t.add("log-repeat-interval", s.log_repeat_interval, "interval of --log-repeat-burst")
      .range(0.1, 86400)
      .unit("seconds");
  t.add("silent-after", s.silent_after,
        "a device not heard from for longer is reported silent (/status, stats "
        "file, metrics)")
      .range(0.1, 1e9)
      .unit("seconds");
  t.add("max-devices", s.max_devices,
        "identities tracked per device at once; a new one beyond it pushes out the "
        "one heard from longest ago")
      .range(1, 10000000);
  t.add("observe-interval", s.observe_interval,
        "CoAP Observe on /status: at most one notification per interval, "
        "while something changed")
      .range(0.1, 86400)
      .unit("seconds");
  t.add("metrics-listen", s.metrics_listen,
        "ADDRESS:PORT of an HTTP endpoint serving GET /metrics (Prometheus "
        "text format), e.g. 127.0.0.1:9464; empty: none");
  t.group("Training mode (federated rounds: server/README.md)");
  t.add("mode", s.mode,
        "async: asynchronous SGD (POST /update); rounds: federated rounds (GET /round, "
        "POST /round/update); gan: MD-GAN, the generator here and a discriminator on each worker "
        "(GET /gan/batches, "
        "POST /gan/feedback)")
      .choices({"async", "rounds", "gan"});
  t.add("round-policy", s.round_policy,
        "rounds: drop-stragglers closes at --round-deadline with what arrived; "
        "wait-all waits for every selected device, up to 4x the deadline")
      .choices({"drop-stragglers", "wait-all"});
  t.add("aggregation", s.aggregation,
        "rounds: masked averages each parameter over the devices that sent it; "
        "fedavg counts a missing entry as zero")
      .choices({"masked", "fedavg"});
  t.add("round-deadline", s.round_deadline, "rounds: how long a round stays open")
      .range(0.1, 1e6)
      .unit("seconds");
  t.add("client-fraction", s.client_fraction,
        "rounds: fraction of the devices seen selected each round (seeded by "
        "--seed)")
      .range(0.001, 1);
  t.add("min-clients", s.min_clients,
        "rounds: deltas a round needs before it may close before its deadline")
      .range(1, 1000000);
  t.add("local-steps", s.local_steps, "rounds: minibatches each selected device trains per round")
      .range(1, 1000000);
  t.add("local-epochs", s.local_epochs,
        "rounds: passes over its own shard each selected device trains per round "
        "instead of --local-steps (0: use --local-steps)")
      .range(0, 1000);
  t.add("server-lr", s.server_lr,
        "rounds: the round's model moves by this times the aggregated delta")
      .range(1e-6, 100);
  t.group("MD-GAN (--mode gan: server/README.md \"MD-GAN\")");
  t.add("gan-workers", s.gan_workers,
        "N: the feedbacks an iteration waits for, and the worker slots (required "
        "with --mode gan)")
      .range(0, 100000);
  t.add("gan-arch", s.gan_arch,
        "the generator's architecture (model/gan_network.h); each worker's "
        "discriminator has its own (worker --gan-arch)")
      .choices({"mlp", "cnn"});
  t.add("gan-k", s.gan_k,
        "generated batches per iteration (the paper: 1 or ceil(log2 N)); worker n gets X_(n mod k) "
        "for its feedback and X_((n+1) mod k) for its discriminator")
      .range(1, 100000);
  t.add("gan-batch", s.gan_batch, "b: generated samples per batch").range(1, 4096);
  t.add("gan-deadline", s.gan_deadline,
        "an iteration closes this long after it opened with the feedbacks that "
        "came (late workers are dropped from it and counted)")
      .range(0.01, 86400)
      .unit("seconds");
  t.add("gan-swap-every", s.gan_swap_every,
        "iterations between discriminator swaps (peer to peer, along a random "
        "cycle; the paper: every epoch of a worker's shard, i.e. shard size / b); 0: none")
      .range(0, 1e9);
  t.add("gan-fp16", s.gan_fp16, "send the generated batches as fp16 (half the bytes)");
  t.add("gan-lr", s.gan_lr, "the generator's Adam learning rate (betas 0.5, 0.999)").range(1e-7, 1);
  t.add("gan-checkpoint-every", s.gan_checkpoint_every,
        "iterations between checkpoints of G and Adam (each "
        "iteration is logged before its step in any case)")
      .range(1, 1e9);
  t.add("gan-eval-every", s.gan_eval_every,
        "iterations between evaluations of the generator: a grid of its digits "
        "in <state-dir>/gan/samples.png and, with --gan-classifier, its scores in gan/metrics.csv "
        "and gan/scores.svg "
        "(on a thread of their own); 0: none")
      .range(0, 1e9);
  t.add("gan-eval-samples", s.gan_eval_samples,
        "generated samples scored per evaluation (and test images of "
        "--eval-data they are compared with)")
      .range(10, 10000);
  t.add("gan-classifier", s.gan_classifier,
        "a trained classifier checkpoint (sim/train-classifier.sh writes the paper "
        "CNN's) that scores the generator: MNIST score, Frechet distance of its features, "
        "conditional accuracy; "
        "needs --eval-data");
  t.add("gan-classifier-model", s.gan_classifier_model,
        "the classifier's model (built-in name or spec)");
  t.group("Output");
  t.add("port-file", s.port_file,
        "once the DTLS port is bound: write it (decimal digits and a newline) here, atomically");
  t.add("stats-file", s.stats_file,
        "JSON object (state, version, ports, recovery, updates, ingress, refused devices, "
        "per-device health, "
        "last evaluation) "
        "rewritten atomically at start, every second and at exit");
  declare_run_settings(t, s);
}

struct AddDevice {
  std::string name, keystore, server_uri;
};

void declare_add_device(settings::Table& t, AddDevice& a) {
  t.positional("name", a.name, "device name = PSK identity ([A-Za-z0-9._-], up to 64)");
  t.add("keystore", a.keystore, "keystore file (created mode 0600 if missing)").required();
  t.add("server-uri", a.server_uri, "URI the worker should use (default coaps://<this host>:5684)");
}

int add_device(AddDevice a) {
  if (a.server_uri.empty()) {
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    a.server_uri = std::string("coaps://") + host + ":5684";
  }
  const auto key = server::add_device(a.keystore, a.name);
  std::cout << server::worker_config_toml(a.server_uri, a.name, key);
  server::log_line("added '" + a.name + "' to " + a.keystore);
  return 0;
}

struct RepairWal {
  std::string state_dir;
  bool skip_damaged = false, cut_at_damage = false;
};

constexpr int kDamageFound = 3;  // repair-wal without a choice found damage; nothing changed

void declare_repair_wal(settings::Table& t, RepairWal& r) {
  t.add("state-dir", r.state_dir, "the server's state directory (the server must not be running)")
      .required();
  t.add("skip-damaged", r.skip_damaged,
        "keep every intact record; empty placeholder updates stand in for the damaged ones");
  t.add("cut-at-damage", r.cut_at_damage,
        "end the log before the first damaged record (drops the intact records after it)");
  t.footer(
      "Without a choice: lists wal.log, wal.prev.log and rounds.wal (federated rounds) and what "
      "each choice would do, changes nothing.\n"
      "A damaged file is kept as FILE.damaged before the repaired one replaces it.\n"
      "Exit status: 0 no damage (a torn tail alone is the server's to cut) or repaired; 3 damage "
      "found, nothing changed (choose --skip-damaged or --cut-at-damage); 1 error (unreadable "
      "file or header, a choice that cannot be carried out); 2 bad usage.");
}

int repair_wal(const RepairWal& r) {
  if (r.skip_damaged && r.cut_at_damage) {
    std::cerr << "edgetrain-server repair-wal: choose one of --skip-damaged and --cut-at-damage\n";
    return 2;
  }
  const auto choice = r.skip_damaged    ? server::WalRepairChoice::kSkipDamaged
                      : r.cut_at_damage ? server::WalRepairChoice::kCutAtDamage
                                        : server::WalRepairChoice::kListOnly;
  if (!std::filesystem::exists(std::filesystem::path(r.state_dir) / "wal.log"))
    throw std::runtime_error("no wal.log in " + r.state_dir +
                             ": not a state directory of edgetrain-server");
  bool damage_left = false;
  for (const char* name : {"wal.log", "wal.prev.log", "rounds.wal"}) {
    const std::filesystem::path path = std::filesystem::path(r.state_dir) / name;
    if (!std::filesystem::exists(path)) continue;
    const server::WalRepairResult result = server::repair_wal(path, choice);
    for (const std::string& line : result.report) std::cout << line << '\n';
    // What was changed also goes to the log (stderr), with the time, like the server's own lines.
    if (result.changed)
      for (const std::string& line : result.report) server::log_line("repair-wal: " + line);
    damage_left = damage_left || (result.damaged && !result.changed);
  }
  return damage_left ? kDamageFound : 0;
}

}  // namespace

int main(int argc, char** argv) {
  server::ServerSettings settings;
  AddDevice device;
  settings::Table table(
      "edgetrain-server",
      "edgetrain-server: the parameter server (CoAP over DTLS with PSK or X.509, WAL, checkpoints, "
      "evaluator)");
  declare_settings(table, settings);
  settings::Table& add = table.subcommand(
      "add-device",
      "add a device with a random key to the keystore and print its worker configuration");
  declare_add_device(add, device);
  RepairWal repair;
  settings::Table& repair_table = table.subcommand(
      "repair-wal",
      "list damage in the middle of the WAL (which stops recovery) and repair it as you choose");
  declare_repair_wal(repair_table, repair);
  server::OperatorCommands operator_commands(table);
  if (auto exit_status = table.parse(argc, argv)) return *exit_status;
  try {
    if (add.parsed()) return add_device(device);
    if (repair_table.parsed()) return repair_wal(repair);
    if (auto exit_status = operator_commands.run()) return *exit_status;
    return server::run_server(settings);
  } catch (const server::StartupError& e) {
    server::log_line(std::string("error: ") + e.what() + " (nothing was created; exit status 2)");
    return server::kStartupErrorExitStatus;
  } catch (const std::exception& e) {
    logging::write(logging::Level::kError, std::string("error: ") + e.what());
    return 1;
  }
}
