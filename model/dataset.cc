#include "model/dataset.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>

namespace edgetrain::runtime {

namespace {

// std::shuffle and the std distributions are implementation-defined; shards must be the
// same on every board and every standard library, so both are written out here over
// mt19937_64, whose output sequence the standard does fix.
std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t bound) {
  // Rejection sampling removes the modulo bias.
  const std::uint64_t limit =
      std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % bound;
  std::uint64_t draw;
  do draw = rng();
  while (draw >= limit);
  return draw % bound;
}

double uniform_unit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

std::vector<std::uint32_t> shuffled_indices(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint32_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(i);
  std::mt19937_64 rng(seed);
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[uniform_below(rng, i)]);
  return order;
}

void check_spec(const ShardSpec& spec) {
  if (spec.worker_count == 0) throw std::invalid_argument("shard: worker_count must be at least 1");
  if (spec.worker_id >= spec.worker_count)
    throw std::invalid_argument("shard: worker_id " + std::to_string(spec.worker_id) +
                                " is not below worker_count " + std::to_string(spec.worker_count));
}

}  // namespace

namespace {

// load_dataset and load_dataset_part: the image file's header, every label, then the
// images (all, or those `pick` chooses).
Dataset load(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
             std::uint32_t num_classes, const IdxLimits& limits, const ExamplePicker* pick,
             bool images_in_place) {
  IdxReader images(images_path, limits);
  const std::vector<std::uint32_t>& dims = images.dims();
  if (dims.size() != 3 && dims.size() != 4)
    throw DataError(images_path.string(), "image file has " + std::to_string(dims.size()) +
                                              " dimensions; expected 3 (N×H×W) or 4 (N×H×W×C)");
  IdxArray labels = read_idx_file(labels_path, limits);
  if (labels.dims.size() != 1)
    throw DataError(labels_path.string(), "label file has " + std::to_string(labels.dims.size()) +
                                              " dimensions; expected 1");
  if (dims[0] != labels.dims[0])
    throw DataError(labels_path.string(), std::to_string(labels.dims[0]) + " labels for " +
                                              std::to_string(dims[0]) + " images in " +
                                              images_path.string());
  Dataset data;
  data.height = dims[1];
  data.width = dims[2];
  data.channels = dims.size() == 4 ? dims[3] : 1;
  data.num_classes = num_classes;
  data.labels.reserve(labels.data.size());
  for (std::size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= num_classes)
      throw DataError(labels_path.string(), "label " + std::to_string(labels.data[i]) +
                                                " of item " + std::to_string(i) + " is not below " +
                                                std::to_string(num_classes) + " classes");
    data.labels.push_back(labels.data[i]);
  }
  if (!pick) {
    data.pixels = images.read_all();
    return data;
  }
  std::vector<std::uint32_t> held = (*pick)(data);
  std::sort(held.begin(), held.end());
  held.erase(std::unique(held.begin(), held.end()), held.end());
  if (!held.empty() && held.back() >= data.size())
    throw std::out_of_range("load_dataset_part: example " + std::to_string(held.back()) +
                            " beyond " + std::to_string(data.size()) + " examples");
  if (images_in_place) data.image_file = images.items_in_place();
  if (!data.image_file) data.pixels = images.read_items(held);
  data.held = std::move(held);
  return data;
}

}  // namespace

Dataset load_dataset(const std::filesystem::path& images_path,
                     const std::filesystem::path& labels_path, std::uint32_t num_classes,
                     const IdxLimits& limits) {
  return load(images_path, labels_path, num_classes, limits, nullptr, false);
}

Dataset load_dataset_part(const std::filesystem::path& images_path,
                          const std::filesystem::path& labels_path, const ExamplePicker& pick,
                          bool images_in_place, std::uint32_t num_classes,
                          const IdxLimits& limits) {
  return load(images_path, labels_path, num_classes, limits, &pick, images_in_place);
}

bool Dataset::has_image(std::size_t i) const {
  if (!held) return i < size();
  return std::binary_search(held->begin(), held->end(), i);
}

void Dataset::copy_image(std::size_t i, std::uint8_t* out) const {
  if (!image_file) {
    const auto from = image(i);
    std::copy(from.begin(), from.end(), out);
    return;
  }
  if (held) held_row(i);  // refuses an example the load did not pick
  image_file->read(static_cast<std::uint32_t>(i), out);
}

void Dataset::images_not_in_memory() {
  throw std::logic_error(
      "data set: its images are read from their file at each use (Dataset::copy_image)");
}

std::size_t Dataset::held_row(std::size_t i) const {
  const auto it = std::lower_bound(held->begin(), held->end(), i);
  if (it == held->end() || *it != i)
    throw std::out_of_range("data set: the image of example " + std::to_string(i) +
                            " is not held (a partial load of " + std::to_string(held->size()) +
                            " of " + std::to_string(size()) + " examples)");
  return static_cast<std::size_t>(it - held->begin());
}

Dataset subset(const Dataset& data, std::span<const std::uint32_t> indices) {
  Dataset out;
  out.height = data.height;
  out.width = data.width;
  out.channels = data.channels;
  out.num_classes = data.num_classes;
  out.format = data.format;
  out.pixels.reserve(indices.size() * data.image_bytes());
  out.labels.reserve(indices.size());
  for (std::uint32_t i : indices) {
    if (i >= data.size())
      throw std::out_of_range("subset: index " + std::to_string(i) + " beyond " +
                              std::to_string(data.size()) + " items");
    out.pixels.resize(out.pixels.size() + data.image_bytes());
    data.copy_image(i, out.pixels.data() + out.pixels.size() - data.image_bytes());
    out.labels.push_back(data.labels[i]);
  }
  return out;
}

std::vector<std::uint32_t> shard_iid(std::size_t dataset_size, const ShardSpec& spec) {
  check_spec(spec);
  const std::vector<std::uint32_t> order = shuffled_indices(dataset_size, spec.seed);
  // The first (size mod count) workers take one extra item.
  const std::size_t base = dataset_size / spec.worker_count;
  const std::size_t extra = dataset_size % spec.worker_count;
  const std::size_t begin = spec.worker_id * base + std::min<std::size_t>(spec.worker_id, extra);
  const std::size_t length = base + (spec.worker_id < extra ? 1 : 0);
  return {order.begin() + static_cast<std::ptrdiff_t>(begin),
          order.begin() + static_cast<std::ptrdiff_t>(begin + length)};
}

std::vector<std::uint32_t> shard_of(const Dataset& data, const ShardSpec& spec,
                                    bool label_skewed) {
  return label_skewed ? shard_label_skewed(data.labels, data.num_classes, spec)
                      : shard_iid(data.size(), spec);
}

std::vector<std::uint32_t> preferred_classes(std::uint32_t worker_id, std::uint32_t num_classes,
                                             const LabelSkew& skew) {
  std::vector<std::uint32_t> classes;
  const std::uint32_t count = std::min(skew.classes_per_worker, num_classes);
  for (std::uint32_t j = 0; j < count; ++j)
    classes.push_back(static_cast<std::uint32_t>(
        (std::uint64_t{worker_id} * skew.classes_per_worker + j) % num_classes));
  return classes;
}

std::vector<std::uint32_t> shard_label_skewed(std::span<const std::int32_t> labels,
                                              std::uint32_t num_classes, const ShardSpec& spec,
                                              const LabelSkew& skew) {
  check_spec(spec);
  if (num_classes == 0)
    throw std::invalid_argument("shard_label_skewed: num_classes must be at least 1");
  if (!(skew.preferred_fraction >= 0.0 && skew.preferred_fraction <= 1.0))
    throw std::invalid_argument("shard_label_skewed: preferred_fraction must lie in [0, 1]");
  std::vector<std::vector<std::uint32_t>> workers_preferring(num_classes);
  for (std::uint32_t w = 0; w < spec.worker_count; ++w)
    for (std::uint32_t c : preferred_classes(w, num_classes, skew))
      workers_preferring[c].push_back(w);

  const std::vector<std::uint32_t> order = shuffled_indices(labels.size(), spec.seed);
  // A second stream, so that the choice of preferred/uniform does not shift the shuffle.
  std::mt19937_64 coin(spec.seed ^ 0x9e3779b97f4a7c15ULL);
  std::vector<std::size_t> next_in_class(num_classes, 0);
  std::size_t next_any = 0;
  std::vector<std::uint32_t> mine;
  for (std::uint32_t item : order) {
    const std::int32_t label = labels[item];
    if (label < 0 || static_cast<std::uint32_t>(label) >= num_classes)
      throw std::invalid_argument("shard_label_skewed: label " + std::to_string(label) +
                                  " of item " + std::to_string(item) + " out of range");
    const auto& candidates = workers_preferring[static_cast<std::uint32_t>(label)];
    const bool preferred = uniform_unit(coin) < skew.preferred_fraction;
    std::uint32_t owner;
    if (preferred && !candidates.empty()) {
      owner = candidates[next_in_class[label]++ % candidates.size()];
    } else {
      owner = static_cast<std::uint32_t>(next_any++ % spec.worker_count);
    }
    if (owner == spec.worker_id) mine.push_back(item);
  }
  return mine;
}

DatasetFiles dataset_files(const std::string& name, DataSplit split) {
  std::filesystem::path directory;
  const char* deps = std::getenv("EDGETRAIN_DEPS");
  const std::filesystem::path dependencies = deps && *deps ? deps : "/var/cache/edgetrain";
  if (name == "mnist") {
    directory = dependencies / "mnist-full";
  } else if (name == "mnist-small") {
    directory = dependencies / "mnist-small";
  } else if (name == "fashion-mnist") {
    directory = "/usr/share/datasets/fashion-mnist";
  } else {
    directory = name;
  }
  const std::string prefix = split == DataSplit::kTrain ? "train" : "t10k";
  auto file = [&](const std::string& stem) {
    const std::filesystem::path raw = directory / (prefix + stem);
    std::error_code ignored;
    return std::filesystem::exists(raw, ignored) ? raw
                                                 : std::filesystem::path(raw.string() + ".gz");
  };
  return {file("-images-idx3-ubyte"), file("-labels-idx1-ubyte")};
}

}  // namespace edgetrain::runtime
