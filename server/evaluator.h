// Test accuracy in a background thread, so that ingestion never waits for it: each round
// takes a snapshot of the parameters (a copy made under ServerState's mutex, a few ms for
// the paper CNN) and evaluates it on the test set with its own Trainer. Rounds run every
// `interval` while the version has changed since the last one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "model/dataset.h"
#include "model/model.h"
#include "server/server_state.h"

namespace edgetrain::server {

struct EvaluationResult {
  std::uint64_t version = 0;
  double accuracy = 0;
  double loss = 0;
  double seconds = 0;             // wall time of the round
  std::vector<float> parameters;  // the evaluated snapshot (BackgroundEvaluator's reports only)
};

// Accuracy and mean loss of `parameters` on `test` (batches of 100).
EvaluationResult evaluate_parameters(const runtime::Model& model, std::span<const float> parameters,
                                     const runtime::Dataset& test);

class BackgroundEvaluator {
 public:
  // `snapshot` is called from the evaluator thread; `report` receives each result there.
  BackgroundEvaluator(runtime::Model model, runtime::Dataset test,
                      std::function<ServerState::Snapshot()> snapshot,
                      std::function<void(const EvaluationResult&)> report,
                      std::chrono::milliseconds interval);
  ~BackgroundEvaluator();  // stops the thread after the current round
  BackgroundEvaluator(const BackgroundEvaluator&) = delete;
  BackgroundEvaluator& operator=(const BackgroundEvaluator&) = delete;

 private:
  void run();

  runtime::Model model_;
  runtime::Dataset test_;
  std::function<ServerState::Snapshot()> snapshot_;
  std::function<void(const EvaluationResult&)> report_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace edgetrain::server
