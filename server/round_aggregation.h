// Federated rounds (FedAvg): how the deltas of one round become one change of the model.
// Pure functions, shared by the server (server/round_coordinator.h) and the simulator, so
// both aggregate and close a round bit for bit alike.
//
//   masked (default, ours): each parameter is averaged over the devices whose delta has
//     that entry, weighted by their example counts: Δ_i = Σ_d n_d·v_{d,i} / Σ_{d∋i} n_d;
//     a parameter no device sent stays unchanged. A compressed (sparse) delta then only
//     moves the entries it trained, instead of pulling the others towards zero.
//   fedavg: the plain weighted mean, an entry a device did not send counts as zero:
//     Δ_i = Σ_d n_d·v_{d,i} / Σ_d n_d (McMahan et al. 2017).
//
// Sums are taken in double in the order the deltas are given (the round log's order), so
// the same deltas in the same order give the same floats on every machine.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/codec.h"

namespace edgetrain::server {

// When a round closes (the server's round_coordinator.h and the simulator's rounds alike).
// drop-stragglers: at the deadline with the deltas that arrived; wait-all: when every
// selected device answered, with a safety limit of kWaitAllSafetyFactor deadlines for a
// device that vanished (ours).
enum class RoundPolicy { kWaitAll, kDropStragglers };
const char* round_policy_name(RoundPolicy policy);
RoundPolicy parse_round_policy(const std::string& name);  // "wait-all" | "drop-stragglers"
inline constexpr double kWaitAllSafetyFactor = 4;

enum class Aggregation { kMasked, kFedAvg };
const char* aggregation_name(Aggregation aggregation);
// "masked" or "fedavg"; throws std::invalid_argument for anything else.
Aggregation parse_aggregation(const std::string& name);

struct RoundDelta {
  std::uint64_t examples = 0;     // the weight: examples the device trained on (> 0)
  transport::SparseUpdate delta;  // new − start, entries as sent (already decoded and checked)
};

// The aggregated delta, all tensors back to back (length Σ tensor_sizes). Throws
// std::invalid_argument for a delta whose tensors do not fit `tensor_sizes` or a zero weight.
std::vector<float> aggregate_deltas(std::span<const RoundDelta> deltas,
                                    std::span<const std::uint32_t> tensor_sizes,
                                    Aggregation aggregation);

// A round's close: the one update the parameter store applies for it (the server submits it
// to ServerState, which logs and applies it; the simulator applies it to its store). The
// deltas are aggregated (aggregate_deltas), and every parameter gets the value
// −server_lr·Δ/store_learning_rate, so that the store's W − store_learning_rate·g with
// divisor 1 (delay 0: the update's fetched version is the round, the store's version) moves
// W by server_lr·Δ, up to one rounding. Sequence round + 1, `model_id` the model's layout id.
// Throws as aggregate_deltas does.
transport::SparseUpdate round_close_update(std::span<const RoundDelta> deltas,
                                           std::span<const std::uint32_t> tensor_sizes,
                                           Aggregation aggregation, float server_lr,
                                           float store_learning_rate, std::uint64_t model_id,
                                           std::uint64_t round);

}  // namespace edgetrain::server
