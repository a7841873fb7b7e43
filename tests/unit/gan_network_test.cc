// runtime::MlpNetwork and the GAN losses (runtime/gan_network.h): the reference network's
// gradients (parameters and input) against finite differences, the XNNPACK network equal to
// the reference on MD-GAN's generator and discriminator at a batch below the one it was built
// for, the losses' gradients against finite differences, and Adam on the discriminator's loss
// actually separating real rows from generated ones.
#include "runtime/gan_network.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/gan_ops.h"
#include "runtime/splitmix64.h"
#include "tests/support/finite_differences.h"

namespace {

using namespace edgetrain::runtime;

using edgetrain::testing::dot;
using edgetrain::testing::expect_matches_finite_differences;
using edgetrain::testing::random_vector;

TEST(MlpNetwork, ReferenceGradientsMatchFiniteDifferences) {
  MlpNetwork net("small", 6, {{5, GanActivation::kLeakyRelu}, {4, GanActivation::kTanh}, {3, GanActivation::kNone}}, 3,
                 KernelBackend::kReference);
  net.model().initialize(5);
  std::vector<float> params(net.model().parameters().begin(), net.model().parameters().end());
  std::mt19937 rng(9);
  auto inp = random_vector(3 * 6, rng);
  const auto probe = random_vector(3 * 3, rng);
  auto loss = [&] { return dot(net.forward(params, inp.data(), 3), probe); };
  loss();
  std::vector<float> dparams(params.size()), dinp(inp.size());
  net.backward(params, probe.data(), dparams, dinp.data());
  expect_matches_finite_differences(params, dparams, loss, 1e-3f, 40, 2e-3, "parameters");
  expect_matches_finite_differences(inp, dinp, loss, 1e-3f, 18, 2e-3, "input");
}

TEST(MlpNetwork, XnnpackEqualsReferenceOnTheMdGanArchitecture) {
  for (const bool generator : {true, false}) {
    SCOPED_TRACE(generator ? "generator" : "discriminator");
    const int inputs = generator ? kGanNoiseSize + kGanClasses : kGanImageSize;
    const auto layers = generator ? mlp_generator_layers() : mlp_discriminator_layers();
    MlpNetwork fast("g", inputs, layers, 10), slow("g", inputs, layers, 10, KernelBackend::kReference);
    fast.model().initialize(3);
    std::vector<float> params(fast.model().parameters().begin(), fast.model().parameters().end());
    std::mt19937 rng(4);
    const int batch = 7;  // below the batch the ops were built for
    const auto inp = random_vector(static_cast<std::size_t>(batch) * inputs, rng);
    const auto dout = random_vector(static_cast<std::size_t>(batch) * fast.outputs(), rng);
    const float* out_fast = fast.forward(params, inp.data(), batch);
    const float* out_slow = slow.forward(params, inp.data(), batch);
    for (std::size_t i = 0; i < dout.size(); i++) ASSERT_NEAR(out_fast[i], out_slow[i], 1e-4) << "output " << i;
    std::vector<float> dp_fast(params.size()), dp_slow(params.size()), dx_fast(inp.size()), dx_slow(inp.size());
    fast.backward(params, dout.data(), dp_fast, dx_fast.data());
    slow.backward(params, dout.data(), dp_slow, dx_slow.data());
    for (std::size_t i = 0; i < params.size(); i++) ASSERT_NEAR(dp_fast[i], dp_slow[i], 1e-4) << "parameter " << i;
    for (std::size_t i = 0; i < inp.size(); i++) ASSERT_NEAR(dx_fast[i], dx_slow[i], 1e-4) << "input " << i;
  }
}

TEST(GanLosses, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(2);
  const int batch = 4;
  auto outputs = random_vector(static_cast<std::size_t>(batch) * (1 + kGanClasses), rng, -3, 3);
  const std::vector<std::int32_t> labels = {0, 9, 4, 4};
  std::vector<float> grad(outputs.size()), scratch(outputs.size());
  for (const bool real : {true, false}) {
    discriminator_loss(outputs.data(), labels.data(), batch, real, grad.data());
    auto loss = [&] {
      const auto l = discriminator_loss(outputs.data(), labels.data(), batch, real, scratch.data());
      return static_cast<double>(l.adversarial) + l.classes;
    };
    expect_matches_finite_differences(outputs, grad, loss, 1e-2f, 44, 2e-3, real ? "real" : "fake");
  }
  generator_loss(outputs.data(), labels.data(), batch, grad.data());
  auto loss = [&] { return static_cast<double>(generator_loss(outputs.data(), labels.data(), batch, scratch.data())); };
  expect_matches_finite_differences(outputs, grad, loss, 1e-2f, 44, 2e-3, "generator");
  const std::vector<std::int32_t> bad = {0, 10, 1, 1};
  EXPECT_THROW(discriminator_loss(outputs.data(), bad.data(), batch, true, grad.data()), std::invalid_argument);
}

// Real rows: a fixed pattern plus noise, labelled by which of two patterns; fake rows: noise.
// Fifty Adam steps of the discriminator must tell them apart and learn the labels.
TEST(GanLosses, AdamOnTheDiscriminatorSeparatesRealFromFake) {
  const int batch = 16;
  MlpNetwork d("d", kGanImageSize, mlp_discriminator_layers(), batch);
  d.model().initialize(1);
  std::vector<float> params(d.model().parameters().begin(), d.model().parameters().end());
  std::vector<float> m(params.size()), v(params.size()), grad(params.size()), grad_fake(params.size());
  GaussianSampler noise(8);
  std::vector<float> real(static_cast<std::size_t>(batch) * kGanImageSize), fake(real.size());
  std::vector<std::int32_t> labels(batch);
  std::vector<float> dout(static_cast<std::size_t>(batch) * (1 + kGanClasses));
  edgetrain::kernels::AdamSettings adam;
  DiscriminatorLoss first_real, last_real, last_fake;
  for (int step = 1; step <= 50; step++) {
    for (int b = 0; b < batch; b++) {
      labels[b] = b % 2 ? 3 : 7;
      for (int i = 0; i < kGanImageSize; i++) {
        const float pattern = ((i / 28 + (labels[b] == 3 ? 0 : 14)) % 28) < 14 ? 0.8f : -0.8f;
        real[static_cast<std::size_t>(b) * kGanImageSize + i] = pattern + 0.1f * noise.next();
        fake[static_cast<std::size_t>(b) * kGanImageSize + i] = 0.5f * noise.next();
      }
    }
    const auto real_loss = discriminator_loss(d.forward(params, real.data(), batch), labels.data(), batch, true, dout.data());
    d.backward(params, dout.data(), grad, nullptr);
    const auto fake_loss = discriminator_loss(d.forward(params, fake.data(), batch), labels.data(), batch, false, dout.data());
    d.backward(params, dout.data(), grad_fake, nullptr);
    for (std::size_t i = 0; i < grad.size(); i++) grad[i] += grad_fake[i];
    edgetrain::kernels::adam_update(params.data(), m.data(), v.data(), grad.data(), params.size(), adam,
                                    static_cast<std::uint64_t>(step));
    if (step == 1) first_real = real_loss;
    last_real = real_loss;
    last_fake = fake_loss;
  }
  EXPECT_LT(last_real.adversarial, 0.1f * first_real.adversarial);
  EXPECT_LT(last_real.classes, 0.1f * first_real.classes);
  EXPECT_EQ(last_real.correct_real_fake, batch);
  EXPECT_EQ(last_fake.correct_real_fake, batch);
}

}  // namespace
