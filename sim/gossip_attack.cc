#include "sim/gossip_attack.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <stdexcept>

namespace edgetrain::sim {

GossipAttack parse_gossip_attack(const std::string& text) {
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  double value = NAN;
  if (colon != std::string::npos && colon + 1 < text.size()) {
    try {
      std::size_t used = 0;
      const std::string number = text.substr(colon + 1);
      value = std::stod(number, &used);
      if (used != number.size()) value = NAN;
    } catch (const std::exception&) {
      value = NAN;
    }
  }
  if ((kind != "bias" && kind != "scale") || !std::isfinite(value) || std::fabs(value) > 3.4e38)
    throw std::invalid_argument("--attack: '" + text +
                                "' is not bias:V or scale:F (a finite float, e.g. bias:1e30)");
  return {kind == "bias" ? GossipAttack::Kind::kBias : GossipAttack::Kind::kScale, value};
}

GossipPoison::GossipPoison(GossipAttack attack, const runtime::Model& model) : attack_(attack) {
  for (auto layer = model.layers().rbegin(); layer != model.layers().rend(); ++layer)
    if (layer->bias_tensor >= 0) {
      const runtime::TensorInfo& bias = model.tensors()[static_cast<std::size_t>(layer->bias_tensor)];
      bias_offset_ = bias.offset;
      bias_size_ = bias.size;
      break;
    }
}

void GossipPoison::apply(std::span<float> parameters) const {
  const auto value = static_cast<float>(attack_.value);
  if (attack_.kind == GossipAttack::Kind::kBias)
    std::fill_n(parameters.begin() + static_cast<std::ptrdiff_t>(bias_offset_), bias_size_, value);
  else
    for (float& v : parameters) v *= value;
}

}  // namespace edgetrain::sim
