#include "server/adaptive_clipping.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace edgetrain::server {

double count_noise_stddev(const AdaptiveClipping& clipping, double expected_devices) {
  return clipping.count_noise_stddev > 0 ? clipping.count_noise_stddev : expected_devices / 20;
}

double delta_noise_multiplier(double total_noise_multiplier, double count_stddev) {
  const double z = total_noise_multiplier;
  if (!(z > 0 && count_stddev > 0))
    throw std::invalid_argument("adaptive clipping needs a noise multiplier and count noise > 0");
  const double rest = 1 / (z * z) - 1 / (4 * count_stddev * count_stddev);
  if (!(rest > 0))
    throw std::invalid_argument(
        "adaptive clipping: the clipped-count noise " + std::to_string(count_stddev) +
        " must be above z/2 = " + std::to_string(z / 2) +
        " (raise --dp-clip-count-stddev or lower --dp-noise-multiplier)");
  return 1 / std::sqrt(rest);
}

double next_clip_norm(double clip_norm, std::size_t unclipped, double count_noise,
                      double expected_devices, const AdaptiveClipping& clipping) {
  const double fraction = (static_cast<double>(unclipped) + count_noise) / expected_devices;
  return clip_norm * std::exp(-clipping.learning_rate * (fraction - clipping.target_quantile));
}

bool counts_as_unclipped(double norm, double clip_norm, bool reloaded) {
  return reloaded ? norm < clip_norm * (1 - 1e-5) : norm <= clip_norm;
}

void check_adaptive_clipping(const AdaptiveClipping& clipping) {
  if (!clipping.enabled()) return;
  if (!(clipping.target_quantile < 1))
    throw std::invalid_argument("--dp-adaptive-clip-quantile must be in (0, 1)");
  if (!(clipping.learning_rate > 0 && std::isfinite(clipping.learning_rate)))
    throw std::invalid_argument("--dp-clip-learning-rate must be > 0");
  if (!(clipping.count_noise_stddev >= 0 && std::isfinite(clipping.count_noise_stddev)))
    throw std::invalid_argument("--dp-clip-count-stddev must be >= 0");
}

}  // namespace edgetrain::server
