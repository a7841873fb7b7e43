// A worker's filter dropout (DISTREAL, issue 14): none, a static per-layer vector (every
// step trains the same thinness: HeteroFL-style static width), or adaptive: the worker reads
// a dropout table (model/dropout_table.h) and picks, with no help from the server, the
// most accurate point whose step fits its step-time budget at the speed it measures now
// (model/dropout_selector.h). It re-selects as its available CPU changes: the measured
// step times move the estimate. Async mode has a fixed budget (--step-time-budget); in
// rounds the budget comes from the round's deadline (RoundWorker sets it per round).
//
// Pacing. Per step (async): every step's time moves a smoothed estimate, and the choice
// follows it with hysteresis. Per round (rounds): a round trains one point, chosen at its
// start from the mean full-model step time of the previous round's steps (in the first
// round, after its first 3 steps). Per-step times under a CPU quota are bursty (a step
// either fits the period's quota or waits for the next period), which made a per-step
// choice flap several times a round; a round's mean is steady.
//
// Used by Worker and RoundWorker around each step: after_step(seconds) with the step's
// wall time (slowdown sleep included: a slowed device is slow).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/dropout_selector.h"
#include "model/dropout_table.h"
#include "model/filter_dropout.h"
#include "model/model.h"
#include "model/trainer.h"

namespace edgetrain::runtime {

struct WorkerDropoutSettings {
  std::vector<float> drop_rates;  // static: one rate per conv layer (empty: none)
  DropoutRescale rescale = DropoutRescale::kInverted;  // static only; a table carries its own
  std::string table_path;          // adaptive: a dropout table file (empty: none)
  double step_budget_seconds = 0;  // adaptive, async mode: the step-time budget (> 0 there)
};

// What a worker reports about its dropout (stats file, progress line).
struct DropoutStatus {
  std::string drop_rates;        // the current vector, "0,0" for the full model; empty: dropout off
  std::uint64_t selections = 0;  // adaptive: times the choice changed
  double full_step_estimate_ms = 0;  // adaptive: the measured speed, as the full model's step time
  double budget_ms = 0;              // adaptive: the step-time budget in force
};

// Per step: async mode; per round: federated rounds (see above).
enum class DropoutPacing { kPerStep, kPerRound };

// The settings' checks alone (what the constructor below refuses), for a program to report
// bad settings before it loads its data: std::invalid_argument naming what is wrong.
void check_worker_dropout(const WorkerDropoutSettings& settings, const Model& model,
                          DropoutPacing pacing);

class WorkerDropout {
 public:
  using Pacing = DropoutPacing;
  // Checks the settings against `model` (std::invalid_argument: both static and table given,
  // a rate outside [0, 1) or the wrong count, a table for another model, an adaptive
  // per-step worker without a budget), and sets the trainer's dropout.
  WorkerDropout(const WorkerDropoutSettings& settings, const Model& model, Trainer& trainer,
                std::uint64_t seed, Pacing pacing);

  bool adaptive() const { return selector_.has_value(); }
  // Adaptive: a new budget per step (seconds); re-selects at once (per round: from the last
  // round's mean). Returns true if the choice changed. No effect when not adaptive.
  bool set_budget(double seconds);
  // A step took `seconds` (wall time). Adaptive: may re-select (returns true then).
  bool after_step(double seconds);
  DropoutStatus status() const;
  // "dropout 0.25,0.5 (full-model step 41.2 ms, budget 30.0 ms)": for the log on a change.
  std::string describe() const;

 private:
  void apply(const std::vector<float>& rates);

  const Model& model_;
  Trainer& trainer_;
  std::uint64_t seed_;
  Pacing pacing_;
  // Per round: this round's step times and the relative times of the points they ran.
  double round_seconds_ = 0, round_relative_ = 0;
  int round_steps_ = 0;
  bool estimated_ = false;
  std::uint64_t applied_ = 0;  // vectors applied so far (varies the draws' seed)
  DropoutRescale rescale_ = DropoutRescale::kInverted;
  std::vector<float> current_;  // empty: dropout off
  std::string current_text_;    // current_ formatted ("" when off)
  std::optional<DropoutSelector> selector_;
};

}  // namespace edgetrain::runtime
