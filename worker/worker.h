// The worker loop of DESIGN.md: pull the model, train one minibatch, compress, push;
// repeat. Survives a server that goes away or is in trouble (exponential backoff with
// jitter, then a fresh DTLS handshake), re-pulls when the server answers 4.09 (wrong model
// or too stale), gives up with an exit status of worker_exit_codes.h on what retrying cannot
// fix (a wrong key, an unknown identity, another model) and on a server silent for too
// long, and stops cleanly when asked. With offline training (WorkerConfig::offline_steps)
// it trains on its own while the server does not answer (worker/offline_training.h).
// `Worker` is the loop over a ServerChannel (its steps pull(), step(), push() can be driven
// one by one, against a fake server in tests); `run_worker()` runs it over CoAP/DTLS.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "worker/compressor.h"
#include "worker/link_adaptation.h"
#include "model/dataset.h"
#include "worker/server_channel.h"
#include "worker/worker_dropout.h"
#include "worker/worker_exit_codes.h"
#include "transport/codec.h"
#include "transport/coap_dtls.h"

namespace edgetrain::runtime {

struct WorkerConfig {
  std::string server_host = "127.0.0.1";
  std::uint16_t server_port = 5684;
  // A sharded server (server/README.md, "Sharded server"): every shard's host and port in
  // shard order, talked to through a ShardedServerChannel; empty: the one server above.
  std::vector<std::pair<std::string, std::uint16_t>> shards;
  std::string identity;
  std::vector<std::uint8_t> key;
  std::string model = "paper-cnn";
  std::uint32_t worker_id = 0;
  std::uint32_t worker_count = 1;
  bool label_skewed = false;
  int batch = 10;
  int threads = 1;
  CompressorOptions compressor;  // the paper's AdaComp by default; its value_encoding is the wire's
  int pull_every = 1;            // steps per model pull; 1 is the paper's (pull before every step)
  // false (default): after the first pull, ask only for the parameters changed since the
  // version held (GET /model?since=V) and overwrite those; the result is the server's model
  // bit for bit, checked by its digest. true: always download the dense model.
  bool dense_pull = false;
  // The seeded first pull (ours; worker/README.md "The first pull"): start from the model
  // built from `seed` (the server's --seed builds the same one), held as version 0, so the
  // first pull is GET /model?since=0 and gets a delta, not the dense model. A server whose
  // version 0 is another model (another seed, --init-from, an initialisation that differs)
  // answers a delta whose digest fails, or one resumed past its change record the dense
  // model: either way the worker then holds the dense model (stats:
  // seeded_first_pull_fallbacks). Ignored with dense_pull and with shards (the sharded
  // channel pulls every shard itself).
  bool seeded_first_pull = true;
  // Ask for the cheap pull's values as fp16 increments (GET /model?since=V&values=fp16-increment,
  // ModelReplica::accept_fp16_increments); a server without them answers fp32 as before.
  bool fp16_increment_pulls = false;
  std::uint64_t max_steps = 0;  // 0: until stopped
  double max_seconds = 0;       // 0: until stopped
  int request_timeout_ms = 60000;
  // Above request_timeout_ms: a request the server keeps answering (blocks of a wide pull
  // or update) may go on this long in all (transport::request_deadline(); ours). 0: the
  // request timeout bounds every request whole.
  int longest_request_ms = 0;
  // Emulates a slower device: after each step, sleep this many times the step's own
  // compute time (0: full speed; 3: a device four times slower).
  double slowdown = 0;
  // Filter dropout (DISTREAL, worker/worker_dropout.h): none, a static vector, or chosen at
  // run time from a dropout table against a step-time budget.
  WorkerDropoutSettings dropout;
  std::uint64_t seed = 1;
  // Transport: X.509 instead of PSK (identity = the certificate's CN; `identity` is then
  // only for logs); or INSECURE plain CoAP (`identity` declared, unproven; no key).
  std::optional<transport::CertificateFiles> certificates;
  bool insecure_plaintext = false;
  transport::CoapTiming timing = transport::CoapTiming::wan();
  // Backoff after a failed request (worker/backoff.h): the first wait is at most
  // backoff_initial, doubling per failure up to backoff_max. Tests shorten them.
  std::chrono::milliseconds backoff_initial{250};
  std::chrono::milliseconds backoff_max{30000};
  // Giving up (worker_exit_codes.h). A refusal that no retry can fix — the DTLS handshake
  // refused (wrong key or certificate), an identity the server does not know, a model that
  // is not the server's — is tried this many times in a row before the worker throws
  // WorkerFailure; a server that does not answer at all (or only answers 5.xx) is retried
  // with backoff, and given up once it has not answered for give_up_after_seconds
  // (0: never), checked after each failed request.
  int max_refusals = 3;
  double give_up_after_seconds = 600;
  // Offline training (worker/offline_training.h; ours, not the paper's): while the server
  // does not answer, keep taking local SGD steps from the last model held, at most
  // offline_steps of them (0: no bound on steps) and for at most offline_seconds
  // (0: no bound on time), then idle until it answers; then send them as one compressed
  // update computed from that model's version. Both 0 (the default): off, the worker idles
  // as soon as the server is away. give_up_after_seconds still ends the run, buffered
  // steps unsent (counted in the stats). offline_lr is the local step's learning rate: the
  // server's --lr (0.1 by default) makes the update the local trajectory's delta.
  std::uint64_t offline_steps = 0;
  double offline_seconds = 0;
  double offline_lr = 0.1;
  // The compression rate of the accumulated offline update (ours): c·s for s steps, at most
  // this (0: the online c). Top-k without error feedback drops what it does not send, so
  // s steps sent at the online c keep what one step would; at c·s they may send up to what
  // the s steps would have sent online, in one update.
  double offline_max_rate = 0;
  // How an offline worker tries its server (ours; worker/README.md, "An intermittent
  // link"). 0 (the default): the try is the pull it needs anyway, bounded by
  // request_timeout_ms, at the backoff's delays, and it blocks the local steps that long.
  // > 0: the try is a small probe (ServerChannel::probe(), GET /status?device=ME) bounded
  // by this, scheduled so that tries take at most offline_try_share of the time offline
  // (next_try_delay()); once a probe is answered, the buffered update goes first and the
  // model is pulled after it.
  double offline_try_timeout_seconds = 0;
  double offline_try_share = 0.1;
  bool offline_training() const { return offline_steps > 0 || offline_seconds > 0; }
  // Compression that follows the link (worker/link_adaptation.h; ours): c chosen per update
  // from the measured uplink, for a share of the step time and/or a byte budget, within
  // [min_rate, max_rate]; compressor.compression_rate is then the first updates' c. While
  // the budget is spent the worker waits, or trains offline when offline training is on.
  LinkAdaptationSettings link;
};

// "coaps://host:port" (port defaults to 5684) into host and port; throws std::invalid_argument.
void parse_server_uri(const std::string& uri, std::string& host, std::uint16_t& port);
// The same, also accepting "coap://host:port" (plain CoAP, port defaults to 5683), which
// sets `plaintext`.
void parse_server_uri(const std::string& uri, std::string& host, std::uint16_t& port,
                      bool& plaintext);
// Hex text (whitespace ignored) into bytes; throws std::invalid_argument.
std::vector<std::uint8_t> parse_hex_key(const std::string& text);

// The examples a worker of `config` trains on (worker_id of worker_count, seed, label skew):
// shard_of() (model/dataset.h). The async, rounds and MD-GAN loops sample it, and
// edgetrain-worker loads only its images (load_dataset_part).
std::vector<std::uint32_t> worker_shard(const WorkerConfig& config, const Dataset& train);

struct WorkerStats {
  std::uint64_t steps = 0;  // minibatches trained
  std::uint64_t updates_accepted = 0;
  std::uint64_t updates_refused = 0;   // 4.09: re-pulled
  std::uint64_t updates_rejected = 0;  // any other answer (4.00, 4.13, 5.00...): logged, backed off
  std::uint64_t pulls = 0;
  std::uint64_t delta_pulls = 0;  // pulls answered with a model delta
  std::uint64_t delta_mismatches =
      0;  // deltas that did not reproduce the server's model (re-pulled dense)
  // The first pull that brought a model: "pending" before it, then "delta" (from the seeded
  // version 0) or "dense", and its payload bytes. A seeded first pull whose delta did not
  // reproduce the server's model counts in seeded_first_pull_fallbacks (and in
  // delta_mismatches); the dense pull after it is then the first pull.
  std::string first_pull = "pending";
  std::uint64_t first_pull_bytes = 0;
  std::uint64_t seeded_first_pull_fallbacks = 0;
  std::uint64_t bytes_sent = 0;      // encoded update payloads
  std::uint64_t bytes_received = 0;  // encoded model payloads
  std::uint64_t server_version = 0;  // as last reported by the server
  std::uint64_t retries =
      0;  // failed requests and server trouble survived (each waited the backoff)
  std::uint64_t non_finite_steps = 0;  // skipped: the gradient was NaN or infinite
  float last_loss = 0;
  DropoutStatus dropout;  // filter dropout in force (worker/worker_dropout.h)
  // Offline training (WorkerConfig::offline_steps): whether the worker is offline now (the
  // server not answering, the worker training on its own), the time it spent so, the local
  // steps it took so, and the steps it holds that the server has not acknowledged yet (the
  // accumulated ones and an update that did not go when the server went away).
  bool offline = false;
  double offline_seconds = 0;
  std::uint64_t offline_steps = 0;
  std::uint64_t buffered_steps = 0;
  // Accumulated offline updates (one per time offline) the server accepted (2.04), and
  // those it answered otherwise (4.09: too stale; 4.22, 5.00, ...), with their steps: the
  // offline work that was lost, logged when it happens.
  std::uint64_t offline_updates_accepted = 0;
  std::uint64_t offline_updates_refused = 0;
  std::uint64_t offline_steps_refused = 0;
  // The last accumulated offline update the server accepted: the version its steps started
  // from and the version it produced (their difference less one is its staleness), and its
  // steps. 0 before any.
  std::uint64_t last_offline_from_version = 0;
  std::uint64_t last_offline_acknowledged_version = 0;
  std::uint64_t last_offline_steps = 0;
  // While offline: the tries of the server (pulls, or probes with offline_try_timeout) and
  // the time they took, during which no local step was taken.
  std::uint64_t offline_tries = 0;
  double offline_try_seconds = 0;
  // Compression that follows the link (WorkerConfig::link): the c of the last update, the
  // uplink estimate (bytes/s through the bottleneck and the fixed time of an exchange), a
  // step's compute time and a loop turn's without its send (pull included), and the byte budget:
  // its estimated wire bytes in the current period and in all (what is counted: worker/README.md),
  // whether the worker is waiting for it now, how often and how long it waited.
  double compression_rate = 0;
  double uplink_bytes_per_second = 0;
  double uplink_fixed_seconds = 0;
  double step_seconds = 0;
  double turn_seconds_without_send = 0;
  std::uint64_t budget_spent_bytes = 0;
  std::uint64_t budget_counted_bytes = 0;
  bool budget_waiting = false;
  std::uint64_t budget_waits = 0;
  double budget_wait_seconds = 0;
  // With shards: per shard, the highest version it acknowledged (ShardedServerChannel);
  // server_version is then their sum. Filled by run_worker(), not by the loop.
  std::vector<std::uint64_t> shard_versions;
};

using WorkerLog = std::function<void(const std::string& line)>;

struct BatchResult;
// The asynchronous step's rule after the gradient, which Worker::step() and the simulator
// share: a step whose loss is not finite, or whose gradient has a value that is not finite
// (NaN or infinite: a diverged model, or a corrupt pull; the compressor refuses it), is
// skipped: false, and nothing may be sent. Otherwise the gradient is compressed into
// `update`'s tensors (the compressor's residuals move on) and true.
bool compress_step(const BatchResult& result, std::span<const float> gradient,
                   Compressor& compressor, transport::SparseUpdate& update);

using WorkerProgress = std::function<void(const WorkerStats&)>;

// One worker: its model, trainer, shard, compressor and copy of the server's model, and
// the server behind `channel`. Used from one thread. Sequence numbers start from the wall
// clock in µs, so they keep growing across restarts (the server drops replays).
class Worker {
 public:
  // Checks `config` (std::invalid_argument; ModelError when the model does not fit the
  // data) and builds everything a step needs. `train`, `channel` and `stop` are not owned
  // and must outlive the worker; `stop` cuts backoff and slowdown sleeps short.
  Worker(const WorkerConfig& config, const Dataset& train, ServerChannel& channel,
         const std::atomic<bool>& stop, WorkerLog log = {});
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Whether the next step must pull first: no model yet, the pull interval is reached, or
  // the last push was refused with 4.09, failed twice, or the last step was not finite.
  bool needs_pull() const;
  // GET the model (the whole model, or the delta since the version held). Returns true
  // when the worker now holds the server's model. False, to be tried again, after a
  // transport failure or an answer other than 2.05 (stats().retries; waits the backoff
  // first), after a model of another layout (waits the backoff too) and after a delta that
  // did not reproduce the server's model (stats().delta_mismatches; the next pull asks for
  // the whole model, without waiting). Throws WorkerFailure when it gives up (see
  // WorkerConfig::max_refusals), std::runtime_error after three delta mismatches in a row
  // (a server that keeps sending unusable deltas is broken). With offline training on and a
  // model held, a server that does not answer sends the worker offline instead of into the
  // backoff's wait (run() trains through it).
  bool pull();
  // Trains one minibatch on the model held and compresses its gradient into the next
  // update. Returns false when the gradient was not finite (NaN or infinite: a diverged
  // model, or a corrupt pull): nothing to push, and the next step pulls first
  // (stats().non_finite_steps); throws std::runtime_error after 10 such steps in a row.
  bool step();
  // POST /update with the last step's update; after a transport failure once more, with the
  // same bytes and sequence number (the server applies it once). With offline training on
  // (WorkerConfig::offline_steps) and a server that does not answer, no second try: the
  // update is kept, to be sent first when the server answers again, and the worker goes
  // offline (run() then trains locally; a failed pull does the same). 2.04: accepted, and the
  // server's version noted; 4.09: refused, the next step pulls first; 4.01/4.03: the
  // identity is not (or no longer) authorized, a refusal like an unknown identity; any
  // other code (5.00 from a server whose disk is full, 4.00, ...): rejected, logged, and
  // the backoff waited, which keeps growing until an update is accepted. Throws
  // WorkerFailure when it gives up.
  void push();
  // pull() when needed, step(), push(), until `stop`, max_steps or max_seconds; `progress`
  // after every push. Offline (WorkerConfig::offline_steps), local steps between tries of
  // the server instead, and `progress` after each of them too; steps offline count in
  // max_steps. Buffered steps when the run ends are not sent (stats().buffered_steps).
  WorkerStats run(const WorkerProgress& progress = {});

  const WorkerStats& stats() const;

  // The last failure seen (kStopped: none): what the worker would exit with if the run
  // ended now without any update accepted (kServerUnreachable, kHandshakeRefused, ...),
  // and its message.
  WorkerExit last_trouble() const;
  const std::string& last_trouble_message() const;

 private:
  // Offline training (WorkerConfig::offline_steps): one turn of the loop while the server
  // is away: a try (the pull the worker needs anyway; once it answers, the update that did
  // not go, then the accumulated steps as one update), or one local step, or, at the
  // bound, a wait for the next try.
  void run_offline(const WorkerProgress& progress);
  // The try with WorkerConfig::offline_try_timeout_seconds: a probe; once it is answered,
  // the pending update, then the accumulated steps as one update, then back online (the
  // next turn pulls). The next try is offline_try_share's (next_try_delay()).
  void try_with_probe(const WorkerProgress& progress);
  // POSTs the pending update (same bytes as before). False when the server is away again.
  bool post_pending(const WorkerProgress& progress);

  struct State;
  std::unique_ptr<State> state_;
};

// The wait before the next try of the server while offline, after a try that took
// `tried` (WorkerConfig::offline_try_share): tries take at most `share` of the time, so
// tried·(1 − share)/share, at least `floor`. Ours.
std::chrono::steady_clock::duration next_try_delay(std::chrono::steady_clock::duration tried,
                                                   double share,
                                                   std::chrono::steady_clock::duration floor);

// How a run ended: its stats, and the program's exit status with the reason.
struct WorkerRun {
  WorkerStats stats;
  WorkerExit exit = WorkerExit::kStopped;
  std::string reason;  // empty for kStopped
};

// The CoAP/DTLS client of a worker's settings (server, PSK identity and key or certificates,
// plain CoAP, timing, request timeout); its waits look at `stop`. Every mode's run uses it.
transport::CoapDtlsClient::Options coap_client_options(const WorkerConfig& config,
                                                       const std::atomic<bool>& stop);

// How a run that applied nothing ends: with the last trouble's exit status (kNothingApplied
// when there was none) and a reason that names `nothing` and that trouble.
void end_without_anything_applied(WorkerExit last_trouble, const std::string& last_trouble_message,
                                  const std::string& nothing, WorkerExit& exit,
                                  std::string& reason);

// A Worker over CoAP/DTLS to config.server_host (CoapServerChannel), which looks at `stop`
// at least every 100 ms while it waits for the server. Runs until `stop` becomes true,
// max_steps or max_seconds is reached, or it gives up (WorkerFailure: exit and reason).
// A run that ends without any update accepted ends with the last trouble's exit status
// (kServerUnreachable when the server never answered, ...) or kNothingApplied. Throws for
// bad configuration or data (std::invalid_argument, ModelError) and for a broken server
// (std::runtime_error).
WorkerRun run_worker(const WorkerConfig& config, const Dataset& train,
                     const std::atomic<bool>& stop, const WorkerLog& log = {},
                     const WorkerProgress& progress = {});

}  // namespace edgetrain::runtime
