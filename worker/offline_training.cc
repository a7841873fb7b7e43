#include "worker/offline_training.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace edgetrain::runtime {

OfflineAccumulator::OfflineAccumulator(float learning_rate) : learning_rate_(learning_rate) {
  if (!(learning_rate > 0.0f && std::isfinite(learning_rate)))
    throw std::invalid_argument("offline training: the learning rate must be finite and > 0");
}

void OfflineAccumulator::begin(std::span<const float> parameters, std::uint64_t version) {
  if (steps_ > 0)
    throw std::logic_error("offline training: begin() with " + std::to_string(steps_) +
                           " steps still buffered");
  local_.assign(parameters.begin(), parameters.end());
  sum_.assign(parameters.size(), 0.0f);
  version_ = version;
  started_ = true;
}

bool OfflineAccumulator::add_step(std::span<const float> gradient) {
  if (!started_) throw std::logic_error("offline training: add_step() before begin()");
  if (gradient.size() != sum_.size())
    throw std::invalid_argument("offline training: a gradient of " +
                                std::to_string(gradient.size()) + " entries for a model of " +
                                std::to_string(sum_.size()));
  // Checked before anything changes, so a refused step leaves the buffered ones intact.
  // No early exit: the loop vectorises, and a refused step is rare.
  bool finite = true;
  for (std::size_t i = 0; i < gradient.size(); ++i) {
    finite &= std::isfinite(sum_[i] + gradient[i]);
    finite &= std::isfinite(local_[i] - learning_rate_ * gradient[i]);
  }
  if (!finite) return false;
  for (std::size_t i = 0; i < gradient.size(); ++i) {
    sum_[i] += gradient[i];
    local_[i] -= learning_rate_ * gradient[i];
  }
  ++steps_;
  return true;
}

void OfflineAccumulator::clear() {
  steps_ = 0;
  started_ = false;
}

double offline_compression_rate(double online_rate, std::uint64_t steps, double max_rate) {
  if (!(max_rate > 0)) return online_rate;
  return std::clamp(online_rate * static_cast<double>(steps), online_rate,
                    std::max(online_rate, max_rate));
}

}  // namespace edgetrain::runtime
