// The privacy accountant of DP-FedAvg (server/dp_accountant.h) against published values of
// the RDP bounds and of the RDP-to-(ε, δ) conversion (the tests of Google's dp_accounting
// library, rdp_privacy_accountant_test.py: test_compute_rdp_poisson_sampled_gaussian and
// test_compute_epsilon_delta_pure_dp), the closed form without sampling, and the definition
// (a numerical integral of the Rényi divergence of the sampled Gaussian's two outputs).
#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
