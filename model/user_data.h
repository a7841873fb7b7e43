// The user's own data: a directory with a data description, edgetrain-data.toml, naming the
// train and test files (NumPy .npy / .npz, or CSV), the example shape, the class count and
// the scaling (format and example: model/README.md, "Your own data").
//
//   num_classes = 3
//   example_shape = [8, 8, 1]          # height, width, channels; or sequence = [length, channels]
//   scaling = "per-example-standardize" # or "scale" (x * scale + offset) or "none"
//   [train]
//   features = "blobs.npz"
//   features_array = "x_train"
//   labels = "blobs.npz"
//   labels_array = "y_train"
//   [test]
//   features = "test.csv"              # a CSV file holds its labels: label_column names them
//   label_column = "label"
//
// Everything in the description and the files is checked when the data loads, and a problem
// is a DataError (model/idx.h) naming the file and what is wrong with it: the description's
// line for a bad key or value; for an array its dtype, its shape against the description's and
// against the labels', a label out of range, Fortran order, a truncated file; for a CSV file
// the line of a bad row. Programs load any data set, IDX or described, through
// load_named_dataset (model/dataset.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <variant>

#include "model/dataset.h"

namespace edgetrain::runtime {

inline constexpr const char* kDataDescriptionFile = "edgetrain-data.toml";

// One split's files. NumPy: `features` and `labels` (the same .npz twice is fine), each with
// its array name when it is an .npz. CSV: `features` only, holding a label column.
struct DataSplitFiles {
  std::filesystem::path features, labels;
  std::string features_array, labels_array;
  bool csv = false;
  std::variant<std::string, std::uint32_t> label_column;  // a header name, or a 0-based index
  // The CSV's first line names its columns.
  bool header = false;
};

struct DataDescription {
  std::filesystem::path file;  // the description itself, for errors
  std::uint32_t height = 1, width = 1, channels = 1;
  std::uint32_t num_classes = 0;
  InputFormat format;  // scaling; the type comes from each split's features
  std::optional<DataSplitFiles> train, test;
};

// Whether `directory` holds a data description.
bool has_data_description(const std::filesystem::path& directory);

// Reads and checks `directory`/edgetrain-data.toml (not the files it names); paths in it are
// relative to `directory`. Throws DataError naming the description and its line.
DataDescription read_data_description(const std::filesystem::path& directory);

// Loads one split of a described data set: all of it (`pick` null) or, as
// load_dataset_part, every label and the features of the examples `pick` chooses only. With
// `in_place`, the features of a .npy file or a stored .npz member stay in the file
// (Dataset::image_file, one pread per use); a deflated member is inflated once keeping those
// rows, a CSV file read twice (labels and checks, then those rows). Every value held in memory
// is checked to be finite.
Dataset load_described_dataset(const DataDescription& description, DataSplit split,
                               const ExamplePicker* pick = nullptr, bool in_place = true);

}  // namespace edgetrain::runtime
