// An image classification data set in memory, and deterministic shards of it for workers.
//
// Images are uint8 in NHWC order (what the IDX files hold; standardisation happens in the
// trainer). A worker holds the images of its shard only (load_dataset_part). Sharding is a pure function of (data set size and labels, worker id, worker
// count, seed), so every worker computes its own shard without talking to anyone, and the
// shards of all workers partition the data set: disjoint, and together all of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/idx.h"
#include "model/input_format.h"

namespace edgetrain::runtime {

struct Dataset {
  std::uint32_t height = 0;
  std::uint32_t width = 0;
  std::uint32_t channels = 0;
  std::uint32_t num_classes = 0;
  // How the examples' bytes read (uint8 or float32 values) and how the trainer scales them;
  // the trainer that trains on or evaluates this data set takes it (Trainer::set_input_format).
  InputFormat format;
  // NHWC, image_bytes() per example: every example's image, or those of `held` only. The
  // values as the file holds them (format.type: uint8, or float32 in the host's byte order).
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;  // every example's label, each in [0, num_classes)
  // A partial load (load_dataset_part: a worker holds the images of its shard only): the
  // examples whose images it holds, ascending; row r of `pixels` is example held[r].
  // Without it, `pixels` holds every example's image, row i example i.
  std::optional<std::vector<std::uint32_t>> held;
  // A partial load from a raw image file may leave the images of `held` in the file:
  // `pixels` is then empty and copy_image() reads each where it lies.
  std::shared_ptr<const IdxItemFile> image_file;

  std::size_t size() const { return labels.size(); }
  // Values per example, and their bytes (an "image" is any example: a sequence is H = 1).
  std::size_t example_values() const { return std::size_t{height} * width * channels; }
  std::size_t image_bytes() const { return example_values() * format.value_bytes(); }
  // Whether example i's image is at hand (in memory or in image_file).
  bool has_image(std::size_t i) const;
  // Example i's image, in memory: std::out_of_range for an example a partial load does not
  // hold, std::logic_error when the images are read from image_file (use copy_image).
  std::span<const std::uint8_t> image(std::size_t i) const {
    if (image_file) images_not_in_memory();
    return {pixels.data() + (held ? held_row(i) : i) * image_bytes(), image_bytes()};
  }
  // Copies example i's image to `out` (image_bytes() bytes), from memory or image_file.
  void copy_image(std::size_t i, std::uint8_t* out) const;

 private:
  std::size_t held_row(std::size_t i) const;
  [[noreturn]] static void images_not_in_memory();
};

// Loads an image file (IDX, N×H×W or N×H×W×C) and its label file (IDX, N). Checks that
// both agree on N and that every label is below `num_classes`; throws DataError naming the
// file at fault.
Dataset load_dataset(const std::filesystem::path& images, const std::filesystem::path& labels,
                     std::uint32_t num_classes = 10, const IdxLimits& limits = {});

// A partial load, what a worker holds: every label, but only the images of the examples
// `pick` chooses (`held`). `pick` gets the data set before its images are read (shape,
// num_classes, every label; size() the whole count) and returns the examples to hold, in
// any order (duplicates count once). Where their images are:
// - a raw image file with `images_in_place` (the worker's way): left in the file
//   (image_file), read at each copy_image(); no image is held in memory;
// - a raw image file otherwise: read at those examples only, into `pixels`;
// - a gzip image file: inflated once, keeping those examples' images in `pixels`.
// The checks are load_dataset's, the image file's whole length and gzip integrity included.
using ExamplePicker = std::function<std::vector<std::uint32_t>(const Dataset&)>;
Dataset load_dataset_part(const std::filesystem::path& images, const std::filesystem::path& labels,
                          const ExamplePicker& pick, bool images_in_place = true,
                          std::uint32_t num_classes = 10, const IdxLimits& limits = {});

// Where a named data set's IDX files are. `name` is "mnist" (full MNIST, 60,000 train /
// 10,000 test, fetched at set-up into $EDGETRAIN_DEPS/mnist-full, default
// /var/cache/edgetrain), "mnist-small" (the 8,000 / 2,000 subset set-up converts into
// $EDGETRAIN_DEPS/mnist-small, for CI-sized runs), "fashion-mnist" (Debian's
// dataset-fashion-mnist, /usr/share/datasets/fashion-mnist) or a directory holding
// {train,t10k}-{images-idx3,labels-idx1}-ubyte, each raw or gzipped (.gz): the raw file
// when it exists, else the .gz one. Does not check that the files exist (load_dataset does).
enum class DataSplit { kTrain, kTest };
struct DatasetFiles {
  std::filesystem::path images, labels;
};
DatasetFiles dataset_files(const std::string& name, DataSplit split);

// Any data set by its --data argument, the one way programs load one: a directory holding a
// data description, edgetrain-data.toml (the user's NumPy or CSV files, model/user_data.h),
// else a named IDX data set or directory (dataset_files, then load_dataset or
// load_dataset_part with 10 classes). Throws DataError naming the file at fault.
bool is_described_dataset(const std::string& data);
Dataset load_named_dataset(const std::string& data, DataSplit split);
Dataset load_named_dataset_part(const std::string& data, DataSplit split, const ExamplePicker& pick,
                                bool images_in_place = true);

// The images and labels at `indices`, in that order.
Dataset subset(const Dataset& data, std::span<const std::uint32_t> indices);

struct ShardSpec {
  std::uint32_t worker_id = 0;
  std::uint32_t worker_count = 1;
  std::uint64_t seed = 0;
};

// I.i.d. sharding: a seeded shuffle of all indices, cut into worker_count contiguous runs
// whose sizes differ by at most one. Returns this worker's indices in shuffled order.
std::vector<std::uint32_t> shard_iid(std::size_t dataset_size, const ShardSpec& spec);

// Label-skewed (non-i.i.d.) sharding. Worker w prefers `classes_per_worker` classes,
// {(w·classes_per_worker + j) mod num_classes : j < classes_per_worker}. Every sample, visited
// in seeded shuffled order, goes with probability `preferred_fraction` to one of the workers
// that prefer its class (round-robin among them), otherwise, or when no worker prefers the
// class, to a worker chosen round-robin among all. preferred_fraction = 0 is close to
// i.i.d.; 1 gives each worker only its own classes (when every class is preferred by someone).
struct LabelSkew {
  std::uint32_t classes_per_worker = 2;
  double preferred_fraction = 0.9;
};
std::vector<std::uint32_t> shard_label_skewed(std::span<const std::int32_t> labels,
                                              std::uint32_t num_classes, const ShardSpec& spec,
                                              const LabelSkew& skew = {});

// A worker's shard of `data`: shard_label_skewed of its labels (default skew) when
// `label_skewed`, else shard_iid of its size, in that function's order. The one definition
// every worker loop trains on and the worker program loads (load_dataset_part).
std::vector<std::uint32_t> shard_of(const Dataset& data, const ShardSpec& spec, bool label_skewed);

// The classes worker `worker_id` prefers under `skew` (what shard_label_skewed uses).
std::vector<std::uint32_t> preferred_classes(std::uint32_t worker_id, std::uint32_t num_classes,
                                             const LabelSkew& skew);

}  // namespace edgetrain::runtime
