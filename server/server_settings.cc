#include "server/server_settings.h"

#include "server/operator_commands.h"
#include "server/server_mode.h"

namespace edgetrain::server {

void declare_server_settings(settings::Table& t, ServerSettings& s) {
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
  t.add("model", s.model,
        "built-in model name (paper-cnn, mlp, mobilenet-mini, resnet-8, resnet-8-32x32x3, ds-cnn, "
        "cnn1d), model spec, or spec file (e.g. tools/onnx_to_edgetrain.py's)");
  t.add("state-dir", s.state_dir, "directory for the WAL, checkpoints and metrics (required)");
  t.add("lr", s.lr, "learning rate");
  t.add("lr-decay-at", s.lr_decay_at,
        "async: multiply the learning rate by --lr-decay-factor from each of these model "
        "versions on, e.g. 3000,4500 (step decay; kept in the WAL, so a restart must give the "
        "same); default: a constant --lr");
  t.add("lr-decay-factor", s.lr_decay_factor, "with --lr-decay-at: the factor at each milestone")
      .range(1e-6, 0.999999);
  t.add("max-staleness", s.max_staleness, "largest delay accepted (D); older updates get 4.09")
      .unit("updates");
  t.add("offline-step-credit", s.offline_step_credit,
        "an update that says it carries s local steps (a worker's offline training) has each "
        "divisor d of the staleness rule cut to ceil(d / min(s, this, d)): at most this many "
        "steps are believed, and no update weighs more than a fresh one (ours; 0: the claim is "
        "ignored, the paper's rule)")
      .range(0, 65535)
      .unit("steps");
  t.add("offline-average", s.offline_average,
        "with --offline-step-credit: a credited update of s steps at delay d weighs at most "
        "s/(s + d), its share of the steps it and the fleet's updates since its version carry "
        "(every divisor at least ceil((s + d) / s); ours)");
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
  t.add("pull-fraction", s.pull_fraction,
        "async: the cheap pull (ours): the server keeps a record of each device's copy and each "
        "GET /model?since=V sends, per tensor, this share of the entries (at least "
        "--pull-min-entries) where the model differs most from it; the rest later. 0: exact "
        "pulls. A shard records its slice; not with --publish-every")
      .range(0, 1);
  t.add("pull-min-entries", s.pull_min_entries,
        "with --pull-fraction: entries a pull sends at least per tensor (a whole tensor if "
        "smaller: biases)")
      .range(1, 1u << 30);
  t.add("pull-max-devices", s.pull_max_devices,
        "with --pull-fraction: devices whose copies are recorded (each parameters × 4 bytes, "
        "× 12 with --entry-staleness); beyond it the one that pulled longest ago loses its "
        "record (its next pull is dense)")
      .range(1, 1u << 24)
      .unit("devices");
  t.add("pull-values", s.pull_values,
        "with --pull-fraction: fp32, or fp16-increment: a device that asks (worker "
        "--pull-values fp16-increment) gets each entry as the increment W - R in fp16, 2 bytes "
        "instead of 4, which it adds to its copy; the record takes the same addition, so the "
        "rounding error goes out with a later pull (ours). Other devices get fp32")
      .choices({"fp32", "fp16-increment"});
  t.add("entry-staleness", s.entry_staleness,
        "with --pull-fraction: σ per entry (ours): an update's σ_i counts the updates since "
        "the version its device's copy of entry i was last the model's (the record keeps it: "
        "8 more bytes per parameter and device), not since its pull. An update whose device "
        "has no record at its t_fetch (restart, pushed out, pulled again) gets the paper's σ. "
        "The WAL keeps each update's older entries, so replay gives the same model; a state "
        "directory's WAL says whether it was on, and a server started otherwise refuses it");
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
        "updates get 4.03 (in --mode gan: bad feedbacks, and its GAN requests); 0: never")
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
        "directory (IDX files, or edgetrain-data.toml: model/README.md), or none");
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
  t.add("q-block", s.timing.q_block,
        "Q-Block (RFC 9177) with clients that ask for it: a GET's answer in bursts, each "
        "asked for by one request (Q-Block2), and request bodies taken in bursts answered "
        "once (Q-Block1) (false: such requests get 4.02 and the clients fall back to RFC 7959 "
        "Block1/Block2)");
  t.add("coap-max-payloads", s.timing.max_payloads,
        "Q-Block MAX_PAYLOADS (RFC 9177): blocks per burst")
      .range(1, 64);
  t.add("datagrams-per-pass", s.datagrams_per_pass,
        "most datagrams read per pass of the event loop, which walks "
        "every session at most every 10 ms (1 = libcoap's own loop, which walks them on every "
        "pass)")
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
  for (const ServerModeEntry& mode : server_modes())
    if (mode.declare) mode.declare(t, s);
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

}  // namespace edgetrain::server
