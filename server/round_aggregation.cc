#include "server/round_aggregation.h"

#include <stdexcept>

namespace edgetrain::server {

const char* round_policy_name(RoundPolicy policy) {
  return policy == RoundPolicy::kWaitAll ? "wait-all" : "drop-stragglers";
}

RoundPolicy parse_round_policy(const std::string& name) {
  if (name == "wait-all") return RoundPolicy::kWaitAll;
  if (name == "drop-stragglers") return RoundPolicy::kDropStragglers;
  throw std::invalid_argument("unknown round policy '" + name + "' (wait-all or drop-stragglers)");
}

const char* aggregation_name(Aggregation aggregation) {
  return aggregation == Aggregation::kMasked ? "masked" : "fedavg";
}

Aggregation parse_aggregation(const std::string& name) {
  if (name == "masked") return Aggregation::kMasked;
  if (name == "fedavg") return Aggregation::kFedAvg;
  throw std::invalid_argument("unknown aggregation '" + name + "' (masked or fedavg)");
}

std::vector<float> aggregate_deltas(std::span<const RoundDelta> deltas,
                                    std::span<const std::uint32_t> tensor_sizes,
                                    Aggregation aggregation) {
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (std::uint32_t size : tensor_sizes) {
    offsets.push_back(total);
    total += size;
  }
  std::vector<double> sums(total, 0.0), weights(total, 0.0);
  double all_weights = 0;
  for (const RoundDelta& round_delta : deltas) {
    if (round_delta.examples == 0) throw std::invalid_argument("a round delta with zero examples");
    const double weight = static_cast<double>(round_delta.examples);
    all_weights += weight;
    for (const transport::SparseTensor& tensor : round_delta.delta.tensors) {
      if (tensor.tensor >= tensor_sizes.size() || tensor.size != tensor_sizes[tensor.tensor] ||
          tensor.indices.size() != tensor.values.size())
        throw std::invalid_argument("a round delta's tensor " + std::to_string(tensor.tensor) +
                                    " does not fit the model");
      const std::size_t base = offsets[tensor.tensor];
      for (std::size_t k = 0; k < tensor.indices.size(); ++k) {
        if (tensor.indices[k] >= tensor.size)
          throw std::invalid_argument("a round delta's index is out of range");
        sums[base + tensor.indices[k]] += weight * static_cast<double>(tensor.values[k]);
        weights[base + tensor.indices[k]] += weight;
      }
    }
  }
  std::vector<float> aggregated(total, 0.0f);
  for (std::size_t i = 0; i < total; ++i) {
    const double divisor = aggregation == Aggregation::kMasked ? weights[i] : all_weights;
    if (divisor > 0) aggregated[i] = static_cast<float>(sums[i] / divisor);
  }
  return aggregated;
}

}  // namespace edgetrain::server
