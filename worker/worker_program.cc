#include "worker/worker_program.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/logging.h"
#include "model/model.h"
#include "transport/coap_dtls.h"
#include "worker/program_support.h"
#include "worker/worker_dropout.h"
#include "worker/worker_exit_codes.h"

namespace edgetrain::runtime {

// The modes (worker/mode_*.cc): one line each.
extern const WorkerMode kAsyncMode, kRoundsMode, kGossipMode, kGanMode;

const std::vector<WorkerMode>& worker_modes() {
  static const std::vector<WorkerMode> modes = {kAsyncMode, kRoundsMode, kGossipMode, kGanMode};
  return modes;
}

const WorkerMode* find_worker_mode(std::string_view name) {
  for (const WorkerMode& mode : worker_modes())
    if (mode.name == name) return &mode;
  return nullptr;
}

namespace {

using program::log_warning;

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The transport part of the configuration: PSK, X.509 or (declared) plain CoAP.
void set_security(WorkerSettings& s, WorkerConfig& config) {
  bool plaintext = false;
  parse_server_uri(s.server, config.server_host, config.server_port, plaintext);
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
    config.certificates = transport::CertificateFiles{s.cert, s.cert_key, s.ca};
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
    config.key = parse_hex_key(s.key_hex);
  }
  config.identity = s.identity;
}

// --shards: every URI, all DTLS or all plain CoAP (set_security() checks the first's scheme
// against --insecure like a --server URI's).
void set_shards(WorkerSettings& s, WorkerConfig& config) {
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
    parse_server_uri(uris[i], host, port, plaintext);
    if (i == 0) first_plaintext = plaintext;
    if (plaintext != first_plaintext)
      throw std::invalid_argument(
          "--shards: mixes coaps:// and coap:// URIs; every shard is reached the same way");
    config.shards.emplace_back(host, port);
  }
  s.server = uris.front();  // for set_security() and the log
}

}  // namespace

// The worker's configuration from its settings; throws std::invalid_argument.
WorkerConfig worker_config(WorkerSettings& s) {
  WorkerConfig config = s.config;
  config.compressor = compressor_options(config.compressor, s.compression);
  set_shards(s, config);
  set_security(s, config);
  transport::check_timing(config.timing);
  config.request_timeout_ms = static_cast<int>(s.request_timeout * 1000);
  config.longest_request_ms = static_cast<int>(s.longest_request * 1000);
  if (config.longest_request_ms > 0 && config.longest_request_ms < config.request_timeout_ms)
    throw std::invalid_argument("--longest-request " + std::to_string(s.longest_request) +
                                " s is below --request-timeout " +
                                std::to_string(s.request_timeout) + " s");
  if (!s.drop_rates.empty()) config.dropout.drop_rates = parse_drop_rates(s.drop_rates);
  config.dropout.rescale = parse_dropout_rescale(s.dropout_rescale);
  config.dropout.step_budget_seconds = s.step_time_budget_ms / 1000;
  config.link.budget = parse_byte_budget(s.byte_budget);
  config.link.budget_counts_pulls = s.budget_counts == "both";
  config.fp16_increment_pulls = s.pull_values == "fp16-increment";
  if (config.fp16_increment_pulls && (config.dense_pull || !s.shards.empty()))
    throw std::invalid_argument(
        "--pull-values fp16-increment asks for deltas of the cheap pull: not with --dense-pull, "
        "nor with --shards yet");
  if (config.link.min_rate > config.link.max_rate)
    throw std::invalid_argument("--min-compression-rate " + std::to_string(config.link.min_rate) +
                                " is above --max-compression-rate " +
                                std::to_string(config.link.max_rate));
  if (config.link.enabled() && !s.shards.empty())
    throw std::invalid_argument("--send-share / --byte-budget do not work with --shards yet");
  if (config.link.enabled() && s.compression.compressor != "adacomp")
    throw std::invalid_argument(
        "--send-share / --byte-budget choose AdaComp's c: not with --compressor " +
        s.compression.compressor);
  const Model model(model_spec_from_argument(config.model));
  // The drop rates or table against the model, before any data is loaded.
  check_worker_dropout(config.dropout, model,
                       s.mode == "rounds" ? DropoutPacing::kPerRound : DropoutPacing::kPerStep);
  // A budget that cannot carry the first (dense) pull would leave the worker waiting forever.
  const std::uint64_t first_pull =
      estimated_wire_bytes(model.parameter_count() * sizeof(float)) + kWireBytesPerHandshake;
  if (config.link.budget.enabled() && config.link.budget_counts_pulls &&
      config.link.budget.bytes < 2 * first_pull)
    throw std::invalid_argument("--byte-budget " + s.byte_budget + ": " +
                                std::to_string(config.link.budget.bytes) +
                                " bytes cannot carry two dense pulls of model '" + config.model +
                                "' (" + std::to_string(first_pull) +
                                " bytes each on the wire: the first pull, and the room kept for "
                                "the next until a delta is seen); raise it, or --budget-counts "
                                "upload");
  return config;
}

void declare_worker_settings(settings::Table& t, WorkerSettings& s) {
  WorkerConfig& c = s.config;
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
        "mnist (full, 60k), mnist-small (its 8k subset), fashion-mnist, a directory with "
        "train-images-idx3-ubyte[.gz] and labels, or one with edgetrain-data.toml (your NumPy "
        "or CSV files: model/README.md)");
  t.add("worker-id", c.worker_id, "this worker's shard number");
  t.add("workers", c.worker_count, "number of shards").range(1, 1e6);
  t.add("label-skew", c.label_skewed, "label-skewed shard instead of i.i.d.");
  t.add("seed", c.seed, "shuffling seed (same on every worker of a run)");
  t.add("model", c.model,
        "paper-cnn, mlp, mobilenet-mini, resnet-8, resnet-8-32x32x3, ds-cnn, cnn1d, a spec or a spec file; must "
        "match the server's");
  t.group("Training and compression");
  t.add("batch", c.batch, "minibatch size").range(1, 4096);
  t.add("threads", c.threads, "compute threads").range(1, 64);
  declare_compression_settings(t, c.compressor, s.compression, {"adacomp", "none"});
  t.add("pull-every", c.pull_every, "steps per model pull (1: the paper's)")
      .range(1, 1e6)
      .unit("steps");
  t.add("dense-pull", c.dense_pull,
        "always download the whole model (default: only the parameters changed since "
        "the version held, GET /model?since=V; same parameters bit for bit)");
  t.add("seeded-first-pull", c.seeded_first_pull,
        "start from the model built from --seed as version 0, so the first pull is a delta "
        "(GET /model?since=0); a server with another initial model answers one whose digest "
        "fails, and the worker pulls the whole model (ours; needs the server's --seed; on by "
        "default, --seeded-first-pull=false: a dense first pull)");
  t.add("pull-values", s.pull_values,
        "fp32, or fp16-increment: ask a server with the cheap pull (--pull-fraction, "
        "--pull-values fp16-increment) for its values as fp16 increments, 2 bytes instead of "
        "4, added to the copy (the copy stays the server's record bit for bit; ours). Not with "
        "--dense-pull or --shards")
      .choices({"fp32", "fp16-increment"});
  t.add("steps", c.max_steps, "stop after this many steps (0: run until stopped)").unit("steps");
  t.add("duration", c.max_seconds, "stop after this long (0: run until stopped)")
      .range(0, 1e9)
      .unit("seconds");
  t.add("slowdown", c.slowdown,
        "emulate a slower device: sleep F times each step's compute time (0: full speed)")
      .range(0, 1000);
  t.group("Filter dropout (DISTREAL: worker/README.md)");
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
  t.group("Training mode (federated rounds: worker/README.md)");
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
  for (const WorkerMode& mode : worker_modes())
    if (mode.declare) mode.declare(t, s);
  t.group("Network");
  t.add("request-timeout", s.request_timeout,
        "time one request (handshake and every block included) may take before "
        "the worker retries; behind a WAN that drops the server's ICMP errors, how long a "
        "restarted server goes "
        "unnoticed")
      .range(0.5, 3600)
      .unit("seconds");
  t.add("longest-request", s.longest_request,
        "a request the server keeps answering (the blocks of a wide pull or update) gets "
        "--request-timeout more after each answer, up to this long in all (ours; 0: "
        "--request-timeout bounds every request whole)")
      .range(0, 36000)
      .unit("seconds");
  t.add("coap-ack-timeout", c.timing.ack_timeout_seconds, "CoAP ACK_TIMEOUT")
      .range(1, 60)
      .unit("seconds");
  t.add("coap-ack-random-factor", c.timing.ack_random_factor, "CoAP ACK_RANDOM_FACTOR").range(1, 4);
  t.add("coap-max-retransmit", c.timing.max_retransmit, "CoAP MAX_RETRANSMIT").range(1, 10);
  t.add("coap-nstart", c.timing.nstart, "CoAP NSTART").range(1, 16);
  t.add("q-block", c.timing.q_block,
        "Q-Block (RFC 9177): pulls asked for once and sent in bursts (Q-Block2), updates "
        "sent in bursts answered once (Q-Block1) (false: RFC 7959 Block1/Block2, one "
        "exchange per block; a server without Q-Block is spoken to with those anyway)");
  t.add("coap-max-payloads", c.timing.max_payloads,
        "Q-Block MAX_PAYLOADS (RFC 9177): blocks per burst")
      .range(1, 64);
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
  t.group("Offline training (async: worker/README.md, \"An intermittent link\")");
  t.add("offline-steps", c.offline_steps,
        "while the server does not answer, keep training on the shard from the last model "
        "held, at most this many local steps, sent as one update when it answers (0: no bound "
        "on steps; with --offline-seconds 0 too: off, the worker idles as the paper's)")
      .unit("steps");
  t.add("offline-seconds", c.offline_seconds,
        "offline training for at most this long per outage (0: no bound on time); whichever "
        "bound comes first, the worker then idles until the server answers. --give-up-after "
        "still ends the run (its buffered steps unsent, in the stats) once the server has "
        "not answered for that long, offline or not")
      .range(0, 1e9)
      .unit("seconds");
  t.add("offline-lr", c.offline_lr,
        "the local steps' learning rate: the server's --lr, so the update carries the local "
        "trajectory (ours)")
      .range(1e-9, 100);
  t.add("offline-max-rate", c.offline_max_rate,
        "compress the accumulated offline update of s steps at c x s, at most this (ours; 0: "
        "at c, as an online update: top-k drops what it does not send, so s steps would keep "
        "what one step keeps)")
      .range(0, 1);
  t.add("offline-try-timeout", c.offline_try_timeout_seconds,
        "while offline, try the server with a small probe (GET /status?device=ME) bounded by "
        "this, and once it answers send the buffered update first and pull after (ours; 0: "
        "the try is the pull, bounded by --request-timeout, at the backoff's delays)")
      .range(0, 3600)
      .unit("seconds");
  t.add("offline-try-share", c.offline_try_share,
        "with --offline-try-timeout: the tries take at most this share of the time offline "
        "(the wait after a try of t seconds is t x (1 - share) / share)")
      .range(0.001, 1);
  t.group("A slow or metered link (async: worker/README.md, \"A metered or slow link\")");
  t.add("send-share", c.link.send_share,
        "choose c per update so that sending takes at most this share of a step's time, from "
        "the uplink measured on the worker's own updates (0: off, --rate for every update)")
      .range(0, 0.95);
  t.add("byte-budget", s.byte_budget,
        "at most BYTES/PERIOD on the wire (e.g. 50MB/day, 5MB/hour, 200kB/10min; estimated from "
        "payloads, blocks and handshakes): c chosen to pace it, and the worker waits (or trains "
        "offline with --offline-steps) rather than pass it; empty: no budget");
  t.add("budget-counts", s.budget_counts,
        "what the budget counts: both (updates and model pulls) or upload (updates only)")
      .choices({"both", "upload"});
  t.add("min-compression-rate", c.link.min_rate,
        "with --send-share or --byte-budget: the smallest c chosen")
      .range(1e-6, 1);
  t.add("max-compression-rate", c.link.max_rate,
        "with --send-share or --byte-budget: the largest c chosen (--rate is the first updates' c)")
      .range(1e-6, 1);
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

namespace {

// Fixed glibc malloc thresholds, unless the environment sets its own: a block of 64 KiB or
// more is mapped on its own and handed back when freed, and the heap's free top is trimmed
// past 128 KiB. With the dynamic threshold (the default) a freed megabyte buffer raises the
// threshold and the next ones stay in the heap, so the peak RSS held what a dense model pull
// had freed: 17.1 -> 16.6 MB on the host (paper CNN, full MNIST, 1 of 10 shards). The boards'
// unit sets the same values through MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_.
void fix_malloc_thresholds() {
#ifdef __GLIBC__
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 128 * 1024);
#endif
}

}  // namespace

int run_worker_program(WorkerSettings& s, const char* program) {
  fix_malloc_thresholds();
  logging::set_level(logging::parse_level(s.log_level).value_or(logging::Level::kInfo));
  const WorkerMode* mode = find_worker_mode(s.mode);
  std::unique_ptr<WorkerModeRun> run;
  try {
    if (!mode) throw std::invalid_argument("unknown --mode " + s.mode);
    if (!s.shards.empty() && s.mode != "async")
      throw std::invalid_argument("--shards works with --mode async only, not " + s.mode);
    if ((s.config.link.send_share > 0 || !s.byte_budget.empty()) && s.mode != "async")
      throw std::invalid_argument("--send-share / --byte-budget work with --mode async only, not " +
                                  s.mode);
    if (s.config.offline_training() && s.mode != "async")
      throw std::invalid_argument(
          "--offline-steps / --offline-seconds work with --mode async only, not " + s.mode);
    run = mode->prepare(s);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return exit_status(WorkerExit::kBadSettings);
  }
  const Dataset train = load_named_dataset_part(
      s.data, DataSplit::kTrain, [&](const Dataset& labels) { return run->shard(labels); });
  program::install_stop_signals();
  return run->run(train);
}

}  // namespace edgetrain::runtime
