#include "model/published_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace edgetrain::runtime {

PublishedModel::PublishedModel(std::vector<std::uint32_t> tensor_sizes,
                               std::span<const float> parameters, std::uint64_t version,
                               PublishOptions options)
    : tensor_sizes_(std::move(tensor_sizes)),
      options_(options),
      published_(parameters.begin(), parameters.end()),
      last_changed_(parameters.size(), version),
      version_(version),
      changes_known_since_(version) {
  if (!(options_.fraction > 0 && options_.fraction <= 1))
    throw std::invalid_argument("publish fraction must be in (0, 1], not " +
                                std::to_string(options_.fraction));
  const std::size_t total =
      std::accumulate(tensor_sizes_.begin(), tensor_sizes_.end(), std::size_t{0});
  if (total != parameters.size())
    throw std::invalid_argument("published model: tensor sizes add up to " + std::to_string(total) +
                                ", not " + std::to_string(parameters.size()));
}

bool PublishedModel::advance(std::span<const float> parameters, std::uint64_t version) {
  if (!options_.enabled() || version < version_ + options_.every) return false;
  if (parameters.size() != published_.size())
    throw std::invalid_argument("published model: wrong parameter count");
  bool changed = false;
  double lag_sq = 0, norm_sq = 0;
  std::size_t offset = 0;
  for (const std::uint32_t size : tensor_sizes_) {
    const float* w = parameters.data() + offset;
    float* p = published_.data() + offset;
    const auto k = static_cast<std::uint32_t>(std::clamp<double>(
        std::max<double>(std::ceil(options_.fraction * size), options_.min_entries), 1,
        static_cast<double>(size)));
    order_.resize(size);
    std::iota(order_.begin(), order_.end(), 0u);
    // Largest |W − P| first; ties by index, so a step is the same on every machine.
    auto larger = [&](std::uint32_t a, std::uint32_t b) {
      const float da = std::fabs(w[a] - p[a]), db = std::fabs(w[b] - p[b]);
      return da != db ? da > db : a < b;
    };
    if (k < size) std::nth_element(order_.begin(), order_.begin() + k, order_.end(), larger);
    for (std::uint32_t j = 0; j < k; ++j) {
      const std::uint32_t i = order_[j];
      if (p[i] == w[i]) continue;
      p[i] = w[i];
      last_changed_[offset + i] = version;
      changed = true;
    }
    for (std::uint32_t i = 0; i < size; ++i) {
      const double d = static_cast<double>(w[i]) - p[i];
      lag_sq += d * d;
      norm_sq += static_cast<double>(w[i]) * w[i];
    }
    offset += size;
  }
  relative_lag_ = norm_sq > 0 ? std::sqrt(lag_sq / norm_sq) : 0;
  version_ = version;
  steps_++;
  return changed;
}

}  // namespace edgetrain::runtime
