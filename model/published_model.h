// The published model: what workers pull when the server does not hand out its exact
// parameters (issue 13, part 4). With 100 workers that pull before every step, an exact
// pull carries every entry that any of the ~100 updates since the worker's last pull
// touched (most of the model); its Block2 requests cost the server more ingress than the
// updates themselves.
//
// Instead the server keeps a second copy P of the model that only follows the true model W
// by small steps: every `every` applied updates it copies into P, per tensor, the `fraction`
// of entries (at least `min_entries`) where |W − P| is largest (P_i ← W_i exactly). What is left
// out stays in W − P and is published later, once it has grown (the server's own error feedback).
// Workers hold P bit for bit: they pull its changes since the publish version they hold (the
// ordinary model delta of transport/CODEC.md, with the digest of P), so every worker can still
// check its copy, and the pull is a bounded number of entries per publish step.
//
// Versions: P is named by the server version at which it was last published; a worker's
// update computed on P carries that version as its fetched version, so the staleness rule
// counts the updates P has not caught up with (at most `every` − 1 more than an exact pull).
//
// Not durable: after a restart P starts again as W (changes_known_since() = that version),
// and workers holding an older P get the dense model once.
//
// A gossip peer (worker/gossip_peer.h) publishes its own model the same way, one step per
// iteration: with a fraction below 1 its neighbours hold a copy that follows its model by
// compressed steps whose left-out part waits for later steps (CHOCO-SGD's public copy x̂
// with error feedback); with fraction 1 they hold its model exactly.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace edgetrain::runtime {

struct PublishOptions {
  std::uint32_t every =
      0;  // applied updates between publish steps; 0: no published model (exact pulls)
  double fraction = 0.01;  // share of each tensor's entries copied per step
  // ... but at least this many (or the whole tensor if smaller): a bias moves with every
  // update, and one entry per step would leave it far behind.
  std::uint32_t min_entries = 32;
  bool enabled() const { return every > 0; }
};

class PublishedModel {
 public:
  // P starts as `parameters` (the true model at `version`). Throws std::invalid_argument on
  // a fraction outside (0, 1] or sizes that do not add up to the parameters.
  PublishedModel(std::vector<std::uint32_t> tensor_sizes, std::span<const float> parameters,
                 std::uint64_t version, PublishOptions options);

  // The true model has reached `version` with `parameters`: publishes a step when `every`
  // updates have been applied since the last one. Returns true if P changed.
  bool advance(std::span<const float> parameters, std::uint64_t version);

  std::span<const float> parameters() const { return published_; }
  std::uint64_t version() const {
    return version_;
  }  // the true model's version at the last publish step
  // Per entry, the publish version that last changed it (entries changed after V are all
  // that differ between P at V and now, for V ≥ changes_known_since()).
  std::span<const std::uint64_t> last_changed() const { return last_changed_; }
  std::uint64_t changes_known_since() const { return changes_known_since_; }
  std::uint64_t steps() const { return steps_; }
  // ‖W − P‖ / ‖W‖ at the last publish step: how far the workers' model lags behind.
  double relative_lag() const { return relative_lag_; }
  const PublishOptions& options() const { return options_; }

 private:
  std::vector<std::uint32_t> tensor_sizes_;
  PublishOptions options_;
  std::vector<float> published_;
  std::vector<std::uint64_t> last_changed_;
  std::uint64_t version_ = 0, changes_known_since_ = 0, steps_ = 0;
  double relative_lag_ = 0;
  std::vector<std::uint32_t> order_;  // scratch: one tensor's entry indices
};

}  // namespace edgetrain::runtime
