// edgetrain's in-process asynchronous simulator: N virtual workers running the real
// trainer, compressor and codec against the real server core (parameter store with the
// staleness rule), on a virtual clock.
//
// Each worker loops: pull the model (version t_fetch), compute the gradient of one
// minibatch of its shard, compress, encode; the encoded update reaches the server after the
// worker's step time. Step times differ per worker (a log-normal speed factor drawn once,
// plus per-step jitter), so updates arrive out of order and with realistic staleness.
// Events are processed in virtual-time order (ties by worker id), which makes a run
// deterministic for a seed. Optional failures: a worker crashes mid-step with some
// probability, loses that update, and comes back after a downtime.
//
// What is measured: the encoded bytes of every update that reaches the server (ingress),
// the dense-model bytes the workers pull, and test accuracy at regular intervals.
//
// Federated rounds (SimMode::kRounds, FedAvg; the server's --mode rounds): each round a
// seeded sample of the workers trains local SGD steps from the round's model with the same
// trainer, sends its delta (new − start) through its own compressor and the codec, and the
// server decodes the deltas it got before the round closed, aggregates them with
// server::aggregate_deltas (the server's own function) and moves the model by server_lr
// times the result, applied through the parameter store as the server's round close is.
// A worker's local training lasts the sum of its step times (speed factor and jitter as in
// async mode). The round closes as the server's does: when every selected worker answered,
// or at the deadline (drop-stragglers) or at the server's safety limit of
// kWaitAllSafetyFactor deadlines (wait-all), whichever comes first; a round with no delta
// yet by then gets a new deadline. A delta that arrives after the close (a straggler's) is
// counted in ingress but left out of the aggregate, and its worker, still busy, starts the
// next round late if selected again; a crashed worker starts late when it is back. Virtual
// time advances by the round's duration; pulls and transfers take no time, as in async mode.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "worker/compressor.h"
#include "model/dataset.h"
#include "model/filter_dropout.h"
#include "model/model.h"
#include "model/trainer.h"
#include "server/parameter_store.h"
#include "server/replica_pull.h"
#include "model/published_model.h"
#include "server/adaptive_clipping.h"
#include "server/round_aggregation.h"
#include "sim/model_attack.h"
#include "transport/codec.h"

namespace edgetrain::sim {

enum class SimMode { kAsync, kRounds };
const char* sim_mode_name(SimMode mode);
SimMode parse_sim_mode(
    const std::string& name);  // "async" | "rounds"; std::invalid_argument otherwise

// The server's round policies (server/round_aggregation.h), the same enum and names; wait-all
// still closes a round kWaitAllSafetyFactor deadlines after it opened (a selected worker that
// crashed never answers).
using server::kWaitAllSafetyFactor;
using server::parse_round_policy;
using server::round_policy_name;
using server::RoundPolicy;

// The deadline when RoundsConfig::deadline_steps is 0: this many times a worker's local
// steps (the mean over the workers, with local_epochs), in mean step times (ours).
inline constexpr double kDefaultDeadlineFactor = 1.5;

// Federated rounds (SimMode::kRounds). Time is in mean step times, as everywhere here.
struct RoundsConfig {
  std::uint32_t local_steps = 10;  // minibatches a selected worker trains per round
  std::uint32_t local_epochs =
      0;                   // > 0: passes over the worker's shard instead (runtime::round_steps)
  float local_lr = 0.05f;  // the worker's plain SGD step (runtime::RoundWorkerConfig::lr)
  float server_lr = 1.0f;  // the model moves by server_lr × the aggregated delta
  // Workers selected per round: max(1, round(client_fraction · workers)), a seeded draw
  // without replacement among the workers that have not left (ours: the server draws each
  // device with probability client_fraction instead; the count here is FedAvg's C·K).
  double client_fraction = 1.0;
  server::AggregationRule aggregation;  // the rule and trimmed-mean's β
  // What the server takes of a delta (server::RoundCoordinator's rules): a delta with a value
  // whose step passes the store's parameter bound is refused (server::round_delta_problem),
  // and with clip_norm > 0 one above that L2 norm is scaled to it (server::clip_round_delta).
  double clip_norm = 0;
  // Experiment knob (ours, issue 37): workers 0..malicious_workers-1 train as the others but
  // send their delta with `attack` applied (sim/model_attack.h).
  int malicious_workers = 0;
  ModelAttack attack;
  // aggregation dp-fedavg (issue 39): the close adds N(0, (z·clip_norm/m)²) per parameter, m
  // the workers selected per round (the fixed denominator), from a generator seeded by the
  // run's seed (a simulation's noise need not be secret); the accountant (server/
  // dp_accountant.h, q = client_fraction: ours, the sampling here is without replacement,
  // not Poisson) gives ε at dp_delta after every round (SimResult::dp_epsilon_by_round).
  double dp_noise_multiplier = 0;
  double dp_delta = 1e-5;
  // The server's --dp-target-epsilon: the run ends before a round would take ε past it
  // (SimResult::privacy_exhausted); 0: no limit.
  double dp_target_epsilon = 0;
  // Distributed noise, secure aggregation's noise rule (privacy/distributed_noise.h; the
  // server's dp-fedavg with --secure-aggregation --min-clients c): with dp_noise_survivors
  // c > 0 each delta that reaches the close is made dense, gets N(0, (z·clip_norm/√c)²) per
  // value from the noise generator, is quantized in the ring's range B = S + 10σ_d for N =
  // the round's deltas (privacy::quantize_bounded, to nearest), and the ring sum read back
  // over m is the close, with no noise of the server's. (No masks: they cancel in the sum.)
  // 0: the server's central noise.
  std::uint32_t dp_noise_survivors = 0;
  // With dp_noise_survivors: the discrete noise (the server's --dp-noise skellam,
  // privacy/skellam.h): each delta scaled by γ, rounded at random within Δ2, plus Sk(v_d) per
  // value from the noise generator; the ring sum read back as sum/γ over m; the accountant
  // counts the Skellam mechanism (server::DpAccountant::skellam).
  bool dp_skellam = false;
  // The server's adaptive clipping (server/adaptive_clipping.h): clip_norm is the first
  // round's; the count's noise from the run's noise generator.
  server::AdaptiveClipping adaptive_clipping;
  RoundPolicy policy = RoundPolicy::kDropStragglers;  // the server's default
  double deadline_steps = 0;                          // 0: kDefaultDeadlineFactor × local steps
  std::uint64_t max_rounds = 50;  // rounds closed (model versions) before the run ends
};

struct SimConfig {
  SimMode mode = SimMode::kAsync;
  RoundsConfig rounds;  // with mode kRounds; max_updates and the staleness settings are then unused
  std::string model = "paper-cnn";  // built-in name, spec text or spec file
  // --init-from: a safetensors file of the model's tensors (a checkpoint, or what
  // tools/onnx_to_edgetrain.py writes) to start from instead of initialize(seed).
  std::string init_from;
  int workers = 10;
  int batch = 10;
  float learning_rate = 0.1f;
  // Async mode: the server's learning-rate schedule (server::LearningRateSchedule, step decay
  // at applied-update versions; the server's --lr-decay-at). Default: none, a constant lr.
  server::LearningRateSchedule lr_schedule;
  runtime::CompressorOptions
      compressor;  // default: the paper's top-k, c = 0.01; its value_encoding is the wire's
  server::StalenessRule staleness_rule = server::StalenessRule::kPerParameterSigma;
  std::uint32_t max_staleness =
      server::kDefaultMaxStaleness;  // D: older updates are refused, the worker re-pulls
  bool label_skewed = false;         // shards: i.i.d. (default) or label-skewed
  runtime::LabelSkew skew;
  double speed_spread = 0.5;       // sigma of the log-normal per-worker speed factor (0: identical)
  double step_jitter = 0.1;        // sigma of the log-normal per-step jitter
  double failure_probability = 0;  // per step: the worker crashes and loses this update
  double downtime_steps = 10;      // mean downtime after a crash, in step times
  // Which workers can fail at all: a seeded choice of round(failing_fraction · workers) of
  // them (1: every worker, as before). The others never fail.
  double failing_fraction = 1;
  // A worker that fails leaves for good instead of coming back after its downtime.
  bool failures_permanent = false;
  std::uint64_t max_updates = 2000;  // updates applied by the server
  std::uint64_t eval_every =
      100;  // applied updates (rounds closed, in rounds mode) between evaluations
  std::size_t eval_examples = 0;           // 0: the whole test set
  std::optional<double> stop_at_accuracy;  // stop once the test accuracy reaches this
  std::uint64_t seed = 1;
  int threads = 1;  // compute threads for the trainer's kernels
  // XNNPACK (fast; bit-identical runs on one machine, but its micro-kernels depend on the
  // CPU's instruction set) or the reference loops (slow; the same bits on every x86-64
  // machine, which is what the recorded determinism figures rely on).
  runtime::KernelBackend kernels = runtime::KernelBackend::kXnnpack;
  // Filter dropout (DISTREAL, model/filter_dropout.h): one drop rate per conv layer, or
  // empty for none. Every simulated worker's step then trains a random sub-network.
  std::vector<float> conv_drop_rates;
  runtime::DropoutRescale dropout_rescale = runtime::DropoutRescale::kInverted;
  // Pulls: workers compute on the server's exact model (default), or on the published model
  // (model/published_model.h) when publish.every > 0. pull_bytes counts a dense model per
  // pull, unless delta_pulls (or a published model): then each pull counts the bytes of the
  // model delta since the version the worker held (GET /model?since=V), as the server sends.
  runtime::PublishOptions publish;
  bool delta_pulls = false;
  // The cheap pull (server/replica_pull.h, ours): each worker's pull sends the largest
  // changes since the copy it holds, the server keeps the rest per worker; counted as the
  // model delta it sends. Excludes publish.
  server::ReplicaPullOptions replica_pull;
  // Every worker starts holding the run's seeded initial model, version 0, as the server does
  // (the real worker's and server's seeded start; gossip peers' ModelReplica::assume), so its
  // first pull is a delta from version 0 (exact, or the cheap pull's) instead of the dense
  // model. Needs delta pulls (delta_pulls, publish or replica_pull). false: the first pull is
  // dense, as before.
  bool seeded_first_pull = false;
  // Devices reachable part of the time (issue 38 part 1; the emulator's --reachable and
  // --outage-period in step times; async mode). With reachable < 1, from outage_start_steps
  // on, worker w's link is down for (1 − reachable)·outage_period_steps of every
  // outage_period_steps, the down part starting at w·outage_period_steps/workers (phases
  // spread evenly, as edgetrain-emulate spreads them). An update whose arrival finds the
  // link down is kept and sent first when the link is back; a worker notices its link's
  // return at once (ours: the real worker's probes, --offline-try-timeout, bound that delay
  // instead). While down, a worker that has pulled once trains offline with offline_steps
  // > 0 (runtime::OfflineAccumulator, the real worker's: local SGD at learning_rate from
  // the copy it last pulled, at most offline_steps steps) and sends the sum as one update
  // claiming its steps (compressed at runtime::offline_compression_rate with
  // offline_max_rate) after the kept one; with 0 it idles, as the paper's worker does.
  double reachable = 1;
  double outage_period_steps = 120;
  double outage_start_steps = 0;
  std::uint64_t offline_steps = 0;
  double offline_max_rate = 0;
  // The server's --offline-step-credit and --offline-average (server/parameter_store.h,
  // "Offline updates").
  std::uint32_t offline_step_credit = 0;
  bool offline_average = false;
  // Local differential privacy on asynchronous updates (issue 39 part 3, a measurement of
  // ours, not in the worker; docs/privacy.md "Asynchronous AdaComp"): with local_dp_clip > 0
  // each step's gradient is clipped to that L2 norm and gets N(0, (z·clip)²) per parameter
  // (z = local_dp_noise_multiplier, seeded noise) before it is compressed, as a worker
  // would do before anything leaves the device. SimResult::local_dp_epsilon is the
  // example-level ε of the device with the most steps (add/remove adjacency; the clipped
  // batch mean has sensitivity 2·clip, so the accountant runs at z/2; sampling rate
  // batch / shard size, treated as Poisson: ours).
  double local_dp_clip = 0;
  double local_dp_noise_multiplier = 0;
  double local_dp_delta = 1e-5;
};

struct EvalPoint {
  std::uint64_t updates = 0;        // applied by the server so far (rounds mode: rounds closed)
  double time = 0;                  // virtual time, in mean step times
  std::uint64_t ingress_bytes = 0;  // encoded updates that reached the server, cumulative
  std::uint64_t pull_bytes = 0;     // encoded models (or model deltas) sent to workers, cumulative
  double accuracy = 0;
  double loss = 0;
};

struct SimResult {
  std::string label;
  std::vector<EvalPoint> curve;
  std::uint64_t updates_applied = 0;
  std::uint64_t updates_refused =
      0;  // too stale, or beyond the parameter bound (server::ParameterStoreOptions)
  std::uint64_t updates_lost = 0;  // worker crashed mid-step
  // Async: steps whose gradient was not finite, skipped and not sent (runtime::compress_step).
  std::uint64_t non_finite_steps = 0;
  std::uint64_t workers_left = 0;  // failed for good (SimConfig::failures_permanent)
  // The run stopped before its budget because the server refused every update for a long
  // while (kStallArrivals): a diverged model whose updates all hit the parameter bound, or
  // workers all beyond the staleness bound. The curve ends with an evaluation at the stop.
  bool stalled = false;
  // Rounds mode: updates_applied counts rounds closed (each one model version),
  // updates_refused closes the store refused, updates_lost the deltas of selected workers
  // that crashed during their local training.
  std::uint64_t round_stragglers = 0;  // deltas that arrived after their round closed (dropped)
  std::uint64_t empty_rounds =
      0;                         // rounds that ended with no delta (every selected worker crashed)
  double mean_round_deltas = 0;  // deltas aggregated per closed round
  std::uint64_t round_deltas_refused = 0;  // a value past the bound (the server's 4.22)
  std::uint64_t round_deltas_clipped = 0;  // scaled to RoundsConfig::clip_norm
  std::vector<double> dp_epsilon_by_round;  // dp-fedavg: ε after each closed round
  std::vector<double> clip_norm_by_round;   // adaptive clipping: the norm each round clipped at
  double local_dp_epsilon = 0;              // async with local DP: see SimConfig::local_dp_clip
  // Async with outages (SimConfig::reachable): local steps taken offline, the updates that
  // carried them (applied, refused as too stale or beyond the bound), and the updates kept
  // while the link was down and sent when it was back.
  std::uint64_t offline_steps = 0;
  std::uint64_t offline_updates_applied = 0;
  std::uint64_t offline_updates_refused = 0;
  std::uint64_t kept_updates = 0;
  bool privacy_exhausted = false;           // the run ended at --dp-target-epsilon
  double virtual_time = 0;       // at the end of the run, in mean step times
  std::uint64_t ingress_bytes = 0;
  std::uint64_t pull_bytes = 0;
  double mean_delay = 0;  // t − t_fetch over applied updates
  std::uint64_t max_delay = 0;
  double mean_update_bytes = 0;
  double mean_pull_bytes = 0;
  double published_lag = 0;  // with a published model: ‖W − P‖ / ‖W‖ at the end
  double wall_seconds = 0;
  std::vector<float> final_parameters;  // the server's model at the end (runtime::Model's arena)
  double final_accuracy() const { return curve.empty() ? 0 : curve.back().accuracy; }
  double best_accuracy() const;
  // Ingress bytes at the first evaluation whose accuracy reaches `target`, if any.
  std::optional<std::uint64_t> ingress_bytes_to(double target) const;
  // Both directions, what the devices pay for (issue 38): upload (ingress) plus download
  // (pulls) at the first evaluation whose accuracy reaches `target`, if any.
  std::optional<std::uint64_t> traffic_bytes_to(double target) const;
  std::optional<std::uint64_t> updates_to(double target) const;
  std::optional<double> time_to(double target) const;
};

// SimConfig::reachable's schedule: whether worker `worker`'s link is down at virtual time
// `time`, and when a link down at `time` is up again (`time` itself when it is up).
bool link_down_at(const SimConfig& config, int worker, double time);
double link_up_again(const SimConfig& config, int worker, double time);

struct Progress {
  std::uint64_t updates, max_updates;
  double accuracy;  // last evaluated, -1 before the first
  std::uint64_t ingress_bytes;
  double mean_delay;
  std::uint64_t round_stragglers = 0;  // rounds mode (updates are then rounds)
};
using ProgressCallback = std::function<void(const Progress&)>;

// Updates refused in a row (none applied) after which a run counts as stalled and stops:
// at least this many, and at least ten per worker.
inline constexpr std::uint64_t kStallArrivals = 200;
// Rounds mode: rounds in a row that left the model unchanged (no delta before the close, or
// a close the store refused: the aggregated step would leave a parameter beyond its bound)
// after which the run counts as stalled and stops.
inline constexpr std::uint64_t kStallRounds = 50;

// Throws std::invalid_argument, saying what is wrong, for a configuration run_simulation()
// refuses (those checks that need no data or model).
void check_sim_config(const SimConfig& config);

// Runs one simulation. Throws std::invalid_argument on a bad configuration and
// runtime::ModelError if the model does not fit the data.
SimResult run_simulation(const SimConfig& config, const runtime::Dataset& train,
                         const runtime::Dataset& test, const std::string& label,
                         const ProgressCallback& progress = {});

}  // namespace edgetrain::sim
