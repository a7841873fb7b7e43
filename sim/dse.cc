#include "sim/dse.h"

#include <algorithm>
#include <stdexcept>

namespace edgetrain::sim {

std::vector<std::vector<float>> dropout_grid(int conv_layers, std::span<const float> levels) {
  if (conv_layers < 1) throw std::invalid_argument("dropout grid: the model has no conv layers");
  if (levels.empty()) throw std::invalid_argument("dropout grid: no rate levels");
  std::vector<std::vector<float>> grid{{}};
  for (int layer = 0; layer < conv_layers; layer++) {
    std::vector<std::vector<float>> longer;
    for (const auto& prefix : grid)
      for (float level : levels) {
        longer.push_back(prefix);
        longer.back().push_back(level);
      }
    grid = std::move(longer);
  }
  return grid;
}

std::vector<DsePoint> pareto_front(const std::vector<DsePoint>& points) {
  std::vector<DsePoint> sorted = points;
  // Fastest first; among equally fast, most accurate first. A point is on the front iff it
  // is more accurate than every faster (or equally fast, earlier) point.
  std::stable_sort(sorted.begin(), sorted.end(), [](const DsePoint& a, const DsePoint& b) {
    return a.relative_time != b.relative_time ? a.relative_time < b.relative_time
                                              : a.accuracy > b.accuracy;
  });
  std::vector<DsePoint> front;
  for (const DsePoint& p : sorted)
    if (front.empty() || p.accuracy > front.back().accuracy) front.push_back(p);
  return front;
}

double relative_flops(const runtime::Model& model, std::span<const float> rates) {
  const runtime::Model sub(runtime::sub_network_spec(model, rates));
  return runtime::forward_macs(sub) / runtime::forward_macs(model);
}

}  // namespace edgetrain::sim
