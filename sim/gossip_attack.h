// A malicious gossip peer's attack (issue 37 part 4): what it does to the model it lets its
// neighbours see. The simulator's malicious peers (edgetrain-sim --malicious-peers,
// sim/README.md "Malicious neighbours") and the emulator's attacker process
// (edgetrain-gossip-attacker, emulation/README.md "Gossip runs") apply the same rewrite, so
// `--attack` means one thing in both.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "model/model.h"

namespace edgetrain::sim {

// kBias sets every entry of the output layer's bias (the last layer that has one) to `value`
// ("bias:1e30"); kScale multiplies the whole model by `value` ("scale:-4").
struct GossipAttack {
  enum class Kind { kBias, kScale } kind = Kind::kBias;
  double value = 1e30;
};
// "bias:V" or "scale:F" with V, F finite floats; std::invalid_argument naming --attack
// otherwise.
GossipAttack parse_gossip_attack(const std::string& text);

// The attack for one model's parameter layout.
class GossipPoison {
 public:
  GossipPoison(GossipAttack attack, const runtime::Model& model);
  // Rewrites `parameters` (a whole model of that layout) in place.
  void apply(std::span<float> parameters) const;

 private:
  GossipAttack attack_;
  std::size_t bias_offset_ = 0, bias_size_ = 0;  // the output layer's bias
};

}  // namespace edgetrain::sim
