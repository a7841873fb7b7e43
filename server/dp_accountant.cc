#include "server/dp_accountant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace edgetrain::server {

double sampled_gaussian_rdp(double q, double noise_multiplier, int alpha) {
  if (!(q >= 0 && q <= 1)) throw std::invalid_argument("the sampling rate must be in [0, 1]");
  if (!(noise_multiplier >= 0)) throw std::invalid_argument("the noise multiplier must be >= 0");
  if (alpha < 2) throw std::invalid_argument("RDP orders start at 2");
  if (q == 0) return 0;
  if (noise_multiplier == 0) return std::numeric_limits<double>::infinity();
  const double a = alpha;
  if (q == 1) return a / (2 * noise_multiplier * noise_multiplier);
  // log A_α as a log-sum-exp of the α + 1 terms.
  const double log_q = std::log(q), log_1mq = std::log1p(-q);
  const double inv_2z2 = 1 / (2 * noise_multiplier * noise_multiplier);
  std::vector<double> terms(static_cast<std::size_t>(alpha) + 1);
  double largest = -std::numeric_limits<double>::infinity();
  for (int k = 0; k <= alpha; ++k) {
    const double kk = k;
    const double log_binomial = std::lgamma(a + 1) - std::lgamma(kk + 1) - std::lgamma(a - kk + 1);
    terms[k] = log_binomial + (a - kk) * log_1mq + kk * log_q + (kk * kk - kk) * inv_2z2;
    largest = std::max(largest, terms[k]);
  }
  double sum = 0;
  for (double t : terms) sum += std::exp(t - largest);
  return (largest + std::log(sum)) / (a - 1);
}

double skellam_rdp(double l1_sensitivity, double l2_sensitivity, double variance, int alpha) {
  if (!(l1_sensitivity >= 0) || !(l2_sensitivity >= 0))
    throw std::invalid_argument("Skellam RDP: the sensitivities must be >= 0");
  if (!(variance > 0)) throw std::invalid_argument("Skellam RDP: the noise variance must be positive");
  if (alpha < 2) throw std::invalid_argument("RDP orders start at 2");
  const double a = alpha, l2_squared = l2_sensitivity * l2_sensitivity;
  return a * l2_squared / (2 * variance) +
         std::min(((2 * a - 1) * l2_squared + 6 * l1_sensitivity) / (4 * variance * variance),
                  3 * l1_sensitivity / (2 * variance));
}

double subsampled_rdp_bound(double q, int alpha, const std::function<double(int)>& rdp) {
  if (!(q >= 0 && q <= 1)) throw std::invalid_argument("the sampling rate must be in [0, 1]");
  if (alpha < 2) throw std::invalid_argument("RDP orders start at 2");
  if (q == 0) return 0;
  const double whole = rdp(alpha);
  if (q == 1 || !std::isfinite(whole)) return whole;
  const double a = alpha, log_q = std::log(q), log_1mq = std::log1p(-q);
  auto log_binomial = [a](double k) { return std::lgamma(a + 1) - std::lgamma(k + 1) - std::lgamma(a - k + 1); };
  std::vector<double> terms;
  terms.push_back((a - 1) * log_1mq + std::log(a * q - q + 1));
  terms.push_back(log_binomial(2) + 2 * log_q + (a - 2) * log_1mq + rdp(2));
  for (int l = 3; l <= alpha; ++l) {
    const double ll = l;
    terms.push_back(std::log(3.0) + log_binomial(ll) + (a - ll) * log_1mq + ll * log_q + (ll - 1) * rdp(l));
  }
  double largest = -std::numeric_limits<double>::infinity();
  for (double t : terms) largest = std::max(largest, t);
  double sum = 0;
  for (double t : terms) sum += std::exp(t - largest);
  return std::min(whole, (largest + std::log(sum)) / (a - 1));
}

EpsilonAtDelta epsilon_from_rdp(std::span<const int> orders, std::span<const double> rdp,
                                double delta) {
  if (orders.size() != rdp.size() || orders.empty())
    throw std::invalid_argument("one RDP value per order is needed");
  if (!(delta > 0 && delta < 1)) throw std::invalid_argument("delta must be in (0, 1)");
  EpsilonAtDelta best{std::numeric_limits<double>::infinity(), 0};
  for (std::size_t i = 0; i < orders.size(); ++i) {
    const double a = orders[i];
    if (a < 2) throw std::invalid_argument("RDP orders start at 2");
    const double epsilon =
        rdp[i] + std::log((a - 1) / a) - (std::log(delta) + std::log(a)) / (a - 1);
    if (epsilon < best.epsilon) best = {epsilon, orders[i]};
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

const std::vector<int>& default_rdp_orders() {
  static const std::vector<int> orders = [] {
    std::vector<int> o;
    for (int a = 2; a <= 64; ++a) o.push_back(a);
    for (int a : {80, 96, 128, 192, 256, 384, 512}) o.push_back(a);
    return o;
  }();
  return orders;
}

DpAccountant::DpAccountant(double sampling_rate, double noise_multiplier) {
  for (int alpha : default_rdp_orders())
    rdp_per_round_.push_back(sampled_gaussian_rdp(sampling_rate, noise_multiplier, alpha));
}

DpAccountant DpAccountant::skellam(double sampling_rate, double l1_sensitivity, double l2_sensitivity,
                                   double variance) {
  DpAccountant accountant;
  auto rdp = [&](int alpha) { return skellam_rdp(l1_sensitivity, l2_sensitivity, variance, alpha); };
  for (int alpha : default_rdp_orders())
    accountant.rdp_per_round_.push_back(subsampled_rdp_bound(sampling_rate, alpha, rdp));
  return accountant;
}

EpsilonAtDelta DpAccountant::epsilon(double delta) const {
  if (rounds_ == 0) return {0, 0};  // nothing released yet
  std::vector<double> total(rdp_per_round_.size());
  for (std::size_t i = 0; i < total.size(); ++i)
    total[i] = rdp_per_round_[i] * static_cast<double>(rounds_);
  return epsilon_from_rdp(default_rdp_orders(), total, delta);
}

}  // namespace edgetrain::server
