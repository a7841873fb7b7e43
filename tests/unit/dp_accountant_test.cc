// The privacy accountant of DP-FedAvg (server/dp_accountant.h) against published values of
// the RDP bounds and of the RDP-to-(ε, δ) conversion (the tests of Google's dp_accounting
// library, rdp_privacy_accountant_test.py: test_compute_rdp_poisson_sampled_gaussian and
// test_compute_epsilon_delta_pure_dp), the closed form without sampling, and the definition
// (a numerical integral of the Rényi divergence of the sampled Gaussian's two outputs). The
// Skellam mechanism's bound and Zhu and Wang's subsampled bound against the Rényi divergences
// computed here from their definition (sums over the Skellam pmf, itself a sum over Poisson
// pmfs), which the bounds must never be below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "server/dp_accountant.h"

namespace {

using namespace edgetrain;

TEST(DpAccountant, MatchesPublishedRdpOfTheSampledGaussian) {
  // q = 0.01, z = 2.5, 50 compositions; the published values at the integer orders.
  const double q = 0.01, z = 2.5;
  const std::vector<std::pair<int, double>> published = {
      {5, 2.18075656e-03}, {50, 2.38460375e-02}, {100, 1.67416308e02}};
  for (const auto& [alpha, rdp] : published)
    EXPECT_NEAR(50 * server::sampled_gaussian_rdp(q, z, alpha), rdp, 1e-4 * rdp) << alpha;
}

TEST(DpAccountant, WithoutSamplingItIsTheGaussiansClosedForm) {
  for (int alpha : {2, 7, 64})
    for (double z : {0.5, 1.0, 4.0})
      EXPECT_NEAR(server::sampled_gaussian_rdp(1.0, z, alpha), alpha / (2 * z * z), 1e-12);
  EXPECT_EQ(server::sampled_gaussian_rdp(0.0, 1.0, 8), 0.0);
  EXPECT_TRUE(std::isinf(server::sampled_gaussian_rdp(0.5, 0.0, 8)));
  EXPECT_THROW(server::sampled_gaussian_rdp(1.5, 1.0, 8), std::invalid_argument);
  EXPECT_THROW(server::sampled_gaussian_rdp(0.5, 1.0, 1), std::invalid_argument);
}

TEST(DpAccountant, MatchesTheDefinitionByNumericalIntegration) {
  // A_α = E_{x ~ N(0, z²)} [((1 − q) + q·exp((2x − 1)/(2z²)))^α], by the trapezoid rule.
  for (const auto& [q, z, alpha] : std::vector<std::tuple<double, double, int>>{
           {0.1, 1.0, 8}, {0.01, 2.0, 32}, {0.5, 3.0, 4}}) {
    const double step = z * 1e-3;
    double a = 0;
    for (double x = -40 * z; x <= 40 * z; x += step) {
      const double density = std::exp(-x * x / (2 * z * z)) / (z * std::sqrt(2 * M_PI));
      a += density * std::pow((1 - q) + q * std::exp((2 * x - 1) / (2 * z * z)), alpha) * step;
    }
    EXPECT_NEAR(server::sampled_gaussian_rdp(q, z, alpha), std::log(a) / (alpha - 1), 1e-6)
        << q << " " << z << " " << alpha;
  }
}

TEST(DpAccountant, ConvertsRdpToEpsilonAsPublished) {
  std::vector<int> orders;
  for (int a = 2; a <= 32; ++a) orders.push_back(a);
  const std::vector<double> rdp(orders.size(), 1.1);  // constant: pure DP
  const server::EpsilonAtDelta e = server::epsilon_from_rdp(orders, rdp, 1e-5);
  EXPECT_NEAR(e.epsilon, 1.32783806176, 1e-9);
  EXPECT_EQ(e.order, 32);
}

TEST(DpAccountant, EpsilonGrowsWithRoundsAndShrinksWithNoise) {
  server::DpAccountant quiet(0.1, 1.0), loud(0.1, 2.0);
  EXPECT_EQ(quiet.epsilon(1e-5).epsilon, 0.0) << "nothing released";
  quiet.add_rounds(100);
  loud.add_rounds(100);
  const double after_100 = quiet.epsilon(1e-5).epsilon;
  EXPECT_GT(after_100, loud.epsilon(1e-5).epsilon);
  quiet.add_rounds(900);
  EXPECT_GT(quiet.epsilon(1e-5).epsilon, after_100);
  EXPECT_LT(quiet.epsilon(1e-3).epsilon, quiet.epsilon(1e-5).epsilon);
}

// log Σ exp(terms).
double log_sum_exp(const std::vector<double>& terms) {
  const double largest = *std::max_element(terms.begin(), terms.end());
  double sum = 0;
  for (double t : terms) sum += std::exp(t - largest);
  return largest + std::log(sum);
}

// log P(Sk(μ) = k) for |k| ≤ reach: Σ_j Pois(j; μ/2)·Pois(j − k; μ/2).
std::map<int, double> skellam_log_pmf(double mu, int reach) {
  const double lambda = mu / 2;
  const int top = static_cast<int>(lambda + 60 * std::sqrt(lambda) + 100);
  std::vector<double> log_poisson(top);
  for (int j = 0; j < top; ++j) log_poisson[j] = -lambda + j * std::log(lambda) - std::lgamma(j + 1.0);
  std::map<int, double> pmf;
  for (int k = -reach; k <= reach; ++k) {
    std::vector<double> terms;
    for (int j = std::max(0, k); j < top && j - k < top; ++j) terms.push_back(log_poisson[j] + log_poisson[j - k]);
    pmf[k] = log_sum_exp(terms);
  }
  return pmf;
}

// One coordinate shifted by Δ (so Δ1 = Δ2 = Δ): D_α(Sk(Δ, μ) ‖ Sk(0, μ)) by its definition,
// never above the bound, and the bound tight to 40% (the paper calls it sharp); then the
// mechanism on a Poisson sample of rate q, both directions of the divergence between
// (1 − q)·Sk(0, μ) + q·Sk(Δ, μ) and Sk(0, μ), never above Zhu and Wang's bound.
TEST(DpAccountant, SkellamBoundsAboveTheDivergencesByTheirDefinition) {
  for (const auto& [mu, shift] : std::vector<std::pair<double, int>>{{50, 5}, {200, 10}, {20, 2}}) {
    const int reach = static_cast<int>(shift + 30 * std::sqrt(mu) + 30);
    const std::map<int, double> log_p = skellam_log_pmf(mu, reach + shift);
    for (int alpha : {2, 4, 8, 16}) {
      std::vector<double> shifted, forward, backward;
      const double q = 0.1;
      for (int k = -reach; k <= reach; ++k) {
        const double mixture = log_sum_exp({std::log1p(-q) + log_p.at(k), std::log(q) + log_p.at(k - shift)});
        shifted.push_back(alpha * log_p.at(k - shift) + (1 - alpha) * log_p.at(k));
        forward.push_back(alpha * mixture + (1 - alpha) * log_p.at(k));
        backward.push_back(alpha * log_p.at(k) + (1 - alpha) * mixture);
      }
      const double exact = log_sum_exp(shifted) / (alpha - 1);
      const double bound = server::skellam_rdp(shift, shift, mu, alpha);
      EXPECT_GE(bound, exact) << mu << " " << shift << " " << alpha;
      EXPECT_LE(bound, 1.4 * exact) << mu << " " << shift << " " << alpha;
      const double sampled = std::max(log_sum_exp(forward), log_sum_exp(backward)) / (alpha - 1);
      const double sampled_bound = server::subsampled_rdp_bound(
          q, alpha, [&](int order) { return server::skellam_rdp(shift, shift, mu, order); });
      EXPECT_GE(sampled_bound, sampled) << mu << " " << shift << " " << alpha;
      EXPECT_LE(sampled_bound, bound);  // sampling never costs privacy
    }
  }
  EXPECT_THROW(server::skellam_rdp(1, 1, 0, 2), std::invalid_argument);
  EXPECT_THROW(server::skellam_rdp(1, 1, 1, 1), std::invalid_argument);
}

// For the Gaussian the general bound lies above the exact sampled Gaussian (Mironov et al.),
// equals the mechanism at q = 1 and is 0 at q = 0. Fed the Skellam of a large variance, whose
// RDP is the Gaussian's plus a term of order 1/μ, the accountant gives about the ε of the
// same bound fed the Gaussian: the difference from the Gaussian accountant is the subsampling
// bound's looseness, not the discrete noise.
TEST(DpAccountant, SubsampledBoundAboveTheExactGaussian) {
  for (const auto& [q, z] : std::vector<std::pair<double, double>>{{0.1, 1.0}, {0.03, 1.0}, {0.3, 0.7}}) {
    auto gaussian = [z = z](int alpha) { return alpha / (2 * z * z); };
    for (int alpha : {2, 3, 8, 32, 128}) {
      const double bound = server::subsampled_rdp_bound(q, alpha, gaussian);
      EXPECT_GE(bound, server::sampled_gaussian_rdp(q, z, alpha) * (1 - 1e-12)) << q << " " << z << " " << alpha;
      EXPECT_LE(bound, gaussian(alpha));
    }
  }
  EXPECT_DOUBLE_EQ(server::subsampled_rdp_bound(1, 7, [](int a) { return a * 0.5; }), 3.5);
  EXPECT_EQ(server::subsampled_rdp_bound(0, 7, [](int a) { return a * 0.5; }), 0.0);
  // Δ2 = 1000, μ = 1000²: the Gaussian of z = 1 plus (2α − 1)/(4·10^6) + ...
  server::DpAccountant skellam = server::DpAccountant::skellam(0.1, 1000 * std::sqrt(1e5), 1000, 1e6);
  std::vector<double> gaussian_bound;
  for (int alpha : server::default_rdp_orders())
    gaussian_bound.push_back(100 * server::subsampled_rdp_bound(0.1, alpha, [](int a) { return a / 2.0; }));
  skellam.add_rounds(100);
  const double via_gaussian = server::epsilon_from_rdp(server::default_rdp_orders(), gaussian_bound, 1e-5).epsilon;
  EXPECT_NEAR(skellam.epsilon(1e-5).epsilon, via_gaussian, 0.01 * via_gaussian);
  server::DpAccountant exact(0.1, 1.0);
  exact.add_rounds(100);
  EXPECT_GT(skellam.epsilon(1e-5).epsilon, exact.epsilon(1e-5).epsilon);
}

}  // namespace
