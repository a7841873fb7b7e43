#include "model/dropout_selector.h"

#include <cmath>
#include <stdexcept>

namespace edgetrain::runtime {

DropoutSelector::DropoutSelector(std::vector<DropoutChoice> points, double budget_seconds,
                                 double smoothing, double reselect_fraction)
    : points_(std::move(points)),
      budget_(budget_seconds),
      smoothing_(smoothing),
      reselect_fraction_(reselect_fraction) {
  if (points_.empty())
    throw std::invalid_argument("dropout selector: no points in the dropout table");
  if (!(budget_ > 0) || !std::isfinite(budget_))
    throw std::invalid_argument("dropout selector: the step-time budget must be positive");
  if (!(smoothing_ > 0 && smoothing_ <= 1))
    throw std::invalid_argument("dropout selector: smoothing must be in (0, 1]");
  for (const DropoutChoice& p : points_) {
    if (!(p.relative_time > 0) || !std::isfinite(p.relative_time)) {
      throw std::invalid_argument("dropout selector: relative times must be positive");
    }
  }
  for (std::size_t i = 1; i < points_.size(); i++)
    if (points_[i].accuracy > points_[current_].accuracy) current_ = i;
}

std::size_t DropoutSelector::best_for(double full_step_seconds) const {
  std::size_t best = points_.size(), fastest = 0;
  for (std::size_t i = 0; i < points_.size(); i++) {
    if (points_[i].relative_time < points_[fastest].relative_time) fastest = i;
    const bool fits = points_[i].relative_time * full_step_seconds <= budget_;
    if (fits && (best == points_.size() || points_[i].accuracy > points_[best].accuracy)) best = i;
  }
  return best == points_.size() ? fastest : best;
}

bool DropoutSelector::set_budget(double budget_seconds) {
  if (!(budget_seconds > 0) || !std::isfinite(budget_seconds))
    throw std::invalid_argument("dropout selector: the step-time budget must be positive");
  budget_ = budget_seconds;
  if (estimate_ == 0) return false;
  return choose();
}

bool DropoutSelector::choose() {
  estimate_at_choice_ = estimate_;
  const std::size_t choice = best_for(estimate_);
  if (choice == current_) return false;
  current_ = choice;
  selections_++;
  return true;
}

void DropoutSelector::set_estimate(double full_step_seconds) {
  if (full_step_seconds > 0 && std::isfinite(full_step_seconds)) estimate_ = full_step_seconds;
}

bool DropoutSelector::record_step(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return false;  // a clock glitch is no measurement
  const double full_equivalent = seconds / points_[current_].relative_time;
  estimate_ =
      estimate_ == 0 ? full_equivalent : estimate_ + smoothing_ * (full_equivalent - estimate_);
  if (estimate_at_choice_ != 0 &&
      std::fabs(estimate_ - estimate_at_choice_) <= reselect_fraction_ * estimate_at_choice_) {
    return false;
  }
  return choose();
}

}  // namespace edgetrain::runtime
