#include "emulation/emulator_settings.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include "emulation/cpu_plan.h"
#include "emulation/plan_draws.h"
#include "emulation/report_files.h"

namespace edgetrain::emulation {

namespace {

// What heads `edgetrain-emulate --help`.
const char* const kEmulatorDescription =
    "edgetrain-emulate [options]: one emulated experiment with the real programs: "
    "edgetrain-server on 127.0.0.1\n"
    "and N edgetrain-worker processes behind a user-space link impairer (emulation/README.md). "
    "Settings come\n"
    "from flags, or from a TOML file (--config) whose keys are the flags' names with '_'.";

void declare_experiment(settings::Table& t, EmulatorSettings& s) {
  t.group("Experiment");
  t.add("workers", s.workers, "number of worker processes").range(1, 4000);
  // Any model the programs take (the server, the workers or peers and edgetrain-fleet-eval
  // get it as it is, and each refuses a bad one naming the statement): this library may not
  // depend on model/ (emulation/CMakeLists.txt), so it does not parse it itself.
  t.add("model", s.model,
        "the model, as the programs' --model: paper-cnn, mlp, mobilenet-mini, resnet-8, "
        "resnet-8-32x32x3, ds-cnn, cnn1d, a spec or a spec file (an absolute path); every "
        "mode takes any of them");
  t.add("data", s.data, "training and test data")
      .choices({"mnist", "mnist-small", "fashion-mnist"});
  t.add("compressor", s.compressor, "adacomp, or none (dense ASGD)").choices({"adacomp", "none"});
  t.add("rate", s.rate, "AdaComp compression rate (the worker checks it)");
  t.add("error-feedback", s.error_feedback,
        "workers keep what they did not send (beyond the paper)");
  t.add("fp16", s.fp16, "workers send values as fp16 (excludes --sign-scale)");
  t.add("sign-scale", s.sign_scale,
        "workers send one fp32 scale and a sign bit per value (excludes --fp16)");
  t.add("pull-every", s.pull_every, "steps per model pull (1: the paper's)").range(1, 1000000);
  t.add("batch", s.batch, "minibatch (the worker checks it)");
  t.add("lr", s.lr, "the server's learning rate (the server checks it)");
  t.add("lr-decay-at", s.lr_decay_at,
        "the server's --lr-decay-at: the learning rate times --lr-decay-factor from each of "
        "these model versions on, e.g. 3000,4500 (the server checks them); empty: a constant --lr");
  t.add("lr-decay-factor", s.lr_decay_factor, "the server's --lr-decay-factor, with --lr-decay-at")
      .range(1e-6, 0.999999);
  t.add("max-staleness", s.max_staleness,
        "the server's largest accepted delay (0: the server's default)");
  t.add("max-parameter-magnitude", s.max_parameter_magnitude,
        "the server's bound on parameters; updates beyond it get 4.22 (0: the server's default)")
      .range(0, 3.4e38);
  t.add("publish-every", s.publish_every,
        "the server's --publish-every: workers pull a published model that "
        "follows the true one by small steps (0: the exact model)")
      .range(0, 1000000)
      .unit("updates");
  t.add("publish-fraction", s.publish_fraction, "the server's --publish-fraction").range(1e-6, 1);
  t.add("pull-fraction", s.pull_fraction,
        "the server's --pull-fraction: the cheap pull (0: exact pulls)")
      .range(0, 1);
  t.add("pull-min-entries", s.pull_min_entries, "the server's --pull-min-entries");
  t.add("entry-staleness", s.entry_staleness,
        "the server's --entry-staleness: σ per entry from its records of the workers' copies "
        "(needs --pull-fraction)");
  t.add("pull-values", s.pull_values,
        "fp32, or fp16-increment: the server's and every worker's --pull-values (the cheap "
        "pull's values as fp16 increments; needs --pull-fraction)")
      .choices({"fp32", "fp16-increment"});
  t.add("dense-pull", s.dense_pull,
        "workers pull the dense model every time (--dense-pull: ASGD's pulls)");
  t.add("seeded-first-pull", s.seeded_first_pull,
        "workers start from the model built from --seed as version 0 (their "
        "--seeded-first-pull; =false: the first pull is dense)");
  t.add("duration", s.duration, "stop after this long").range(0, 1e9).unit("seconds");
  t.add("target-accuracy", s.target_accuracy,
        "stop once the evaluator reports this and every --fail event happened (0: off)")
      .range(0, 1);
  t.add("shards", s.shards,
        "async: a sharded server of this many edgetrain-server --shard I/N processes, every worker "
        "posting its update's slices to each (0: one unsharded server)")
      .range(0, 64);
  t.add("shard-checkpoint-every", s.shard_checkpoint_every,
        "with --shards: updates between a shard's checkpoints, "
        "from which the assembled model is evaluated")
      .range(1, 1000000);
  t.add("eval-interval", s.eval_interval, "between the server's evaluations")
      .range(0, 1e9)
      .unit("seconds");
  t.add("request-timeout", s.request_timeout,
        "a worker's bound on one request (the impairer passes no ICMP)")
      .range(0, 1e9)
      .unit("seconds");
  t.add("longest-request", s.longest_request,
        "the worker's --longest-request (0: --request-timeout bounds every request whole)")
      .range(0, 36000)
      .unit("seconds");
  t.add("seed", s.seed, "draws of link profiles, slowdowns and loss");
  t.add("label", s.label, "name of the run in plots and tables (empty: from the options)");
  t.add("label-skew", s.label_skew,
        "label-skewed shards (the worker's --label-skew) instead of i.i.d.");
  t.group("Federated rounds (server/README.md, worker/README.md)");
  t.add(
       "mode", s.mode,
       "async: asynchronous SGD; rounds: federated rounds (server and workers); gossip: no server, "
       "the workers are peers that average models with their neighbours")
      .choices({"async", "rounds", "gossip"});
  t.add("round-policy", s.round_policy, "rounds: drop-stragglers or wait-all")
      .choices({"drop-stragglers", "wait-all"});
  t.add("round-deadline", s.round_deadline, "rounds: how long a round stays open")
      .range(0.1, 1e6)
      .unit("seconds");
  t.add("aggregation", s.aggregation,
        "rounds: the server's --aggregation (dp-fedavg: client-level differential privacy, "
        "with --round-clip-norm and --dp-noise-multiplier)")
      .choices({"masked", "fedavg", "trimmed-mean", "median", "dp-fedavg"});
  t.add("round-clip-norm", s.round_clip_norm,
        "rounds: the server's --round-clip-norm (0: no clipping)")
      .range(0, 3.4e38);
  t.add("secure-aggregation", s.secure_aggregation,
        "rounds: the server's --secure-aggregation (needs --round-clip-norm)");
  t.add("secagg-drop-fraction", s.secagg_drop_fraction,
        "rounds, secure aggregation: the share of the workers (the last ones) that leave right "
        "after their masked input in the first round (a test flag of the worker)")
      .range(0, 0.49);
  t.add("min-clients", s.min_clients,
        "rounds: the server's --min-clients (0: its default); with dp-fedavg and "
        "--secure-aggregation the fewest survivors a round closes with, each device's noise "
        "share calibrated to them (c; at most --workers)")
      .range(0, 255);
  t.add("dp-noise-multiplier", s.dp_noise_multiplier,
        "rounds, dp-fedavg: the server's --dp-noise-multiplier (its --dp-expected-devices is "
        "--client-fraction x --workers)")
      .range(0, 1e6);
  t.add("dp-noise", s.dp_noise,
        "rounds, dp-fedavg with --secure-aggregation: the server's --dp-noise, the devices' noise "
        "(skellam: discrete, exact in the ring; docs/privacy.md)")
      .choices({"gaussian", "skellam"});
  t.add("dp-target-epsilon", s.dp_target_epsilon,
        "rounds, dp-fedavg: the server's --dp-target-epsilon (0: no limit)")
      .range(0, 1e9);
  t.add("dp-adaptive-clip-quantile", s.dp_adaptive_clip_quantile,
        "rounds, dp-fedavg: the server's --dp-adaptive-clip-quantile (0: a fixed clip norm)")
      .range(0, 0.999);
  t.add("client-fraction", s.client_fraction, "rounds: share of the devices selected per round")
      .range(1e-6, 1);
  t.add("local-steps", s.local_steps, "rounds: minibatches a selected device trains per round")
      .range(1, 1000000);
  t.add("local-epochs", s.local_epochs,
        "rounds: passes over its shard instead of --local-steps (0: steps)")
      .range(0, 1000);
  t.add("local-lr", s.local_lr, "rounds and gossip: the workers' local SGD learning rate")
      .range(1e-9, 100);
  t.add("server-lr", s.server_lr,
        "rounds: the server moves the model by this times the aggregated delta")
      .range(1e-6, 100);
  t.group(
      "Gossip (--mode gossip: worker/README.md \"Gossip\", emulation/README.md \"Gossip runs\")");
  t.add("topology", s.topology, "gossip: the peers' graph")
      .choices({"ring", "random-regular", "full"});
  t.add("degree", s.degree, "gossip, random-regular: neighbours per peer").range(1, 4000);
  t.add("gossip", s.gossip, "gossip: d-psgd (a barrier per iteration) or ad-psgd (pairwise, none)")
      .choices({"d-psgd", "ad-psgd"});
  t.add("gossip-publish-fraction", s.gossip_publish_fraction,
        "gossip, d-psgd: share of each tensor a neighbour's "
        "copy moves by per iteration (1: dense; 0.01: compressed gossip)")
      .range(1e-6, 1);
  t.add("consensus-step", s.consensus_step,
        "gossip, d-psgd: the peers' --consensus-step (0: their default)")
      .range(0, 1);
  t.add("neighbour-wait", s.neighbour_wait,
        "gossip, d-psgd: how long a peer waits for a neighbour behind it")
      .range(0, 3600)
      .unit("seconds");
  t.add("balance-target", s.balance_target,
        "gossip: workload balancing, a step's target time (0: off)")
      .range(0, 3600)
      .unit("seconds");
  t.add("wait-steps", s.wait_steps,
        "gossip, d-psgd: the peers' --wait-steps (local steps a peer may take while a "
        "neighbour is behind; 0: off)")
      .range(0, 1000);
  t.add("max-lr-factor", s.max_lr_factor,
        "gossip, with --balance-target: the peers' --max-lr-factor (the lr follows "
        "the batch linearly up to this many times --local-lr)")
      .range(1, 64);
  t.add("plateau-patience", s.plateau_patience,
        "gossip: accuracy-aware training, the peers' --plateau-patience (0: off)")
      .range(0, 1000);
  t.add("validate-every", s.validate_every, "gossip: iterations between a peer's validations")
      .range(1, 1000000);
  t.add("checkpoint-every", s.checkpoint_every,
        "gossip: iterations between a peer's checkpoints (the fleet's "
        "evaluations read them)")
      .range(1, 1000000000);
  t.add("max-neighbour-magnitude", s.max_neighbour_magnitude,
        "gossip: the peers' --max-neighbour-magnitude, a neighbour's model with a larger value "
        "is refused (0: no bound)")
      .range(0, 1e30);
  t.add("neighbour-clip", s.neighbour_clip,
        "gossip, d-psgd: the peers' --neighbour-clip, each neighbour's difference clipped to "
        "this L2 norm before the mix (0: off)")
      .range(0, 1e30);
  t.add("malicious-peers", s.malicious_peers,
        "gossip: peers 0..N-1 are attackers (edgetrain-gossip-attacker: they train on their "
        "shard, and their neighbours see their model poisoned by --attack); accuracies are then "
        "the honest peers' (an experiment's knob, as edgetrain-sim's)")
      .range(0, 4000);
  t.add("attack", s.attack,
        "gossip, with --malicious-peers: bias:V (the output layer's bias set to V) or scale:F "
        "(the model times F), as edgetrain-sim --attack (empty: bias:1e30)");
  t.add("eval-examples", s.eval_examples,
        "gossip and --shards: test images per evaluation of the fleet (or the "
        "assembled model) during the run (the final one uses all)")
      .range(1, 1000000);
  t.group("Filter dropout (DISTREAL: worker/README.md)");
  t.add("drop-rates", s.drop_rates,
        "every worker trains this sub-network: one rate per conv layer, e.g. 0.25,0.5");
  t.add("class-drop-rates", s.class_drop_rates,
        "a static width per CPU class (HeteroFL-style): CLASS=R1:R2,... "
        "e.g. pi5=0:0,zero2w=0.5:0.5 (classes of --cpu-classes; a class not named trains the full "
        "model)");
  t.add("dropout-table", s.dropout_table,
        "workers choose their drop rates at run time from this table "
        "(edgetrain-dse's JSON)");
  t.add("step-time-budget", s.step_time_budget, "async with --dropout-table: a step's time budget")
      .range(0, 1e9)
      .unit("ms");
  t.add("deadline-share", s.deadline_share,
        "rounds with --dropout-table: share of the time left before the "
        "deadline the local steps may take")
      .range(0.01, 1);
}

void declare_devices(settings::Table& t, EmulatorSettings& s) {
  t.group("Devices and network");
  t.add("network", s.network, "namespaces if 'ip netns add' works (auto), or forced")
      .choices({"auto", "netns", "loopback"});
  t.add("link", s.link,
        "impaired link, e.g. delay=20:80,jitter=5,loss=0.01,bandwidth=1000:5000 (ms, probability, "
        "kbit/s; A:B drawn per worker)");
  t.add("impaired", s.impaired, "how many workers (the first K) get --link, or all");
  t.add("slowdown", s.slowdown,
        "A[:B]: a worker sleeps F x its step's compute time, F drawn per worker");
  t.add("qemu-workers", s.qemu_workers,
        "the last K workers are the aarch64 build under qemu-aarch64");
  t.add("cpu-classes", s.cpu_classes,
        "speed classes as CPU quotas, each worker in its own cgroup: NAME=SHARE,... "
        "(SHARE of one core, e.g. pi4=0.6,zero2w=0.2; worker i in class i mod K; needs root; "
        "empty: no quotas)");
  t.add("cpu-schedule", s.cpu_schedule,
        "quota changes during the run: START-END:FACTOR[@CLASS],... (seconds; "
        "e.g. 60-120:0.5 halves every worker's share for a minute)");
  t.add("cpu-period", s.cpu_period, "the cgroup's CPU period").range(1000, 1000000).unit("µs");
  t.add("cpu-priority", s.cpu_priority,
        "with --cpu-classes: the run's cgroup gets the largest CPU weight (v1 cpu.shares 262144, "
        "v2 cpu.weight 10000), so that on a machine busy with other work each worker still gets "
        "its quota (which bounds what the run takes); without it the run's workers share one "
        "default weight, and a worker that computes takes CPU from the others of its run");
  t.add("reachable", s.reachable,
        "share of the time each worker's link is up: below 1, the impairer drops everything "
        "on it for (1 - this) x --outage-period of every period from --outage-start on, worker "
        "i of N starting its windows i/N of a period later (so 1 - this of the fleet is down at "
        "any time)")
      .range(0.01, 1);
  t.add("outage-period", s.outage_period, "with --reachable below 1: one down window per period")
      .range(1, 1e7)
      .unit("seconds");
  t.add("outage-start", s.outage_start,
        "with --reachable below 1: every link up before this (the workers fetch a model)")
      .range(0, 1e7)
      .unit("seconds");
  t.add("offline-steps", s.offline_steps,
        "workers train offline while their server is unreachable, at most this many steps per "
        "outage (the worker's --offline-steps; 0 with --offline-seconds 0: they idle)");
  t.add("offline-seconds", s.offline_seconds, "the worker's --offline-seconds")
      .range(0, 1e9)
      .unit("seconds");
  t.add("offline-lr", s.offline_lr, "the worker's --offline-lr (a local step's learning rate)")
      .range(1e-9, 1e3);
  t.add("offline-max-rate", s.offline_max_rate,
        "the worker's --offline-max-rate (the offline update of s steps at c x s, at most this; "
        "0: at c)")
      .range(0, 1);
  t.add("offline-average", s.offline_average, "the server's --offline-average");
  t.add("offline-try-timeout", s.offline_try_timeout,
        "the worker's --offline-try-timeout (0: an offline worker's try is its pull)")
      .range(0, 3600)
      .unit("seconds");
  t.add("offline-try-share", s.offline_try_share, "the worker's --offline-try-share")
      .range(0.001, 1);
  t.add("offline-step-credit", s.offline_step_credit,
        "the server's --offline-step-credit (0: an update's local steps are ignored)")
      .range(0, 65535)
      .unit("steps");
  t.group("Failures");
  t.add("fail", s.fail,
        "kill-worker:I@T[+D] (SIGKILL worker I at T s, restart D s later; default 5, +0 never), "
        "kill-server@T[+D] (restart D s later, default 3), kill-shard:J@T[+D] (with --shards), "
        "comma-separated");
  t.group("Paths");
  t.add("out", s.out, "output directory; emptied first if it holds an earlier run");
  t.add("build-dir", s.build_dir, "host build tree (empty: <repo>/build/host)");
  t.add("aarch64-build-dir", s.aarch64_build_dir,
        "aarch64 build tree (empty: <repo>/build/aarch64)");
  t.add("quiet", s.quiet, "no progress line");
}

std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// 0.01, not 0.010000000000000000208: 15 digits hold every value a person types.
std::string shortest_number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", value);
  return text;
}

std::string field_text(const settings::Field& field) {
  return std::visit(
      [](auto* value) {
        using T = std::decay_t<decltype(*value)>;
        if constexpr (std::is_same_v<T, std::string>)
          return *value;
        else if constexpr (std::is_same_v<T, bool>)
          return std::string(*value ? "1" : "0");
        else if constexpr (std::is_floating_point_v<T>)
          return shortest_number_text(*value);
        else
          return std::to_string(*value);
      },
      field);
}

}  // namespace

void declare_emulator_settings(settings::Table& table, EmulatorSettings& s) {
  declare_experiment(table, s);
  declare_devices(table, s);
}

// Checks that relate settings, or read one's text (the table checks each alone).
void check_emulator_settings(const EmulatorSettings& s) {
  if ((s.entry_staleness || s.pull_values != "fp32") && !(s.pull_fraction > 0))
    throw std::invalid_argument(
        "--entry-staleness and --pull-values fp16-increment are settings of the cheap pull: "
        "give --pull-fraction too");
  if (s.lr_decay_at.empty() && s.lr_decay_factor != EmulatorSettings{}.lr_decay_factor)
    throw std::invalid_argument("--lr-decay-factor needs --lr-decay-at (the versions it applies from)");
  if (s.fp16 && s.sign_scale)
    throw std::invalid_argument(
        "--fp16 and --sign-scale exclude each other (choose one value encoding)");
  if (s.qemu_workers > s.workers)
    throw std::invalid_argument("--qemu-workers must be 0..--workers");
  // The server would refuse these at start-up; said here, before any process starts.
  if (s.aggregation == "dp-fedavg" && !(s.round_clip_norm > 0 && s.dp_noise_multiplier > 0))
    throw std::invalid_argument(
        "--aggregation dp-fedavg needs --round-clip-norm and --dp-noise-multiplier above 0");
  if (s.aggregation != "dp-fedavg" &&
      (s.dp_noise_multiplier > 0 || s.dp_target_epsilon > 0 || s.dp_adaptive_clip_quantile > 0))
    throw std::invalid_argument("the --dp-* settings go with --aggregation dp-fedavg");
  if (s.secure_aggregation && !(s.mode == "rounds" && s.round_clip_norm > 0))
    throw std::invalid_argument("--secure-aggregation needs --mode rounds and --round-clip-norm above 0");
  if (s.dp_noise != "gaussian" && !(s.aggregation == "dp-fedavg" && s.secure_aggregation))
    throw std::invalid_argument("--dp-noise " + s.dp_noise + " is the devices' noise: it needs --aggregation dp-fedavg and --secure-aggregation");
  if (s.min_clients > 0 && s.mode != "rounds")
    throw std::invalid_argument("--min-clients is a setting of --mode rounds");
  if (s.min_clients > s.workers)
    throw std::invalid_argument("--min-clients " + std::to_string(s.min_clients) + " is above --workers " +
                                std::to_string(s.workers) + ": no round could close");
  if (s.secagg_drop_fraction > 0 && !s.secure_aggregation)
    throw std::invalid_argument("--secagg-drop-fraction is a setting of --secure-aggregation");
  if (s.mode != "rounds" && (s.aggregation != "masked" || s.round_clip_norm > 0))
    throw std::invalid_argument("--aggregation and --round-clip-norm are settings of --mode rounds");
  const int dropout_choices =
      !s.drop_rates.empty() + !s.class_drop_rates.empty() + !s.dropout_table.empty();
  if (dropout_choices > 1)
    throw std::invalid_argument("give one of --drop-rates, --class-drop-rates and --dropout-table");
  if (!s.class_drop_rates.empty() && s.cpu_classes.empty())
    throw std::invalid_argument("--class-drop-rates needs --cpu-classes");
  if (!s.class_drop_rates.empty()) {
    const auto classes = parse_cpu_classes(s.cpu_classes);
    for (const std::string& item : split_fields(s.class_drop_rates)) {
      const auto equals = item.find('=');
      const std::string name = item.substr(0, equals);
      if (equals == std::string::npos ||
          std::none_of(classes.begin(), classes.end(),
                       [&](const auto& c) { return c.name == name; }))
        throw std::invalid_argument("--class-drop-rates: '" + item +
                                    "' is not CLASS=R1:R2 with a class of --cpu-classes");
      if (!std::regex_match(item.substr(equals + 1), std::regex("[0-9.]+(:[0-9.]+)*")))
        throw std::invalid_argument("--class-drop-rates: '" + item +
                                    "': rates are numbers separated by ':'");
    }
  }
  if (s.mode == "async" && !s.dropout_table.empty() && !(s.step_time_budget > 0))
    throw std::invalid_argument("--dropout-table in async mode needs --step-time-budget");
  if (s.mode == "gossip") {
    if (s.workers < 2)
      throw std::invalid_argument("--mode gossip needs at least 2 workers (peers)");
    if (s.fail.find("kill-server") != std::string::npos)
      throw std::invalid_argument(
          "--mode gossip has no server to kill (kill-worker:I@T kills a peer)");
    if (!s.drop_rates.empty() || !s.class_drop_rates.empty() || !s.dropout_table.empty())
      throw std::invalid_argument(
          "--mode gossip trains the whole model: no --drop-rates, --class-drop-rates or "
          "--dropout-table");
  }
  if (s.mode != "gossip" && (s.malicious_peers > 0 || !s.attack.empty()))
    throw std::invalid_argument(
        "--malicious-peers and --attack are for --mode gossip (an attacker is a gossip peer)");
  if (s.mode != "gossip" && (s.neighbour_clip > 0 || s.max_neighbour_magnitude != 1e4))
    throw std::invalid_argument(
        "--neighbour-clip and --max-neighbour-magnitude are the gossip peers' (--mode gossip)");
  if (s.mode == "gossip") {
    if (s.malicious_peers >= s.workers)
      throw std::invalid_argument("--malicious-peers " + std::to_string(s.malicious_peers) +
                                  " must be below --workers " + std::to_string(s.workers) +
                                  " (an honest peer must remain)");
    if (!s.attack.empty() && s.malicious_peers == 0)
      throw std::invalid_argument("--attack needs --malicious-peers N (the peers that attack)");
    if (!s.attack.empty()) check_gossip_attack(s.attack);
    if (s.malicious_peers + s.qemu_workers > s.workers)
      throw std::invalid_argument(
          "the attackers (peers 0..N-1) are a host program and the --qemu-workers the last "
          "peers: --malicious-peers + --qemu-workers must not exceed --workers");
    if (s.neighbour_clip > 0 && s.gossip == "ad-psgd")
      throw std::invalid_argument("--neighbour-clip is d-psgd's (an AD-PSGD midpoint is not clipped)");
  }
  if (s.shards > 0) {
    if (s.mode != "async")
      throw std::invalid_argument(
          "--shards is for --mode async (a shard serves /model and /update only)");
    if (s.publish_every > 0)
      throw std::invalid_argument("--shards and --publish-every exclude each other");
    if (s.fail.find("kill-server") != std::string::npos)
      throw std::invalid_argument("with --shards, kill one shard: kill-shard:J@T[+D]");
  } else if (s.fail.find("kill-shard") != std::string::npos) {
    throw std::invalid_argument("kill-shard:J@T needs --shards");
  }
  if (s.reachable < 1 && (s.mode == "gossip" || s.shards > 0))
    throw std::invalid_argument(
        "--reachable below 1 is not built for --mode gossip or --shards yet (one link per "
        "worker and server only)");
  if ((s.offline_steps > 0 || s.offline_seconds > 0) && s.mode != "async")
    throw std::invalid_argument("--offline-steps / --offline-seconds work with --mode async only");
  if (s.impaired != "all" && !std::regex_match(s.impaired, std::regex("[0-9]+")))
    throw std::invalid_argument("--impaired must be a number or 'all'");
  parse_link_profile(s.link);
  parse_range(s.slowdown, "--slowdown");
  if (s.cpu_classes.empty()) {
    if (!s.cpu_schedule.empty()) throw std::invalid_argument("--cpu-schedule needs --cpu-classes");
    if (s.cpu_priority) throw std::invalid_argument("--cpu-priority needs --cpu-classes");
  } else {
    parse_cpu_schedule(s.cpu_schedule, parse_cpu_classes(s.cpu_classes));
  }
}

void check_gossip_attack(const std::string& text) {
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  bool number = false;
  if (colon != std::string::npos && colon + 1 < text.size()) {
    try {
      std::size_t used = 0;
      const double value = std::stod(text.substr(colon + 1), &used);
      number = used == text.size() - colon - 1 && std::isfinite(value) && std::fabs(value) <= 3.4e38;
    } catch (const std::exception&) {
    }
  }
  if ((kind != "bias" && kind != "scale") || !number)
    throw std::invalid_argument("--attack: '" + text +
                                "' is not bias:V or scale:F (a finite float, e.g. bias:1e30)");
}

std::string shell_assignments(const settings::Table& table) {
  std::string text;
  for (const auto& setting : table.settings())
    text += setting->key() + "=" + shell_quoted(field_text(setting->field())) + "\n";
  return text;
}

int print_emulator_settings(int argc, const char* const* argv) {
  EmulatorSettings s;
  settings::Table table("edgetrain-emulate", kEmulatorDescription);
  declare_emulator_settings(table, s);
  if (const auto status = table.parse(argc, argv)) return *status;
  try {
    check_emulator_settings(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgetrain-emulate: %s\n", e.what());
    return 2;
  }
  std::fputs(shell_assignments(table).c_str(), stdout);
  return 0;
}

}  // namespace edgetrain::emulation
