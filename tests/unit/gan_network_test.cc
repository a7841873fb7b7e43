// runtime::MlpNetwork, runtime::ConvGanNetwork and the GAN losses (model/gan_network.h):
// the reference networks' gradients (parameters and input) against finite differences, the
// XNNPACK networks equal to the reference on MD-GAN's generators and discriminators (MLP and
// CNN) at a batch below the one they were built for, the CNN architecture's layout, the
// losses' gradients against finite differences, and Adam on the discriminator's loss (both
// architectures) actually separating real rows from generated ones.
#include "model/gan_network.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string_view>
#include <vector>

#include "kernels/gan_ops.h"
#include "common/splitmix64.h"
#include "tests/support/finite_differences.h"

namespace {

using namespace edgetrain::runtime;

using edgetrain::testing::dot;
using edgetrain::testing::expect_matches_finite_differences;
using edgetrain::testing::random_vector;

TEST(MlpNetwork, ReferenceGradientsMatchFiniteDifferences) {
  MlpNetwork net(
      "small", 6,
      {{5, GanActivation::kLeakyRelu}, {4, GanActivation::kTanh}, {3, GanActivation::kNone}}, 3,
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
    MlpNetwork fast("g", inputs, layers, 10),
        slow("g", inputs, layers, 10, KernelBackend::kReference);
    fast.model().initialize(3);
    std::vector<float> params(fast.model().parameters().begin(), fast.model().parameters().end());
    std::mt19937 rng(4);
    const int batch = 7;  // below the batch the ops were built for
    const auto inp = random_vector(static_cast<std::size_t>(batch) * inputs, rng);
    const auto dout = random_vector(static_cast<std::size_t>(batch) * fast.outputs(), rng);
    const float* out_fast = fast.forward(params, inp.data(), batch);
    const float* out_slow = slow.forward(params, inp.data(), batch);
    for (std::size_t i = 0; i < dout.size(); i++)
      ASSERT_NEAR(out_fast[i], out_slow[i], 1e-4) << "output " << i;
    std::vector<float> dp_fast(params.size()), dp_slow(params.size()), dx_fast(inp.size()),
        dx_slow(inp.size());
    fast.backward(params, dout.data(), dp_fast, dx_fast.data());
    slow.backward(params, dout.data(), dp_slow, dx_slow.data());
    for (std::size_t i = 0; i < params.size(); i++)
      ASSERT_NEAR(dp_fast[i], dp_slow[i], 1e-4) << "parameter " << i;
    for (std::size_t i = 0; i < inp.size(); i++)
      ASSERT_NEAR(dx_fast[i], dx_slow[i], 1e-4) << "input " << i;
  }
}

// The CNN architecture's layers at a few channels each: the same spatial shapes, kernels,
// strides, paddings and activations (7x7 -> 14x14 -> 28x28 and 28 -> 14 -> 7 -> 4 -> 2), few
// enough values that a float forward pass resolves a central difference.
constexpr std::string_view kNarrowGenerator =
    "input 1x1x12; fc 7x7x3; deconv 2 5x5 stride 2; deconv 1 5x5 stride 2";
constexpr std::string_view kNarrowDiscriminator =
    "input 28x28x1; conv 2 3x3 stride 2; conv 3 3x3 stride 2; conv 3 3x3 stride 2; conv 4 3x3 "
    "stride 2; fc 11";

void expect_network_gradients_match_finite_differences(ConvGanNetwork& net, int batch,
                                                       std::uint64_t seed) {
  net.model().initialize(seed);
  std::vector<float> params(net.model().parameters().begin(), net.model().parameters().end());
  // Non-zero biases, so a wrong bias gradient or a bias read from the wrong offset shows.
  for (const auto& t : net.model().tensors())
    if (t.name.ends_with(".bias"))
      for (std::size_t i = 0; i < t.size; i++)
        params[t.offset + i] = (i % 2 ? 0.3f : -0.3f) + 0.05f * static_cast<float>(i % 5);
  std::mt19937 rng(static_cast<unsigned>(seed));
  auto inp = random_vector(static_cast<std::size_t>(batch) * net.inputs(), rng);
  const auto probe = random_vector(static_cast<std::size_t>(batch) * net.outputs(), rng);
  auto loss = [&] { return dot(net.forward(params, inp.data(), batch), probe); };
  loss();
  std::vector<float> dparams(params.size()), dinp(inp.size());
  net.backward(params, probe.data(), dparams, dinp.data());
  expect_matches_finite_differences(params, dparams, loss, 1e-3f, 120, 3e-3, "parameters");
  expect_matches_finite_differences(inp, dinp, loss, 1e-3f, 60, 3e-3, "input");
  // Every tensor is reached: each has a non-zero gradient somewhere.
  for (const auto& t : net.model().tensors()) {
    const auto begin = dparams.begin() + static_cast<std::ptrdiff_t>(t.offset);
    EXPECT_TRUE(std::any_of(begin, begin + static_cast<std::ptrdiff_t>(t.size), [](float g) {
      return g != 0;
    })) << t.name;
  }
}

// Leaky ReLU is replaced by tanh here: a conv or deconv weight moves hundreds of activations
// at once, and a 1e-3 step then carries some leaky ReLU input across its kink for most
// weights (seen: differences off by 5e-3..5e-2), which says nothing about the gradient. The
// layers, their buffers and offsets are what this checks; leaky ReLU's backward and its place
// in the network (it reads the pre-activation) are checked by MlpNetwork's test above and by
// kernels' gan_ops_test, and the XNNPACK test below runs the real activations.
std::vector<GanActivation> smooth(std::vector<GanActivation> activations) {
  for (auto& a : activations)
    if (a == GanActivation::kLeakyRelu) a = GanActivation::kTanh;
  return activations;
}

TEST(ConvGanNetwork, ReferenceGeneratorGradientsMatchFiniteDifferences) {
  ConvGanNetwork g("g", kNarrowGenerator, smooth(cnn_generator_activations()), 3,
                   KernelBackend::kReference);
  ASSERT_EQ(g.outputs(), kGanImageSize);
  expect_network_gradients_match_finite_differences(g, 2, 11);
}

TEST(ConvGanNetwork, ReferenceDiscriminatorGradientsMatchFiniteDifferences) {
  ConvGanNetwork d("d", kNarrowDiscriminator, smooth(cnn_discriminator_activations()), 3,
                   KernelBackend::kReference);
  ASSERT_EQ(d.outputs(), 1 + kGanClasses);
  expect_network_gradients_match_finite_differences(d, 2, 12);
}

// The CNN as built, with the parameter counts gan_network.h states.
TEST(ConvGanNetwork, CnnArchitectureHasTheStatedLayout) {
  const auto g = make_generator_network(GanArchitecture::kCnn, 4, KernelBackend::kReference);
  const auto d = make_discriminator_network(GanArchitecture::kCnn, 4, KernelBackend::kReference);
  EXPECT_EQ(g->inputs(), kGanNoiseSize + kGanClasses);
  EXPECT_EQ(g->outputs(), kGanImageSize);
  EXPECT_EQ(d->inputs(), kGanImageSize);
  EXPECT_EQ(d->outputs(), 1 + kGanClasses);
  EXPECT_EQ(g->model().parameter_count(), 902657u);
  EXPECT_EQ(d->model().parameter_count(), 102795u);
  const auto& gl = g->model().layers();
  ASSERT_EQ(gl.size(), 3u);
  EXPECT_EQ(gl[0].out, (ExampleShape{7, 7, 128}));
  EXPECT_EQ(gl[1].out, (ExampleShape{14, 14, 64}));
  EXPECT_EQ(gl[2].out, (ExampleShape{28, 28, 1}));
  const auto& dl = d->model().layers();
  ASSERT_EQ(dl.size(), 5u);
  EXPECT_EQ(dl[0].out, (ExampleShape{14, 14, 16}));
  EXPECT_EQ(dl[3].out, (ExampleShape{2, 2, 128}));
  EXPECT_EQ(dl[4].out, (ExampleShape{1, 1, 11}));
  EXPECT_EQ(g->model().tensors()[2].name, "deconv1.weight");
  EXPECT_EQ(g->model().tensors()[2].shape, (std::vector<int>{64, 5, 5, 128}));
  // The MLP through the same factory, and the names.
  EXPECT_EQ(make_generator_network(GanArchitecture::kMlp, 4, KernelBackend::kReference)
                ->model()
                .parameter_count(),
            110u * 512 + 512 + 512u * 512 + 512 + 512u * 784 + 784);
  EXPECT_EQ(parse_gan_architecture("cnn"), GanArchitecture::kCnn);
  EXPECT_EQ(parse_gan_architecture("mlp"), GanArchitecture::kMlp);
  EXPECT_STREQ(gan_architecture_name(GanArchitecture::kCnn), "cnn");
  EXPECT_STREQ(gan_architecture_name(GanArchitecture::kMlp), "mlp");
  EXPECT_THROW(parse_gan_architecture("dcgan"), std::invalid_argument);
  // Activations are the network's, one per layer; the spec's own relu and maxpool are refused.
  EXPECT_THROW(ConvGanNetwork("x", kNarrowDiscriminator, cnn_generator_activations(), 2),
               std::invalid_argument);
  EXPECT_THROW(ConvGanNetwork("x", "input 4x4x1; conv 2 3x3 relu; fc 3",
                              {GanActivation::kNone, GanActivation::kNone}, 2),
               std::invalid_argument);
  EXPECT_THROW(ConvGanNetwork("x", "input 4x4x1; maxpool 2; fc 3",
                              {GanActivation::kNone, GanActivation::kNone}, 2),
               std::invalid_argument);
}

TEST(ConvGanNetwork, XnnpackEqualsReferenceOnTheMdGanCnn) {
  for (const bool generator : {true, false}) {
    SCOPED_TRACE(generator ? "generator" : "discriminator");
    auto build = [&](KernelBackend backend) {
      return generator ? make_generator_network(GanArchitecture::kCnn, 10, backend)
                       : make_discriminator_network(GanArchitecture::kCnn, 10, backend);
    };
    const auto fast = build(KernelBackend::kXnnpack), slow = build(KernelBackend::kReference);
    fast->model().initialize(3);
    std::vector<float> params(fast->model().parameters().begin(), fast->model().parameters().end());
    std::mt19937 rng(4);
    const int batch = 7;  // below the batch the ops were built for
    // Twice: the second time the padding rows hold the first pass's values, not zeros.
    for (int pass = 0; pass < 2; pass++) {
      const auto inp = random_vector(static_cast<std::size_t>(batch) * fast->inputs(), rng);
      const auto dout = random_vector(static_cast<std::size_t>(batch) * fast->outputs(), rng);
      const float* out_fast = fast->forward(params, inp.data(), batch);
      const float* out_slow = slow->forward(params, inp.data(), batch);
      for (std::size_t i = 0; i < dout.size(); i++)
        ASSERT_NEAR(out_fast[i], out_slow[i], 1e-4) << "output " << i;
      std::vector<float> dp_fast(params.size()), dp_slow(params.size()), dx_fast(inp.size()),
          dx_slow(inp.size());
      fast->backward(params, dout.data(), dp_fast, dx_fast.data());
      slow->backward(params, dout.data(), dp_slow, dx_slow.data());
      for (std::size_t i = 0; i < params.size(); i++)
        ASSERT_NEAR(dp_fast[i], dp_slow[i], 1e-4) << "parameter " << i;
      for (std::size_t i = 0; i < inp.size(); i++)
        ASSERT_NEAR(dx_fast[i], dx_slow[i], 1e-4) << "input " << i;
    }
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
  auto loss = [&] {
    return static_cast<double>(
        generator_loss(outputs.data(), labels.data(), batch, scratch.data()));
  };
  expect_matches_finite_differences(outputs, grad, loss, 1e-2f, 44, 2e-3, "generator");
  const std::vector<std::int32_t> bad = {0, 10, 1, 1};
  EXPECT_THROW(discriminator_loss(outputs.data(), bad.data(), batch, true, grad.data()),
               std::invalid_argument);
}

// Real rows: a fixed pattern plus noise, labelled by which of two patterns; fake rows: noise.
// `steps` Adam steps of the discriminator must tell them apart and learn the labels.
void expect_adam_separates_real_from_fake(GanArchitecture architecture, int steps, float lr) {
  SCOPED_TRACE(gan_architecture_name(architecture));
  const int batch = 16;
  const auto network = make_discriminator_network(architecture, batch, KernelBackend::kXnnpack);
  GanNetwork& d = *network;
  d.model().initialize(1);
  std::vector<float> params(d.model().parameters().begin(), d.model().parameters().end());
  std::vector<float> m(params.size()), v(params.size()), grad(params.size()),
      grad_fake(params.size());
  GaussianSampler noise(8);
  std::vector<float> real(static_cast<std::size_t>(batch) * kGanImageSize), fake(real.size());
  std::vector<std::int32_t> labels(batch);
  std::vector<float> dout(static_cast<std::size_t>(batch) * (1 + kGanClasses));
  edgetrain::kernels::AdamSettings adam;
  adam.lr = lr;
  DiscriminatorLoss first_real, last_real, last_fake;
  for (int step = 1; step <= steps; step++) {
    for (int b = 0; b < batch; b++) {
      labels[b] = b % 2 ? 3 : 7;
      for (int i = 0; i < kGanImageSize; i++) {
        const float pattern = ((i / 28 + (labels[b] == 3 ? 0 : 14)) % 28) < 14 ? 0.8f : -0.8f;
        real[static_cast<std::size_t>(b) * kGanImageSize + i] = pattern + 0.1f * noise.next();
        fake[static_cast<std::size_t>(b) * kGanImageSize + i] = 0.5f * noise.next();
      }
    }
    const auto real_loss = discriminator_loss(d.forward(params, real.data(), batch), labels.data(),
                                              batch, true, dout.data());
    d.backward(params, dout.data(), grad, nullptr);
    const auto fake_loss = discriminator_loss(d.forward(params, fake.data(), batch), labels.data(),
                                              batch, false, dout.data());
    d.backward(params, dout.data(), grad_fake, nullptr);
    for (std::size_t i = 0; i < grad.size(); i++) grad[i] += grad_fake[i];
    edgetrain::kernels::adam_update(params.data(), m.data(), v.data(), grad.data(), params.size(),
                                    adam, static_cast<std::uint64_t>(step));
    if (step == 1) first_real = real_loss;
    last_real = real_loss;
    last_fake = fake_loss;
  }
  std::printf("%s: real/fake loss %.4f -> %.4f, class loss %.4f -> %.4f\n",
              gan_architecture_name(architecture), first_real.adversarial, last_real.adversarial,
              first_real.classes, last_real.classes);
  EXPECT_LT(last_real.adversarial, 0.1f * first_real.adversarial);
  EXPECT_LT(last_real.classes, 0.1f * first_real.classes);
  EXPECT_EQ(last_real.correct_real_fake, batch);
  EXPECT_EQ(last_fake.correct_real_fake, batch);
}

TEST(GanLosses, AdamOnTheDiscriminatorSeparatesRealFromFake) {
  expect_adam_separates_real_from_fake(GanArchitecture::kMlp, 50, 2e-4f);
}

TEST(GanLosses, AdamOnTheCnnDiscriminatorSeparatesRealFromFake) {
  // At the GAN's lr 2e-4 it took 100 steps (50 left the loss at 0.21 of 0.71): 106 s under QEMU.
  expect_adam_separates_real_from_fake(GanArchitecture::kCnn, 30, 1e-3f);
}

}  // namespace

// A discriminator's feedback to the generator needs only its input gradient: backward() with
// no parameter gradients gives the same input gradient, bit for bit, on both kernels and both
// architectures (the fully connected layers skip their weight gradients).
TEST(GanNetworks, TheInputGradientAloneIsTheFullBackwardsInputGradient) {
  for (const auto architecture : {GanArchitecture::kMlp, GanArchitecture::kCnn}) {
    for (const auto backend : {KernelBackend::kReference, KernelBackend::kXnnpack}) {
      const int batch = 5;
      auto d = make_discriminator_network(architecture, 8, backend);
      d->model().initialize(3);
      const std::vector<float> params(d->model().parameters().begin(),
                                      d->model().parameters().end());
      edgetrain::runtime::SplitMix64 bits{7};
      std::vector<float> x(static_cast<std::size_t>(batch) * d->inputs()),
          dout(static_cast<std::size_t>(batch) * d->outputs());
      for (auto& v : x) v = static_cast<float>(bits.uniform_double() * 2 - 1);
      for (auto& v : dout) v = static_cast<float>(bits.uniform_double() - 0.5);
      std::vector<float> dparams(params.size()), full(x.size()), alone(x.size());
      d->forward(params, x.data(), batch);
      d->backward(params, dout.data(), dparams, full.data());
      d->forward(params, x.data(), batch);
      d->backward(params, dout.data(), {}, alone.data());
      EXPECT_EQ(alone, full) << gan_architecture_name(architecture)
                             << (backend == KernelBackend::kXnnpack ? " xnnpack" : " reference");
    }
  }
}
