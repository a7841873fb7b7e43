// A worker's partial load (load_dataset_part: every label, the images of its shard only,
// in memory or read where they lie in a raw file) gives the sampler exactly the batches a
// full load gives, for the same shard and seed: i.i.d. and label-skewed shards, raw and
// gzip files, and on full MNIST when set-up has fetched it.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "model/dataset.h"
#include "model/shard_sampler.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_data.h"

namespace {

namespace fs = std::filesystem;
using namespace edgetrain::runtime;

std::vector<std::uint8_t> idx_bytes(std::vector<std::uint32_t> dims,
                                    const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> out = {0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(d >> shift));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<std::uint8_t> gzip(const std::vector<std::uint8_t>& raw) {
  std::vector<std::uint8_t> out(compressBound(static_cast<uLong>(raw.size())) + 64);
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  s.next_in = const_cast<Bytef*>(raw.data());
  s.avail_in = static_cast<uInt>(raw.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

void write(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Every batch of `steps` steps of `batch` examples, pixels and labels, as the worker's
// sampler draws them (its seed rule: worker/worker.cc).
struct Draws {
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;
};
Draws draw(const Dataset& data, const ShardSpec& spec, bool skewed, int batch, int steps) {
  ShardSampler sampler(data, shard_of(data, spec, skewed),
                       spec.seed ^ (0x9e3779b97f4a7c15ULL * (spec.worker_id + 1)));
  Draws all;
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(batch) * data.image_bytes());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (int s = 0; s < steps; ++s) {
    sampler.next_batch(batch, pixels, labels);
    all.pixels.insert(all.pixels.end(), pixels.begin(), pixels.end());
    all.labels.insert(all.labels.end(), labels.begin(), labels.end());
  }
  return all;
}

// The partial loads of `spec`'s shard (images in place and in memory) draw the batches the
// full load draws, over more than two epochs of the shard.
void expect_same_batches(const fs::path& images, const fs::path& labels, const ShardSpec& spec,
                         bool skewed, int batch) {
  const Dataset full = load_dataset(images, labels);
  const std::vector<std::uint32_t> shard = shard_of(full, spec, skewed);
  ASSERT_FALSE(shard.empty());
  const int steps = static_cast<int>(2 * shard.size() / static_cast<std::size_t>(batch) + 3);
  const Draws expected = draw(full, spec, skewed, batch, steps);
  for (bool in_place : {true, false}) {
    const Dataset part = load_dataset_part(
        images, labels, [&](const Dataset& d) { return shard_of(d, spec, skewed); }, in_place);
    SCOPED_TRACE(images.string() + (in_place ? " in place" : " in memory") +
                 (skewed ? ", label skew" : ", i.i.d.") + ", worker " +
                 std::to_string(spec.worker_id) + " of " + std::to_string(spec.worker_count));
    ASSERT_EQ(part.size(), full.size());
    EXPECT_EQ(part.labels, full.labels);
    ASSERT_TRUE(part.held);
    EXPECT_EQ(part.held->size(), shard.size());
    // Images in place only for a raw file; then none is in memory.
    const bool raw = images.extension() != ".gz";
    EXPECT_EQ(part.image_file != nullptr, in_place && raw);
    EXPECT_EQ(part.pixels.size(), in_place && raw ? 0 : shard.size() * full.image_bytes());
    const Draws got = draw(part, spec, skewed, batch, steps);
    EXPECT_TRUE(got.pixels == expected.pixels);
    EXPECT_EQ(got.labels, expected.labels);
  }
}

class PartialLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_.path());
    // 997 images of 4x5 with 10 classes, raw and gzip.
    std::mt19937 rng(21);
    std::vector<std::uint8_t> pixels(997 * 20), labels(997);
    for (auto& p : pixels) p = static_cast<std::uint8_t>(rng());
    for (auto& l : labels) l = static_cast<std::uint8_t>(rng() % 10);
    const auto images = idx_bytes({997, 4, 5}, pixels), label_file = idx_bytes({997}, labels);
    write(dir_.path() / "img", images);
    write(dir_.path() / "img.gz", gzip(images));
    write(dir_.path() / "lab", label_file);
    write(dir_.path() / "lab.gz", gzip(label_file));
  }
  edgetrain::testing::TempDir dir_{"edgetrain-partial-load"};
};

TEST_F(PartialLoad, DrawsTheBatchesOfAFullLoadIidAndLabelSkewed) {
  for (const char* images : {"img", "img.gz"}) {
    for (bool skewed : {false, true}) {
      for (const ShardSpec& spec : {ShardSpec{0, 1, 5}, ShardSpec{3, 10, 5}, ShardSpec{9, 10, 77},
                                    ShardSpec{0, 100, 5}}) {
        expect_same_batches(dir_.path() / images, dir_.path() / "lab.gz", spec, skewed, 4);
      }
    }
  }
}

TEST_F(PartialLoad, HoldsOnlyTheExamplesPicked) {
  const std::vector<std::uint32_t> picked = {500, 3, 3, 996};  // any order, duplicates once
  for (bool in_place : {true, false}) {
    const Dataset part = load_dataset_part(
        dir_.path() / "img", dir_.path() / "lab", [&](const Dataset&) { return picked; }, in_place);
    EXPECT_EQ(*part.held, (std::vector<std::uint32_t>{3, 500, 996}));
    EXPECT_TRUE(part.has_image(500));
    EXPECT_FALSE(part.has_image(4));
    EXPECT_FALSE(part.has_image(997));
    std::vector<std::uint8_t> image(part.image_bytes());
    EXPECT_NO_THROW(part.copy_image(996, image.data()));
    EXPECT_THROW(part.copy_image(4, image.data()), std::out_of_range);
    if (in_place) {
      EXPECT_THROW(part.image(3), std::logic_error);  // no image in memory: copy_image
    } else {
      EXPECT_THROW(part.image(4), std::out_of_range);
    }
    // The sampler refuses a shard with an example the load did not pick.
    EXPECT_THROW(ShardSampler(part, {3, 4}, 1), std::invalid_argument);
    // subset() copies from a partial load too.
    const std::vector<std::uint32_t> two = {996, 3};
    const Dataset copy = subset(part, two);
    EXPECT_FALSE(copy.held);
    EXPECT_EQ(copy.pixels.size(), 2 * part.image_bytes());
  }
  const auto beyond = [](const Dataset&) { return std::vector<std::uint32_t>{997}; };
  EXPECT_THROW(load_dataset_part(dir_.path() / "img", dir_.path() / "lab", beyond),
               std::out_of_range);
}

// A partial load refuses what a full load refuses.
TEST_F(PartialLoad, RefusesWhatAFullLoadRefuses) {
  const auto none = [](const Dataset&) { return std::vector<std::uint32_t>{}; };
  std::vector<std::uint8_t> bad_labels = idx_bytes({997}, std::vector<std::uint8_t>(997, 3));
  bad_labels.back() = 10;
  write(dir_.path() / "bad-lab", bad_labels);
  EXPECT_THROW(load_dataset_part(dir_.path() / "img", dir_.path() / "bad-lab", none), DataError);
  write(dir_.path() / "six-lab", idx_bytes({6}, std::vector<std::uint8_t>(6, 1)));
  EXPECT_THROW(load_dataset_part(dir_.path() / "img", dir_.path() / "six-lab", none), DataError);
  auto long_images = idx_bytes({997, 4, 5}, std::vector<std::uint8_t>(997 * 20 + 1, 0));
  write(dir_.path() / "long-img", long_images);
  for (bool in_place : {true, false})
    EXPECT_THROW(load_dataset_part(dir_.path() / "long-img", dir_.path() / "lab", none, in_place),
                 DataError);
}

// The worker's case: full MNIST, worker 0 of 10 and of 100, i.i.d. and label-skewed, at
// batch 10, more than two epochs of the shard.
TEST(PartialLoadMnist, DrawsTheBatchesOfAFullLoad) {
  const fs::path dir = edgetrain::testing::mnist_dir();
  EDGETRAIN_REQUIRE_DATA(dir / "train-images-idx3-ubyte", dir / "train-labels-idx1-ubyte");
  for (bool skewed : {false, true})
    for (std::uint32_t workers : {10u, 100u})
      expect_same_batches(dir / "train-images-idx3-ubyte", dir / "train-labels-idx1-ubyte",
                          {0, workers, 1}, skewed, 10);
}

}  // namespace
