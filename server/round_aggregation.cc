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

transport::SparseUpdate round_close_update(std::span<const RoundDelta> deltas,
                                           std::span<const std::uint32_t> tensor_sizes,
                                           Aggregation aggregation, float server_lr,
                                           float store_learning_rate, std::uint64_t model_id,
                                           std::uint64_t round) {
  const std::vector<float> mean = aggregate_deltas(deltas, tensor_sizes, aggregation);
  transport::SparseUpdate update;
  update.model_id = model_id;
  update.sequence = round + 1;
  update.fetched_version = round;
  // The store applies W − lr·g with divisor 1 (delay 0): g = −server_lr·Δ/lr moves W by
  // server_lr·Δ (up to one rounding), and the server's WAL holds g, so replay is bit-exact.
  const float scale = -server_lr / store_learning_rate;
  std::size_t offset = 0;
  for (std::uint32_t t = 0; t < tensor_sizes.size(); ++t) {
    transport::SparseTensor tensor;
    tensor.tensor = t;
    tensor.size = tensor_sizes[t];
    tensor.indices.resize(tensor_sizes[t]);
    tensor.values.resize(tensor_sizes[t]);
    for (std::uint32_t i = 0; i < tensor_sizes[t]; ++i) {
      tensor.indices[i] = i;
      tensor.values[i] = scale * mean[offset + i];
    }
    offset += tensor_sizes[t];
    update.tensors.push_back(std::move(tensor));
  }
  return update;
}

}  // namespace edgetrain::server
