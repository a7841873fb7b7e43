#include "server/replica_pull.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>

namespace edgetrain::server {

namespace {
constexpr float kLargestHalf = 65504.0f;
}  // namespace

const char* pull_selection_name(ReplicaPullOptions::Selection selection) {
  switch (selection) {
    case ReplicaPullOptions::Selection::kLargestChange: return "largest";
    case ReplicaPullOptions::Selection::kAgeWeighted: return "age";
    case ReplicaPullOptions::Selection::kGlobalScaled: return "global";
    case ReplicaPullOptions::Selection::kRelativeChange: return "relative";
    case ReplicaPullOptions::Selection::kGlobalLargest: return "global-raw";
  }
  return "?";
}

ReplicaPullOptions::Selection parse_pull_selection(const std::string& word) {
  for (const auto selection :
       {ReplicaPullOptions::Selection::kLargestChange, ReplicaPullOptions::Selection::kAgeWeighted,
        ReplicaPullOptions::Selection::kGlobalScaled, ReplicaPullOptions::Selection::kRelativeChange,
        ReplicaPullOptions::Selection::kGlobalLargest})
    if (word == pull_selection_name(selection)) return selection;
  throw std::invalid_argument("pull selection must be largest, age, global, relative or global-raw, got '" +
                              word + "'");
}

void check_replica_pull_options(const ReplicaPullOptions& options) {
  if (!(options.fraction >= 0 && options.fraction <= 1))
    throw std::invalid_argument("pull fraction must be in [0, 1] (0: exact pulls), got " +
                                std::to_string(options.fraction));
  if (options.enabled() && options.min_entries == 0)
    throw std::invalid_argument("pull min entries must be at least 1");
  if (options.entry_staleness && !options.enabled())
    throw std::invalid_argument(
        "entry staleness is for the cheap pull: it needs a pull fraction above 0 (with exact "
        "pulls every entry of a copy is as old as the pull)");
  if ((options.values == transport::ValueEncoding::kFp16 ||
       options.values == transport::ValueEncoding::kFp16Increment) &&
      !options.enabled())
    throw std::invalid_argument(
        "fp16 pull values and increments are for the cheap pull: they need a pull fraction "
        "above 0 (an exact pull sends the model's values as they are)");
  if (options.selection != ReplicaPullOptions::Selection::kLargestChange && !options.enabled())
    throw std::invalid_argument(std::string("pull selection ") +
                                pull_selection_name(options.selection) +
                                " is for the cheap pull: it needs a pull fraction above 0");
  if (!(options.age_versions > 0 && std::isfinite(options.age_versions)))
    throw std::invalid_argument("pull age versions must be a positive number, got " +
                                std::to_string(options.age_versions));
  if (options.values != transport::ValueEncoding::kFp32 &&
      options.values != transport::ValueEncoding::kFp16 &&
      options.values != transport::ValueEncoding::kFp16Increment)
    throw std::invalid_argument("pull values must be fp32, fp16 or fp16 increments (not sign + "
                                "scale)");
}

transport::ModelDelta replica_pull(std::uint64_t model_id,
                                   std::span<const std::uint32_t> tensor_sizes,
                                   std::span<const float> parameters, std::uint64_t version,
                                   std::span<float> held, std::uint64_t held_version,
                                   const ReplicaPullOptions& options,
                                   std::span<std::uint64_t> held_since) {
  std::size_t total = 0;
  for (const std::uint32_t size : tensor_sizes) total += size;
  if (parameters.size() != total || held.size() != total)
    throw std::invalid_argument("replica pull: " + std::to_string(parameters.size()) +
                                " parameters and a held copy of " + std::to_string(held.size()) +
                                " for a layout of " + std::to_string(total));
  if (!held_since.empty() && held_since.size() != total)
    throw std::invalid_argument("replica pull: " + std::to_string(held_since.size()) +
                                " entry versions for a layout of " + std::to_string(total));
  const bool keep_since = !held_since.empty();
  // fp16 values when asked for and the whole model fits fp16's range (else this pull goes in
  // fp32 rather than clamp a value the worker would then hold wrong).
  bool fp16 = options.values == transport::ValueEncoding::kFp16;
  if (fp16)
    for (const float v : parameters)
      if (!(std::fabs(v) <= kLargestHalf)) {
        fp16 = false;
        break;
      }
  // fp16 increments: the worker adds float(half(W − R)) to R, and so does the record here,
  // so the copy stays the record bit for bit and the rounding error stays in W − R, which a
  // later pull sends (error feedback). No range fallback: an increment beyond 65504 is
  // clamped and the rest waits in W − R.
  const bool increments = options.values == transport::ValueEncoding::kFp16Increment;
  // The value the worker will hold for entry i if it is sent (w: the model's, r: the copy's).
  auto sendable = [fp16, increments](float w, float r) {
    return increments ? r + transport::round_to_fp16(w - r)
           : fp16     ? transport::round_to_fp16(w)
                      : w;
  };
  transport::ModelDelta delta;
  delta.model_id = model_id;
  delta.base_version = held_version;
  delta.version = version;
  delta.values = increments ? transport::ValueEncoding::kFp16Increment
                 : fp16     ? transport::ValueEncoding::kFp16
                            : transport::ValueEncoding::kFp32;
  using Selection = ReplicaPullOptions::Selection;
  if (options.selection == Selection::kAgeWeighted && !keep_since)
    throw std::invalid_argument(
        "replica pull: the age-weighted selection needs the entries' versions (held_since)");
  // Scratch kept per thread between pulls (up to the model's size: 1.7 MB for the paper
  // CNN), so that a pull does not fault in fresh pages for it every time. Indices are the
  // entries' offsets in the whole model, so one order serves every rule, per tensor or across.
  thread_local std::vector<std::uint32_t> differing;
  thread_local std::vector<std::size_t> differing_end;  // per tensor: its end in `differing`
  thread_local std::vector<std::uint32_t> chosen;
  thread_local std::vector<std::uint64_t> keys;
  thread_local std::vector<float> scale;  // per tensor: RMS of its W (global, relative)
  differing.clear();
  differing_end.clear();
  scale.clear();
  const bool scaled = options.selection == Selection::kGlobalScaled ||
                      options.selection == Selection::kRelativeChange;
  std::size_t offset = 0;
  for (const std::uint32_t size : tensor_sizes) {
    // Bit patterns, not ==: a copy is exact or it is not (and 0.0 against -0.0 is a change
    // the digest sees).
    for (std::size_t i = offset; i < offset + size; ++i) {
      if (std::bit_cast<std::uint32_t>(sendable(parameters[i], held[i])) !=
          std::bit_cast<std::uint32_t>(held[i]))
        differing.push_back(static_cast<std::uint32_t>(i));
      else if (keep_since)
        held_since[i] = version;  // the worker's value is the model's now
    }
    differing_end.push_back(differing.size());
    if (scaled) {
      double squares = 0;
      for (std::size_t i = offset; i < offset + size; ++i)
        squares += static_cast<double>(parameters[i]) * parameters[i];
      const double rms = size ? std::sqrt(squares / size) : 0;
      const double s = options.selection == Selection::kRelativeChange ? rms / 10 : rms;
      scale.push_back(static_cast<float>(std::max<double>(s, FLT_MIN)));
    }
    offset += size;
  }
  // An entry's score: |W − R| (the default, bit for bit the magnitude it always compared),
  // or that weighted by the rule. Never negative, so its bits order as its value.
  auto score = [&](std::uint32_t i, std::uint32_t tensor) -> float {
    const float change = std::fabs(parameters[i] - held[i]);
    switch (options.selection) {
      case Selection::kLargestChange:
      case Selection::kGlobalLargest: break;
      case Selection::kAgeWeighted: {
        const double age = version > held_since[i] ? static_cast<double>(version - held_since[i]) : 0;
        return static_cast<float>(change * (1 + age / options.age_versions));
      }
      case Selection::kGlobalScaled: return change / scale[tensor];
      case Selection::kRelativeChange: return change / (std::fabs(parameters[i]) + scale[tensor]);
    }
    return change;
  };
  // Each key packs the score's bits over the inverted index: a strict order (score, then the
  // lower index), the same on every machine, compared as integers (edgetrain-pull-bench).
  auto key = [&](std::uint32_t i, std::uint32_t tensor) {
    return std::uint64_t{std::bit_cast<std::uint32_t>(score(i, tensor))} << 32 |
           static_cast<std::uint32_t>(~i);
  };
  // Keeps the `count` highest keys' entries in `chosen`, in index order.
  auto take_highest = [&](std::size_t count) {
    const std::size_t first = chosen.size();
    std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(count), keys.end(),
                     std::greater<>());
    for (std::size_t j = 0; j < count; ++j) chosen.push_back(~static_cast<std::uint32_t>(keys[j]));
    std::sort(chosen.begin() + static_cast<std::ptrdiff_t>(first), chosen.end());
  };
  const bool pooled = options.selection == Selection::kGlobalScaled ||
                      options.selection == Selection::kGlobalLargest;
  chosen.clear();
  std::size_t pooled_budget = 0;
  keys.clear();
  for (std::uint32_t t = 0; t < tensor_sizes.size(); ++t) {
    const std::size_t begin = t ? differing_end[t - 1] : 0, end = differing_end[t];
    const std::size_t budget = std::max<std::size_t>(
        options.min_entries, static_cast<std::size_t>(std::ceil(options.fraction * tensor_sizes[t])));
    if (pooled) {
      if (budget >= tensor_sizes[t]) {  // covered whole: every change goes, as by default
        chosen.insert(chosen.end(), differing.begin() + static_cast<std::ptrdiff_t>(begin),
                      differing.begin() + static_cast<std::ptrdiff_t>(end));
      } else {
        pooled_budget += budget;
        for (std::size_t j = begin; j < end; ++j) keys.push_back(key(differing[j], t));
      }
      continue;
    }
    if (end - begin <= budget) {
      chosen.insert(chosen.end(), differing.begin() + static_cast<std::ptrdiff_t>(begin),
                    differing.begin() + static_cast<std::ptrdiff_t>(end));
      continue;
    }
    keys.clear();
    for (std::size_t j = begin; j < end; ++j) keys.push_back(key(differing[j], t));
    take_highest(budget);
  }
  if (pooled) {
    take_highest(std::min(pooled_budget, keys.size()));
    std::sort(chosen.begin(), chosen.end());  // the whole tensors' and the pool's in one order
  }
  // The delta: the chosen entries, tensor by tensor, as the worker will hold them.
  offset = 0;
  std::size_t next = 0;
  for (std::uint32_t t = 0; t < tensor_sizes.size(); ++t) {
    const std::size_t size = tensor_sizes[t];
    const std::size_t first = next;
    while (next < chosen.size() && chosen[next] < offset + size) ++next;
    if (next > first) {
      transport::SparseTensor sent{t, static_cast<std::uint32_t>(size), {}, {}};
      sent.indices.reserve(next - first);
      sent.values.reserve(next - first);
      for (std::size_t j = first; j < next; ++j) {
        const std::uint32_t i = chosen[j];
        if (increments) {
          const float increment = transport::round_to_fp16(parameters[i] - held[i]);
          held[i] += increment;
          sent.values.push_back(increment);
        } else {
          held[i] = sendable(parameters[i], held[i]);
          sent.values.push_back(held[i]);
        }
        sent.indices.push_back(static_cast<std::uint32_t>(i - offset));
        if (keep_since) held_since[i] = version;
      }
      delta.tensors.push_back(std::move(sent));
    }
    offset += size;
  }
  delta.digest = transport::parameter_digest(held);
  return delta;
}

}  // namespace edgetrain::server
