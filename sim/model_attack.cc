#include "sim/model_attack.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>

namespace edgetrain::sim {

ModelAttack parse_model_attack(const std::string& text) {
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  double v = std::numeric_limits<double>::infinity();
  if (colon != std::string::npos && colon + 1 < text.size()) {
    const char* number = text.c_str() + colon + 1;
    char* end = nullptr;
    errno = 0;
    const double parsed = std::strtod(number, &end);
    if (end && *end == '\0' && errno == 0) v = parsed;
  }
  if ((kind != "bias" && kind != "scale") || !std::isfinite(v) || std::fabs(v) > 3.4e38)
    throw std::invalid_argument("--attack: '" + text +
                                "' is not bias:V or scale:F (a finite float, e.g. bias:1e30)");
  return {kind == "bias" ? ModelAttack::Kind::kBias : ModelAttack::Kind::kScale, v};
}

std::pair<std::size_t, std::size_t> output_bias_range(const runtime::Model& model) {
  for (auto layer = model.layers().rbegin(); layer != model.layers().rend(); ++layer)
    if (layer->bias_tensor >= 0) {
      const runtime::TensorInfo& bias = model.tensors()[static_cast<std::size_t>(layer->bias_tensor)];
      return {bias.offset, bias.size};
    }
  return {0, 0};
}

void apply_model_attack(const ModelAttack& attack, std::span<float> values,
                        std::pair<std::size_t, std::size_t> bias) {
  const auto value = static_cast<float>(attack.value);
  if (attack.kind == ModelAttack::Kind::kBias)
    std::fill_n(values.begin() + static_cast<std::ptrdiff_t>(bias.first), bias.second, value);
  else
    for (float& v : values) v *= value;
}

}  // namespace edgetrain::sim
