// libFuzzer target for the rest of a user's data directory (model/user_data.cc): its CSV
// files and its description, edgetrain-data.toml. The first input byte picks what the rest is:
//   bit 0 clear: a CSV file, read with a description the other bits choose (example shape,
//                class count, label column by index or by name, header or not, all rows or
//                every other one);
//   bit 0 set:   the text of edgetrain-data.toml, read and checked, then its splits loaded
//                (the files it names do not exist: their loads must be refused cleanly).
// Whatever the reader accepts must hold what it says: every label in [0, classes), every
// value finite, one example's values per held row. Everything else is a DataError, never a
// crash, a hang or an out-of-bounds read.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/idx.h"
#include "model/user_data.h"

using namespace edgetrain::runtime;

namespace {
void require(bool condition) {
  if (!condition) std::abort();
}

void check_accepted(const Dataset& data, const DataDescription& d, bool partial) {
  require(!data.labels.empty());
  for (const std::int32_t label : data.labels)
    require(label >= 0 && static_cast<std::uint32_t>(label) < d.num_classes);
  const std::size_t rows = partial ? data.held.value().size() : data.size();
  require(data.pixels.size() == rows * data.example_values() * sizeof(float));
  for (std::size_t i = 0; i < data.pixels.size(); i += sizeof(float)) {
    float value;
    std::memcpy(&value, data.pixels.data() + i, sizeof value);
    require(std::isfinite(value));
  }
}

void fuzz_csv(std::uint8_t mode, const std::uint8_t* text, std::size_t size) {
  static const int fd = memfd_create("user_data_fuzz_csv", 0);
  require(fd >= 0);
  require(ftruncate(fd, 0) == 0);
  if (size > 0) require(pwrite(fd, text, size, 0) == static_cast<ssize_t>(size));
  DataDescription d;
  d.file = "edgetrain-data.toml";
  d.height = 1;
  d.width = 1 + ((mode >> 1) & 3);
  d.channels = 1 + ((mode >> 3) & 1);
  d.num_classes = 1 + ((mode >> 4) & 3);
  DataSplitFiles f;
  f.features = "/proc/self/fd/" + std::to_string(fd);
  f.csv = true;
  if (mode & 0x40) {
    f.label_column = std::string("label");
    f.header = true;
  } else {
    f.label_column = std::uint32_t{0};
    f.header = false;
  }
  d.train = f;
  const bool partial = mode & 0x80;
  const ExamplePicker every_other = [](const Dataset& all) {
    std::vector<std::uint32_t> picked;
    for (std::uint32_t i = 0; i < all.size(); i += 2) picked.push_back(i);
    return picked;
  };
  try {
    const Dataset data = load_described_dataset(d, DataSplit::kTrain, partial ? &every_other : nullptr);
    check_accepted(data, d, partial);
  } catch (const DataError&) {
  }
}

void fuzz_description(const std::uint8_t* text, std::size_t size) {
  // The reader opens <directory>/edgetrain-data.toml: one private directory per process.
  static const std::filesystem::path directory = [] {
    std::filesystem::path p = std::filesystem::temp_directory_path() /
                              ("edgetrain-user-data-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(p);
    static const std::filesystem::path removed_at_exit = p;
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(removed_at_exit, ignored);
    });
    return p;
  }();
  {
    std::ofstream out(directory / kDataDescriptionFile, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(text), static_cast<std::streamsize>(size));
    require(static_cast<bool>(out));
  }
  try {
    const DataDescription d = read_data_description(directory);
    require(d.num_classes >= 1);
    require(d.train || d.test);
    // Loads only files inside the private directory (which holds the description alone, so
    // each load must be refused): a description may name any path, and /dev/stdin or a
    // multi-gigabyte file would only make the fuzzer wait.
    auto inside = [&](const std::filesystem::path& p) {
      return p.empty() || p.lexically_normal().parent_path() == directory;
    };
    for (const DataSplit split : {DataSplit::kTrain, DataSplit::kTest}) {
      const auto& files = split == DataSplit::kTrain ? d.train : d.test;
      if (!files || !inside(files->features) || !inside(files->labels)) continue;
      try {
        const Dataset data = load_described_dataset(d, split);
        check_accepted(data, d, false);
      } catch (const DataError&) {
      }
    }
  } catch (const DataError&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  if (mode & 1)
    fuzz_description(data + 1, size - 1);
  else
    fuzz_csv(mode, data + 1, size - 1);
  return 0;
}
