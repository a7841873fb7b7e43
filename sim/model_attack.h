// What a malicious participant of a simulation does to the model or delta it sends
// (--malicious-peers / --attack, experiment knobs of ours for issue 37): shared by the gossip
// simulation (a peer's published model) and the rounds simulation (a worker's delta).
//   bias:V   every entry of the output layer's bias set to V
//   scale:F  every value times F (F < 0: a sign flip; a large F: a boosted delta)
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include "model/model.h"

namespace edgetrain::sim {

struct ModelAttack {
  enum class Kind { kBias, kScale } kind = Kind::kBias;
  double value = 1e30;
};

// "bias:V" or "scale:F" (a finite float); std::invalid_argument naming --attack otherwise.
ModelAttack parse_model_attack(const std::string& text);

// The output layer's bias (the last layer that has one) as (offset, size) in the model's
// flat parameters; (0, 0) for a model without biases.
std::pair<std::size_t, std::size_t> output_bias_range(const runtime::Model& model);

// Applies `attack` to `values` (a whole model or delta, flat) in place; `bias` is
// output_bias_range() of the model.
void apply_model_attack(const ModelAttack& attack, std::span<float> values,
                        std::pair<std::size_t, std::size_t> bias);

}  // namespace edgetrain::sim
