// The user's own data (model/user_data.h, model/numpy_file.h): a directory with
// edgetrain-data.toml naming NumPy (.npy, .npz stored or deflated) or CSV files. The files are
// written here byte by byte as NumPy and zip lay them out (no Python in the unit tests, so they
// run under QEMU too); tests/integration/user_data.sh trains on files NumPy itself wrote.
// Each format loads to the values written; each problem is a DataError naming the file and
// saying what is wrong; a worker's partial load holds its shard's rows only and equals the
// full load's; shards follow the description's class count; and the Trainer learns from
// float32 examples.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/dataset.h"
#include "model/filter_dropout.h"
#include "model/model.h"
#include "model/numpy_file.h"
#include "model/shard_sampler.h"
#include "model/trainer.h"
#include "model/user_data.h"
#include "tests/support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using namespace edgetrain::runtime;
using Bytes = std::vector<std::uint8_t>;

// --- writers ------------------------------------------------------------------------------

template <class T>
Bytes bytes_of(const std::vector<T>& values) {
  Bytes out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A .npy file (version 1.0) as np.save writes it: magic, header dict padded with spaces to a
// multiple of 64 bytes and ended by a newline, then the payload.
Bytes npy(const std::string& descr, const std::string& shape, const Bytes& payload,
          bool fortran = false) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                     ", 'shape': " + shape + ", }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  Bytes out = {0x93,
               'N',
               'U',
               'M',
               'P',
               'Y',
               1,
               0,
               static_cast<std::uint8_t>(dict.size() & 255),
               static_cast<std::uint8_t>(dict.size() >> 8)};
  out.insert(out.end(), dict.begin(), dict.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void put16(Bytes& b, std::uint32_t v) {
  b.push_back(static_cast<std::uint8_t>(v)), b.push_back(static_cast<std::uint8_t>(v >> 8));
}
void put32(Bytes& b, std::uint32_t v) { put16(b, v & 0xffff), put16(b, v >> 16); }

Bytes raw_deflate(const Bytes& raw) {
  Bytes out(compressBound(static_cast<uLong>(raw.size())) + 64);
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  s.next_in = const_cast<Bytef*>(raw.data());
  s.avail_in = static_cast<uInt>(raw.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

// A zip file of .npy members, stored (np.savez) or deflated (np.savez_compressed).
struct ZipMember {
  std::string name;
  Bytes data;
};
Bytes zip(const std::vector<ZipMember>& members, bool deflated) {
  Bytes out, directory;
  for (const ZipMember& m : members) {
    const Bytes body = deflated ? raw_deflate(m.data) : m.data;
    const auto crc =
        static_cast<std::uint32_t>(crc32(0, m.data.data(), static_cast<uInt>(m.data.size())));
    const auto offset = static_cast<std::uint32_t>(out.size());
    auto common = [&](Bytes& b) {
      put16(b, 20), put16(b, 0), put16(b, deflated ? 8 : 0), put16(b, 0), put16(b, 0x21);
      put32(b, crc), put32(b, static_cast<std::uint32_t>(body.size())),
          put32(b, static_cast<std::uint32_t>(m.data.size()));
      put16(b, static_cast<std::uint32_t>(m.name.size())), put16(b, 0);
    };
    put32(out, 0x04034b50);
    common(out);
    out.insert(out.end(), m.name.begin(), m.name.end());
    out.insert(out.end(), body.begin(), body.end());
    put32(directory, 0x02014b50), put16(directory, 20);
    common(directory);
    put16(directory, 0), put16(directory, 0), put16(directory, 0), put32(directory, 0),
        put32(directory, offset);
    directory.insert(directory.end(), m.name.begin(), m.name.end());
  }
  const auto directory_offset = static_cast<std::uint32_t>(out.size());
  out.insert(out.end(), directory.begin(), directory.end());
  put32(out, 0x06054b50), put16(out, 0), put16(out, 0);
  put16(out, static_cast<std::uint32_t>(members.size())),
      put16(out, static_cast<std::uint32_t>(members.size()));
  put32(out, static_cast<std::uint32_t>(directory.size())), put32(out, directory_offset),
      put16(out, 0);
  return out;
}

void write(const fs::path& path, const Bytes& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}
void write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// N examples of 2x3x1 float32, value = example + position / 10; labels example % 3.
constexpr int kN = 12;
std::vector<float> features(int n = kN) {
  std::vector<float> v;
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < 6; ++p) v.push_back(static_cast<float>(i) + static_cast<float>(p) / 10);
  return v;
}
std::vector<std::int64_t> labels(int n = kN) {
  std::vector<std::int64_t> v;
  for (int i = 0; i < n; ++i) v.push_back(i % 3);
  return v;
}

const char* kNumpyDescription = R"(num_classes = 3
example_shape = [2, 3, 1]
[train]
features = "x.npy"
labels = "y.npy"
[test]
features = "x.npy"
labels = "y.npy"
)";

class UserDataTest : public ::testing::Test {
 public:  // the error cases' lambdas write through these
  UserDataTest() : dir_("user-data") { fs::create_directories(dir_.path()); }
  fs::path at(const std::string& name) const { return dir_.path() / name; }
  std::string data() const { return dir_.path().string(); }
  void describe(const std::string& text) { write(at(kDataDescriptionFile), text); }
  // The standard float32 .npy pair, then the description.
  void write_npy_pair(const std::string& description = kNumpyDescription) {
    write(at("x.npy"), npy("<f4", "(12, 2, 3, 1)", bytes_of(features())));
    write(at("y.npy"), npy("<i8", "(12,)", bytes_of(labels())));
    describe(description);
  }
  // The DataError loading the train split throws (fails the test when none is thrown).
  std::string load_error() {
    try {
      load_named_dataset(data(), DataSplit::kTrain);
    } catch (const DataError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no DataError";
    return "";
  }
  edgetrain::testing::TempDir dir_;
};

std::vector<float> floats_of(const Dataset& d) {
  std::vector<float> v(d.pixels.size() / 4);
  std::memcpy(v.data(), d.pixels.data(), d.pixels.size());
  return v;
}

// --- each format --------------------------------------------------------------------------

TEST_F(UserDataTest, Float32NpyLoadsItsValuesShapeAndClasses) {
  write_npy_pair();
  EXPECT_TRUE(is_described_dataset(data()));
  const Dataset d = load_named_dataset(data(), DataSplit::kTrain);
  EXPECT_EQ(d.height, 2u);
  EXPECT_EQ(d.width, 3u);
  EXPECT_EQ(d.channels, 1u);
  EXPECT_EQ(d.num_classes, 3u);
  EXPECT_EQ(d.format.type, ExampleType::kFloat32);
  EXPECT_EQ(d.format.scaling, Scaling::kPerExampleStandardize);
  EXPECT_EQ(d.image_bytes(), 24u);
  EXPECT_EQ(floats_of(d), features());
  EXPECT_EQ(std::vector<std::int64_t>(d.labels.begin(), d.labels.end()), labels());
}

TEST_F(UserDataTest, Uint8NpyWithoutChannelAxisAndUint8LabelsAndScale) {
  Bytes pixels(kN * 6);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * 3);
  write(at("x.npy"), npy("|u1", "(12, 2, 3)", pixels));
  Bytes y;
  for (auto l : labels()) y.push_back(static_cast<std::uint8_t>(l));
  write(at("y.npy"), npy("|u1", "(12,)", y));
  std::string description = kNumpyDescription;
  description.insert(description.find("[train]"),
                     "scaling = \"scale\"\nscale = 0.5\noffset = -1\n");
  describe(description);
  const Dataset d = load_named_dataset(data(), DataSplit::kTest);
  EXPECT_EQ(d.format.type, ExampleType::kUint8);
  EXPECT_EQ(d.format.scaling, Scaling::kAffine);
  EXPECT_FLOAT_EQ(d.format.scale, 0.5f);
  EXPECT_FLOAT_EQ(d.format.offset, -1.0f);
  EXPECT_EQ(d.pixels, pixels);
  EXPECT_EQ(d.labels[4], 1);
}

TEST_F(UserDataTest, NpzStoredAndDeflatedLoadTheNamedArrays) {
  for (bool deflated : {false, true}) {
    SCOPED_TRACE(deflated ? "deflated" : "stored");
    const std::vector<std::int64_t> y = labels();
    write(at("d.npz"), zip({{"y.npy", npy("<i4", "(12,)",
                                          bytes_of(std::vector<std::int32_t>(y.begin(), y.end())))},
                            {"x.npy", npy("<f4", "(12, 2, 3, 1)", bytes_of(features()))}},
                           deflated));
    describe(R"(num_classes = 3
example_shape = [2, 3, 1]
[train]
features = "d.npz"
features_array = "x"
labels = "d.npz"
labels_array = "y"
)");
    const Dataset d = load_named_dataset(data(), DataSplit::kTrain);
    EXPECT_EQ(floats_of(d), features());
    EXPECT_EQ(d.labels[5], 2);
  }
}

TEST_F(UserDataTest, CsvWithHeaderAndNamedLabelColumn) {
  write(at("t.csv"),
        "f0,f1,\"label\",f2,f3,f4,f5\r\n"
        "0.5,1,2,-3,4e-1,5,6\r\n"
        "\n"
        "1,1,0,1,1,1, 1.25\r\n");
  describe(R"(num_classes = 3
example_shape = [2, 3, 1]
scaling = "none"
[train]
features = "t.csv"
label_column = "label"
)");
  const Dataset d = load_named_dataset(data(), DataSplit::kTrain);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d.labels, (std::vector<std::int32_t>{2, 0}));
  EXPECT_EQ(d.format.type, ExampleType::kFloat32);
  EXPECT_EQ(d.format.scaling, Scaling::kNone);
  EXPECT_EQ(floats_of(d), (std::vector<float>{0.5f, 1, -3, 0.4f, 5, 6, 1, 1, 1, 1, 1, 1.25f}));
}

// A header line where none was declared: the message says how to declare it.
TEST_F(UserDataTest, AnUndeclaredCsvHeaderIsNamed) {
  write(at("t.csv"), "label,a,b\n0,1,2\n");
  describe(
      "num_classes = 3\nexample_shape = [1, 2, 1]\n[train]\nfeatures = \"t.csv\"\n"
      "label_column = 0\n");
  const std::string message = load_error();
  EXPECT_NE(message.find("t.csv: line 1: label 'label' (column 0) is not an integer; if this line "
                         "names the columns, set header = true"),
            std::string::npos)
      << message;
  describe(
      "num_classes = 3\nexample_shape = [1, 2, 1]\n[train]\nfeatures = \"t.csv\"\n"
      "label_column = 0\nheader = true\n");
  EXPECT_EQ(load_named_dataset(data(), DataSplit::kTrain).labels, (std::vector<std::int32_t>{0}));
}

TEST_F(UserDataTest, CsvWithoutHeaderLabelByIndexAndASequenceShape) {
  write(at("t.csv"), "1,2,3,4,5,6,1\n6,5,4,3,2,1,0\n");
  describe(R"(num_classes = 2
sequence = [3, 2]
[train]
features = "t.csv"
label_column = 6
)");
  const Dataset d = load_named_dataset(data(), DataSplit::kTrain);
  EXPECT_EQ(d.height, 1u);  // a sequence is an H = 1 example: length 3, 2 channels
  EXPECT_EQ(d.width, 3u);
  EXPECT_EQ(d.channels, 2u);
  EXPECT_EQ(d.labels, (std::vector<std::int32_t>{1, 0}));
  EXPECT_EQ(floats_of(d)[6], 6.0f);
}

TEST_F(UserDataTest, IdxNamesStillLoadTheirFiles) {
  EXPECT_FALSE(is_described_dataset(data()));  // no description: an IDX directory
  EXPECT_FALSE(is_described_dataset("mnist"));
  EXPECT_THROW(load_named_dataset(data(), DataSplit::kTrain), DataError);  // no IDX files there
}

TEST_F(UserDataTest, ABuiltInNameShadowingADescribedDirectoryIsRefused) {
  fs::create_directories(at("mnist-small"));
  write(at("mnist-small") / kDataDescriptionFile, std::string("num_classes = 2\n"));
  const fs::path here = fs::current_path();
  fs::current_path(dir_.path());
  std::string reason;
  try {
    is_described_dataset("mnist-small");
  } catch (const DataError& e) {
    reason = e.reason();
  }
  const bool dotted = is_described_dataset("./mnist-small");
  fs::current_path(here);
  EXPECT_NE(reason.find("give ./mnist-small"), std::string::npos) << reason;
  EXPECT_TRUE(dotted);
}

// --- every problem names its file ---------------------------------------------------------

struct Case {
  const char* what;
  std::function<void(UserDataTest&)> make;
  std::vector<std::string> expected;  // substrings of the message
};

TEST_F(UserDataTest, EachProblemIsADataErrorNamingTheFileAndTheProblem) {
  const std::string desc = kNumpyDescription;
  const Bytes x = npy("<f4", "(12, 2, 3, 1)", bytes_of(features()));
  const Bytes y = npy("<i8", "(12,)", bytes_of(labels()));
  auto with = [&](Bytes fx, Bytes fy, std::string d) {
    return [=](UserDataTest& t) {
      write(t.at("x.npy"), fx);
      write(t.at("y.npy"), fy);
      t.describe(d);
    };
  };
  std::vector<double> f64(kN * 6, 1.0);
  std::vector<std::int64_t> bad_label = labels();
  bad_label[7] = 3;
  std::vector<std::int64_t> negative = labels();
  negative[2] = -1;
  std::vector<float> nan = features();
  nan[6 * 4 + 2] = std::nanf("");
  Bytes truncated = x;
  truncated.resize(truncated.size() - 5);
  Bytes trailing = x;
  trailing.push_back(0);
  Bytes big_endian = npy(">f4", "(12, 2, 3, 1)", bytes_of(features()));
  std::string replaced = desc;
  replaced.replace(replaced.find("[2, 3, 1]"), 9, "[3, 2, 1]");
  std::vector<Case> cases = {
      {"float64 features",
       with(npy("<f8", "(12, 2, 3, 1)", bytes_of(f64)), y, desc),
       {"x.npy", "dtype '<f8'", "float32 or uint8"}},
      {"float labels",
       with(x, npy("<f4", "(12,)", bytes_of(features(2))), desc),
       {"y.npy", "labels of dtype '<f4'", "integers"}},
      {"labels of two dimensions",
       with(x, npy("<i8", "(6, 2)", bytes_of(labels())), desc),
       {"y.npy", "shape (6, 2)"}},
      {"fewer labels than examples",
       with(x, npy("<i8", "(11,)", bytes_of(labels(11))), desc),
       {"y.npy", "11 labels for 12 examples"}},
      {"example shape not the description's",
       with(x, y, replaced),
       {"x.npy", "(12, 2, 3, 1)", "3x2x1", "edgetrain-data.toml"}},
      {"label out of range",
       with(x, npy("<i8", "(12,)", bytes_of(bad_label)), desc),
       {"y.npy", "label 3 of example 7", "[0, 3)"}},
      {"negative label",
       with(x, npy("<i8", "(12,)", bytes_of(negative)), desc),
       {"y.npy", "label -1 of example 2"}},
      {"Fortran order",
       with(npy("<f4", "(12, 2, 3, 1)", bytes_of(features()), true), y, desc),
       {"x.npy", "Fortran"}},
      {"truncated file", with(truncated, y, desc), {"x.npy", "truncated"}},
      {"trailing bytes", with(trailing, y, desc), {"x.npy", "1 bytes after"}},
      {"big-endian", with(big_endian, y, desc), {"x.npy", "big-endian"}},
      {"not a .npy",
       with(Bytes{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'}, y, desc),
       {"x.npy", "not a .npy"}},
      {"a NaN",
       with(npy("<f4", "(12, 2, 3, 1)", bytes_of(nan)), y, desc),
       {"x.npy", "value 2 of example 4 is not finite"}},
      {"missing file", with(x, y, desc + "\n"), {}},  // replaced below: y.npy removed
      {"unknown key",
       with(x, y, desc + "shuffle = true\n"),
       {"edgetrain-data.toml:9", "unknown key 'shuffle'"}},
      {"no num_classes",
       with(x, y, desc.substr(desc.find('\n') + 1)),
       {"edgetrain-data.toml", "'num_classes' is missing"}},
      {"bad scaling",
       with(x, y, "scaling = \"minmax\"\n" + desc),
       {"edgetrain-data.toml:1", "scaling is 'minmax'"}},
      {"not TOML", with(x, y, "num_classes = = 3\n"), {"edgetrain-data.toml:1", "not valid TOML"}},
  };
  cases[13] = {"missing file",
               [&](UserDataTest& t) {
                 with(x, y, desc)(t);
                 fs::remove(t.at("y.npy"));
               },
               {"y.npy", "cannot read"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    c.make(*this);
    const std::string message = load_error();
    for (const std::string& part : c.expected)
      EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

TEST_F(UserDataTest, NpzProblemsNameTheArchiveAndTheArray) {
  const Bytes x = npy("<f4", "(12, 2, 3, 1)", bytes_of(features()));
  const Bytes y = npy("<i8", "(12,)", bytes_of(labels()));
  describe(R"(num_classes = 3
example_shape = [2, 3, 1]
[train]
features = "d.npz"
features_array = "x"
labels = "d.npz"
labels_array = "y"
)");
  write(at("d.npz"), zip({{"x.npy", x}, {"labels.npy", y}}, false));
  std::string message = load_error();
  EXPECT_NE(message.find("d.npz: has no array y (arrays: x, labels)"), std::string::npos)
      << message;

  Bytes damaged = zip({{"x.npy", x}, {"y.npy", y}}, true);
  damaged[60] ^= 0x10;  // inside x's deflated bytes
  write(at("d.npz"), damaged);
  message = load_error();
  EXPECT_NE(message.find("d.npz:x"), std::string::npos) << message;

  Bytes cut = zip({{"x.npy", x}, {"y.npy", y}}, true);
  cut.resize(cut.size() - 30);  // the end of the central directory is gone
  write(at("d.npz"), cut);
  message = load_error();
  EXPECT_NE(message.find("d.npz"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST_F(UserDataTest, BadCsvRowsNameTheirLine) {
  describe(R"(num_classes = 3
example_shape = [1, 2, 1]
[train]
features = "t.csv"
label_column = "y"
)");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"y,a,b\n0,1,2\n1,2\n", "t.csv: line 3: 2 fields; the header has 3"},
      {"y,a,b\n0,1,2\n1,2,x\n", "t.csv: line 3: column 2 ('x') is not a number"},
      {"y,a,b\n0,1,2\n\n4,1,2\n", "t.csv: line 4: label 4 is not in [0, 3)"},
      {"y,a,b\n0.5,1,2\n", "t.csv: line 2: label '0.5' (column 0) is not an integer"},
      {"y,a,b\n0,1,nan\n", "t.csv: line 2: column 2 ('nan') is not finite"},
      {"label,a,b\n0,1,2\n", "t.csv: line 1: no column named 'y' in the header (label, a, b)"},
      {"y,a,b,c\n0,1,2,3\n",
       "t.csv: line 1: 4 columns: the label and 3 features, but examples "
       "of 1x2x1 have 2 values"},
      {"y,a,b\n", "t.csv: holds no examples"},
      // A byte order mark (spreadsheets write one) is not part of the first column's name.
      {"\xEF\xBB\xBFy,a,b\n0,1,2\n1,2,3\n7,1,1\n", "t.csv: line 4: label 7 is not in [0, 3)"},
  };
  for (const auto& [text, expected] : cases) {
    SCOPED_TRACE(text);
    write(at("t.csv"), text);
    const std::string message = load_error();
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

// --- a worker's shard ---------------------------------------------------------------------

// For each format: the partial load of a worker's shard holds only that shard's rows (in the
// file for a .npy and a stored member, in memory otherwise), every label, and draws the same
// batches as the full load; i.i.d. and label-skewed shards with the description's classes.
TEST_F(UserDataTest, PartialLoadsHoldTheShardAndDrawWhatTheFullLoadDraws) {
  constexpr int n = 90;
  std::vector<std::int64_t> y(n);
  for (int i = 0; i < n; ++i) y[i] = (i * 7) % 5;
  const Bytes x = npy("<f4", "(90, 2, 3, 1)", bytes_of(features(n)));
  const Bytes yb = npy("<i8", "(90,)", bytes_of(y));
  write(at("x.npy"), x);
  write(at("y.npy"), yb);
  write(at("s.npz"), zip({{"x.npy", x}, {"y.npy", yb}}, false));
  write(at("d.npz"), zip({{"x.npy", x}, {"y.npy", yb}}, true));
  std::string csv = "label,a,b,c,d,e,f\n";
  const std::vector<float> values = features(n);
  for (int i = 0; i < n; ++i) {
    csv += std::to_string(y[i]);
    for (int p = 0; p < 6; ++p) {
      char text[32];
      std::snprintf(text, sizeof text, ",%.9g", values[i * 6 + p]);
      csv += text;
    }
    csv += "\n";
  }
  write(at("t.csv"), csv);
  const std::string head = "num_classes = 5\nexample_shape = [2, 3, 1]\n[train]\n";
  const std::vector<std::pair<std::string, std::string>> formats = {
      {"npy", "features = \"x.npy\"\nlabels = \"y.npy\"\n"},
      {"stored npz",
       "features = \"s.npz\"\nfeatures_array = \"x\"\nlabels = \"s.npz\"\nlabels_array = \"y\"\n"},
      {"deflated npz",
       "features = \"d.npz\"\nfeatures_array = \"x\"\nlabels = \"d.npz\"\nlabels_array = \"y\"\n"},
      {"csv", "features = \"t.csv\"\nlabel_column = \"label\"\n"},
  };
  for (const auto& [format, split] : formats) {
    describe(head + split);
    const Dataset full = load_named_dataset(data(), DataSplit::kTrain);
    ASSERT_EQ(full.num_classes, 5u);
    for (bool skewed : {false, true}) {
      std::vector<int> owners(n, 0);
      for (std::uint32_t w = 0; w < 3; ++w) {
        SCOPED_TRACE(format + (skewed ? " label-skewed" : " iid") + " worker " + std::to_string(w));
        const ShardSpec spec{w, 3, 11};
        const Dataset part = load_named_dataset_part(
            data(), DataSplit::kTrain, [&](const Dataset& d) { return shard_of(d, spec, skewed); });
        const std::vector<std::uint32_t> shard = shard_of(full, spec, skewed);
        EXPECT_EQ(part.labels, full.labels);
        ASSERT_TRUE(part.held.has_value());
        EXPECT_EQ(part.held->size(), shard.size());
        const bool in_file = format == "npy" || format == "stored npz";
        EXPECT_EQ(part.image_file != nullptr, in_file);
        EXPECT_EQ(part.pixels.size(), in_file ? 0u : shard.size() * part.image_bytes());
        std::vector<std::uint8_t> a(full.image_bytes()), b(full.image_bytes());
        for (std::uint32_t i : shard) {
          owners[i]++;
          full.copy_image(i, a.data());
          part.copy_image(i, b.data());
          ASSERT_EQ(a, b) << "example " << i;
        }
        if (skewed) {
          // Most of a worker's shard is of its preferred classes (p = 0.9 by default).
          int preferred = 0;
          const auto classes = preferred_classes(w, 5, LabelSkew{});
          for (std::uint32_t i : shard)
            preferred += std::count(classes.begin(), classes.end(),
                                    static_cast<std::uint32_t>(full.labels[i]));
          EXPECT_GT(preferred, static_cast<int>(shard.size()) * 3 / 4);
        }
      }
      // The shards partition the data set.
      EXPECT_EQ(std::count(owners.begin(), owners.end(), 1), n) << format;
    }
  }
}

// --- the trainer on float examples --------------------------------------------------------

// The Trainer reads float32 examples by the data's format and scales them: x*scale+offset on
// floats gives exactly what the same values pre-scaled give with no scaling.
TEST(UserDataTrainer, ScaleScalingEqualsPrescaledValues) {
  Model model(parse_model_spec("input 2x3x1; fc 4 relu; fc 3", "tiny"));
  model.initialize(5);
  const std::vector<float> x = features(4);
  std::vector<float> prescaled(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) prescaled[i] = x[i] * 0.25f - 1.0f;
  const std::vector<std::int32_t> y = {0, 1, 2, 0};
  Trainer trainer(model, 4, KernelBackend::kReference);
  trainer.set_input_format({ExampleType::kFloat32, Scaling::kAffine, 0.25f, -1.0f});
  const BatchResult scaled = trainer.evaluate(model.parameters(), bytes_of(x).data(), y.data(), 4);
  trainer.set_input_format({ExampleType::kFloat32, Scaling::kNone});
  const BatchResult plain =
      trainer.evaluate(model.parameters(), bytes_of(prescaled).data(), y.data(), 4);
  EXPECT_EQ(scaled.loss, plain.loss);
  // And not by accident: unscaled, the same bytes give another loss.
  const BatchResult raw = trainer.evaluate(model.parameters(), bytes_of(x).data(), y.data(), 4);
  EXPECT_NE(raw.loss, plain.loss);
}

// Filter dropout trains a sub-network with a Trainer of its own: it reads the batch by the
// same input format, whether the format was set before or after set_dropout(). With nothing
// dropped (rate 0) its gradient is the full model's.
TEST(UserDataTrainer, FilterDropoutTakesTheInputFormat) {
  Model model(parse_model_spec("input 4x4x1; conv 2 3x3 same relu; fc 3", "conv"));
  model.initialize(9);
  std::vector<float> x(3 * 16);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * 40.0f;
  const std::vector<std::int32_t> y = {2, 0, 1};
  const InputFormat floats{ExampleType::kFloat32, Scaling::kAffine, 0.05f, 0.5f};
  std::vector<float> expected(model.parameter_count()), got(model.parameter_count());
  Trainer plain(model, 3, KernelBackend::kReference);
  plain.set_input_format(floats);
  plain.compute_gradient(model.parameters(), bytes_of(x).data(), y.data(), 3, expected);
  for (bool format_first : {true, false}) {
    SCOPED_TRACE(format_first ? "format, then dropout" : "dropout, then format");
    Trainer trainer(model, 3, KernelBackend::kReference);
    DropoutConfig config;
    config.conv_drop_rates = {0.0f};
    if (format_first) trainer.set_input_format(floats);
    trainer.set_dropout(config);
    if (!format_first) trainer.set_input_format(floats);
    trainer.compute_gradient(model.parameters(), bytes_of(x).data(), y.data(), 3, got);
    EXPECT_EQ(got, expected);
  }
}

// A float32 data set written as .npy, loaded, sampled and trained by the Trainer (XNNPACK, as a
// worker trains) for a few dozen SGD steps: the loss falls and the accuracy rises well above
// chance. Three Gaussian blobs in 4x4x1, which uint8 could not hold (negative values).
TEST_F(UserDataTest, TrainerLearnsAFloatDataSet) {
  constexpr int n = 600, values = 16, classes = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> means(classes * values);
  for (float& m : means) m = noise(rng) * 0.8f;
  std::vector<float> x(n * values);
  std::vector<std::int64_t> y(n);
  for (int i = 0; i < n; ++i) {
    y[i] = i % classes;
    for (int v = 0; v < values; ++v) x[i * values + v] = means[y[i] * values + v] + noise(rng);
  }
  write(at("x.npy"), npy("<f4", "(600, 4, 4, 1)", bytes_of(x)));
  write(at("y.npy"), npy("<i8", "(600,)", bytes_of(y)));
  describe(
      "num_classes = 3\nexample_shape = [4, 4, 1]\nscaling = \"none\"\n"
      "[train]\nfeatures = \"x.npy\"\nlabels = \"y.npy\"\n");
  const Dataset train = load_named_dataset(data(), DataSplit::kTrain);
  ASSERT_EQ(train.format.type, ExampleType::kFloat32);

  Model model(parse_model_spec("input 4x4x1; fc 16 relu; fc 3", "blobs"));
  model.initialize(3);
  constexpr int batch = 10;
  Trainer trainer(model, batch);
  trainer.set_input_format(train.format);
  Trainer evaluator(model, n);
  evaluator.set_input_format(train.format);
  const BatchResult before =
      evaluator.evaluate(model.parameters(), train.pixels.data(), train.labels.data(), n);
  std::vector<std::uint32_t> all(n);
  for (int i = 0; i < n; ++i) all[i] = static_cast<std::uint32_t>(i);
  ShardSampler sampler(train, all, 1);
  std::vector<std::uint8_t> pixels(batch * train.image_bytes());
  std::vector<std::int32_t> labels(batch);
  std::vector<float> grad(model.parameter_count());
  for (int step = 0; step < 40; ++step) {
    sampler.next_batch(batch, pixels, labels);
    trainer.compute_gradient(model.parameters(), pixels.data(), labels.data(), batch, grad);
    std::span<float> params = model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i] -= 0.05f * grad[i];
  }
  const BatchResult after =
      evaluator.evaluate(model.parameters(), train.pixels.data(), train.labels.data(), n);
  EXPECT_LT(after.loss, 0.6f * before.loss) << before.loss << " -> " << after.loss;
  EXPECT_GT(after.correct, n * 3 / 4) << "of " << n;
}

}  // namespace
