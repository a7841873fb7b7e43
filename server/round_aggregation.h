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
//   trimmed-mean and median: robust rules against a few bad devices (issue 37), coordinate-
//     wise as in Yin et al. (ICML 2018): over the m_i devices whose delta has entry i, sort
//     their values, drop the k = ⌊β·m_i⌋ smallest and the k largest and take the plain mean
//     of the rest (β: trim_fraction; at least one value is kept, so k ≤ (m_i − 1)/2), or take
//     the median (the mean of the two middle values for an even m_i). Unweighted, as in the
//     paper: a device's example count does not weigh here, so a device cannot claim a large
//     one to outvote the others. Over the devices that sent the entry, as masked is (ours).
//   dp-fedavg: DP-FedAvg's estimator with a fixed denominator (McMahan et al. 2018): the
//     unweighted sum of the (clipped) deltas over the expected number of devices per round,
//     Δ_i = Σ_d v_{d,i} / m (a missing entry counts as zero), so that one device changes Δ
//     by at most its clip norm S over m whatever the others sent; the caller adds the
//     Gaussian noise (server/dp_accountant.h, server/secure_noise.h) before the close.
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

enum class Aggregation { kMasked, kFedAvg, kTrimmedMean, kMedian, kDpFedAvg };
const char* aggregation_name(Aggregation aggregation);
// "masked", "fedavg", "trimmed-mean", "median" or "dp-fedavg"; throws std::invalid_argument
// otherwise.
Aggregation parse_aggregation(const std::string& name);

// β of trimmed-mean (ours: with 5 to 9 devices it drops one value at each end, and with 10
// to 14 two, which tolerates one or two bad devices per entry).
inline constexpr double kDefaultTrimFraction = 0.2;
// The rule and its parameter. Made from an Aggregation alone, β is the default.
struct AggregationRule {
  AggregationRule(Aggregation kind = Aggregation::kMasked,  // NOLINT: implicit on purpose
                  double trim_fraction = kDefaultTrimFraction)
      : kind(kind), trim_fraction(trim_fraction) {}
  Aggregation kind;
  double trim_fraction;         // in [0, 0.5): the share dropped at each end (trimmed-mean only)
  double expected_devices = 0;  // dp-fedavg's fixed denominator m (> 0)
};
// Values kept of the m sorted ones: [k, m − k).
std::size_t trimmed_count(std::size_t m, double trim_fraction);

struct RoundDelta {
  std::uint64_t examples = 0;     // the weight: examples the device trained on (> 0)
  transport::SparseUpdate delta;  // new − start, entries as sent (already decoded and checked)
};

// The aggregated delta, all tensors back to back (length Σ tensor_sizes). Throws
// std::invalid_argument for a delta whose tensors do not fit `tensor_sizes`, a zero weight
// or a trim fraction outside [0, 0.5).
std::vector<float> aggregate_deltas(std::span<const RoundDelta> deltas,
                                    std::span<const std::uint32_t> tensor_sizes,
                                    AggregationRule rule);

// What a server takes of a device's delta before it acknowledges it (issue 37), shared by
// the server's RoundCoordinator and the simulator:
// Why `delta` cannot be taken, or empty: a value that is not finite, or whose step alone
// (server_lr · v) passes the parameters' bound (--max-parameter-magnitude).
std::string round_delta_problem(const transport::SparseUpdate& delta, float server_lr,
                                float bound);
// Per-device norm clipping (--round-clip-norm τ > 0): when the L2 norm of all of `delta`'s
// values is above τ, every value is scaled by τ/norm (in double, then rounded to float).
// Returns the norm before clipping (clipped when it is > τ). The clipped delta is what the
// round log keeps, so a restart reloads exactly what will be aggregated.
double clip_round_delta(transport::SparseUpdate& delta, double max_norm);

// A round's close: the one update the parameter store applies for it (the server submits it
// to ServerState, which logs and applies it; the simulator applies it to its store). The
// deltas are aggregated (aggregate_deltas), and every parameter gets the value
// −server_lr·Δ/store_learning_rate, so that the store's W − store_learning_rate·g with
// divisor 1 (delay 0: the update's fetched version is the round, the store's version) moves
// W by server_lr·Δ, up to one rounding. Sequence round + 1, `model_id` the model's layout id.
// Throws as aggregate_deltas does.
// The close's update for an aggregated delta `mean` (all tensors back to back): what
// round_close_update() makes of aggregate_deltas(), for a caller that changes the aggregate
// first (dp-fedavg's noise).
transport::SparseUpdate close_update_of(std::span<const float> mean,
                                        std::span<const std::uint32_t> tensor_sizes,
                                        float server_lr, float store_learning_rate,
                                        std::uint64_t model_id, std::uint64_t round);
transport::SparseUpdate round_close_update(std::span<const RoundDelta> deltas,
                                           std::span<const std::uint32_t> tensor_sizes,
                                           AggregationRule rule, float server_lr,
                                           float store_learning_rate, std::uint64_t model_id,
                                           std::uint64_t round);

}  // namespace edgetrain::server
