// The worker loop of federated rounds (edgetrain-worker --mode rounds; worker/README.md,
// "Federated rounds"): poll GET /round; when selected, pull the round's model (GET /model),
// train the round's local steps on this worker's shard with plain SGD at `lr`, and post the
// model delta (new − start, compressed with the worker's compressor) to
// POST /round/update?examples=N, its fetched-version field carrying the round number; then
// wait for the next round. Same exit codes (worker_exit_codes.h), backoff and stop flag as
// Worker. Used from one thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/shard_sampler.h"
#include "model/trainer.h"
#include "worker/worker.h"

namespace edgetrain::runtime {

struct RoundWorkerConfig {
  WorkerConfig worker;        // server, identity, model, shard, batch, compressor, backoff, limits
  float lr = 0.05f;           // the local SGD step
  double poll_seconds = 0.5;  // between GET /round while not selected or done
  std::uint64_t max_rounds = 0;  // deltas accepted before the run ends; 0: until stopped
  // With a dropout table (worker.dropout.table_path): the share of the time left before the
  // round's deadline, after the pull and less the send's expected time (the pull's, scaled
  // by the last delta's size), that the local steps may take (ours: a margin for jitter).
  double deadline_share = 0.8;
  // Secure rounds, for tests only (tests/integration/rounds_secure_aggregation.sh): write the
  // round's start model, clipped delta and quantized delta to files in this folder (which
  // reveals them: never on a real device), and leave the run right after the step named
  // ("shares", "input" or, signed sessions, "consistency") was accepted, as a device that
  // drops out then.
  std::string test_secagg_dump_dir;
  std::string test_secagg_drop_after;
};

// What GET /round said (the JSON of server/round_coordinator.h), decoded defensively.
struct RoundInfo {
  std::uint64_t round = 0;
  std::uint64_t model_version = 0;
  double deadline_seconds = 0;
  bool selected = false;
  std::uint32_t local_steps = 0;
  std::uint32_t local_epochs = 0;  // > 0: passes over the device's shard instead of local_steps
  // A secure round (server/secure_round.h): the steps of /round/secagg/ under this session
  // and identity, with the delta clipped to clip_norm and quantized.
  bool secure = false;
  std::uint64_t secagg_session = 0;
  std::string secagg_identity;
  double clip_norm = 0;
  // A session that sends a subset (server --secagg-subset, privacy/subset.h): the public seed
  // and length of the entries every device masks; length 0: every entry.
  std::uint64_t secagg_subset_seed = 0;
  std::uint32_t secagg_subset_length = 0;
  // dp-fedavg with secure aggregation (privacy/distributed_noise.h): this device's share of
  // the noise, N(0, σ²) per value added after clipping, and the per-value range B it
  // quantizes the noised values in; 0 and 0: no noise, the range is clip_norm. The worker
  // refuses a session whose B does not cover the clip and the noise's tails.
  double dp_device_noise_stddev = 0;
  double secagg_value_bound = 0;
  // Keys signed by the devices' certificates and the consistency step (server
  // --secagg-signed-keys, privacy/secagg_signed.h). A worker with a certificate requires it
  // whatever the server says; one with a PSK identity cannot sign and does not take part.
  bool secagg_signed_keys = false;
  // SecAgg+ (server --secagg-neighbours, privacy/secagg_graph.h): k neighbours per device,
  // 0: every device. The key directory must say the same (the device refuses it otherwise).
  std::uint32_t secagg_neighbours = 0;
  // dp-fedavg's discrete noise (`"dp_noise": "skellam"`, privacy/skellam.h): the scale γ, each
  // device's Skellam variance v_d and the rounding's L2 bound Δ2; all 0 otherwise.
  double secagg_skellam_scale = 0;
  double secagg_skellam_variance = 0;
  double secagg_skellam_l2_bound = 0;
  // Adaptive clipping under secure aggregation (privacy/distributed_noise.h, the count): the
  // device appends b + N(0, σ²) (b = 1 when its delta was not clipped), quantized in
  // [−bound, bound]; both 0: no such value.
  double dp_clip_count_device_stddev = 0;
  double secagg_count_value_bound = 0;
};
// nullopt when the payload is not such an object (wrong types, missing keys, steps 0 or
// above 10^6, epochs above 1000; local_epochs may be absent: 0; a secure round without a
// session, an identity of 1..255 bytes or a positive clip norm; a subset without both its
// seed and a length of 1..2^28; a device noise without a value bound or either not a
// number; a "dp_noise" other than "skellam", or "skellam" without its three numbers).
// Whether the device can honour the noise is secure_send's check, not the parse's.
std::optional<RoundInfo> parse_round_info(std::span<const std::uint8_t> payload);
// The minibatches of one round: local_steps, or with local_epochs enough to pass over a
// shard of `shard_size` examples that many times (at least one, at most 10^6).
std::uint64_t round_steps(const RoundInfo& round, std::size_t shard_size, int batch);

// ---- A round's local training: the rule RoundWorker and the simulator share ---------------

// What a round's local training works with: the trainer, the worker's shard, its batch and
// local learning rate, and the scratch of a step (a batch's pixels and labels, the gradient).
struct LocalTrainer {
  Trainer& trainer;
  ShardSampler& sampler;
  int batch;
  float lr;
  std::span<std::uint8_t> pixels;  // batch × image bytes
  std::span<std::int32_t> labels;  // batch
  std::span<float> gradient;       // the model's parameter count
};
// What each loop does around a step besides the arithmetic.
struct LocalTrainingHooks {
  // Before each step (before its batch is drawn): false ends the training there (the
  // worker's stop flag; a simulated crash). None: every step runs.
  std::function<bool()> before_step;
  // After each step's gradient, before it is applied; `started` is when its compute began
  // (the worker's slowdown and its filter dropout's pacing).
  std::function<void(const BatchResult& result, std::chrono::steady_clock::time_point started)>
      after_gradient;
};
struct LocalTraining {
  std::uint64_t steps = 0;         // minibatches computed
  std::uint64_t examples = 0;      // of the steps applied: the delta's weight (examples=N)
  std::optional<float> last_loss;  // of the last step applied
};
// FedAvg's client update (McMahan et al. 2017) as the worker trains it: `steps` minibatches
// from the shard, each a plain SGD step x ← x − lr·g on `parameters`, which start as the
// round's model `start`; a step whose loss is not finite is skipped (nothing applied, its
// examples not counted). Then `delta` ← parameters − start: what the worker compresses and
// sends in place of a gradient (it may be the trainer's `gradient`, written after the last
// step).
LocalTraining train_round_locally(const LocalTrainer& with, std::uint64_t steps,
                                  std::span<const float> start, std::span<float> parameters,
                                  std::span<float> delta, const LocalTrainingHooks& hooks = {});

struct RoundWorkerStats {
  std::uint64_t rounds_trained = 0;   // deltas sent and accepted (2.04)
  std::uint64_t deltas_refused = 0;   // 4.09: the round closed, or another round/model
  std::uint64_t deltas_rejected = 0;  // 4.00, 5.00, ...: backed off
  std::uint64_t polls = 0, pulls = 0, steps = 0, retries = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::uint64_t secagg_requests = 0;  // secure rounds: the answered requests of their steps, polls included
  std::uint64_t secagg_not_yet = 0;   // of those, answered 5.03 (the step was still open)
  // Secure rounds that send a subset: the L2 norm of what this device holds back for later
  // rounds (error feedback), after its last masked input was taken.
  double secagg_unsent_norm = 0;
  std::uint64_t last_round = 0;
  // Every round whose delta the server acknowledged (2.04), in order. Round r is model
  // version r, so a server that kept what it acknowledged is at version r or later after
  // any restart (the emulator checks it, as for async workers' acknowledged versions).
  std::vector<std::uint64_t> acknowledged_rounds;
  float last_loss = 0;
  DropoutStatus dropout;  // filter dropout in force (worker/worker_dropout.h)
};

class RoundWorker {
 public:
  RoundWorker(const RoundWorkerConfig& config, const Dataset& train, ServerChannel& channel,
              const std::atomic<bool>& stop, WorkerLog log = {});
  ~RoundWorker();
  RoundWorker(const RoundWorker&) = delete;
  RoundWorker& operator=(const RoundWorker&) = delete;

  // One pass: poll the round; if selected and not done yet, pull, train and send. Returns
  // true when a delta was accepted. Throws WorkerFailure when it gives up.
  bool run_once();
  // run_once() until stop, max_rounds or the worker's max_seconds; `progress` after every
  // delta sent.
  RoundWorkerStats run(const std::function<void(const RoundWorkerStats&)>& progress = {});
  const RoundWorkerStats& stats() const;
  WorkerExit last_trouble() const;
  const std::string& last_trouble_message() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A RoundWorker over CoAP/DTLS, ending like run_worker() (exit status and reason).
struct RoundWorkerRun {
  RoundWorkerStats stats;
  WorkerExit exit = WorkerExit::kStopped;
  std::string reason;
};
RoundWorkerRun run_round_worker(const RoundWorkerConfig& config, const Dataset& train,
                                const std::atomic<bool>& stop, const WorkerLog& log = {},
                                const std::function<void(const RoundWorkerStats&)>& progress = {});

}  // namespace edgetrain::runtime
