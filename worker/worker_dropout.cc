#include "worker/worker_dropout.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace edgetrain::runtime {

void check_worker_dropout(const WorkerDropoutSettings& settings, const Model& model,
                          DropoutPacing pacing) {
  if (!settings.drop_rates.empty() && !settings.table_path.empty())
    throw std::invalid_argument(
        "worker: give either --drop-rates (a static vector) or --dropout-table (chosen at run "
        "time), not both");
  if (!settings.table_path.empty()) {
    read_dropout_table(settings.table_path, model);
    if (pacing == DropoutPacing::kPerStep && !(settings.step_budget_seconds > 0))
      throw std::invalid_argument(
          "worker: --dropout-table needs --step-time-budget in async mode (in rounds the "
          "round's deadline sets the budget)");
  } else if (!settings.drop_rates.empty()) {
    validate_drop_rates(model, settings.drop_rates);
  } else if (settings.step_budget_seconds > 0) {
    throw std::invalid_argument("worker: --step-time-budget is for --dropout-table");
  }
}

WorkerDropout::WorkerDropout(const WorkerDropoutSettings& settings, const Model& model,
                             Trainer& trainer, std::uint64_t seed, Pacing pacing)
    : model_(model), trainer_(trainer), seed_(seed), pacing_(pacing), rescale_(settings.rescale) {
  check_worker_dropout(settings, model, pacing);
  if (!settings.table_path.empty()) {
    const DropoutTable table = read_dropout_table(settings.table_path, model);
    rescale_ = table.rescale;
    // Before the first measurement the selector holds the most accurate point; a round
    // worker replaces this budget with its deadline's before training.
    selector_.emplace(dropout_choices(table),
                      settings.step_budget_seconds > 0 ? settings.step_budget_seconds : 1.0);
    apply(selector_->current_choice().drop_rates);
  } else if (!settings.drop_rates.empty()) {
    apply(settings.drop_rates);
  }
}

void WorkerDropout::apply(const std::vector<float>& rates) {
  current_ = rates;
  current_text_ = format_drop_rates(current_);  // here, not per step: status() runs every step
  if (std::all_of(rates.begin(), rates.end(), [](float r) { return r == 0.0f; })) {
    trainer_.clear_dropout();  // the full model runs the full model's kernels
    return;
  }
  // A new seed per vector applied, so coming back to a vector does not replay its draws.
  trainer_.set_dropout({rates, rescale_, seed_ + 0x9e3779b97f4a7c15ULL * ++applied_});
}

bool WorkerDropout::set_budget(double seconds) {
  if (!selector_) return false;
  if (pacing_ == Pacing::kPerRound && round_steps_ > 0) {
    selector_->set_estimate(round_seconds_ / round_relative_);
    estimated_ = true;
    round_seconds_ = round_relative_ = 0;
    round_steps_ = 0;
  }
  if (!selector_->set_budget(seconds)) return false;
  apply(selector_->current_choice().drop_rates);
  return true;
}

bool WorkerDropout::after_step(double seconds) {
  if (!selector_ || !(seconds > 0)) return false;
  if (pacing_ == Pacing::kPerStep) {
    if (!selector_->record_step(seconds)) return false;
    apply(selector_->current_choice().drop_rates);
    return true;
  }
  round_seconds_ += seconds;
  round_relative_ += selector_->current_choice().relative_time;
  round_steps_++;
  // The first round has no estimate to start from: choose after its first few steps.
  constexpr int kFirstEstimateSteps = 3;
  if (estimated_ || round_steps_ < kFirstEstimateSteps) return false;
  return set_budget(selector_->budget());
}

DropoutStatus WorkerDropout::status() const {
  DropoutStatus status;
  status.drop_rates = current_text_;
  if (selector_) {
    status.selections = selector_->selections();
    status.full_step_estimate_ms = selector_->full_step_estimate() * 1e3;
    status.budget_ms = selector_->budget() * 1e3;
  }
  return status;
}

std::string WorkerDropout::describe() const {
  const DropoutStatus s = status();
  char text[200];
  std::snprintf(text, sizeof text, "dropout %s (full-model step %.1f ms, budget %.1f ms)",
                s.drop_rates.c_str(), s.full_step_estimate_ms, s.budget_ms);
  return text;
}

}  // namespace edgetrain::runtime
