#include "model/user_data.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include "model/numpy_file.h"

namespace edgetrain::runtime {

namespace {

std::string at_line(const std::string& file, const toml::source_region& where) {
  return file + ":" + std::to_string(where.begin.line);
}

// The description's keys, each checked for its type; an unknown key is refused so that a
// misspelt one is not silently ignored.
class DescriptionReader {
 public:
  explicit DescriptionReader(std::filesystem::path file) : file_(std::move(file)) {
    name_ = file_.string();
    try {
      table_ = toml::parse_file(name_);
    } catch (const toml::parse_error& e) {
      const auto& at = e.source().begin;
      throw DataError(name_ + ":" + std::to_string(at.line),
                      "not valid TOML: " + std::string(e.description()));
    }
  }

  DataDescription read() {
    static const std::set<std::string> kTop = {
        "num_classes", "example_shape", "sequence", "scaling", "scale", "offset", "train", "test"};
    check_keys(table_, kTop, "");
    DataDescription d;
    d.file = file_;
    const std::int64_t classes = integer(table_, "num_classes", true);
    if (classes < 1 || classes > 1 << 20)
      fail(table_["num_classes"].node(), "num_classes must be 1 to 2^20");
    d.num_classes = static_cast<std::uint32_t>(classes);

    const toml::node* image = table_.get("example_shape");
    const toml::node* sequence = table_.get("sequence");
    if (!!image == !!sequence)
      throw DataError(name_,
                      "give the example shape once: example_shape = [height, width, "
                      "channels] or sequence = [length, channels]");
    const std::vector<std::uint32_t> dims = dimensions(
        *(image ? image : sequence), image ? "example_shape" : "sequence", image ? 3 : 2);
    if (image) {
      d.height = dims[0], d.width = dims[1], d.channels = dims[2];
    } else {
      d.height = 1, d.width = dims[0], d.channels = dims[1];  // a sequence is an H = 1 example
    }
    std::uint64_t values = std::uint64_t{d.height} * d.width * d.channels;
    if (values > (std::uint64_t{1} << 26))
      fail(image ? image : sequence,
           "examples of " + std::to_string(values) + " values are too large");

    const std::string scaling = text(table_, "scaling", false, "per-example-standardize");
    if (scaling == "per-example-standardize") {
      d.format.scaling = Scaling::kPerExampleStandardize;
    } else if (scaling == "scale") {
      d.format.scaling = Scaling::kAffine;
      d.format.scale = static_cast<float>(number(table_, "scale", 1.0));
      d.format.offset = static_cast<float>(number(table_, "offset", 0.0));
    } else if (scaling == "none") {
      d.format.scaling = Scaling::kNone;
    } else {
      fail(table_["scaling"].node(),
           "scaling is '" + scaling + "'; expected per-example-standardize, scale or none");
    }
    if (d.format.scaling != Scaling::kAffine && (table_.get("scale") || table_.get("offset")))
      fail(table_.get("scale") ? table_.get("scale") : table_.get("offset"),
           "scale and offset go with scaling = \"scale\"");
    if (!table_.get("train") && !table_.get("test"))
      throw DataError(name_, "names no files: give a [train] and a [test] section");
    d.train = split(DataSplit::kTrain);
    d.test = split(DataSplit::kTest);
    return d;
  }

 private:
  [[noreturn]] void fail(const toml::node* node, const std::string& why) const {
    throw DataError(node ? at_line(name_, node->source()) : name_, why);
  }

  void check_keys(const toml::table& table, const std::set<std::string>& allowed,
                  const std::string& section) const {
    for (const auto& [key, node] : table) {
      if (allowed.count(std::string(key.str()))) continue;
      std::string list;
      for (const std::string& k : allowed) list += (list.empty() ? "" : ", ") + k;
      throw DataError(at_line(name_, key.source()),
                      "unknown key '" + std::string(key.str()) + "'" +
                          (section.empty() ? "" : " in [" + section + "]") + " (keys: " + list +
                          ")");
    }
  }

  std::int64_t integer(const toml::table& t, const char* key, bool required) const {
    const toml::node* node = t.get(key);
    if (!node) {
      if (required) throw DataError(name_, std::string("'") + key + "' is missing");
      return -1;
    }
    if (!node->is_integer()) fail(node, std::string("'") + key + "' must be an integer");
    return node->as_integer()->get();
  }

  double number(const toml::table& t, const char* key, double fallback) const {
    const toml::node* node = t.get(key);
    if (!node) return fallback;
    if (node->is_integer()) return static_cast<double>(node->as_integer()->get());
    if (!node->is_floating_point()) fail(node, std::string("'") + key + "' must be a number");
    const double value = node->as_floating_point()->get();
    if (!std::isfinite(value)) fail(node, std::string("'") + key + "' must be finite");
    return value;
  }

  std::string text(const toml::table& t, const char* key, bool required,
                   const std::string& fallback = "") const {
    const toml::node* node = t.get(key);
    if (!node) {
      if (required) throw DataError(name_, std::string("'") + key + "' is missing");
      return fallback;
    }
    if (!node->is_string()) fail(node, std::string("'") + key + "' must be a string");
    return node->as_string()->get();
  }

  std::vector<std::uint32_t> dimensions(const toml::node& node, const char* key,
                                        std::size_t count) const {
    const toml::array* list = node.as_array();
    if (!list || list->size() != count)
      fail(&node,
           std::string(key) + " must be a list of " + std::to_string(count) + " positive integers");
    std::vector<std::uint32_t> dims;
    for (const toml::node& element : *list) {
      if (!element.is_integer() || element.as_integer()->get() < 1 ||
          element.as_integer()->get() > (1 << 24))
        fail(&node, std::string(key) + " must be a list of " + std::to_string(count) +
                        " positive integers");
      dims.push_back(static_cast<std::uint32_t>(element.as_integer()->get()));
    }
    return dims;
  }

  std::optional<DataSplitFiles> split(DataSplit which) const {
    const char* section = which == DataSplit::kTrain ? "train" : "test";
    const toml::node* node = table_.get(section);
    if (!node) return std::nullopt;
    const toml::table* t = node->as_table();
    if (!t) fail(node, std::string("'") + section + "' must be a section: [" + section + "]");
    check_keys(*t,
               {"features", "features_array", "labels", "labels_array", "label_column", "header"},
               section);
    DataSplitFiles f;
    const std::filesystem::path directory = file_.parent_path();
    const std::string features = text(*t, "features", false);
    if (features.empty())
      throw DataError(at_line(name_, t->source()), std::string("[") + section +
                                                       "] needs 'features' (a .npy, .npz or "
                                                       ".csv file)");
    f.features = directory / features;
    f.csv = f.features.extension() == ".csv" || f.features.extension() == ".CSV";
    if (f.csv) {
      for (const char* key : {"labels", "labels_array", "features_array"})
        if (t->get(key))
          fail(t->get(key), std::string("'") + key +
                                "' does not go with a CSV file, which holds "
                                "its labels (label_column)");
      const toml::node* column = t->get("label_column");
      if (!column)
        throw DataError(at_line(name_, t->source()),
                        std::string("[") + section +
                            "] holds a CSV file: give label_column (its name or 0-based index)");
      if (column->is_string()) {
        f.label_column = column->as_string()->get();
      } else if (column->is_integer() && column->as_integer()->get() >= 0 &&
                 column->as_integer()->get() < (1 << 24)) {
        f.label_column = static_cast<std::uint32_t>(column->as_integer()->get());
      } else {
        fail(column, "label_column must be a column name or a 0-based index");
      }
      f.header = std::holds_alternative<std::string>(f.label_column);
      if (const toml::node* header = t->get("header")) {
        if (!header->is_boolean()) fail(header, "'header' must be true or false");
        f.header = header->as_boolean()->get();
        if (!f.header && std::holds_alternative<std::string>(f.label_column))
          fail(header, "a label_column given by name needs header = true");
      }
    } else {
      for (const char* key : {"label_column", "header"})
        if (t->get(key)) fail(t->get(key), std::string("'") + key + "' goes with a CSV file only");
      const std::string labels = text(*t, "labels", false);
      if (labels.empty())
        throw DataError(at_line(name_, t->source()),
                        std::string("[") + section + "] needs 'labels' (a .npy or .npz file)");
      f.labels = directory / labels;
      f.features_array = text(*t, "features_array", false);
      f.labels_array = text(*t, "labels_array", false);
    }
    return f;
  }

  std::filesystem::path file_;
  std::string name_;
  toml::table table_;
};

// --- NumPy -------------------------------------------------------------------------------

std::vector<std::int32_t> read_labels(const std::filesystem::path& path, const std::string& array,
                                      std::uint32_t num_classes) {
  NpyReader reader(path, array);
  const NpyHeader& h = reader.header();
  if (h.kind != 'i' && h.kind != 'u')
    throw DataError(reader.name(), "labels of dtype '" + h.descr +
                                       "'; expected integers (int32, int64 or uint8: "
                                       "y.astype(np.int64))");
  if (h.shape.size() != 1)
    throw DataError(reader.name(), "labels of shape " + shape_text(h.shape) +
                                       "; expected one label per example, shape (N,)");
  if (h.shape[0] > std::numeric_limits<std::uint32_t>::max())
    throw DataError(reader.name(), "more than 2^32 labels");
  const std::vector<std::uint8_t> bytes = reader.read_all();
  std::vector<std::int32_t> labels(static_cast<std::size_t>(h.shape[0]));
  for (std::size_t i = 0; i < labels.size(); ++i) {
    // Little-endian integers of 1 to 8 bytes, signed or not.
    const std::uint8_t* p = bytes.data() + i * h.item_bytes;
    std::uint64_t raw = 0;
    for (std::size_t b = 0; b < h.item_bytes; ++b) raw |= std::uint64_t{p[b]} << (8 * b);
    const bool negative = h.kind == 'i' && (p[h.item_bytes - 1] & 0x80);
    if (negative || raw >= num_classes) {
      // Sign-extended from its width, so that -1 in an int8 array reads -1.
      const std::string shown =
          negative ? std::to_string(static_cast<std::int64_t>(
                         h.item_bytes == 8 ? raw : raw | (~std::uint64_t{0} << (8 * h.item_bytes))))
                   : std::to_string(raw);
      throw DataError(reader.name(), "label " + shown + " of example " + std::to_string(i) +
                                         " is not in [0, " + std::to_string(num_classes) +
                                         ") (num_classes = " + std::to_string(num_classes) + ")");
    }
    labels[i] = static_cast<std::int32_t>(raw);
  }
  return labels;
}

std::string example_shape_text(const DataDescription& d) {
  return std::to_string(d.height) + "x" + std::to_string(d.width) + "x" +
         std::to_string(d.channels);
}

// An array's per-example shape fits the description when it equals height, width, channels,
// with leading and trailing dimensions of 1 dropped on both sides: (N, 8, 8) is 8x8x1, and a
// sequence of 128 x 3 is (N, 128, 3) or (N, 1, 128, 3).
bool shape_fits(std::span<const std::uint64_t> example, const DataDescription& d) {
  auto trim = [](std::vector<std::uint64_t> v) {
    while (!v.empty() && v.back() == 1) v.pop_back();
    while (!v.empty() && v.front() == 1) v.erase(v.begin());
    return v;
  };
  return trim({example.begin(), example.end()}) == trim({d.height, d.width, d.channels});
}

void check_finite(const std::uint8_t* bytes, std::size_t values, const std::string& name,
                  std::span<const std::uint32_t> examples, std::size_t per_example) {
  for (std::size_t i = 0; i < values; ++i) {
    float value;
    std::memcpy(&value, bytes + 4 * i, 4);
    if (!std::isfinite(value)) {
      const std::size_t row = i / per_example;
      throw DataError(name, "value " + std::to_string(i % per_example) + " of example " +
                                std::to_string(examples.empty() ? row : examples[row]) +
                                " is not finite (" + std::to_string(value) + ")");
    }
  }
}

Dataset load_numpy(const DataDescription& d, const DataSplitFiles& f, const ExamplePicker* pick,
                   bool in_place) {
  NpyReader features(f.features, f.features_array);
  const NpyHeader& h = features.header();
  Dataset data;
  data.height = d.height;
  data.width = d.width;
  data.channels = d.channels;
  data.num_classes = d.num_classes;
  data.format = d.format;
  if (h.descr == "<f4" || h.descr == "=f4") {
    data.format.type = ExampleType::kFloat32;
  } else if (h.descr == "|u1") {
    data.format.type = ExampleType::kUint8;
  } else {
    throw DataError(features.name(), "features of dtype '" + h.descr +
                                         "'; expected float32 or uint8 (x.astype(np.float32))");
  }
  const std::span<const std::uint64_t> example(h.shape.data() + 1, h.shape.size() - 1);
  if (!shape_fits(example, d))
    throw DataError(features.name(), "features of shape " + shape_text(h.shape) + ": examples of " +
                                         shape_text(example) + " do not match the description's " +
                                         example_shape_text(d) + " (" + d.file.filename().string() +
                                         ")");
  data.labels = read_labels(f.labels, f.labels_array, d.num_classes);
  const std::string labels_name =
      f.labels.string() + (f.labels_array.empty() ? "" : ":" + f.labels_array);
  if (features.rows() != data.labels.size())
    throw DataError(labels_name, std::to_string(data.labels.size()) + " labels for " +
                                     std::to_string(features.rows()) + " examples in " +
                                     features.name());
  const bool floats = data.format.type == ExampleType::kFloat32;
  if (!pick) {
    data.pixels = features.read_all();
    if (floats)
      check_finite(data.pixels.data(), data.pixels.size() / 4, features.name(), {},
                   data.example_values());
    return data;
  }
  std::vector<std::uint32_t> held = (*pick)(data);
  std::sort(held.begin(), held.end());
  held.erase(std::unique(held.begin(), held.end()), held.end());
  if (!held.empty() && held.back() >= data.size())
    throw std::out_of_range("load_described_dataset: example " + std::to_string(held.back()) +
                            " beyond " + std::to_string(data.size()) + " examples");
  if (in_place) data.image_file = features.rows_in_place();
  if (!data.image_file) {
    data.pixels = features.read_rows(held);
    if (floats)
      check_finite(data.pixels.data(), data.pixels.size() / 4, features.name(), held,
                   data.example_values());
  }
  data.held = std::move(held);
  return data;
}

// --- CSV ---------------------------------------------------------------------------------

// Splits one CSV line into fields: commas, and fields in double quotes ("" is a quote), as
// spreadsheets and pandas write them; no line breaks inside a field. False: a stray quote.
bool split_csv_line(std::string_view line, std::vector<std::string>& fields) {
  fields.clear();
  std::string field;
  bool quoted = false, was_quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      if (!field.empty() || was_quoted) return false;
      quoted = was_quoted = true;
    } else if (c == ',') {
      fields.push_back(std::move(field));
      field.clear();
      was_quoted = false;
    } else {
      if (was_quoted && c != ' ') return false;
      field += c;
    }
  }
  if (quoted) return false;
  fields.push_back(std::move(field));
  return true;
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// One pass over a CSV file: every label (checked), every row's fields checked, and the
// features of the rows `keep` says (all when null) appended to `features`.
struct CsvPass {
  std::vector<std::int32_t> labels;
  std::vector<std::uint8_t> features;  // float32 bytes
};

CsvPass read_csv(const DataDescription& d, const DataSplitFiles& f,
                 const std::vector<std::uint32_t>* keep) {
  const std::string name = f.features.string();
  std::ifstream in(f.features, std::ios::binary);
  if (!in) throw DataError(name, "cannot read: " + std::string(std::strerror(errno)));
  const std::size_t values = std::size_t{d.height} * d.width * d.channels;
  CsvPass pass;
  std::string line;
  std::vector<std::string> fields;
  std::size_t line_number = 0, columns = 0, label_index = 0, next_kept = 0;
  bool first = true;
  if (const auto* index = std::get_if<std::uint32_t>(&f.label_column)) label_index = *index;
  auto bad = [&](const std::string& why) {
    return DataError(name, "line " + std::to_string(line_number) + ": " + why);
  };
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // Spreadsheets often save CSV as UTF-8 with a byte order mark, which would otherwise
    // stick to the first column's name.
    if (line_number == 1 && line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);
    if (trimmed(line).empty()) continue;
    if (!split_csv_line(line, fields)) throw bad("a stray double quote");
    if (first) {
      first = false;
      columns = fields.size();
      if (const auto* wanted = std::get_if<std::string>(&f.label_column)) {
        const auto it = std::find_if(fields.begin(), fields.end(),
                                     [&](const std::string& c) { return trimmed(c) == *wanted; });
        if (it == fields.end()) {
          std::string list;
          for (const std::string& c : fields)
            list += (list.empty() ? "" : ", ") + std::string(trimmed(c));
          throw bad("no column named '" + *wanted + "' in the header (" + list + ")");
        }
        label_index = static_cast<std::size_t>(it - fields.begin());
      } else if (label_index >= columns) {
        throw bad("label_column " + std::to_string(label_index) + " but rows have " +
                  std::to_string(columns) + " columns");
      }
      if (columns - 1 != values)
        throw bad(std::to_string(columns) + " columns: the label and " +
                  std::to_string(columns - 1) + " features, but examples of " +
                  example_shape_text(d) + " have " + std::to_string(values) + " values");
      if (f.header) continue;
    }
    if (fields.size() != columns)
      throw bad(std::to_string(fields.size()) + " fields; the " +
                (f.header ? std::string("header has ") : std::string("first row has ")) +
                std::to_string(columns));
    const std::size_t example = pass.labels.size();
    if (example >= std::numeric_limits<std::uint32_t>::max()) throw bad("more than 2^32 rows");
    const std::string_view label_text = trimmed(fields[label_index]);
    std::int64_t label = -1;
    const auto [end, error] =
        std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
    if (error != std::errc() || end != label_text.data() + label_text.size())
      throw bad(
          "label '" + std::string(label_text) + "' (column " + std::to_string(label_index) +
          ") is not an integer" +
          (example == 0 && !f.header ? "; if this line names the columns, set header = true" : ""));
    if (label < 0 || label >= d.num_classes)
      throw bad("label " + std::to_string(label) + " is not in [0, " +
                std::to_string(d.num_classes) +
                ") (num_classes = " + std::to_string(d.num_classes) + ")");
    pass.labels.push_back(static_cast<std::int32_t>(label));
    const bool kept = !keep || (next_kept < keep->size() && (*keep)[next_kept] == example);
    if (kept && keep) ++next_kept;
    for (std::size_t c = 0; c < columns; ++c) {
      if (c == label_index) continue;
      const std::string_view text = trimmed(fields[c]);
      float value = 0;
      const auto [at, failed] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (failed != std::errc() || at != text.data() + text.size() || text.empty())
        throw bad("column " + std::to_string(c) + " ('" + std::string(text) + "') is not a number");
      if (!std::isfinite(value))
        throw bad("column " + std::to_string(c) + " ('" + std::string(text) + "') is not finite");
      if (kept) {
        std::uint8_t bytes[4];
        std::memcpy(bytes, &value, 4);
        pass.features.insert(pass.features.end(), bytes, bytes + 4);
      }
    }
  }
  if (in.bad()) throw DataError(name, "cannot read: " + std::string(std::strerror(errno)));
  if (pass.labels.empty()) throw DataError(name, "holds no examples");
  return pass;
}

Dataset load_csv(const DataDescription& d, const DataSplitFiles& f, const ExamplePicker* pick) {
  Dataset data;
  data.height = d.height;
  data.width = d.width;
  data.channels = d.channels;
  data.num_classes = d.num_classes;
  data.format = d.format;
  data.format.type = ExampleType::kFloat32;
  static const std::vector<std::uint32_t> kNone;
  // A partial load reads the file twice (labels first, then its rows' features) rather than
  // holding every row's features at once: a worker's memory is its shard's.
  CsvPass pass = read_csv(d, f, pick ? &kNone : nullptr);
  data.labels = std::move(pass.labels);
  if (!pick) {
    data.pixels = std::move(pass.features);
    return data;
  }
  std::vector<std::uint32_t> held = (*pick)(data);
  std::sort(held.begin(), held.end());
  held.erase(std::unique(held.begin(), held.end()), held.end());
  if (!held.empty() && held.back() >= data.size())
    throw std::out_of_range("load_described_dataset: example " + std::to_string(held.back()) +
                            " beyond " + std::to_string(data.size()) + " examples");
  CsvPass second = read_csv(d, f, &held);
  if (second.labels != data.labels)
    throw DataError(f.features.string(), "changed while it was read");
  data.pixels = std::move(second.features);
  data.held = std::move(held);
  return data;
}

}  // namespace

bool has_data_description(const std::filesystem::path& directory) {
  std::error_code ignored;
  return std::filesystem::is_regular_file(directory / kDataDescriptionFile, ignored);
}

DataDescription read_data_description(const std::filesystem::path& directory) {
  return DescriptionReader(directory / kDataDescriptionFile).read();
}

Dataset load_described_dataset(const DataDescription& description, DataSplit split,
                               const ExamplePicker* pick, bool in_place) {
  const auto& files = split == DataSplit::kTrain ? description.train : description.test;
  if (!files)
    throw DataError(
        description.file.string(),
        std::string("has no [") + (split == DataSplit::kTrain ? "train" : "test") + "] section");
  return files->csv ? load_csv(description, *files, pick)
                    : load_numpy(description, *files, pick, in_place);
}

// model/dataset.h: the one entry point programs load --data through.
bool is_described_dataset(const std::string& data) {
  if (data == "mnist" || data == "mnist-small" || data == "fashion-mnist") {
    // A built-in name wins, but not silently over a directory of the user's own data that
    // happens to bear it in the working directory.
    if (has_data_description(data))
      throw DataError((std::filesystem::path(data) / kDataDescriptionFile).string(),
                      "'" + data + "' names a built-in data set, and the directory '" + data +
                          "' here holds a data description: give ./" + data +
                          " to train on the directory's data, or rename it");
    return false;
  }
  return has_data_description(data);
}

Dataset load_named_dataset(const std::string& data, DataSplit split) {
  if (is_described_dataset(data)) return load_described_dataset(read_data_description(data), split);
  const DatasetFiles files = dataset_files(data, split);
  return load_dataset(files.images, files.labels);
}

Dataset load_named_dataset_part(const std::string& data, DataSplit split, const ExamplePicker& pick,
                                bool images_in_place) {
  if (is_described_dataset(data))
    return load_described_dataset(read_data_description(data), split, &pick, images_in_place);
  const DatasetFiles files = dataset_files(data, split);
  return load_dataset_part(files.images, files.labels, pick, images_in_place);
}

}  // namespace edgetrain::runtime
