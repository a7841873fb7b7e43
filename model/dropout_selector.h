// Run-time choice of a dropout vector (DISTREAL, issue 14 part 4): a device picks, from the
// Pareto points of its dropout table (model/dropout_table.h), the most accurate one whose
// step fits its step-time budget at the speed it measures now, with no help from the
// server.
//
// The speed estimate is the full-model-equivalent step time: each measured step divided by
// the relative time of the point it ran with, smoothed (exponential moving average). The
// choice is made again when that estimate has moved by more than `reselect_fraction` since
// the last choice, so the device follows a change of its spare CPU without flapping on
// jitter. When no point fits, the fastest point is used.
//
// The worker uses it through worker/adaptive_dropout.h (--dropout-table).
#pragma once

#include <cstddef>
#include <vector>

namespace edgetrain::runtime {

struct DropoutChoice {
  std::vector<float> drop_rates;
  double relative_time = 1;  // step time / full model's step time
  double accuracy = 0;       // the DSE's accuracy for this vector (higher is better)
};

class DropoutSelector {
 public:
  // `points` non-empty, relative times positive; budget in seconds, positive. Throws
  // std::invalid_argument otherwise. Starts at the most accurate point (no measurement yet).
  DropoutSelector(std::vector<DropoutChoice> points, double budget_seconds, double smoothing = 0.2,
                  double reselect_fraction = 0.1);

  // A step with the current point took `seconds`. Returns true if the choice changed.
  bool record_step(double seconds);

  std::size_t current() const { return current_; }
  const DropoutChoice& current_choice() const { return points_[current_]; }
  double full_step_estimate() const { return estimate_; }  // seconds; 0 before the first step
  std::size_t selections() const { return selections_; }   // choices changed so far

  // A new step-time budget (a round's deadline moved, say): chooses again at once from the
  // current estimate (before any measurement, keeps the current point). Returns true if the
  // choice changed. Throws std::invalid_argument for a budget that is not positive.
  bool set_budget(double budget_seconds);
  double budget() const { return budget_; }
  // Replaces the speed estimate with a full-model step time measured elsewhere (a round
  // worker's mean over its last round); does not choose again (set_budget() does).
  void set_estimate(double full_step_seconds);

  // The most accurate point whose estimated step time fits the budget, else the fastest.
  std::size_t best_for(double full_step_seconds) const;

 private:
  // Chooses for the current estimate; returns true if the choice changed.
  bool choose();

  std::vector<DropoutChoice> points_;
  double budget_, smoothing_, reselect_fraction_;
  std::size_t current_ = 0;
  double estimate_ = 0;  // full-model-equivalent step time, smoothed
  double estimate_at_choice_ = 0;
  std::size_t selections_ = 0;
};

}  // namespace edgetrain::runtime
