// The server's parameters and the staleness-aware apply of DESIGN.md (AdaComp paper):
//
//   delay = t − t_fetch
//   σ_i   = how many of the last `delay` applied updates touched index i
//   W_i  ← W_i − lr · g_i / max(1, σ_i)   for every sent index i;   t ← t + 1
//
// Memory is bounded by the maximum staleness D: updates with delay > D are refused (the
// worker must re-pull), and the indices touched by the last D updates are kept in a ring.
// With D ≤ 64 (the default D is 64) each parameter has a 64-bit mask: bit v mod 64 is set
// while the sparse update that produced version v is among the last D and touched it, so
// σ_i is the popcount of the mask over the window's bits, O(1) per entry; a set leaving
// the ring clears its bits. With a larger D each touched entry records the previous version
// that touched the same parameter, and each parameter the newest version that touched it:
// σ_i is found by following that chain back until it leaves the window, O(k + Σσ_i) for an
// update's k entries. Either way a dense update is stored as a flag and counts for every
// parameter without a bit or a link.
//
// Values: an update is applied only if every parameter it touches stays finite and within
// ±max_parameter_magnitude afterwards. The check is exact: the new values are computed
// (σ divisor and lr included) before anything changes, and are then what is written, so a
// refused update changes nothing and an accepted one cannot overflow a parameter. Group
// commit reserve()s updates before they are durable: each is checked against the values the
// updates reserved before it will leave, and joins the staleness history at once, so σ and
// the check see exactly what apply_reserved() will do, in version order.
//
// Option: Zhang et al. 2016 ("Staleness-aware async-SGD"), one divisor per update:
// W_i ← W_i − lr · g_i / max(1, delay). No history is kept for it.
//
// Per-entry staleness (the cheap pull, server/replica_pull.h; ours, docs/design.md §3): a
// worker whose pulls leave entries out computes on a copy whose entries come from different
// versions. Given h_i, the version at which entry i of that copy was last the model's value
// (the server's record of the copy), entry i's delay is d_i = t − min(h_i, t_fetch), at most
// D (the history holds no more): σ_i counts the updates of the last d_i versions that
// touched i, and the delay rule divides by max(1, d_i). With every h_i = t_fetch (an exact
// pull) this is the rule above, bit for bit.
//
// Offline updates (issue 38 part 1; ours, docs/design.md §3): an update may say that it carries
// s local steps (SparseUpdate::local_steps, a worker's accumulated offline training). With
// offline_step_credit C > 0 the rule's divisor d_i (σ_i, or the delay) becomes
// ⌈d_i / min(s', d_i)⌉ with s' = min(s, C): an update that carries at least as many steps
// as updates touched the entry meanwhile is applied at the full learning rate, as a fresh
// one. The credit only ever lowers a divisor to 1, never below, so an update that lies about
// its steps weighs at most what a fresh update may (the value bound still applies); C caps
// how much staleness a claim can waive. C = 0 (the default): the claim is ignored.
//
// With offline_average on as well (ours; a bound on what one credited update may change),
// every divisor of an update whose claim is credited (s' = min(s, C) > 1) is at least
// ⌈(s' + d) / s'⌉, d its delay in versions: its weight is at most s'/(s' + d), the share
// of its s' steps in the s' + d steps that it and the fleet's d updates since its version
// carry, as when two trajectories from one model are averaged by their work. Without it
// the credit applies an update of s ≥ σ_i steps at full weight however far the fleet
// moved meanwhile (measured: accuracy fell after wide offline updates, docs/emulation-results.md).
//
// Learning-rate schedule (step decay, as PyTorch's MultiStepLR; ours as defaults, docs/design.md
// §3): with milestones V1 < V2 < … and a factor F, the update that produces version t is
// applied with lr(t) = lr · F^n, n the number of milestones ≤ t, in every rule above and in
// reserve() as in apply(): W_i ← W_i − lr(t) · g_i / divisor_i. lr(t) is computed by n float
// multiplications, so a replay gets the same bits. No milestones (the default): lr(t) = lr,
// the arithmetic of a store without a schedule, bit for bit.
//
// No networking, no durability here: the server wraps this with its WAL and CoAP handlers.
// Not thread-safe; the server applies updates one at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/codec.h"

namespace edgetrain::server {

enum class StalenessRule {
  kPerParameterSigma,  // the AdaComp paper (default)
  kPerUpdateDelay,     // Zhang et al.: lr / max(1, delay)
  kNone,               // plain asynchronous SGD: lr for every update, whatever its delay
};

// D, the largest delay an update may have, unless a program's --max-staleness says
// otherwise: one default for the server and the simulator.
inline constexpr std::uint32_t kDefaultMaxStaleness = 64;
// The largest |W_i| an update may leave behind, unless a program says otherwise: far above
// any weight of a healthy network, far below where float arithmetic overflows.
inline constexpr float kDefaultMaxParameterMagnitude = 1e6f;

// "Learning-rate schedule" above. Checked by check_learning_rate_schedule().
struct LearningRateSchedule {
  std::vector<std::uint64_t> decay_at;  // milestones V1 < V2 < …, each ≥ 1; empty: none
  float factor = 0.1f;                  // F in (0, 1): PyTorch's MultiStepLR default γ
  bool enabled() const { return !decay_at.empty(); }
  bool operator==(const LearningRateSchedule&) const = default;
};
// lr(t) of "Learning-rate schedule" for the update that produces `version`.
float learning_rate_at(float learning_rate, const LearningRateSchedule& schedule,
                       std::uint64_t version);
// Throws std::invalid_argument saying what is wrong: milestones not strictly increasing or
// 0, more than kMaxLearningRateMilestones of them, or a factor outside (0, 1).
void check_learning_rate_schedule(const LearningRateSchedule& schedule);
// "V1,V2,…" (a program's --lr-decay-at) → the milestones; "" → none. Throws
// std::invalid_argument naming the flag's text and the problem.
std::vector<std::uint64_t> parse_lr_decay_at(std::string_view text);
// "V1,V2,…" of the milestones (what parse_lr_decay_at() reads back); "" for none.
std::string format_lr_decay_at(std::span<const std::uint64_t> milestones);
// The most milestones a schedule may have: bounds the WAL header's extension (server/README.md).
inline constexpr std::size_t kMaxLearningRateMilestones = 64;

struct ParameterStoreOptions {
  float learning_rate = 0.1f;                          // the paper's
  std::uint32_t max_staleness = kDefaultMaxStaleness;  // D: largest delay accepted
  StalenessRule rule = StalenessRule::kPerParameterSigma;
  // An update that would leave a parameter it touches non-finite or beyond ±this is refused
  // (kOutOfBounds). Non-finite results are refused whatever the bound.
  float max_parameter_magnitude = kDefaultMaxParameterMagnitude;
  // C of "Offline updates" above: the most local steps an update's claim is credited with;
  // 0: claims ignored (the paper's rule for every update). At most 65535 (the claim's range).
  std::uint32_t offline_step_credit = 0;
  // "offline_average" above; needs offline_step_credit > 0.
  bool offline_average = false;
  LearningRateSchedule lr_schedule;  // "Learning-rate schedule" above; default: none
};

// Which value check apply() makes: the configured bound, or only finiteness (replaying a log
// whose updates were acknowledged under another bound).
enum class ValueCheck { kBound, kFiniteOnly };

enum class ApplyStatus {
  kApplied,
  kWrongModel,     // model id differs          → CoAP 4.09, re-pull
  kTooStale,       // delay > D                 → CoAP 4.09, re-pull
  kFromTheFuture,  // t_fetch > t               → CoAP 4.00
  kMalformed,      // layout, index or value problem → CoAP 4.00
  kOutOfBounds,    // a touched parameter would become non-finite or exceed the bound → CoAP 4.22
};
const char* apply_status_name(ApplyStatus status);

struct ApplyResult {
  ApplyStatus status = ApplyStatus::kApplied;
  std::uint64_t version = 0;  // t after the call (unchanged when refused)
  std::string reason;         // empty when applied
  bool applied() const { return status == ApplyStatus::kApplied; }
};

class ParameterStore {
 public:
  // `initial` holds all tensors back to back; throws std::invalid_argument when its length
  // differs from the sum of `tensor_sizes` or a size is zero.
  ParameterStore(std::uint64_t model_id, std::vector<std::uint32_t> tensor_sizes,
                 std::vector<float> initial, ParameterStoreOptions options = {});

  // Checks the whole update first (layout, staleness, the values it leaves), so a refused
  // update changes nothing. Throws std::logic_error while updates are reserved.
  // `entry_versions`: empty, or per flat parameter index the version h_i at which the
  // sending worker's copy of that entry was last the model's (per-entry staleness, above;
  // the caller's record, read during the call only). The update's own delay still decides
  // kTooStale. Throws std::invalid_argument when it is neither empty nor one per parameter.
  ApplyResult apply(const transport::SparseUpdate& update, ValueCheck values = ValueCheck::kBound,
                    std::span<const std::uint64_t> entry_versions = {});
  // The checks apply() makes before computing values (model, staleness, layout), without
  // applying; kOutOfBounds is only found by apply() and reserve().
  ApplyResult admissible(const transport::SparseUpdate& update) const {
    return admissible_after(update, 0);
  }

  // Group commit. reserve() makes every check of apply() against the state the updates
  // reserved so far will leave (version t + reserved(), their values, their touched sets in
  // the staleness history), computes the update's divisors and new values, and reserves the
  // next version for it: its touched set joins the history now, its values wait.
  // apply_reserved() then writes the oldest reserved update's values (exactly what reserve()
  // checked) and advances t; the caller passes each reserved update once, in order.
  // cancel_last_reserved() forgets the newest reservation (its WAL write failed),
  // cancel_reserved() all of them (the sync failed): the history is as it was before.
  // Nothing here allocates once the reservations' buffers have been used (they are recycled).
  // `entry_versions` as for apply().
  ApplyResult reserve(const transport::SparseUpdate& update,
                      ValueCheck values = ValueCheck::kBound,
                      std::span<const std::uint64_t> entry_versions = {});
  ApplyResult apply_reserved();
  void cancel_last_reserved();
  void cancel_reserved();
  std::size_t reserved() const { return reserved_.size(); }

  // Puts the store in the state of an uninterrupted run that had reached `version` with
  // `parameters` (from a checkpoint): `recent` holds the updates that produced the last
  // versions (oldest first, the last one produced `version`). Their touched sets refill the
  // staleness history, so σ for the next updates is what it would have been without the
  // restart; their values are not applied again. Under kPerParameterSigma, fewer than
  // min(version, D) recent updates leave σ too small; the caller checks. Throws
  // std::invalid_argument for a parameter count that differs, more recent updates than
  // `version`, or a recent update apply() would call malformed.
  // Throws std::logic_error while updates are reserved.
  void restore(std::uint64_t version, std::span<const float> parameters,
               std::span<const transport::SparseUpdate> recent);
  // The flat index of the first parameter that is not finite, or -1 (a loaded checkpoint).
  static std::ptrdiff_t first_non_finite(std::span<const float> parameters);

  std::uint64_t version() const { return version_; }
  std::uint64_t model_id() const { return model_id_; }
  std::span<const float> parameters() const { return parameters_; }
  std::span<const std::uint32_t> tensor_sizes() const { return tensor_sizes_; }
  const ParameterStoreOptions& options() const { return options_; }
  // Per parameter (flat index), the version whose update last touched it, for the sparse
  // model download (GET /model?since=V): the entries with last_changed()[i] > V are all
  // that differ between the parameters at V and now, for every V ≥ changes_known_since().
  // Conservative: an entry counts as changed when an update sent it, even if its value
  // came out the same. Kept in O(k) per update. Before changes_known_since() (a restart
  // knows only the history restore() was given) every entry counts as changed then.
  std::span<const std::uint64_t> last_changed() const { return last_changed_; }
  std::uint64_t changes_known_since() const { return changes_known_since_; }
  // The divisor used for each sent entry by the last applied update, in the update's order
  // (tensor by tensor as sent): max(1, σ_i), or max(1, delay) under kPerUpdateDelay, or 1 under
  // kNone.
  std::span<const std::uint32_t> last_divisors() const { return last_divisors_; }

 private:
  struct TouchedSet {
    bool dense = false;
    std::vector<std::uint32_t> indices;  // flat arena indices, when !dense
    // Per entry, under the chain (D > 64): the previous sparse update that touched the same
    // parameter (its version, 0 for none, and the entry's position in that update's set).
    std::vector<std::uint64_t> previous_version;
    std::vector<std::uint32_t> previous_position;
  };
  // A reserved update: what apply_reserved() writes, and what cancelling it restores.
  struct Reservation {
    std::uint64_t version = 0;            // the version it produces
    std::vector<std::uint32_t> touched;   // flat indices, in the update's order
    std::vector<std::uint32_t> divisors;  // per entry
    std::vector<float> values;            // per entry: the parameter's value after it
    // Per entry: the reservation that touched the parameter before this one (version, or
    // anything ≤ t for none, and position), restored by cancelling this one.
    std::vector<std::uint64_t> previous_reserved_version;
    std::vector<std::uint32_t> previous_reserved_position;
    TouchedSet displaced;  // the history slot it overwrote
    std::size_t ring_length_before = 0;
  };
  ApplyResult admissible_after(const transport::SparseUpdate& update, std::uint64_t pending) const;
  std::string check(const transport::SparseUpdate& update) const;
  float bound_for(ValueCheck values) const;
  // divisors_ for touched_ (σ or the delay rule); per entry when entry_versions is not empty.
  // divisors_ lowered for the local steps `update` claims (offline_step_credit).
  void credit_local_steps(const transport::SparseUpdate& update, std::uint64_t delay);
  void compute_divisors(std::uint64_t delay, std::uint64_t fetched_version,
                        std::span<const std::uint64_t> entry_versions);
  void check_entry_versions(std::span<const std::uint64_t> entry_versions) const;
  std::string reserved_values(const transport::SparseUpdate& update, ValueCheck values);
  void compute_sigma(std::uint64_t delay);
  // entry_delays_ for touched_: top − min(h_i, fetched_version), at most D.
  void compute_entry_delays(std::uint64_t fetched_version,
                            std::span<const std::uint64_t> entry_versions);
  void compute_entry_sigma();  // sigma_ for touched_ from entry_delays_
  // How many sparse updates that produced a version above window_start touched `entry`: its
  // chain of touches walked from the newest back (window_start at most D behind the top).
  std::uint32_t sparse_touches_after(std::size_t entry, std::uint64_t window_start) const;
  void remember_touched();
  void collect_touched(const transport::SparseUpdate& update);
  std::uint64_t history_top() const {
    return version_ + reserved_.size();
  }                                                     // newest version in the history
  const TouchedSet& set_at_age(std::size_t age) const;  // age 0 = newest

  std::uint64_t model_id_;
  std::vector<std::uint32_t> tensor_sizes_;
  std::vector<std::size_t> tensor_offsets_;
  std::vector<float> parameters_;
  ParameterStoreOptions options_;
  std::uint64_t version_ = 0;

  std::vector<TouchedSet>
      ring_;  // D slots; the update applied as version v−1 → v sits at (v − 1) mod D
  std::size_t ring_length_ = 0;  // min(t, D)
  // D ≤ 64: per parameter, bit v mod 64 set while the sparse update of version v is in the
  // ring and touched it. The chain of a larger D instead: per parameter, the newest sparse
  // update touching it (0: none) and its entry in that update's set.
  static constexpr std::uint32_t kMaskBits = 64;
  bool masks() const { return !touch_masks_.empty(); }
  void set_bits(const TouchedSet& set, std::uint64_t version, bool on);
  void retire(const TouchedSet& set);  // the set leaving the ring as the next update is remembered
  std::vector<std::uint64_t> touch_masks_;
  std::vector<std::uint64_t> last_touch_version_;
  std::vector<std::uint32_t> last_touch_position_;
  std::vector<std::uint32_t> sigma_;    // scratch: σ of each entry of the current update
  std::vector<std::uint64_t> entry_delays_;  // scratch: per-entry staleness, each entry's delay
  std::vector<std::uint32_t> dense_newer_;   // scratch: dense sets among the `a` newest, per a
  std::vector<std::uint32_t> touched_;  // the current update's flat indices
  std::vector<std::uint32_t> last_divisors_;
  std::vector<std::uint32_t> divisors_;  // scratch: the current update's divisors
  std::vector<float> new_values_;        // scratch: new values (reserve) or old ones (apply's undo)
  std::deque<Reservation> reserved_;     // oldest first: versions t + 1 … t + reserved()
  std::vector<Reservation> spare_;       // recycled reservations (their buffers)
  // Per parameter: the newest reservation touching it (its version; 0: none) and the entry's
  // position there. Allocated at the first reserve(); apply() never touches them.
  std::vector<std::uint64_t> reserved_touch_version_;
  std::vector<std::uint32_t> reserved_touch_position_;
  std::vector<std::uint64_t> last_changed_;  // see last_changed()
  std::uint64_t changes_known_since_ = 0;
};

}  // namespace edgetrain::server
