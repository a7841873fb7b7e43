#include "server/parameter_store.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace edgetrain::server {

const char* apply_status_name(ApplyStatus status) {
  switch (status) {
    case ApplyStatus::kApplied:
      return "applied";
    case ApplyStatus::kWrongModel:
      return "wrong model";
    case ApplyStatus::kTooStale:
      return "too stale";
    case ApplyStatus::kFromTheFuture:
      return "from the future";
    case ApplyStatus::kMalformed:
      return "malformed";
    case ApplyStatus::kOutOfBounds:
      return "out of bounds";
  }
  return "unknown";
}

float learning_rate_at(float learning_rate, const LearningRateSchedule& schedule,
                       std::uint64_t version) {
  float lr = learning_rate;
  for (std::uint64_t milestone : schedule.decay_at) {
    if (milestone > version) break;
    lr *= schedule.factor;
  }
  return lr;
}

void check_learning_rate_schedule(const LearningRateSchedule& schedule) {
  if (!(schedule.factor > 0 && schedule.factor < 1))
    throw std::invalid_argument("learning-rate schedule: decay factor " +
                                std::to_string(schedule.factor) + " is not in (0, 1)");
  if (schedule.decay_at.size() > kMaxLearningRateMilestones)
    throw std::invalid_argument("learning-rate schedule: " +
                                std::to_string(schedule.decay_at.size()) +
                                " milestones, at most " +
                                std::to_string(kMaxLearningRateMilestones));
  for (std::size_t k = 0; k < schedule.decay_at.size(); ++k) {
    if (schedule.decay_at[k] == 0)
      throw std::invalid_argument("learning-rate schedule: milestone 0 (versions start at 1)");
    if (k > 0 && schedule.decay_at[k] <= schedule.decay_at[k - 1])
      throw std::invalid_argument("learning-rate schedule: milestones " +
                                  std::to_string(schedule.decay_at[k - 1]) + " then " +
                                  std::to_string(schedule.decay_at[k]) +
                                  " are not strictly increasing");
  }
}

std::vector<std::uint64_t> parse_lr_decay_at(std::string_view text) {
  std::vector<std::uint64_t> milestones;
  if (text.empty()) return milestones;
  const std::string quoted = "--lr-decay-at '" + std::string(text) + "': ";
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string_view item =
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty() || item.size() > 19 ||
        item.find_first_not_of("0123456789") != std::string_view::npos)
      throw std::invalid_argument(quoted + "'" + std::string(item) +
                                  "' is not a version (a whole number); expected V1,V2,... such "
                                  "as 3000,4500");
    milestones.push_back(std::stoull(std::string(item)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  LearningRateSchedule schedule{milestones, 0.5f};
  try {
    check_learning_rate_schedule(schedule);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(quoted + e.what());
  }
  return milestones;
}

std::string format_lr_decay_at(std::span<const std::uint64_t> milestones) {
  std::string text;
  for (std::uint64_t m : milestones) text += (text.empty() ? "" : ",") + std::to_string(m);
  return text;
}

ParameterStore::ParameterStore(std::uint64_t model_id, std::vector<std::uint32_t> tensor_sizes,
                               std::vector<float> initial, ParameterStoreOptions options)
    : model_id_(model_id),
      tensor_sizes_(std::move(tensor_sizes)),
      parameters_(std::move(initial)),
      options_(options) {
  std::size_t total = 0;
  for (std::uint32_t n : tensor_sizes_) {
    if (n == 0) throw std::invalid_argument("parameter store: empty tensor");
    tensor_offsets_.push_back(total);
    total += n;
  }
  if (total != parameters_.size())
    throw std::invalid_argument("parameter store: tensor sizes add up to " + std::to_string(total) +
                                ", " + std::to_string(parameters_.size()) +
                                " initial values given");
  if (total > UINT32_MAX) throw std::invalid_argument("parameter store: more than 2^32 parameters");
  if (options_.offline_step_credit > 65535)
    throw std::invalid_argument("parameter store: offline_step_credit " +
                                std::to_string(options_.offline_step_credit) +
                                " is beyond 65535, the most steps an update can claim");
  if (options_.offline_average && options_.offline_step_credit == 0)
    throw std::invalid_argument(
        "parameter store: offline_average needs an offline_step_credit above 0");
  if (options_.lr_schedule.enabled()) check_learning_rate_schedule(options_.lr_schedule);
  last_changed_.assign(total, 0);
  if (options_.rule == StalenessRule::kPerParameterSigma) {
    ring_.resize(options_.max_staleness);
    if (options_.max_staleness >= 1 && options_.max_staleness <= kMaskBits) {
      touch_masks_.assign(total, 0);
    } else {
      last_touch_version_.assign(total, 0);
      last_touch_position_.assign(total, 0);
    }
  }
}

std::string ParameterStore::check(const transport::SparseUpdate& update) const {
  std::vector<bool> seen(tensor_sizes_.size(), false);
  for (const auto& t : update.tensors) {
    const std::string where = "tensor " + std::to_string(t.tensor) + ": ";
    if (t.tensor >= tensor_sizes_.size())
      return where + "the model has " + std::to_string(tensor_sizes_.size()) + " tensors";
    if (seen[t.tensor]) return where + "appears twice";
    seen[t.tensor] = true;
    if (t.size != tensor_sizes_[t.tensor])
      return where + "size " + std::to_string(t.size) + ", the model's is " +
             std::to_string(tensor_sizes_[t.tensor]);
    if (t.indices.size() != t.values.size()) return where + "index and value counts differ";
    for (std::size_t j = 0; j < t.indices.size(); ++j) {
      if (t.indices[j] >= t.size)
        return where + "index " + std::to_string(t.indices[j]) + " beyond the tensor";
      if (j > 0 && t.indices[j] <= t.indices[j - 1])
        return where + "indices not strictly increasing";
      if (!std::isfinite(t.values[j])) return where + "non-finite value";
    }
  }
  return {};
}

namespace {

// The per-parameter arrays are far larger than the caches and an update's entries are spread
// over them, so nearly every entry misses: each loop below asks for entry j + kAhead's lines
// while it works on entry j, so that the misses overlap instead of following each other.
constexpr std::size_t kAhead = 16;
template <typename T>
inline void prefetch_read(const T* p) {
  __builtin_prefetch(p, 0, 3);
}
template <typename T>
inline void prefetch_write(T* p) {
  __builtin_prefetch(p, 1, 3);
}

}  // namespace

const ParameterStore::TouchedSet& ParameterStore::set_at_age(std::size_t age) const {
  const std::size_t d = ring_.size();
  return ring_[static_cast<std::size_t>((history_top() - 1 - age) % d)];
}

// Leaves in sigma_[j] σ of touched_[j]: how many of the updates that produced versions
// t − delay + 1 … t touched it (t: the newest version in the history, reserved ones
// included). Sparse ones are found by walking the parameter's chain of touches from the
// newest back until it leaves that window; dense ones touch everything.
// σ under D <= 64 is a popcount per entry; x86-64's baseline has no POPCNT instruction, so
// without a clone for the CPUs that have it every entry costs a call into libgcc. Not under
// a sanitizer: the clone's resolver runs while the program is relocated, before the
// sanitizer's runtime is up, and its instrumented code crashes there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define EDGETRAIN_POPCNT_CLONES __attribute__((target_clones("popcnt", "default")))
#else
#define EDGETRAIN_POPCNT_CLONES
#endif
EDGETRAIN_POPCNT_CLONES
void ParameterStore::compute_sigma(std::uint64_t delay) {
  const std::uint64_t window_start = history_top() - delay;  // versions above this one count
  std::uint32_t dense_in_window = 0;
  for (std::size_t age = 0;
       age < std::min<std::size_t>(static_cast<std::size_t>(delay), ring_length_); ++age)
    dense_in_window += set_at_age(age).dense ? 1 : 0;
  sigma_.resize(touched_.size());
  if (masks()) {
    // The window's versions top − delay + 1 … top are `delay` consecutive bits (mod 64),
    // the last one at top mod 64; every bit set for a version older than the ring is cleared.
    const std::uint64_t top = history_top();
    const unsigned end = static_cast<unsigned>(top % kMaskBits);  // bit of version top
    std::uint64_t window = delay >= kMaskBits ? ~std::uint64_t{0} : (std::uint64_t{1} << delay) - 1;
    window = delay >= kMaskBits
                 ? window
                 : std::rotl(window, static_cast<int>((end + kMaskBits + 1 - delay) % kMaskBits));
    const std::size_t n = touched_.size();
    for (std::size_t j = 0; j < n; ++j) {
      if (j + kAhead < n)
        prefetch_write(&touch_masks_[touched_[j + kAhead]]);  // remember_touched() sets a bit next
      sigma_[j] = dense_in_window +
                  static_cast<std::uint32_t>(std::popcount(touch_masks_[touched_[j]] & window));
    }
    return;
  }
  for (std::size_t j = 0; j < touched_.size(); ++j)
    sigma_[j] = dense_in_window + sparse_touches_after(touched_[j], window_start);
}

std::uint32_t ParameterStore::sparse_touches_after(std::size_t entry,
                                                   std::uint64_t window_start) const {
  const std::size_t d = ring_.size();
  std::uint32_t touches = 0;
  std::uint64_t version = last_touch_version_[entry];
  std::uint32_t position = last_touch_position_[entry];
  // A version inside the window is at most D old, so its slot still holds its set.
  while (version > window_start) {
    ++touches;
    const TouchedSet& set = ring_[static_cast<std::size_t>((version - 1) % d)];
    version = set.previous_version[position];
    position = set.previous_position[position];
  }
  return touches;
}

void ParameterStore::compute_entry_delays(std::uint64_t fetched_version,
                                          std::span<const std::uint64_t> entry_versions) {
  const std::uint64_t top = history_top();
  const std::uint64_t limit = options_.max_staleness;
  entry_delays_.resize(touched_.size());
  for (std::size_t j = 0; j < touched_.size(); ++j) {
    // A record newer than the update's pull (the worker pulled again before this update
    // arrived) cannot describe the copy it was computed on: the pull's version bounds it.
    const std::uint64_t held = std::min(entry_versions[touched_[j]], fetched_version);
    entry_delays_[j] = std::min(top - held, limit);
  }
}

// As compute_sigma(), with each entry's own window: the updates of the last entry_delays_[j]
// versions (at most D, so inside the ring).
EDGETRAIN_POPCNT_CLONES
void ParameterStore::compute_entry_sigma() {
  const std::size_t d = ring_.size();
  const std::size_t known = std::min<std::size_t>(d, ring_length_);
  // dense_newer_[a]: dense sets among the a newest, for a = 0 … known.
  dense_newer_.assign(known + 1, 0);
  for (std::size_t age = 0; age < known; ++age)
    dense_newer_[age + 1] = dense_newer_[age] + (set_at_age(age).dense ? 1 : 0);
  sigma_.resize(touched_.size());
  const std::uint64_t top = history_top();
  const std::size_t n = touched_.size();
  if (masks()) {
    const unsigned end = static_cast<unsigned>(top % kMaskBits);  // bit of version top
    for (std::size_t j = 0; j < n; ++j) {
      if (j + kAhead < n) prefetch_write(&touch_masks_[touched_[j + kAhead]]);
      const std::uint64_t delay = entry_delays_[j];
      std::uint64_t window =
          delay >= kMaskBits ? ~std::uint64_t{0} : (std::uint64_t{1} << delay) - 1;
      if (delay < kMaskBits)
        window = std::rotl(window, static_cast<int>((end + kMaskBits + 1 - delay) % kMaskBits));
      sigma_[j] = dense_newer_[std::min<std::size_t>(static_cast<std::size_t>(delay), known)] +
                  static_cast<std::uint32_t>(std::popcount(touch_masks_[touched_[j]] & window));
    }
    return;
  }
  for (std::size_t j = 0; j < n; ++j) {
    const std::uint64_t delay = entry_delays_[j];
    sigma_[j] = dense_newer_[std::min<std::size_t>(static_cast<std::size_t>(delay), known)] +
                sparse_touches_after(touched_[j], top - delay);
  }
}

// Pushes touched_ as the set of version top + 1 (top: the newest version in the history,
// reserved ones included), overwriting the one of version top + 1 − D, and chains each
// entry to the previous touch of its parameter.
void ParameterStore::remember_touched() {
  if (ring_.empty()) return;
  const std::uint64_t top = history_top();
  TouchedSet& slot = ring_[static_cast<std::size_t>(top % ring_.size())];
  if (ring_length_ < ring_.size()) ++ring_length_;
  slot.dense = touched_.size() == parameters_.size();
  slot.indices.clear();
  slot.previous_version.clear();
  slot.previous_position.clear();
  if (slot.dense) return;
  slot.indices.assign(touched_.begin(), touched_.end());
  if (masks()) {
    set_bits(slot, top + 1, true);
    return;
  }
  slot.previous_version.resize(touched_.size());
  slot.previous_position.resize(touched_.size());
  for (std::size_t j = 0; j < touched_.size(); ++j) {
    const std::uint32_t i = touched_[j];
    slot.previous_version[j] = last_touch_version_[i];
    slot.previous_position[j] = last_touch_position_[i];
    last_touch_version_[i] = top + 1;
    last_touch_position_[i] = static_cast<std::uint32_t>(j);
  }
}

// `set` held the slot the next remembered update takes: once the ring is full, that is the
// set of version top + 1 − D, which leaves the ring, and its bits go.
void ParameterStore::retire(const TouchedSet& set) {
  if (masks() && ring_length_ == ring_.size())
    set_bits(set, history_top() + 1 - ring_.size(), false);
}

// Sets (or clears) the bit of `version`, whose update touched `set`, in the masks of its
// parameters.
void ParameterStore::set_bits(const TouchedSet& set, std::uint64_t version, bool on) {
  if (set.dense) return;
  const std::uint64_t bit = std::uint64_t{1} << (version % kMaskBits);
  const std::size_t n = set.indices.size();
  const std::uint32_t* indices = set.indices.data();
  if (on) {
    for (std::size_t k = 0; k < n; ++k) {
      if (k + kAhead < n) prefetch_write(&touch_masks_[indices[k + kAhead]]);
      touch_masks_[indices[k]] |= bit;
    }
  } else {
    for (std::size_t k = 0; k < n; ++k) {
      if (k + kAhead < n) prefetch_write(&touch_masks_[indices[k + kAhead]]);
      touch_masks_[indices[k]] &= ~bit;
    }
  }
}

ApplyResult ParameterStore::admissible_after(const transport::SparseUpdate& update,
                                             std::uint64_t pending) const {
  const std::uint64_t t = version_ + pending;
  if (update.model_id != model_id_)
    return {ApplyStatus::kWrongModel, t,
            "update is for model " + std::to_string(update.model_id) + ", this is " +
                std::to_string(model_id_)};
  if (update.fetched_version > t)
    return {ApplyStatus::kFromTheFuture, t,
            "fetched version " + std::to_string(update.fetched_version) +
                " is ahead of the server's " + std::to_string(t)};
  const std::uint64_t delay = t - update.fetched_version;
  if (delay > options_.max_staleness)
    return {ApplyStatus::kTooStale, t,
            "delay " + std::to_string(delay) + " exceeds the maximum staleness " +
                std::to_string(options_.max_staleness)};
  if (std::string problem = check(update); !problem.empty())
    return {ApplyStatus::kMalformed, t, problem};
  return {ApplyStatus::kApplied, t, {}};
}

void ParameterStore::collect_touched(const transport::SparseUpdate& update) {
  touched_.clear();
  for (const auto& t : update.tensors)
    for (std::uint32_t i : t.indices)
      touched_.push_back(static_cast<std::uint32_t>(tensor_offsets_[t.tensor] + i));
}

void ParameterStore::restore(std::uint64_t version, std::span<const float> parameters,
                             std::span<const transport::SparseUpdate> recent) {
  if (parameters.size() != parameters_.size())
    throw std::invalid_argument("parameter store: restoring " + std::to_string(parameters.size()) +
                                " parameters into " + std::to_string(parameters_.size()));
  if (!reserved_.empty())
    throw std::logic_error("parameter store: restore() while updates are reserved");
  if (recent.size() > version)
    throw std::invalid_argument("parameter store: more recent updates than the version");
  for (const auto& update : recent)
    if (std::string problem = check(update); !problem.empty())
      throw std::invalid_argument("parameter store: recent update: " + problem);
  for (auto& slot : ring_) slot = {};
  ring_length_ = 0;
  std::fill(touch_masks_.begin(), touch_masks_.end(), std::uint64_t{0});
  std::fill(last_touch_version_.begin(), last_touch_version_.end(), std::uint64_t{0});
  std::fill(last_touch_position_.begin(), last_touch_position_.end(), 0u);
  std::fill(reserved_touch_version_.begin(), reserved_touch_version_.end(), std::uint64_t{0});
  version_ = version - recent.size();
  // The parameters before the recent updates are not known, so the change record starts
  // there: what the recent updates touched changed at their versions, the rest earlier.
  changes_known_since_ = version_;
  std::fill(last_changed_.begin(), last_changed_.end(), changes_known_since_);
  for (const auto& update : recent) {
    collect_touched(update);
    if (!ring_.empty())
      retire(
          ring_[static_cast<std::size_t>(version_ % ring_.size())]);  // more recent updates than D
    remember_touched();
    for (std::uint32_t i : touched_) last_changed_[i] = version_ + 1;
    ++version_;
  }
  std::copy(parameters.begin(), parameters.end(), parameters_.begin());
}

std::ptrdiff_t ParameterStore::first_non_finite(std::span<const float> parameters) {
  for (std::size_t i = 0; i < parameters.size(); ++i)
    if (!std::isfinite(parameters[i])) return static_cast<std::ptrdiff_t>(i);
  return -1;
}

namespace {

// The rule's arithmetic, in one place: apply() and reserve() compute every new value with it.
inline float stepped(float base, float learning_rate, float g, std::uint32_t divisor) {
  return base - learning_rate * g / static_cast<float>(divisor);
}

// A NaN fails the comparison too; with FLT_MAX as the bound only infinities and NaN fail.
inline bool within(float value, float bound) { return std::fabs(value) <= bound; }

std::string out_of_bounds(const transport::SparseTensor& t, std::size_t e, float base, float value,
                          std::uint32_t divisor, float bound) {
  char text[200];
  std::snprintf(text, sizeof(text),
                "tensor %u index %u would become %g (from %g; value %g, divisor %u), beyond ±%g",
                t.tensor, t.indices[e], static_cast<double>(value), static_cast<double>(base),
                static_cast<double>(t.values[e]), divisor, static_cast<double>(bound));
  return text;
}

}  // namespace

float ParameterStore::bound_for(ValueCheck values) const {
  return values == ValueCheck::kBound ? options_.max_parameter_magnitude : FLT_MAX;
}

void ParameterStore::check_entry_versions(std::span<const std::uint64_t> entry_versions) const {
  if (!entry_versions.empty() && entry_versions.size() != parameters_.size())
    throw std::invalid_argument("parameter store: " + std::to_string(entry_versions.size()) +
                                " entry versions for " + std::to_string(parameters_.size()) +
                                " parameters");
}

void ParameterStore::compute_divisors(std::uint64_t delay, std::uint64_t fetched_version,
                                      std::span<const std::uint64_t> entry_versions) {
  divisors_.resize(touched_.size());
  if (!entry_versions.empty() && options_.rule != StalenessRule::kNone) {
    compute_entry_delays(fetched_version, entry_versions);
    if (options_.rule == StalenessRule::kPerParameterSigma) {
      compute_entry_sigma();
      for (std::size_t j = 0; j < touched_.size(); ++j)
        divisors_[j] = std::max<std::uint32_t>(1, sigma_[j]);
    } else {
      for (std::size_t j = 0; j < touched_.size(); ++j)
        divisors_[j] = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, entry_delays_[j]));
    }
    return;
  }
  if (options_.rule == StalenessRule::kPerParameterSigma) {
    compute_sigma(delay);
    for (std::size_t j = 0; j < touched_.size(); ++j)
      divisors_[j] = std::max<std::uint32_t>(1, sigma_[j]);
  } else {
    const auto divisor = options_.rule == StalenessRule::kNone
                             ? 1u
                             : static_cast<std::uint32_t>(std::max<std::uint64_t>(1, delay));
    std::fill(divisors_.begin(), divisors_.end(), divisor);
  }
}

void ParameterStore::credit_local_steps(const transport::SparseUpdate& update,
                                        std::uint64_t delay) {
  const std::uint32_t steps = std::min<std::uint32_t>(update.local_steps, options_.offline_step_credit);
  if (steps <= 1) return;
  // ⌈(s' + d) / s'⌉, at most ⌈(65535 + D) / 2⌉: fits the divisors' 32 bits.
  const std::uint32_t averaged =
      options_.offline_average ? static_cast<std::uint32_t>((steps + delay + steps - 1) / steps) : 1;
  for (std::uint32_t& d : divisors_) d = std::max(averaged, d <= steps ? 1 : (d + steps - 1) / steps);
}

ApplyResult ParameterStore::apply(const transport::SparseUpdate& update, ValueCheck values,
                                  std::span<const std::uint64_t> entry_versions) {
  if (!reserved_.empty())
    throw std::logic_error("parameter store: apply() while updates are reserved");
  check_entry_versions(entry_versions);
  if (ApplyResult verdict = admissible(update); !verdict.applied()) return verdict;
  const std::uint64_t delay = version_ - update.fetched_version;
  collect_touched(update);
  compute_divisors(delay, update.fetched_version, entry_versions);
  credit_local_steps(update, delay);
  // One pass writes the new values and checks them; a refusal puts the old ones back.
  const float bound = bound_for(values);
  const float learning_rate =
      learning_rate_at(options_.learning_rate, options_.lr_schedule, version_ + 1);
  new_values_.resize(touched_.size());  // here: each entry's old value
  std::size_t j = 0;
  for (const auto& t : update.tensors) {
    float* tensor = parameters_.data() + tensor_offsets_[t.tensor];
    for (std::size_t e = 0; e < t.indices.size(); ++e, ++j) {
      float& w = tensor[t.indices[e]];
      const float old = w;
      w = stepped(old, learning_rate, t.values[e], divisors_[j]);
      new_values_[j] = old;
      if (!within(w, bound)) {
        std::string problem = out_of_bounds(t, e, old, w, divisors_[j], bound);
        for (std::size_t k = 0; k <= j; ++k) parameters_[touched_[k]] = new_values_[k];
        return {ApplyStatus::kOutOfBounds, version_, std::move(problem)};
      }
    }
  }
  last_divisors_.swap(divisors_);
  if (!ring_.empty()) retire(ring_[static_cast<std::size_t>(version_ % ring_.size())]);
  remember_touched();
  for (std::uint32_t i : touched_) last_changed_[i] = version_ + 1;
  ++version_;
  return {ApplyStatus::kApplied, version_, {}};
}

// Leaves in new_values_ the value of each entry after the update, on top of the values the
// reservations before it leave; empty, or why the update is refused.
std::string ParameterStore::reserved_values(const transport::SparseUpdate& update,
                                            ValueCheck values) {
  const float bound = bound_for(values);
  // The version this reservation produces: history_top() has not counted it yet.
  const float learning_rate =
      learning_rate_at(options_.learning_rate, options_.lr_schedule, history_top() + 1);
  new_values_.resize(touched_.size());
  std::size_t j = 0;
  const std::size_t n = touched_.size();
  for (const auto& t : update.tensors) {
    for (std::size_t e = 0; e < t.indices.size(); ++e, ++j) {
      if (j + kAhead < n) {
        const std::uint32_t ahead = touched_[j + kAhead];
        prefetch_read(&parameters_[ahead]);
        prefetch_write(&reserved_touch_version_[ahead]);  // reserve() writes both next
        prefetch_write(&reserved_touch_position_[ahead]);
      }
      const std::uint32_t i = touched_[j];
      float base = parameters_[i];
      if (reserved_touch_version_[i] > version_)
        base = reserved_[static_cast<std::size_t>(reserved_touch_version_[i] - version_ - 1)]
                   .values[reserved_touch_position_[i]];
      const float value = stepped(base, learning_rate, t.values[e], divisors_[j]);
      new_values_[j] = value;
      if (!within(value, bound)) return out_of_bounds(t, e, base, value, divisors_[j], bound);
    }
  }
  return {};
}

ApplyResult ParameterStore::reserve(const transport::SparseUpdate& update, ValueCheck values,
                                    std::span<const std::uint64_t> entry_versions) {
  check_entry_versions(entry_versions);
  const std::uint64_t top = history_top();
  if (ApplyResult verdict = admissible_after(update, reserved_.size()); !verdict.applied())
    return verdict;
  const std::uint64_t delay = top - update.fetched_version;
  collect_touched(update);
  if (reserved_touch_version_.empty()) {
    reserved_touch_version_.assign(parameters_.size(), 0);
    reserved_touch_position_.assign(parameters_.size(), 0);
  }
  compute_divisors(delay, update.fetched_version, entry_versions);
  credit_local_steps(update, delay);
  if (std::string problem = reserved_values(update, values); !problem.empty())
    return {ApplyStatus::kOutOfBounds, top, std::move(problem)};

  Reservation r;
  if (!spare_.empty()) {
    r = std::move(spare_.back());
    spare_.pop_back();
  }
  r.version = top + 1;
  // Swapped, not copied (~2,600 entries × 3 arrays per update): divisors_ and new_values_ are
  // scratch, refilled whole for the next update, and so is touched_ (swapped below, once
  // remember_touched() has read it); the scratch keeps the recycled reservation's buffers.
  r.divisors.swap(divisors_);
  r.values.swap(new_values_);
  r.previous_reserved_version.resize(touched_.size());
  r.previous_reserved_position.resize(touched_.size());
  for (std::size_t j = 0; j < touched_.size(); ++j) {
    const std::uint32_t i = touched_[j];
    r.previous_reserved_version[j] = reserved_touch_version_[i];
    r.previous_reserved_position[j] = reserved_touch_position_[i];
    reserved_touch_version_[i] = r.version;
    reserved_touch_position_[i] = static_cast<std::uint32_t>(j);
  }
  r.ring_length_before = ring_length_;
  // The slot remember_touched() refills: keep what it held, for cancelling.
  if (!ring_.empty()) std::swap(r.displaced, ring_[static_cast<std::size_t>(top % ring_.size())]);
  if (!ring_.empty()) retire(r.displaced);
  remember_touched();
  r.touched.swap(touched_);
  reserved_.push_back(std::move(r));
  return {ApplyStatus::kApplied, top + 1, {}};
}

ApplyResult ParameterStore::apply_reserved() {
  if (reserved_.empty())
    throw std::logic_error("parameter store: apply_reserved() without a reserved update");
  Reservation& r = reserved_.front();
  const std::size_t n = r.touched.size();
  for (std::size_t j = 0; j < n; ++j) {
    if (j + kAhead < n) {
      prefetch_write(&parameters_[r.touched[j + kAhead]]);
      prefetch_write(&last_changed_[r.touched[j + kAhead]]);
    }
    parameters_[r.touched[j]] = r.values[j];
    last_changed_[r.touched[j]] = r.version;
  }
  last_divisors_.swap(r.divisors);  // r goes to spare_: its buffers are reused, not read
  version_ = r.version;
  spare_.push_back(std::move(r));
  reserved_.pop_front();
  return {ApplyStatus::kApplied, version_, {}};
}

void ParameterStore::cancel_last_reserved() {
  if (reserved_.empty())
    throw std::logic_error("parameter store: cancel_last_reserved() without a reserved update");
  Reservation& r = reserved_.back();
  for (std::size_t j = r.touched.size(); j-- > 0;) {
    reserved_touch_version_[r.touched[j]] = r.previous_reserved_version[j];
    reserved_touch_position_[r.touched[j]] = r.previous_reserved_position[j];
  }
  if (!ring_.empty()) {
    TouchedSet& slot = ring_[static_cast<std::size_t>((r.version - 1) % ring_.size())];
    if (masks()) {
      set_bits(slot, r.version, false);
      if (r.ring_length_before == ring_.size())
        set_bits(r.displaced, r.version - ring_.size(), true);  // back in the ring
    } else if (!slot.dense) {
      for (std::size_t j = 0; j < slot.indices.size(); ++j) {
        last_touch_version_[slot.indices[j]] = slot.previous_version[j];
        last_touch_position_[slot.indices[j]] = slot.previous_position[j];
      }
    }
    std::swap(slot, r.displaced);
    ring_length_ = r.ring_length_before;
  }
  spare_.push_back(std::move(r));
  reserved_.pop_back();
}

void ParameterStore::cancel_reserved() {
  while (!reserved_.empty()) cancel_last_reserved();
}

}  // namespace edgetrain::server
