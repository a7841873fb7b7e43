// Sharding: each scheme partitions the data set, is deterministic, and has the shape it
// promises (balanced for i.i.d., concentrated on preferred classes for label skew).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "model/dataset.h"

using namespace edgetrain::runtime;

namespace {

std::vector<std::int32_t> random_labels(std::size_t n, std::uint32_t classes, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> labels(n);
  for (auto& l : labels) l = static_cast<std::int32_t>(rng() % classes);
  return labels;
}

// Every index in [0, n) appears in exactly one shard.
void expect_partition(const std::vector<std::vector<std::uint32_t>>& shards, std::size_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& shard : shards)
    for (auto i : shard) {
      ASSERT_LT(i, n);
      ++seen[i];
    }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
}

TEST(ShardIid, PartitionsBalancedAndDeterministic) {
  for (std::size_t n : {0u, 1u, 7u, 1000u, 8000u}) {
    for (std::uint32_t workers : {1u, 3u, 8u}) {
      std::vector<std::vector<std::uint32_t>> shards;
      for (std::uint32_t w = 0; w < workers; ++w) shards.push_back(shard_iid(n, {w, workers, 42}));
      expect_partition(shards, n);
      auto [lo, hi] = std::minmax_element(shards.begin(), shards.end(),
                                          [](auto& a, auto& b) { return a.size() < b.size(); });
      EXPECT_LE(hi->size() - lo->size(), 1u);
      EXPECT_EQ(shard_iid(n, {workers - 1, workers, 42}), shards.back());
    }
  }
}

TEST(ShardIid, SeedChangesTheShuffle) {
  auto a = shard_iid(1000, {0, 2, 1});
  auto b = shard_iid(1000, {0, 2, 2});
  EXPECT_NE(a, b);
  // A shuffle, not the identity order.
  EXPECT_FALSE(std::is_sorted(a.begin(), a.end()));
}

TEST(ShardIid, RejectsBadSpec) {
  EXPECT_THROW(shard_iid(10, {0, 0, 1}), std::invalid_argument);
  EXPECT_THROW(shard_iid(10, {3, 3, 1}), std::invalid_argument);
}

double preferred_share(const std::vector<std::uint32_t>& shard,
                       const std::vector<std::int32_t>& labels, std::uint32_t worker,
                       std::uint32_t classes, const LabelSkew& skew) {
  auto preferred = preferred_classes(worker, classes, skew);
  std::size_t hits = 0;
  for (auto i : shard)
    hits +=
        std::count(preferred.begin(), preferred.end(), static_cast<std::uint32_t>(labels[i])) > 0;
  return shard.empty() ? 0.0 : static_cast<double>(hits) / static_cast<double>(shard.size());
}

TEST(ShardLabelSkewed, PartitionsAndConcentratesOnPreferredClasses) {
  const std::uint32_t classes = 10, workers = 5;
  const auto labels = random_labels(8000, classes, 3);
  for (double fraction : {0.0, 0.5, 0.9, 1.0}) {
    LabelSkew skew{2, fraction};
    std::vector<std::vector<std::uint32_t>> shards;
    for (std::uint32_t w = 0; w < workers; ++w)
      shards.push_back(shard_label_skewed(labels, classes, {w, workers, 9}, skew));
    expect_partition(shards, labels.size());
    for (std::uint32_t w = 0; w < workers; ++w) {
      // Preferred classes are 2 of 10: a share of fraction + (1 − fraction)·0.2 expected.
      const double expected = fraction + (1.0 - fraction) * 0.2;
      EXPECT_NEAR(preferred_share(shards[w], labels, w, classes, skew), expected, 0.05)
          << "worker " << w << " fraction " << fraction;
      EXPECT_EQ(shard_label_skewed(labels, classes, {w, workers, 9}, skew), shards[w]);
    }
  }
}

TEST(ShardLabelSkewed, ClassesNobodyPrefersAreSpreadOverAll) {
  // 2 workers × 2 classes leave 6 of 10 classes unpreferred: they must still be assigned.
  const auto labels = random_labels(2000, 10, 4);
  LabelSkew skew{2, 1.0};
  auto a = shard_label_skewed(labels, 10, {0, 2, 5}, skew);
  auto b = shard_label_skewed(labels, 10, {1, 2, 5}, skew);
  expect_partition({a, b}, labels.size());
  std::set<std::int32_t> classes_of_a;
  for (auto i : a) classes_of_a.insert(labels[i]);
  EXPECT_FALSE(classes_of_a.count(2) || classes_of_a.count(3));  // worker 1's classes, fraction 1
  EXPECT_TRUE(classes_of_a.count(0) && classes_of_a.count(9));
}

TEST(Subset, CopiesImagesAndLabelsInOrder) {
  Dataset data;
  data.height = 1;
  data.width = 2;
  data.channels = 1;
  data.num_classes = 10;
  data.pixels = {0, 1, 10, 11, 20, 21};
  data.labels = {3, 4, 5};
  std::vector<std::uint32_t> pick = {2, 0};
  auto s = subset(data, pick);
  EXPECT_EQ(s.pixels, (std::vector<std::uint8_t>{20, 21, 0, 1}));
  EXPECT_EQ(s.labels, (std::vector<std::int32_t>{5, 3}));
  std::vector<std::uint32_t> bad = {3};
  EXPECT_THROW(subset(data, bad), std::out_of_range);
}

}  // namespace

// dataset_files: one place maps a data set's name and split to its files.
namespace {

class DatasetFilesIn : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("edgetrain-dataset-files-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void touch(const std::string& name) { std::ofstream(dir_ / name) << ""; }
  std::filesystem::path dir_;
};

TEST_F(DatasetFilesIn, ADirectoryPrefersRawFilesAndFallsBackToGzip) {
  touch("train-images-idx3-ubyte");
  touch("train-labels-idx1-ubyte.gz");
  const DatasetFiles train = dataset_files(dir_.string(), DataSplit::kTrain);
  EXPECT_EQ(train.images, dir_ / "train-images-idx3-ubyte");
  EXPECT_EQ(train.labels, dir_ / "train-labels-idx1-ubyte.gz");
  // Neither exists: the .gz name, which load_dataset's error then names.
  const DatasetFiles test = dataset_files(dir_.string(), DataSplit::kTest);
  EXPECT_EQ(test.images, dir_ / "t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(test.labels, dir_ / "t10k-labels-idx1-ubyte.gz");
}

TEST_F(DatasetFilesIn, NamedDataSetsLiveWhereSetUpPutsThem) {
  // Restored afterwards: the environment outlives this test.
  const char* before = std::getenv("EDGETRAIN_DEPS");
  const std::string saved = before ? before : "";
  ::setenv("EDGETRAIN_DEPS", dir_.parent_path().c_str(), 1);
  EXPECT_EQ(dataset_files("mnist", DataSplit::kTest).images.parent_path(),
            dir_.parent_path() / "mnist-full");
  EXPECT_EQ(dataset_files("mnist-small", DataSplit::kTest).images.parent_path(),
            dir_.parent_path() / "mnist-small");
  ::unsetenv("EDGETRAIN_DEPS");
  EXPECT_EQ(dataset_files("mnist", DataSplit::kTrain).images.parent_path(),
            "/var/cache/edgetrain/mnist-full");
  EXPECT_EQ(dataset_files("mnist-small", DataSplit::kTrain).images.parent_path(),
            "/var/cache/edgetrain/mnist-small");
  EXPECT_EQ(dataset_files("fashion-mnist", DataSplit::kTest).labels.parent_path(),
            "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(
      dataset_files("fashion-mnist", DataSplit::kTest).labels.filename().string().substr(0, 4),
      "t10k");
  if (before) ::setenv("EDGETRAIN_DEPS", saved.c_str(), 1);
}

}  // namespace
