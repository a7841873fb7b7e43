#include "sim/sim_program.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <stdexcept>

#include "model/model.h"
#include "server/checkpoint_file.h"
#include "server/durable_file.h"
#include "sim/sim_program_support.h"

namespace edgetrain::sim {

// The modes (sim/sim_mode_*.cc): one line each.
extern const SimModeEntry kSimAsyncMode, kSimRoundsMode, kSimGossipMode;

const std::vector<SimModeEntry>& sim_modes() {
  static const std::vector<SimModeEntry> modes = {kSimAsyncMode, kSimRoundsMode, kSimGossipMode};
  return modes;
}

const SimModeEntry* find_sim_mode(std::string_view name) {
  for (const SimModeEntry& mode : sim_modes())
    if (mode.name == name) return &mode;
  return nullptr;
}

void refuse_settings_of_mode(const settings::Table& table, std::string_view owner) {
  const SimModeEntry* mode = find_sim_mode(owner);
  if (!mode || mode->group.empty()) return;
  for (const auto& setting : table.settings())
    if (table.was_set(setting->flag()) && setting->group() == mode->group)
      throw std::invalid_argument("--" + setting->flag() + " is a setting of --mode " +
                                  std::string(owner));
}

// The groups in the order --help has always listed them: the shared rows (async's own rows
// among them: async and rounds share its simulation's settings), each mode's own group from
// the registry, then filter dropout, compression and the run's output.
void declare_sim_settings(settings::Table& t, SimSettings& s) {
  SimConfig& c = s.config;
  t.group("Data and model");
  t.add("data", s.data,
        "mnist (full MNIST, 60k + 10k), mnist-small (its 8k + 2k subset), fashion-mnist (Debian's "
        "60k + 10k), a directory of IDX files, or one with edgetrain-data.toml (your NumPy or CSV "
        "files: model/README.md)");
  t.add("train-images", s.train_images, "IDX file (raw or .gz); overrides --data");
  t.add("train-labels", s.train_labels, "IDX file");
  t.add("test-images", s.test_images, "IDX file");
  t.add("test-labels", s.test_labels, "IDX file");
  t.add("model", c.model,
        "paper-cnn, mlp, mobilenet-mini, resnet-8, resnet-8-32x32x3, ds-cnn, cnn1d, or a spec such "
        "as 'input 28x28x1; fc 64 relu; fc 10', or a spec file (tools/onnx_to_edgetrain.py writes one)");
  t.group("Mode");
  t.add("mode", s.mode,
        "async (asynchronous SGD with the staleness rule), rounds (federated rounds, FedAvg: "
        "selected workers train local steps and send model deltas) or gossip (no server: peers "
        "train and average "
        "models with their neighbours, EdgeGossip)")
      .choices({"async", "rounds", "gossip"});
  t.group("Workers and server");
  t.add("workers", c.workers, "virtual workers (with --mode gossip: peers)").range(1, 10000);
  t.add("batch", c.batch, "minibatch per step (gossip: the base batch balancing starts from)")
      .range(1, 4096);
  t.add("lr", c.learning_rate, "server learning rate (gossip: the peers' plain SGD learning rate)")
      .range(0, 1e9);
  t.add("lr-decay-at", s.lr_decay_at,
        "async: multiply the server's lr by --lr-decay-factor at each of these applied-update "
        "versions, e.g. 3000,4500 (step decay, the server's --lr-decay-at); default: a constant lr");
  t.add("lr-decay-factor", c.lr_schedule.factor, "with --lr-decay-at: the factor at each milestone")
      .range(1e-6, 0.999999);
  t.add("staleness", s.staleness,
        "sigma (the paper: per parameter), delay (Zhang et al.: lr/delay) or none "
        "(plain lr whatever the delay: what the staleness rule buys)")
      .choices({"sigma", "delay", "none"});
  t.add("max-staleness", c.max_staleness, "updates older than this are refused").unit("updates");
  t.add("label-skew", c.label_skewed, "label-skewed shards instead of i.i.d.");
  t.add("classes-per-worker", c.skew.classes_per_worker, "with --label-skew");
  t.add("preferred-fraction", c.skew.preferred_fraction, "with --label-skew").range(0, 1);
  t.add("speed-spread", c.speed_spread, "log-normal sigma of worker speeds (0: all equal)")
      .range(0, 1e9);
  t.add("step-jitter", c.step_jitter,
        "log-normal sigma of every step's time around its worker's mean (all modes)")
      .range(0, 10);
  t.add("failure-probability", c.failure_probability, "per step: worker crashes, loses the update")
      .range(0, 1);
  t.add("failing-fraction", c.failing_fraction,
        "share of the workers that can fail (a seeded choice; the others never do)")
      .range(0, 1);
  t.add("downtime", c.downtime_steps, "mean time a failed worker stays away")
      .range(0, 1e9)
      .unit("step times");
  t.add("leave-for-good", c.failures_permanent,
        "a failed worker never comes back (default: it rejoins after --downtime)");
  t.add("reachable", c.reachable,
        "async: share of the time each worker's link is up (edgetrain-emulate's --reachable): "
        "from --outage-start on, down for (1 - R) of every --outage-period, the phases spread "
        "evenly over the workers; an update that finds its link down is kept and sent when it "
        "is back; 1: always up")
      .range(0, 1);
  t.add("outage-period", c.outage_period_steps, "with --reachable: the period of the outages")
      .range(0, 1e12)
      .unit("step times");
  t.add("outage-start", c.outage_start_steps, "with --reachable: every link is up before this")
      .range(0, 1e12)
      .unit("step times");
  t.add("offline-steps", c.offline_steps,
        "with --reachable: a worker whose link is down trains up to this many local steps from "
        "the model it last pulled and sends them as one update when its link is back (the "
        "worker's --offline-steps); 0: it idles, as the paper's worker")
      .range(0, 1e12);
  t.add("offline-max-rate", c.offline_max_rate,
        "with --offline-steps: the offline update is compressed at c x its steps, at most this "
        "(the worker's --offline-max-rate); 0: at c")
      .range(0, 1);
  t.add("offline-step-credit", c.offline_step_credit,
        "the server credits an update's claimed local steps up to this many (edgetrain-server "
        "--offline-step-credit); 0: claims ignored")
      .range(0, 65535);
  t.add("offline-average", c.offline_average,
        "with --offline-step-credit: a credited update of s steps at delay d weighs at most "
        "s/(s + d) (edgetrain-server --offline-average)");
  t.add("threads", c.threads, "compute threads").range(1, 64);
  t.add("local-dp-clip", c.local_dp_clip,
        "async: clip each step's gradient to this L2 norm before it is compressed (local "
        "differential privacy, a measurement: docs/privacy.md); 0: off")
      .range(0, 3.4e38);
  t.add("local-dp-noise-multiplier", c.local_dp_noise_multiplier,
        "async, with --local-dp-clip: Gaussian noise per parameter and step, a multiple of the "
        "clip norm; epsilon per device in summary.json")
      .range(0, 1e6);
  t.add("delta-pulls", c.delta_pulls,
        "count each pull as the model delta since the worker's copy (GET "
        "/model?since=V, the worker's default) instead of the dense model (--dense-pull, the "
        "paper's)");
  t.add("publish-every", c.publish.every,
        "workers compute on a published model that follows the server's every "
        "this many applied updates (edgetrain-server --publish-every; implies --delta-pulls); 0: "
        "the exact model")
      .range(0, 1000000)
      .unit("updates");
  t.add("publish-fraction", c.publish.fraction,
        "with --publish-every: share of each tensor's entries a publish step "
        "copies; with --mode gossip: the same for each peer's published model, once per iteration "
        "(there the default "
        "is 1: dense gossip)")
      .range(1e-6, 1);
  t.add("publish-min-entries", c.publish.min_entries,
        "with --publish-every: entries a step copies at least per "
        "tensor")
      .range(1, 1u << 30);
  t.add("pull-fraction", c.replica_pull.fraction,
        "the cheap pull (server/replica_pull.h, ours): each pull sends, per tensor, this share "
        "of the entries where the model differs most from the worker's copy; the server keeps "
        "the rest per worker for later pulls (nothing lost, only delayed); 0: exact pulls; "
        "excludes --publish-every")
      .range(0, 1);
  t.add("pull-min-entries", c.replica_pull.min_entries,
        "with --pull-fraction: entries a pull sends at least per tensor")
      .range(1, 1u << 30);
  t.add("entry-staleness", c.replica_pull.entry_staleness,
        "with --pull-fraction: the server counts each entry's sigma from the version at which "
        "the worker's copy of that entry was last the model's (ours), not from the pull's "
        "version");
  t.add("pull-values", s.pull_values,
        "with --pull-fraction: fp32 (exact values), fp16 (half the value bytes; the server's "
        "record of the worker's copy keeps the rounded value, so the rounding error goes out "
        "with a later pull; ours) or fp16-increment (the increment W - R in fp16, which the "
        "worker adds to its copy and the record by the same float addition: the rounding "
        "error stays in W - R, at most |W - R|/2048; ours)")
      .choices({"fp32", "fp16", "fp16-increment"});
  t.add("pull-selection", s.pull_selection,
        "with --pull-fraction, which differing entries a pull sends (ours; server/replica_pull.h): "
        "largest (per tensor, the largest |W - R|), age (per tensor, |W - R| weighted by "
        "1 + the versions since the worker's value was last the model's / --pull-age-versions), "
        "global (tensors the budget covers go whole; the others' budgets pooled and given to "
        "the largest |W - R| / RMS of the entry's tensor across them), global-raw (the same pool "
        "given to the largest |W - R| across them, unscaled) or relative (per tensor, "
        "|W - R| / (|W| + RMS of the tensor / 10))")
      .choices({"largest", "age", "global", "relative", "global-raw"});
  t.add("pull-age-versions", c.replica_pull.age_versions,
        "with --pull-selection age: the age in versions that doubles an entry's score")
      .range(1e-3, 1e12)
      .unit("versions");
  t.add("first-pull", s.first_pull,
        "dense (each worker's first pull is the whole model) or seeded (each worker starts "
        "holding the run's seeded initial model, version 0, as the server does, and its first "
        "pull is a delta from it; needs --delta-pulls, --publish-every or --pull-fraction)")
      .choices({"dense", "seeded"});
  t.add("kernels", s.kernels,
        "xnnpack (fast; same seed, same bits on one machine) or reference (plain loops, "
        "slow; the same bits on every x86-64 machine)")
      .choices({"xnnpack", "reference"});
  t.add("seed", c.seed, "same seed, same run");
  for (const SimModeEntry& mode : sim_modes()) {
    if (!mode.declare) continue;
    t.group(std::string(mode.group));
    mode.declare(t, s);
  }
  t.group("Attackers (--mode rounds and gossip; an experiment knob of ours)");
  t.add("malicious-peers", s.malicious_peers,
        "workers (rounds) or peers (gossip) 0..N-1 are malicious: they train as the others but "
        "send their delta (rounds) or publish their model (gossip, and do not mix) with --attack "
        "applied; gossip accuracy is reported over the honest peers (sim/README.md \"Malicious "
        "neighbours\", \"Robust rounds\")")
      .range(0, 100000);
  t.add("attack", s.attack,
        "what a malicious worker or peer does: bias:V (the output bias of its delta or model "
        "set to V) or scale:F (its delta or model times F)");
  t.group("Filter dropout (DISTREAL)");
  t.add("drop-rates", s.drop_rates,
        "one drop rate per conv layer, e.g. 0.5,0.25 (each in [0, 1); empty: none); "
        "every worker's step trains a random sub-network");
  t.add("dropout-rescale", s.dropout_rescale,
        "inverted (ours: kept filters' outputs times 1/keep) or none")
      .choices({"inverted", "none"});
  t.group("Compression");
  runtime::declare_compression_settings(t, c.compressor, s.compression,
                                        {"none", "adacomp", "both"});
  t.add("bin-local", s.bin_local,
        "option: IBM's bin-local selection (Chen et al. 2018) instead of top-k");
  t.add("bin-size", c.compressor.bin_size, "entries per bin for --bin-local").range(1, 1e9);
  t.group("Run and output");
  t.add("updates", c.max_updates, "stop after this many applied updates (async mode)")
      .unit("updates");
  t.add("eval-every", s.eval_every,
        "applied updates (closed rounds with --mode rounds, mean peer iterations with "
        "--mode gossip) between test evaluations (0: 100 updates, every round, or 20 iterations)")
      .range(0, 1e12);
  t.add("eval-examples", c.eval_examples,
        "test examples per evaluation (0: all; with --mode gossip, per peer and "
        "for the consensus model, and the default there is 1000)");
  t.add("stop-at-accuracy", s.stop_at_accuracy,
        "stop once the test accuracy (gossip: the peers' mean) reaches this "
        "(0: never)")
      .range(0, 1);
  t.add("target-accuracy", s.target_accuracy,
        "accuracy for the traffic ratio (0: auto, half a point below the "
        "lower best)")
      .range(0, 1);
  t.add("out", s.out_dir, "directory for sim.csv, plots and summary.md");
  t.add("init-from", c.init_from,
        "start from these parameters instead of --seed's: a safetensors file of exactly the "
        "model's tensors (a checkpoint, --save-model's file, or tools/onnx_to_edgetrain.py's "
        "weights); async and rounds modes");
  t.add("save-model", s.save_model,
        "write the last run's final model here (safetensors, with its accuracy in the "
        "metadata): e.g. a classifier for edgetrain-gan --classifier");
  t.add("quiet", s.quiet, "no progress line");
}

SimData load_sim_data(const SimSettings& s) {
  if (s.train_images.empty())
    return {runtime::load_named_dataset(s.data, runtime::DataSplit::kTrain),
            runtime::load_named_dataset(s.data, runtime::DataSplit::kTest)};
  if (s.train_labels.empty() || s.test_images.empty() || s.test_labels.empty())
    throw std::invalid_argument(
        "--train-images needs --train-labels, --test-images and --test-labels too");
  return {runtime::load_dataset(s.train_images, s.train_labels),
          runtime::load_dataset(s.test_images, s.test_labels)};
}

int run_sim_program(const SimSettings& s, const settings::Table& table) {
  // Settings that are wrong together (the table checks each alone) are refused before the
  // data loads, with the table's exit status.
  std::unique_ptr<SimModeRun> run;
  try {
    const SimModeEntry* mode = find_sim_mode(s.mode);
    if (!mode) throw std::invalid_argument("unknown --mode " + s.mode);
    run = mode->prepare(s, table);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "edgetrain-sim: %s\n", e.what());
    return 2;
  }
  return run->run(load_sim_data(s));
}

ProgressLine::ProgressLine(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0) {}

ProgressLine::~ProgressLine() {
  if (tty_ && shown_) std::fprintf(stderr, "\n");
}

void ProgressLine::show(const char* line, double done, double total) {
  if (quiet_) return;
  shown_ = true;
  if (tty_) {
    std::fprintf(stderr, "\r%-100s", line);
  } else if (done >= last_printed_ + total / 10 || done >= total) {
    std::fprintf(stderr, "%s\n", line);
    last_printed_ = done;
  }
}

std::string accuracy_text(double accuracy) {
  return accuracy < 0 ? "  -  " : std::to_string(accuracy * 100).substr(0, 5) + "%";
}

runtime::KernelBackend kernel_backend(const SimSettings& s) {
  return s.kernels == "reference" ? runtime::KernelBackend::kReference
                                  : runtime::KernelBackend::kXnnpack;
}

void save_model(const SimSettings& s, const std::vector<float>& parameters, std::uint64_t version,
                const std::string& label, double final_accuracy) {
  runtime::Model model(runtime::model_spec_from_argument(s.config.model));
  std::copy(parameters.begin(), parameters.end(), model.parameters().begin());
  const std::map<std::string, std::string> metadata = {
      {"edgetrain.model", model.spec().name},
      {"edgetrain.model_id", std::to_string(model.layout_id())},
      {"edgetrain.version", std::to_string(version)},
      {"edgetrain.sim.method", label},
      {"edgetrain.sim.data", s.data},
      {"edgetrain.sim.final_test_accuracy", std::to_string(final_accuracy)}};
  server::write_file_atomically(s.save_model, server::sealed_checkpoint_bytes(model, metadata));
  std::cout << "model: " << s.save_model << " (" << label << ", final test accuracy "
            << final_accuracy * 100 << "%)\n";
}

}  // namespace edgetrain::sim
