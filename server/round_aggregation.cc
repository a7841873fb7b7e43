#include "server/round_aggregation.h"

#include <algorithm>
#include <cmath>
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
  switch (aggregation) {
    case Aggregation::kMasked: return "masked";
    case Aggregation::kFedAvg: return "fedavg";
    case Aggregation::kTrimmedMean: return "trimmed-mean";
    case Aggregation::kMedian: return "median";
    case Aggregation::kDpFedAvg: return "dp-fedavg";
  }
  return "?";
}

Aggregation parse_aggregation(const std::string& name) {
  for (Aggregation a : {Aggregation::kMasked, Aggregation::kFedAvg, Aggregation::kTrimmedMean,
                        Aggregation::kMedian, Aggregation::kDpFedAvg})
    if (name == aggregation_name(a)) return a;
  throw std::invalid_argument("unknown aggregation '" + name +
                              "' (masked, fedavg, trimmed-mean, median or dp-fedavg)");
}

std::size_t trimmed_count(std::size_t m, double trim_fraction) {
  std::size_t k = static_cast<std::size_t>(std::floor(trim_fraction * static_cast<double>(m)));
  if (m > 0 && 2 * k >= m) k = (m - 1) / 2;
  return m - 2 * k;
}

std::string round_delta_problem(const transport::SparseUpdate& delta, float server_lr,
                                float bound) {
  for (const transport::SparseTensor& tensor : delta.tensors)
    for (std::size_t i = 0; i < tensor.values.size(); ++i) {
      const float v = tensor.values[i];
      if (!std::isfinite(v))
        return "tensor " + std::to_string(tensor.tensor) + ", entry " +
               std::to_string(tensor.indices[i]) + ": the value is not finite";
      if (std::fabs(static_cast<double>(server_lr) * v) > bound)
        return "tensor " + std::to_string(tensor.tensor) + ", entry " +
               std::to_string(tensor.indices[i]) + ": a step of " +
               std::to_string(static_cast<double>(server_lr) * v) +
               " would pass the parameter bound " + std::to_string(bound) +
               " (--max-parameter-magnitude)";
    }
  return {};
}

double clip_round_delta(transport::SparseUpdate& delta, double max_norm) {
  double squares = 0;  // double: a float sum of squares of large values overflows
  for (const transport::SparseTensor& tensor : delta.tensors)
    for (float v : tensor.values) squares += static_cast<double>(v) * static_cast<double>(v);
  const double norm = std::sqrt(squares);
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / norm;
    for (transport::SparseTensor& tensor : delta.tensors)
      for (float& v : tensor.values) v = static_cast<float>(static_cast<double>(v) * scale);
  }
  return norm;
}

namespace {

// trimmed-mean and median: coordinate by coordinate over the devices that sent it, a block
// of coordinates at a time (a device's indices are strictly increasing, so one cursor per
// device and tensor walks them), so the memory is a block times the devices, not the model.
void robust_aggregate(std::span<const RoundDelta> deltas,
                      std::span<const std::uint32_t> tensor_sizes, const AggregationRule& rule,
                      std::vector<float>& aggregated) {
  constexpr std::uint32_t kBlock = 1024;
  const std::size_t m = deltas.size();
  std::vector<float> values(static_cast<std::size_t>(kBlock) * m);
  std::vector<std::uint32_t> counts(kBlock);
  std::vector<const transport::SparseTensor*> of_device(m);
  std::vector<std::size_t> cursor(m);
  std::size_t offset = 0;
  for (std::uint32_t t = 0; t < tensor_sizes.size(); ++t) {
    for (std::size_t d = 0; d < m; ++d) {
      of_device[d] = nullptr;
      cursor[d] = 0;
      for (const transport::SparseTensor& tensor : deltas[d].delta.tensors)
        if (tensor.tensor == t) of_device[d] = &tensor;
    }
    for (std::uint32_t begin = 0; begin < tensor_sizes[t]; begin += kBlock) {
      const std::uint32_t end = std::min(tensor_sizes[t], begin + kBlock);
      std::fill(counts.begin(), counts.begin() + (end - begin), 0u);
      for (std::size_t d = 0; d < m; ++d) {
        const transport::SparseTensor* tensor = of_device[d];
        if (!tensor) continue;
        for (std::size_t& k = cursor[d]; k < tensor->indices.size() && tensor->indices[k] < end;
             ++k) {
          const std::uint32_t i = tensor->indices[k] - begin;
          values[static_cast<std::size_t>(i) * m + counts[i]++] = tensor->values[k];
        }
      }
      for (std::uint32_t i = 0; i < end - begin; ++i) {
        const std::size_t n = counts[i];
        if (n == 0) continue;  // nobody sent it: unchanged, as masked
        float* first = values.data() + static_cast<std::size_t>(i) * m;
        // Selection, not a sort: O(n) per coordinate (a sort made the rule 30 times the
        // mean's cost at 100 devices). The order of the sum below is then that of the
        // partition, the same for the same values on the same standard library.
        double result;
        if (rule.kind == Aggregation::kMedian) {
          std::nth_element(first, first + n / 2, first + n);
          result = first[n / 2];
          if (n % 2 == 0)  // the lower middle value: the largest of those before it
            result = (static_cast<double>(*std::max_element(first, first + n / 2)) + result) / 2;
        } else {
          const std::size_t kept = trimmed_count(n, rule.trim_fraction);
          const std::size_t skip = (n - kept) / 2;
          if (skip > 0) {
            std::nth_element(first, first + skip, first + n);  // the skip smallest before it
            std::nth_element(first + skip, first + skip + kept, first + n);  // the largest after
          }
          double sum = 0;
          for (std::size_t j = skip; j < skip + kept; ++j) sum += first[j];
          result = sum / static_cast<double>(kept);
        }
        aggregated[offset + begin + i] = static_cast<float>(result);
      }
    }
    offset += tensor_sizes[t];
  }
}

}  // namespace

std::vector<float> aggregate_deltas(std::span<const RoundDelta> deltas,
                                    std::span<const std::uint32_t> tensor_sizes,
                                    AggregationRule rule) {
  if (!(rule.trim_fraction >= 0 && rule.trim_fraction < 0.5))
    throw std::invalid_argument("the trim fraction must be in [0, 0.5)");
  const bool dp = rule.kind == Aggregation::kDpFedAvg;
  if (dp && !(rule.expected_devices > 0))
    throw std::invalid_argument("dp-fedavg needs the expected number of devices per round");
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (std::uint32_t size : tensor_sizes) {
    offsets.push_back(total);
    total += size;
  }
  const bool robust = rule.kind == Aggregation::kTrimmedMean || rule.kind == Aggregation::kMedian;
  std::vector<double> sums(robust ? 0 : total, 0.0), weights(robust ? 0 : total, 0.0);
  double all_weights = 0;
  for (const RoundDelta& round_delta : deltas) {
    if (round_delta.examples == 0) throw std::invalid_argument("a round delta with zero examples");
    const double weight = dp ? 1.0 : static_cast<double>(round_delta.examples);
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
        if (robust) continue;  // only checked here
        sums[base + tensor.indices[k]] += weight * static_cast<double>(tensor.values[k]);
        weights[base + tensor.indices[k]] += weight;
      }
    }
  }
  std::vector<float> aggregated(total, 0.0f);
  if (robust) {
    // The checks above ran over every delta: the robust pass can trust the layout.
    robust_aggregate(deltas, tensor_sizes, rule, aggregated);
    return aggregated;
  }
  for (std::size_t i = 0; i < total; ++i) {
    const double divisor = rule.kind == Aggregation::kMasked ? weights[i]
                           : dp                               ? rule.expected_devices
                                                              : all_weights;
    if (divisor > 0) aggregated[i] = static_cast<float>(sums[i] / divisor);
  }
  return aggregated;
}

transport::SparseUpdate round_close_update(std::span<const RoundDelta> deltas,
                                           std::span<const std::uint32_t> tensor_sizes,
                                           AggregationRule rule, float server_lr,
                                           float store_learning_rate, std::uint64_t model_id,
                                           std::uint64_t round) {
  const std::vector<float> mean = aggregate_deltas(deltas, tensor_sizes, rule);
  return close_update_of(mean, tensor_sizes, server_lr, store_learning_rate, model_id, round);
}

transport::SparseUpdate close_update_of(std::span<const float> mean,
                                        std::span<const std::uint32_t> tensor_sizes,
                                        float server_lr, float store_learning_rate,
                                        std::uint64_t model_id, std::uint64_t round) {
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
