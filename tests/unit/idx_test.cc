// IDX reading: valid files (raw and gzip) round-trip, and every kind of broken file is
// refused with a DataError that names the file. The files are made here, in a temp dir.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "model/dataset.h"
#include "model/idx.h"
#include "tests/support/test_data.h"

namespace fs = std::filesystem;
using edgetrain::runtime::DataError;
using edgetrain::runtime::IdxLimits;
using edgetrain::runtime::load_dataset;
using edgetrain::runtime::read_idx_file;

namespace {

std::vector<std::uint8_t> idx_bytes(std::vector<std::uint32_t> dims,
                                    const std::vector<std::uint8_t>& payload,
                                    std::uint8_t type = 0x08) {
  std::vector<std::uint8_t> out = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<std::uint8_t>(d >> shift));
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<std::uint8_t> gzip(const std::vector<std::uint8_t>& raw) {
  uLongf size = compressBound(static_cast<uLong>(raw.size())) + 64;
  std::vector<std::uint8_t> out(size);
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

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint32_t seed, int modulo = 256) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng() % modulo);
  return out;
}

class IdxFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("edgetrain_idx_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& name, const std::vector<std::uint8_t>& bytes) {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  // Expects read_idx_file to throw a DataError naming the file whose reason contains `needle`.
  void expect_refused(const fs::path& p, const std::string& needle, const IdxLimits& limits = {}) {
    try {
      read_idx_file(p, limits);
      ADD_FAILURE() << p << " was accepted; expected an error containing '" << needle << "'";
    } catch (const DataError& e) {
      EXPECT_EQ(e.file(), p.string());
      EXPECT_NE(e.reason().find(needle), std::string::npos) << "reason: " << e.reason();
      EXPECT_NE(std::string(e.what()).find(p.filename().string()), std::string::npos);
    }
  }
  fs::path dir_;
};

TEST_F(IdxFiles, RawAndGzipReadTheSameContent) {
  const auto payload = random_bytes(3 * 5 * 4, 1);
  const auto raw = idx_bytes({3, 5, 4}, payload);
  for (const auto& p : {write("a-idx3-ubyte", raw), write("a-idx3-ubyte.gz", gzip(raw))}) {
    auto array = read_idx_file(p);
    EXPECT_EQ(array.dims, (std::vector<std::uint32_t>{3, 5, 4})) << p;
    EXPECT_EQ(array.data, payload) << p;
  }
}

TEST_F(IdxFiles, WrongMagicIsRefused) {
  auto bytes = idx_bytes({2}, {1, 2});
  bytes[1] = 7;
  expect_refused(write("magic", bytes), "magic");
  expect_refused(write("float-type", idx_bytes({1}, {0, 0, 0, 0}, 0x0D)), "type byte 0x0d");
  expect_refused(write("zero-dims", idx_bytes({}, {})), "dimensions");
}

TEST_F(IdxFiles, TruncatedFilesAreRefused) {
  const auto full = idx_bytes({4, 3}, random_bytes(12, 2));
  expect_refused(write("payload", {full.begin(), full.end() - 1}), "truncated");
  expect_refused(write("header", {full.begin(), full.begin() + 6}), "truncated header");
  expect_refused(write("short-magic", {0, 0}), "shorter than");
  auto gz = gzip(full);
  expect_refused(
      write("cut.gz", {gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)}),
      "truncated");
}

TEST_F(IdxFiles, TrailingBytesAreRefused) {
  auto bytes = idx_bytes({2}, {1, 2});
  bytes.push_back(9);
  expect_refused(write("trailing", bytes), "after the 2 data bytes");
  auto gz = gzip(idx_bytes({2}, {1, 2}));
  gz.push_back(0);
  expect_refused(write("trailing.gz", gz), "after the end of the gzip stream");
}

TEST_F(IdxFiles, BadGzipIsRefused) {
  auto gz = gzip(idx_bytes({64}, random_bytes(64, 3)));
  for (std::size_t i = 10; i < gz.size() - 8; ++i) gz[i] ^= 0x5a;  // corrupt the deflate body
  expect_refused(write("bad.gz", gz), "gzip");
  expect_refused(write("header-only.gz", {0x1f, 0x8b, 8, 0}), "gzip");
}

TEST_F(IdxFiles, OversizedDimensionsAreRefusedBeforeAllocating) {
  expect_refused(write("huge", idx_bytes({0xffffffffu, 0xffffffffu, 0xffffffffu}, {1})), "cap");
  IdxLimits small;
  small.max_payload_bytes = 100;
  expect_refused(write("over-cap", idx_bytes({11, 10}, random_bytes(110, 4))), "cap", small);
  expect_refused(write("zero-dim", idx_bytes({0, 28}, {})), "zero");
  // A gzip bomb: tiny file, content beyond the cap.
  expect_refused(write("bomb.gz", gzip(idx_bytes({1000}, std::vector<std::uint8_t>(1000, 0)))),
                 "cap", small);
}

TEST_F(IdxFiles, EmptyAndMissingFilesAreRefused) {
  expect_refused(write("empty", {}), "empty");
  expect_refused(dir_ / "does-not-exist", "cannot read");
}

TEST_F(IdxFiles, DatasetChecksThatImagesAndLabelsAgree) {
  const auto pixels = random_bytes(5 * 2 * 3, 5);
  const auto labels = random_bytes(5, 6, 10);
  auto images_path = write("img", idx_bytes({5, 2, 3}, pixels));
  auto labels_path = write("lab.gz", gzip(idx_bytes({5}, labels)));
  auto data = load_dataset(images_path, labels_path);
  ASSERT_EQ(data.size(), 5u);
  EXPECT_EQ(data.height, 2u);
  EXPECT_EQ(data.width, 3u);
  EXPECT_EQ(data.channels, 1u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(data.labels[i], labels[i]);
    EXPECT_TRUE(std::equal(data.image(i).begin(), data.image(i).end(),
                           pixels.begin() + static_cast<std::ptrdiff_t>(i * 6)));
  }

  auto six_labels = write("lab6", idx_bytes({6}, random_bytes(6, 7, 10)));
  EXPECT_THROW(
      {
        try {
          load_dataset(images_path, six_labels);
        } catch (const DataError& e) {
          EXPECT_EQ(e.file(), six_labels.string());
          EXPECT_NE(e.reason().find("6 labels for 5 images"), std::string::npos) << e.reason();
          throw;
        }
      },
      DataError);
  auto big_label = write("lab-big", idx_bytes({5}, {0, 1, 2, 10, 3}));
  EXPECT_THROW(load_dataset(images_path, big_label), DataError);
  EXPECT_THROW(load_dataset(labels_path, labels_path), DataError);  // labels as images: 1-D
  EXPECT_THROW(load_dataset(images_path, images_path), DataError);  // images as labels: 3-D
}

void expect_real_dataset(const fs::path& images, const fs::path& labels,
                         std::size_t expected_count) {
  EDGETRAIN_REQUIRE_DATA(images, labels);
  auto data = load_dataset(images, labels);
  EXPECT_EQ(data.size(), expected_count);
  EXPECT_EQ(data.height, 28u);
  EXPECT_EQ(data.width, 28u);
  EXPECT_EQ(data.channels, 1u);
  // Every class appears, and images are not blank.
  std::vector<std::size_t> per_class(10, 0);
  for (auto label : data.labels) ++per_class[static_cast<std::size_t>(label)];
  for (std::size_t c = 0; c < 10; ++c)
    EXPECT_GT(per_class[c], expected_count / 50) << "class " << c;
  std::size_t nonzero = 0;
  for (auto p : data.image(0)) nonzero += p != 0;
  EXPECT_GT(nonzero, 20u);
}

TEST(RealData, MnistFromSetUpIsTheFullSet) {
  const fs::path dir = edgetrain::testing::mnist_dir();
  expect_real_dataset(dir / "train-images-idx3-ubyte", dir / "train-labels-idx1-ubyte", 60000);
  expect_real_dataset(dir / "t10k-images-idx3-ubyte", dir / "t10k-labels-idx1-ubyte", 10000);
}

TEST(RealData, MnistSmallFromSetUp) {
  const fs::path dir = edgetrain::testing::mnist_small_dir();
  expect_real_dataset(dir / "train-images-idx3-ubyte", dir / "train-labels-idx1-ubyte", 8000);
  expect_real_dataset(dir / "t10k-images-idx3-ubyte", dir / "t10k-labels-idx1-ubyte", 2000);
}

TEST(RealData, FashionMnistGzip) {
  const fs::path dir = edgetrain::testing::fashion_mnist_dir();
  expect_real_dataset(dir / "t10k-images-idx3-ubyte.gz", dir / "t10k-labels-idx1-ubyte.gz", 10000);
}

}  // namespace

// IdxReader: parts of a file read without the rest, with the checks of a whole read.
namespace {

using edgetrain::runtime::IdxReader;

// The rows `items` of `payload` (rows of `row` bytes), back to back.
std::vector<std::uint8_t> rows_of(const std::vector<std::uint8_t>& payload, std::size_t row,
                                  const std::vector<std::uint32_t>& items) {
  std::vector<std::uint8_t> out;
  for (std::uint32_t i : items)
    out.insert(out.end(), payload.begin() + static_cast<std::ptrdiff_t>(i * row),
               payload.begin() + static_cast<std::ptrdiff_t>((i + 1) * row));
  return out;
}

TEST_F(IdxFiles, ReadItemsTakesTheRowsAskedForFromRawAndGzipFiles) {
  // 3,000 rows of 100 bytes: more than the gzip reader's 64 KiB buffers hold.
  const auto payload = random_bytes(3000 * 100, 8);
  const auto raw = idx_bytes({3000, 10, 10}, payload);
  std::mt19937 rng(5);
  std::vector<std::uint32_t> some;  // runs of neighbours and gaps, first and last rows
  for (std::uint32_t i = 0; i < 3000; ++i)
    if (i == 0 || i == 2999 || rng() % 7 == 0) some.push_back(i);
  std::vector<std::uint32_t> all(3000);
  for (std::uint32_t i = 0; i < 3000; ++i) all[i] = i;
  for (const auto& p : {write("a-idx3-ubyte", raw), write("a-idx3-ubyte.gz", gzip(raw))}) {
    for (const auto& items : {some, all, std::vector<std::uint32_t>{}, std::vector<std::uint32_t>{1234}}) {
      IdxReader reader(p);
      EXPECT_EQ(reader.dims(), (std::vector<std::uint32_t>{3000, 10, 10})) << p;
      EXPECT_EQ(reader.item_bytes(), 100u);
      EXPECT_EQ(reader.read_items(items), rows_of(payload, 100, items)) << p << " " << items.size();
    }
    IdxReader whole(p);
    EXPECT_EQ(whole.read_all(), payload) << p;
    EXPECT_THROW(whole.read_all(), std::logic_error) << "a reader reads once";
  }
}

TEST_F(IdxFiles, ReadItemsRefusesItemsOutOfOrderOrBeyondTheFile) {
  const auto p = write("a", idx_bytes({4, 2}, random_bytes(8, 9)));
  IdxReader reader(p);
  const std::vector<std::uint32_t> descending = {2, 1}, repeated = {1, 1}, beyond = {4};
  EXPECT_THROW(reader.read_items(descending), std::invalid_argument);
  EXPECT_THROW(reader.read_items(repeated), std::invalid_argument);
  EXPECT_THROW(reader.read_items(beyond), std::invalid_argument);
  const std::vector<std::uint32_t> fine = {0, 3};
  EXPECT_EQ(reader.read_items(fine).size(), 4u);  // the refusals read nothing
}

// A part of a damaged file is refused as the whole file is: the rest is checked too.
TEST_F(IdxFiles, APartialReadChecksTheWholeFile) {
  const auto full = idx_bytes({40, 3}, random_bytes(120, 10));
  const std::vector<std::uint32_t> first = {0};
  auto expect_part_refused = [&](const fs::path& p, const std::string& needle) {
    try {
      IdxReader(p).read_items(first);
      ADD_FAILURE() << p << " was accepted; expected '" << needle << "'";
    } catch (const DataError& e) {
      EXPECT_NE(e.reason().find(needle), std::string::npos) << p << ": " << e.reason();
    }
  };
  expect_part_refused(write("short", {full.begin(), full.end() - 1}), "truncated");
  auto longer = full;
  longer.push_back(1);
  expect_part_refused(write("long", longer), "1 bytes after the 120 data bytes");
  expect_part_refused(write("long.gz", gzip(longer)), "1 bytes after the 120 data bytes");
  auto gz = gzip(full);
  gz.push_back(0);
  expect_part_refused(write("trailing.gz", gz), "after the end of the gzip stream");
  auto damaged = gzip(full);
  damaged[damaged.size() - 6] ^= 0xff;  // the CRC: found only at the end of the stream
  expect_part_refused(write("crc.gz", damaged), "gzip");
}

TEST_F(IdxFiles, ItemsInPlaceReadRawRowsWhereTheyLie) {
  const auto payload = random_bytes(50 * 6, 12);
  const auto raw = idx_bytes({50, 2, 3}, payload);
  const auto items = IdxReader(write("a", raw)).items_in_place();
  ASSERT_NE(items, nullptr);
  EXPECT_EQ(items->count(), 50u);
  EXPECT_EQ(items->item_bytes(), 6u);
  for (std::uint32_t i : {0u, 17u, 49u}) {
    std::vector<std::uint8_t> row(6);
    items->read(i, row.data());
    EXPECT_EQ(row, rows_of(payload, 6, {i}));
  }
  std::vector<std::uint8_t> row(6);
  EXPECT_THROW(items->read(50, row.data()), std::out_of_range);
  // A gzip file's items can only be read in order: none in place.
  EXPECT_EQ(IdxReader(write("a.gz", gzip(raw))).items_in_place(), nullptr);
  // The raw file's length is checked before its items are handed out.
  auto longer = raw;
  longer.push_back(0);
  EXPECT_THROW(IdxReader(write("b", longer)).items_in_place(), DataError);
}

}  // namespace
