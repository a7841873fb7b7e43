#include "server/evaluator.h"

#include <algorithm>

#include "model/trainer.h"

namespace edgetrain::server {

EvaluationResult evaluate_parameters(const runtime::Model& model, std::span<const float> parameters,
                                     const runtime::Dataset& test) {
  constexpr int kBatch = 100;
  const auto started = std::chrono::steady_clock::now();
  runtime::Trainer trainer(model, kBatch);
  trainer.set_input_format(test.format);
  // batchnorm's running statistics never reach the server (model/README.md, "Normalization
  // state"): they are recomputed for these parameters from the examples evaluated.
  if (trainer.has_batch_norm()) {
    trainer.begin_normalization_calibration();
    for (std::size_t start = 0; start < test.size(); start += kBatch) {
      const int count = static_cast<int>(std::min<std::size_t>(kBatch, test.size() - start));
      trainer.calibrate_normalization(parameters, test.pixels.data() + start * test.image_bytes(),
                                      test.labels.data() + start, count);
    }
    trainer.finish_normalization_calibration();
  }
  std::size_t correct = 0;
  double loss_sum = 0;
  for (std::size_t start = 0; start < test.size(); start += kBatch) {
    const int count = static_cast<int>(std::min<std::size_t>(kBatch, test.size() - start));
    auto r = trainer.evaluate(parameters, test.pixels.data() + start * test.image_bytes(),
                              test.labels.data() + start, count);
    correct += r.correct;
    loss_sum += static_cast<double>(r.loss) * count;
  }
  EvaluationResult result;
  if (test.size()) {
    result.accuracy = static_cast<double>(correct) / test.size();
    result.loss = loss_sum / test.size();
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

BackgroundEvaluator::BackgroundEvaluator(runtime::Model model, runtime::Dataset test,
                                         std::function<ServerState::Snapshot()> snapshot,
                                         std::function<void(const EvaluationResult&)> report,
                                         std::chrono::milliseconds interval)
    : model_(std::move(model)),
      test_(std::move(test)),
      snapshot_(std::move(snapshot)),
      report_(std::move(report)),
      interval_(interval),
      thread_([this] { run(); }) {}

BackgroundEvaluator::~BackgroundEvaluator() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void BackgroundEvaluator::run() {
  std::optional<std::uint64_t> last_version;
  while (true) {
    ServerState::Snapshot snapshot = snapshot_();
    if (snapshot.version != last_version) {
      EvaluationResult result = evaluate_parameters(model_, snapshot.parameters, test_);
      result.version = snapshot.version;
      result.parameters =
          std::move(snapshot.parameters);  // for the best checkpoint (server/run_end.h)
      last_version = snapshot.version;
      report_(result);
    }
    std::unique_lock lock(mutex_);
    if (wake_.wait_for(lock, interval_, [this] { return stop_; })) return;
  }
}

}  // namespace edgetrain::server
