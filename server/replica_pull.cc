#include "server/replica_pull.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>

namespace edgetrain::server {

namespace {
constexpr float kLargestHalf = 65504.0f;
}  // namespace

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
  // Scratch kept per thread between pulls (up to the largest tensor: 4.8 MB for the paper
  // CNN's fc1), so that a pull does not fault in fresh pages for it every time.
  thread_local std::vector<std::uint32_t> differing;
  thread_local std::vector<std::uint64_t> keys;
  std::size_t offset = 0;
  for (std::uint32_t t = 0; t < tensor_sizes.size(); ++t) {
    const std::uint32_t size = tensor_sizes[t];
    const float* w = parameters.data() + offset;
    float* r = held.data() + offset;
    std::uint64_t* since = keep_since ? held_since.data() + offset : nullptr;
    differing.clear();
    // Bit patterns, not ==: a copy is exact or it is not (and 0.0 against -0.0 is a change
    // the digest sees).
    for (std::uint32_t i = 0; i < size; ++i) {
      if (std::bit_cast<std::uint32_t>(sendable(w[i], r[i])) != std::bit_cast<std::uint32_t>(r[i]))
        differing.push_back(i);
      else if (since)
        since[i] = version;  // the worker's value is the model's now
    }
    const std::size_t budget = std::max<std::size_t>(
        options.min_entries, static_cast<std::size_t>(std::ceil(options.fraction * size)));
    if (differing.size() > budget) {
      // The `budget` largest |W − R|; a strict order (magnitude, then the lower index) so the
      // choice is the same on every machine. Each key packs the magnitude's bits (ordered as
      // the magnitudes, which are never negative) over the inverted index, so the selection
      // compares integers instead of recomputing |W − R| (edgetrain-pull-bench).
      keys.clear();
      for (const std::uint32_t i : differing)
        keys.push_back(std::uint64_t{std::bit_cast<std::uint32_t>(std::fabs(w[i] - r[i]))} << 32 |
                       static_cast<std::uint32_t>(~i));
      std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(budget), keys.end(),
                       std::greater<>());
      for (std::size_t j = 0; j < budget; ++j)
        differing[j] = ~static_cast<std::uint32_t>(keys[j]);
      differing.resize(budget);
      std::sort(differing.begin(), differing.end());
    }
    if (!differing.empty()) {
      transport::SparseTensor sent{t, size, {}, {}};
      sent.indices = differing;
      sent.values.reserve(differing.size());
      for (const std::uint32_t i : differing) {
        if (increments) {
          const float increment = transport::round_to_fp16(w[i] - r[i]);
          r[i] += increment;
          sent.values.push_back(increment);
        } else {
          r[i] = sendable(w[i], r[i]);
          sent.values.push_back(r[i]);
        }
        if (since) since[i] = version;
      }
      delta.tensors.push_back(std::move(sent));
    }
    offset += size;
  }
  delta.digest = transport::parameter_digest(held);
  return delta;
}

}  // namespace edgetrain::server
