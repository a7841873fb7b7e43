// sim::GanFleet (sim/gan_simulation.h), MD-GAN and FL-GAN in one process: the traffic each
// counts follows the paper's formulas (MD-GAN: 2·b·d down and b·d up per worker and
// iteration, |θ_D| per swap; FL-GAN: G and D both ways per averaging), swaps and averagings
// happen every E epochs of a shard, the evaluated generator changes as training goes, and bad
// settings are refused.
#include "sim/gan_simulation.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "model/classifier_readout.h"
#include "tests/support/test_data.h"

namespace {

using namespace edgetrain;

const runtime::Dataset& train_digits() {
  static const runtime::Dataset data = [] {
    const std::string dir = edgetrain::testing::mnist_small_dir().string() + "/";
    return runtime::load_dataset(dir + "train-images-idx3-ubyte", dir + "train-labels-idx1-ubyte");
  }();
  return data;
}

sim::GanFleetSettings small(sim::GanMode mode) {
  sim::GanFleetSettings s;
  s.mode = mode;
  s.workers = 3;
  s.k = 2;
  s.gan.batch = 8;
  // 8,000 digits over 3 workers: 2,666 per shard, 333 iterations per epoch; E = 0.03 → every 10.
  s.epochs_between = 0.03;
  return s;
}

TEST(GanFleet, MdGanTrafficAndSwapsFollowThePaper) {
  sim::GanFleet fleet(small(sim::GanMode::kMdGan), train_digits());
  std::vector<std::uint8_t> before(20 * 784), after(20 * 784);
  std::vector<std::int32_t> labels(20);
  fleet.sample(20, 5, before.data(), labels.data());
  for (int i = 0; i < 25; i++) fleet.iterate();
  fleet.sample(20, 5, after.data(), labels.data());
  const std::uint64_t d = 784 * 4, b = 8;
  EXPECT_EQ(fleet.traffic().down_bytes, 25 * 3 * 2 * b * d);
  EXPECT_EQ(fleet.traffic().up_bytes, 25 * 3 * b * d);
  EXPECT_EQ(fleet.traffic().swaps, 2u);  // after iterations 10 and 20
  EXPECT_EQ(fleet.traffic().peer_bytes, 2 * 3 * fleet.discriminator_parameters() * 4);
  EXPECT_GT(fleet.worker_seconds_per_iteration(), 0.0);
  EXPECT_NE(before, after) << "the server's generator did not change";
}

TEST(GanFleet, FlGanAveragesEveryEEpochs) {
  sim::GanFleet fleet(small(sim::GanMode::kFlGan), train_digits());
  for (int i = 0; i < 25; i++) fleet.iterate();
  EXPECT_EQ(fleet.traffic().averagings, 2u);
  const std::uint64_t models =
      (fleet.generator_parameters() + fleet.discriminator_parameters()) * 4;
  EXPECT_EQ(fleet.traffic().up_bytes, 2 * 3 * models);
  EXPECT_EQ(fleet.traffic().down_bytes, 2 * 3 * models);
  EXPECT_EQ(fleet.traffic().peer_bytes, 0u);
}

// The CI-sized check of what MD-GAN learns: scored by an MLP classifier trained here
// (the paper CNN's checkpoint takes minutes to make), the MNIST score of the server's
// generator rises and the Fréchet distance to test digits falls within 300 iterations.
TEST(GanFleetLongRun, MdGanMnistScoreRisesAndFrechetDistanceFalls) {
  const std::string dir = edgetrain::testing::mnist_small_dir().string() + "/";
  const runtime::Dataset test =
      runtime::load_dataset(dir + "t10k-images-idx3-ubyte", dir + "t10k-labels-idx1-ubyte");
  const runtime::SampleClassifier classifier(train_digits(), 1500, 3);
  runtime::GanJudge judge(classifier.model(), test.pixels.data(), 300);
  sim::GanFleetSettings s = small(sim::GanMode::kMdGan);
  s.gan.batch = 32;
  sim::GanFleet fleet(s, train_digits());
  std::vector<std::uint8_t> pixels(300 * 784);
  std::vector<std::int32_t> labels(300);
  auto scores = [&] {
    fleet.sample(300, 11, pixels.data(), labels.data());
    return judge.score(pixels.data(), labels.data(), 300);
  };
  const runtime::GanScores before = scores();
  for (int i = 0; i < 300; i++) fleet.iterate();
  const runtime::GanScores after = scores();
  std::printf(
      "MNIST score %.2f -> %.2f, Frechet distance %.1f -> %.1f, conditional accuracy %.2f -> "
      "%.2f\n",
      before.mnist_score, after.mnist_score, before.frechet_distance, after.frechet_distance,
      before.conditional_accuracy, after.conditional_accuracy);
  EXPECT_GT(after.mnist_score, before.mnist_score + 1.0);
  EXPECT_LT(after.frechet_distance, before.frechet_distance * 0.8);
}

TEST(GanFleet, RefusesBadSettings) {
  auto s = small(sim::GanMode::kMdGan);
  s.k = 4;  // more batches than workers
  EXPECT_THROW(sim::GanFleet(s, train_digits()), std::invalid_argument);
  s = small(sim::GanMode::kMdGan);
  s.workers = 0;
  EXPECT_THROW(sim::GanFleet(s, train_digits()), std::invalid_argument);
  s = small(sim::GanMode::kFlGan);
  s.epochs_between = 0;
  EXPECT_THROW(sim::GanFleet(s, train_digits()), std::invalid_argument);
}

}  // namespace
