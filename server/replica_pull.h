// The cheap pull (issue 38 part 3, a design of ours): a pull that sends each worker only the
// largest changes since the copy it holds, and keeps the rest for later pulls, so that
// nothing is lost, only delayed.
//
// An exact pull at 100 workers that pull before every step carries every entry any of the
// ~100 updates since the worker's last pull touched (259 kB per update against a 21.5 kB
// update, docs/results.md). The published model (model/published_model.h) cuts that by
// making every worker compute on one shared copy P that lags the true model W, and costs
// accuracy. Here instead the server knows, per worker, the copy R that worker holds (it
// built it: every value in R is one it sent) and a pull sends, per tensor, the
// `fraction` of entries (at least `min_entries`) where |W − R| is largest, R_i ← W_i
// exactly. What is left out stays in W − R of that worker and is sent once it has grown
// past the entries that were chosen: error correction kept by the server per worker, as
// the published model's is kept once for everybody.
//
// The message is the ordinary model delta (transport/CODEC.md) with the digest of R after
// the pull, so a worker applies and checks it as it applies an exact delta: nothing changes
// on the worker (worker/model_replica.h). Its base version is the version the server gave
// the worker's copy at its previous pull, its version the server's version now; the
// worker's update then carries that version as t_fetch, and the staleness rule counts the
// updates since the pull, though the entries left out are older than that (docs/results.md
// says what that costs). So the record also keeps, per entry, the version at which the
// worker's value of it was last the model's (`held_since`): the store can count each
// entry's σ from there (ParameterStore::apply's entry_versions; ours, docs/design.md §3).
//
// Cost on the server: one float per parameter and worker (the copy), 8 more bytes with
// `held_since`, and a pass over the model per pull. Pure functions over spans; the caller owns the copies.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/codec.h"

namespace edgetrain::server {

struct ReplicaPullOptions {
  double fraction = 0;  // share of each tensor's entries a pull sends; 0: exact pulls
  // ... but at least this many (or the whole tensor if smaller): a bias moves with every
  // update, as in runtime::PublishOptions.
  std::uint32_t min_entries = 32;
  // Count each entry's σ from the version its value in the worker's copy comes from
  // (`held_since` below, ParameterStore::apply's entry_versions; ours), not from the pull's.
  bool entry_staleness = false;
  // How a pull's values travel (ours): kFp32, exact (the default), or kFp16, half the value
  // bytes. With kFp16 the server's record keeps the value the worker really holds, the model's
  // rounded to fp16, so the rounding error stays in W − R and goes out with a later pull once
  // the rounded value moves: error correction on the worker's copy at no cost to the worker.
  // An entry is sent only when its rounded value differs from the worker's (the rest would
  // change nothing), chosen by |W − R| as in fp32. Never kSignScale. A model that holds a
  // magnitude beyond 65504 (fp16's largest) is pulled in fp32 until it no longer does.
  // kFp16Increment (ours): the pull sends the increment half(W − R) in fp16 and the worker
  // adds it to its copy; the record here takes the same float addition, so the copy stays
  // the record bit for bit, and what rounding leaves (at most |W − R|·2⁻¹¹, not |W|·2⁻¹¹ as
  // with kFp16) stays in W − R for a later pull. An entry is sent only when its increment
  // moves the copy; chosen by |W − R| as in fp32.
  transport::ValueEncoding values = transport::ValueEncoding::kFp32;
  // Which differing entries fill a pull's budget (ours; docs/results.md "Selection rules"):
  // every rule scores an entry by a multiple of |W − R| and takes the highest scores, ties
  // to the lower index, so every rule is deterministic and none loses anything: once W stops
  // moving, each pull sends what is left of W − R until the copy is W.
  //  kLargestChange (the default): per tensor, the largest |W − R|.
  //  kAgeWeighted: per tensor, |W − R|·(1 + (version − held_since)/age_versions): an entry
  //    left out long goes out even when its change is modest. Needs `held_since`.
  //  kGlobalScaled: tensors whose budget max(min_entries, ⌈fraction·n⌉) covers them go
  //    whole, as with the default; the other tensors' budgets are pooled, and the pool goes
  //    to the largest |W − R| / RMS(W of the entry's tensor) across them, so a tensor gets a
  //    share in proportion to how far its copy is off relative to its own scale rather than
  //    a fixed fraction. The RMS is the model's at the pull (at least FLT_MIN).
  //  kGlobalLargest: as kGlobalScaled, the pool going to the largest |W − R| across the
  //    pooled tensors, unscaled: a tensor's share follows its share of the |W − R| mass.
  //  kRelativeChange: per tensor, the largest |W − R| / (|W| + ε), ε = RMS(W of the tensor)/10
  //    (at least FLT_MIN), so small weights that moved a lot relative to themselves go first.
  enum class Selection { kLargestChange, kAgeWeighted, kGlobalScaled, kRelativeChange, kGlobalLargest };
  Selection selection = Selection::kLargestChange;
  double age_versions = 400;  // kAgeWeighted's τ: the age that doubles an entry's score
  bool enabled() const { return fraction > 0; }
};

// "largest", "age", "global", "relative" or "global-raw", for flags and logs; parse_pull_selection
// throws std::invalid_argument, naming the word and the choices, for any other word.
const char* pull_selection_name(ReplicaPullOptions::Selection selection);
ReplicaPullOptions::Selection parse_pull_selection(const std::string& word);

// Throws std::invalid_argument, naming the setting, for a fraction outside [0, 1],
// min_entries 0 with a fraction set, entry_staleness, fp16 values (or increments) or a
// selection other than the default without one, sign + scale values, or an age_versions
// that is not a positive finite number.
void check_replica_pull_options(const ReplicaPullOptions& options);

// The pull of a worker whose copy is `held` (the server's record of it) from the model
// `parameters` at `version`: per tensor of `tensor_sizes`, the entries whose values differ,
// and of those at most max(min_entries, ⌈fraction·n⌉) with the largest |parameters − held|
// (ties: the lower index). Overwrites those entries of `held` with the model's values
// (rounded to fp16 with options.values kFp16: then "differ" means the rounded value differs
// from `held`'s; with kFp16Increment adds the rounded increments to them: "differ" means the
// increment moves `held`'s value), so that `held` is the worker's copy after it applies the delta, and
// returns the delta, with base_version `held_version`, version `version`, the digest of the
// new `held` and options.values as its value encoding.
// The entries chosen are those of options.selection (the default: the largest |W − R| per
// tensor); kAgeWeighted needs `held_since` (std::invalid_argument when it is empty).
// `held_since` (empty: not kept) holds per entry the version at which `held`'s value was
// last the model's; every entry of `held` equal to the model's after the pull (sent, or
// not changed; with fp16: the model's rounded value) gets `version`, the entries left out
// keep theirs.
// Throws std::invalid_argument when the spans' lengths do not match `tensor_sizes`.
transport::ModelDelta replica_pull(std::uint64_t model_id,
                                   std::span<const std::uint32_t> tensor_sizes,
                                   std::span<const float> parameters, std::uint64_t version,
                                   std::span<float> held, std::uint64_t held_version,
                                   const ReplicaPullOptions& options,
                                   std::span<std::uint64_t> held_since = {});

}  // namespace edgetrain::server
