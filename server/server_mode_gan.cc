// --mode gan on the server: the MD-GAN coordinator (server/gan_coordinator.h) in
// <state-dir>/gan behind the ServerMode seam, with the generator's evaluations (a grid of
// samples, and with --gan-classifier its MNIST score, Fréchet distance and conditional
// accuracy) on a thread of their own.
#include <atomic>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/png_image.h"
#include "common/svg_plot.h"
#include "model/classifier_readout.h"
#include "model/dataset.h"
#include "model/gan_training.h"
#include "server/gan_coordinator.h"
#include "server/server_mode.h"
#include "server/startup_checks.h"

namespace edgetrain::server {
namespace {

class GanMode : public ServerMode {
 public:
  GanMode(const ServerSettings& s, GanServerOptions options) : s_(s) {
    try {
      gan_ = std::make_unique<GanCoordinator>(std::move(options));
    } catch (const std::invalid_argument& e) {
      throw StartupError(e.what());
    } catch (const GanStateError& e) {
      throw StartupError(std::string("GAN state: ") + e.what());
    }
    open_evaluation();
  }
  ~GanMode() override {
    if (eval_thread_.joinable()) eval_thread_.join();
  }

  std::string_view name() const override { return "gan"; }
  void attach(transport::CoapDtlsServer& server,
              std::function<void(const transport::CoapRequest&)> note) override {
    gan_->attach(server, std::move(note));
  }
  // After the coordinator's deadline check: an evaluation every --gan-eval-every iterations,
  // unless the last one is still running.
  void poll() override {
    gan_->poll();
    if (!sampler_ || gan_->iteration() < evaluated_at_ + s_.gan_eval_every || eval_running_) return;
    start_evaluation();
  }
  std::string status_json() const override { return gan_->status_json(); }
  // The run's progress is the generator's iterations (--stop-after-updates counts them).
  std::optional<std::uint64_t> progress() const override { return gan_->iteration(); }
  bool evaluates_classifier() const override { return false; }
  void shutdown() override {
    if (eval_thread_.joinable()) eval_thread_.join();
    gan_->checkpoint();
    log_line("MD-GAN: checkpoint at iteration " + std::to_string(gan_->iteration()));
  }
  const GanCoordinator& coordinator() const { return *gan_; }

 private:
  // A copy of G to sample from, and the judge (classifier and the test images' features)
  // when --gan-classifier is given.
  void open_evaluation() {
    // Evaluations fall on multiples of --gan-eval-every, after a restart too (a restart at
    // iteration 25 with every 20 evaluates at 40, not at 45).
    evaluated_at_ = s_.gan_eval_every ? gan_->iteration() - gan_->iteration() % s_.gan_eval_every
                                      : gan_->iteration();
    if (s_.gan_eval_every == 0) return;
    runtime::GanSettings settings;
    settings.batch = 100;
    settings.architecture = runtime::parse_gan_architecture(s_.gan_arch);
    sampler_ = runtime::make_generator(settings, s_.seed);
    if (s_.gan_classifier.empty()) return;
    if (s_.eval_data == "none")
      throw StartupError("--gan-classifier scores against test images: give --eval-data");
    try {
      runtime::Model classifier(runtime::model_spec_from_argument(s_.gan_classifier_model));
      classifier.load_safetensors(s_.gan_classifier);
      const auto files = runtime::dataset_files(s_.eval_data, runtime::DataSplit::kTest);
      const runtime::Dataset test = runtime::load_dataset(files.images, files.labels);
      judge_ = std::make_unique<runtime::GanJudge>(
          classifier, test.pixels.data(),
          std::min<int>(static_cast<int>(s_.gan_eval_samples), static_cast<int>(test.size())));
    } catch (const std::exception& e) {
      throw StartupError(std::string("--gan-classifier: ") + e.what());
    }
    const auto csv = std::filesystem::path(s_.state_dir) / "gan" / "metrics.csv";
    if (!std::filesystem::exists(csv))
      std::ofstream(csv)
          << "unix_time,iteration,mnist_score,frechet_distance,conditional_accuracy\n";
    log_line("MD-GAN: the generator is scored every " + std::to_string(s_.gan_eval_every) +
             " iterations with " + s_.gan_classifier + " on " +
             std::to_string(s_.gan_eval_samples) + " samples against " + s_.eval_data +
             "'s test images");
    if (gan_->recovery().fresh)
      start_evaluation();  // the untrained generator's scores, the curve's first point
  }

  void start_evaluation() {
    if (eval_thread_.joinable()) eval_thread_.join();
    evaluated_at_ = gan_->iteration();
    sampler_->params = gan_->generator().params;
    eval_running_ = true;
    eval_thread_ = std::thread([this, iteration = evaluated_at_] {
      try {
        evaluate(iteration);
      } catch (const std::exception& e) {
        log_line(std::string("GAN evaluation failed: ") + e.what());
      }
      eval_running_ = false;
    });
  }

  // On the evaluation thread: samples of classes 0-9 by column (the same noise every time),
  // the grid, and the scores.
  void evaluate(std::uint64_t iteration) {
    const int count = static_cast<int>(s_.gan_eval_samples);
    std::vector<std::uint8_t> pixels(static_cast<std::size_t>(count) * runtime::kGanImageSize);
    std::vector<std::int32_t> labels(count);
    runtime::sample_generator(*sampler_, count, s_.seed + 7777, pixels.data(), labels.data());
    const auto dir = std::filesystem::path(s_.state_dir) / "gan";
    image::write_png_grid((dir / "samples.png").string(),
                          image::tile_images(pixels, std::min(count, 100), 28, 10));
    if (!judge_) return;
    const runtime::GanScores scores = judge_->score(pixels.data(), labels.data(), count);
    std::ofstream(dir / "metrics.csv", std::ios::app)
        << std::time(nullptr) << ',' << iteration << ',' << scores.mnist_score << ','
        << scores.frechet_distance << ',' << scores.conditional_accuracy << '\n';
    scores_.x.push_back(static_cast<double>(iteration));
    scores_.y.push_back(scores.mnist_score);
    plot::PlotOptions plot;
    plot.title = "MD-GAN: the generator's MNIST score (" + s_.gan_classifier_model + " classifier)";
    plot.x_label = "generator iterations";
    plot.y_label = "MNIST score";
    std::ofstream(dir / "scores.svg") << plot::render_svg_line_chart({scores_}, plot);
    log_line("MD-GAN iteration " + std::to_string(iteration) + ": MNIST score " +
             short_number(scores.mnist_score) + ", Frechet distance " +
             short_number(scores.frechet_distance) + ", conditional accuracy " +
             short_number(scores.conditional_accuracy));
  }

  const ServerSettings& s_;
  std::unique_ptr<GanCoordinator> gan_;
  // The generator's evaluations run on eval_thread_, on a copy of G in sampler_.
  std::unique_ptr<runtime::GanPart> sampler_;
  std::unique_ptr<runtime::GanJudge> judge_;
  std::thread eval_thread_;
  std::atomic<bool> eval_running_{false};
  std::uint64_t evaluated_at_ = 0;
  plot::PlotSeries scores_{"MNIST score", {}, {}};
};

}  // namespace

void declare_gan_settings(settings::Table& t, ServerSettings& s) {
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
  t.add("gan-max-feedback", s.gan_max_feedback,
        "a feedback holding a value beyond ±this (or a non-finite one) gets 4.22 and is not "
        "counted (honest values stayed below 0.4 in the runs measured; bad feedbacks count towards "
        "--quarantine-after)")
      .range(1e-6, 1e30);
  t.add("gan-clip-feedback", s.gan_clip_feedback,
        "scale each accepted feedback down to this L2 norm when it is above it (ours; the "
        "logged step holds the clipped feedback, so replay is exact); 0: no clipping")
      .range(0, 1e30);
  t.add("gan-checkpoint-every", s.gan_checkpoint_every,
        "iterations between checkpoints of G and Adam (each "
        "iteration is logged before the next one opens in any case)")
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
        "a trained classifier checkpoint (experiments/train-classifier.sh writes the paper "
        "CNN's) that scores the generator: MNIST score, Frechet distance of its features, "
        "conditional accuracy; "
        "needs --eval-data");
  t.add("gan-classifier-model", s.gan_classifier_model,
        "the classifier's model (built-in name or spec)");
}

std::unique_ptr<ServerMode> make_gan_mode(const ServerSettings& s, ServerState&,
                                          ResourceOptions& resources) {
  GanServerOptions o;
  o.gan.batch = static_cast<int>(s.gan_batch);
  o.gan.seed = s.seed;
  o.gan.adam.lr = static_cast<float>(s.gan_lr);
  o.gan.architecture = runtime::parse_gan_architecture(s.gan_arch);
  o.workers = s.gan_workers;
  o.k = s.gan_k;
  o.deadline_seconds = s.gan_deadline;
  o.swap_every = s.gan_swap_every;
  o.encoding = s.gan_fp16 ? transport::ValueEncoding::kFp16 : transport::ValueEncoding::kFp32;
  o.checkpoint_every = s.gan_checkpoint_every;
  o.max_feedback_magnitude = static_cast<float>(s.gan_max_feedback);
  o.clip_feedback_norm = s.gan_clip_feedback;
  o.quarantine_after = s.quarantine_after;
  o.quarantine_seconds = s.quarantine_seconds;
  o.directory = std::filesystem::path(s.state_dir) / "gan";
  o.log = log_line;
  auto mode = std::make_unique<GanMode>(s, std::move(o));
  resources.updates_refused_because = "--mode gan: workers post feedback to /gan/feedback";
  resources.extra_status = [m = mode.get()] { return m->status_json(); };
  const GanCoordinator& gan = mode->coordinator();
  const auto& r = gan.recovery();
  log_line("MD-GAN: " + s.gan_arch + " generator, " + std::to_string(s.gan_workers) +
           " workers, k " + std::to_string(s.gan_k) + ", batch " + std::to_string(s.gan_batch) +
           ", deadline " + short_number(s.gan_deadline) + " s, " +
           (s.gan_swap_every
                ? "discriminator swaps every " + std::to_string(s.gan_swap_every) + " iterations"
                : std::string("no discriminator swaps")) +
           ", batches in " + (s.gan_fp16 ? "fp16" : "fp32") + ", feedback values beyond ±" +
           short_number(s.gan_max_feedback) + " refused" +
           (s.quarantine_after > 0
                ? ", quarantine after " + std::to_string(s.quarantine_after) + " bad feedbacks"
                : std::string()) +
           "; " +
           (r.fresh ? std::string("a new generator")
                    : "recovered iteration " + std::to_string(gan.iteration()) + " (checkpoint " +
                          std::to_string(r.checkpoint_iteration) + " + " +
                          std::to_string(r.replayed) + " logged steps)"));
  return mode;
}

}  // namespace edgetrain::server
