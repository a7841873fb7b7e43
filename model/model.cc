#include "model/model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <utility>

#include "common/splitmix64.h"

namespace edgetrain::runtime {
namespace {

// Caps that keep a hostile or mistyped spec from allocating absurd amounts of memory.
constexpr long long kMaxDimension = 4096;
constexpr long long kMaxParameters = 64LL * 1024 * 1024;

constexpr std::string_view kPaperCnnSpec =
    "input 28x28x1; conv 32 3x3 same relu; maxpool 2; conv 64 3x3 same relu; maxpool 2; fc 128 "
    "relu; fc 10";
constexpr std::string_view kMlpSpec = "input 28x28x1; fc 128 relu; fc 10";
// A MobileNet-style depthwise-separable network for 28x28 grey images (issue 35): a strided
// stem, three depthwise 3x3 + pointwise 1x1 blocks (the second strided), global average
// pooling and the classifier; 30,794 parameters, 7 % of the paper CNN's. He init: with
// Glorot's, seven ReLU layers without normalization shrink the activations' second moment
// about 5000-fold and the loss stayed at ln 10 for 150 steps on MNIST at any learning rate.
constexpr std::string_view kMobilenetMiniSpec =
    "input 28x28x1; init he; conv 32 3x3 stride 2 same relu; "
    "dwconv 3x3 same relu; conv 64 1x1 relu; "
    "dwconv 3x3 stride 2 same relu; conv 128 1x1 relu; "
    "dwconv 3x3 same relu; conv 128 1x1 relu; "
    "globalavgpool; fc 10";

// ResNet-8 as MLPerf Tiny's image-classification reference has it (Banbury et al., 2021):
// a 16-channel stem, three stages of one residual block (16, 32, 64 channels; the last two
// halve the image and project their skip with a strided 1x1 conv), global average pooling
// and the classifier. Ours: no batch normalization (the reference has it after every conv;
// its place is marked below for a 'groupnorm'/'batchnorm' statement) and He init, which
// keeps the unnormalized blocks' activations from vanishing.
#define EDGETRAIN_RESNET8_BODY                                                                     \
  "init he; conv 16 3x3 same relu; name s0; " /* stage 1: identity skip (a norm layer would follow \
                                                 each conv) */                                     \
  "conv 16 3x3 same relu; conv 16 3x3 same; add s0 relu; name s1; " /* stage 2: strided, 1x1       \
                                                                       projection on the skip */   \
  "conv 32 3x3 stride 2 same relu; conv 32 3x3 same; name b2; "                                    \
  "from s1; conv 32 1x1 stride 2 valid; add b2 relu; name s2; " /* stage 3 */                      \
  "conv 64 3x3 stride 2 same relu; conv 64 3x3 same; name b3; "                                    \
  "from s2; conv 64 1x1 stride 2 valid; add b3 relu; "                                             \
  "globalavgpool; fc 10"
constexpr std::string_view kResnet8Spec = "input 28x28x1; " EDGETRAIN_RESNET8_BODY;
constexpr std::string_view kResnet8RgbSpec = "input 32x32x3; " EDGETRAIN_RESNET8_BODY;
#undef EDGETRAIN_RESNET8_BODY
// DS-CNN (Zhang et al., "Hello Edge", 2017, the small model) for keyword spotting on 49
// frames of 10 MFCCs: a strided stem, four depthwise-separable blocks of 64 channels,
// global average pooling, 12 classes (Speech Commands' 10 words, silence, unknown). Ours: a
// 3x3 stem instead of the paper's 10x4 (square kernels only) and no batch normalization.
constexpr std::string_view kDsCnnSpec =
    "input 49x10x1; init he; conv 64 3x3 stride 2 same relu; "
    "dwconv 3x3 same relu; conv 64 1x1 relu; dwconv 3x3 same relu; conv 64 1x1 relu; "
    "dwconv 3x3 same relu; conv 64 1x1 relu; dwconv 3x3 same relu; conv 64 1x1 relu; "
    "globalavgpool; fc 12";
// A 1-D CNN for windows of 128 samples of 9 sensor channels (UCI HAR's body acceleration,
// gyroscope and total acceleration, 6 activities). Ours (no one reference network): four
// valid conv1d layers of kernel 5, the second and fourth strided 2 in place of pooling,
// global average pooling.
constexpr std::string_view kCnn1dSpec =
    "input 128x9 sequence; init he; conv1d 32 5 relu; conv1d 32 5 stride 2 relu; "
    "conv1d 64 5 relu; conv1d 64 5 stride 2 relu; globalavgpool; fc 6";

std::vector<std::string> split(std::string_view text, auto is_separator) {
  std::vector<std::string> parts;
  std::string current;
  for (char c : text) {
    if (is_separator(c)) {
      if (!current.empty()) parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

int parse_positive(const std::string& token, const std::string& statement) {
  std::size_t used = 0;
  long long value = -1;
  try {
    value = std::stoll(token, &used);
  } catch (...) {
    used = 0;
  }
  if (used != token.size() || value < 1 || value > kMaxDimension) {
    throw ModelError("model spec: '" + token + "' in '" + statement +
                     "' is not a size between 1 and " + std::to_string(kMaxDimension));
  }
  return static_cast<int>(value);
}

// "28x28x1" or "3x3"
std::vector<int> parse_dims(const std::string& token, std::size_t count,
                            const std::string& statement) {
  auto parts = split(token, [](char c) { return c == 'x' || c == 'X'; });
  if (parts.size() != count) {
    throw ModelError("model spec: expected " + std::to_string(count) + " sizes joined by 'x' in '" +
                     statement + "', got '" + token + "'");
  }
  std::vector<int> dims;
  for (auto& p : parts) dims.push_back(parse_positive(p, statement));
  return dims;
}

// The kernel of a 2-D conv-like statement: "KxK", square only.
int parse_square_kernel(const std::string& token, const std::string& statement) {
  const auto k = parse_dims(token, 2, statement);
  if (k[0] != k[1])
    throw ModelError("model spec: only square kernels are supported: '" + statement + "'");
  return k[0];
}

// The words of a 2-D conv-like statement after its sizes, from words[first]: relu, stride S
// and, where `padding`, same|valid. `usage` ends the message for a word it does not know.
void parse_conv_words(const std::vector<std::string>& words, std::size_t first, bool padding,
                      const std::string& usage, LayerSpec& layer, const std::string& statement) {
  for (std::size_t i = first; i < words.size(); i++) {
    if (words[i] == "relu")
      layer.relu = true;
    else if (padding && words[i] == "same")
      layer.same_padding = true;
    else if (padding && words[i] == "valid")
      layer.same_padding = false;
    else if (words[i] == "stride" && i + 1 < words.size())
      layer.stride = parse_positive(words[++i], statement);
    else
      throw ModelError("model spec: unexpected '" + words[i] + "' in '" + statement + "'" + usage);
  }
  if (padding && layer.same_padding && layer.kernel % 2 == 0)
    throw ModelError("model spec: 'same' padding needs an odd kernel size: '" + statement + "'");
}

bool is_tensor_name(const std::string& word) {
  return std::all_of(word.begin(), word.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
}

// FNV-1a, for the layout fingerprint.
std::uint64_t fnv1a(std::uint64_t hash, std::string_view bytes) {
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

// The layout id: the tensor names and shapes, from `hash` on.
std::uint64_t tensor_fingerprint(std::uint64_t hash, const std::vector<TensorInfo>& tensors) {
  for (const auto& t : tensors) {
    hash = fnv1a(hash, t.name);
    for (int d : t.shape) hash = fnv1a(hash, std::to_string(d) + ",");
    hash = fnv1a(hash, ";");
  }
  return hash;
}

}  // namespace

ModelSpec parse_model_spec(std::string_view text, std::string name) {
  ModelSpec spec;
  spec.name = std::move(name);
  std::string without_comments;
  bool in_comment = false;
  for (char c : text) {
    if (c == '#') in_comment = true;
    if (c == '\n') in_comment = false;
    if (!in_comment) without_comments += c;
  }
  bool have_input = false, have_init = false;
  std::set<std::string> names;  // tensors named so far
  std::string pending_from;     // a 'from A' waiting for the layer that reads A
  for (std::string statement :
       split(without_comments, [](char c) { return c == ';' || c == '\n'; })) {
    // Trimmed, so errors quote the statement as written.
    statement.erase(0, statement.find_first_not_of(" \t\r"));
    statement.erase(statement.find_last_not_of(" \t\r") + 1);
    auto words =
        split(statement, [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == ','; });
    if (words.empty()) continue;
    const std::string& verb = words[0];
    if (verb == "input") {
      if (have_input) throw ModelError("model spec: more than one 'input' statement");
      if (!spec.layers.empty()) throw ModelError("model spec: 'input' must come first");
      if (words.size() == 3 && words[2] == "sequence") {
        auto d = parse_dims(words[1], 2, statement);
        spec.input = {1, d[0], d[1]};
        spec.sequence = true;
      } else if (words.size() == 2) {
        auto d = parse_dims(words[1], 3, statement);
        spec.input = {d[0], d[1], d[2]};
      } else {
        throw ModelError("model spec: expected 'input HxWxC' or 'input LxC sequence', got '" +
                         statement + "'");
      }
      have_input = true;
      continue;
    }
    if (!have_input) throw ModelError("model spec: the first statement must be 'input HxWxC'");
    if (verb == "init") {
      if (have_init) throw ModelError("model spec: more than one 'init' statement");
      if (words.size() != 2 || (words[1] != "glorot" && words[1] != "he"))
        throw ModelError("model spec: expected 'init glorot' or 'init he', got '" + statement +
                         "'");
      spec.init = words[1] == "he" ? WeightInit::kHe : WeightInit::kGlorot;
      have_init = true;
      continue;
    }
    if (verb == "name") {
      if (words.size() != 2 || !is_tensor_name(words[1]))
        throw ModelError("model spec: expected 'name A' (A of letters, digits, '_' or '-'), got '" +
                         statement + "'");
      if (!names.insert(words[1]).second)
        throw ModelError("model spec: '" + statement + "': the name '" + words[1] +
                         "' is taken already");
      if (!pending_from.empty())
        throw ModelError("model spec: '" + statement + "' right after 'from " + pending_from +
                         "' would give tensor " + pending_from + " a second name");
      std::string& current = spec.layers.empty() ? spec.input_name : spec.layers.back().name;
      if (!current.empty())
        throw ModelError("model spec: '" + statement + "': this tensor is named '" + current +
                         "' already");
      current = words[1];
      continue;
    }
    if (verb == "from") {
      if (words.size() != 2)
        throw ModelError("model spec: expected 'from A', got '" + statement + "'");
      if (!names.contains(words[1]))
        throw ModelError("model spec: '" + statement + "': no tensor is named '" + words[1] +
                         "' before it");
      if (!pending_from.empty())
        throw ModelError("model spec: '" + statement + "' right after 'from " + pending_from +
                         "' (a 'from' is followed by the layer that reads it)");
      pending_from = words[1];
      continue;
    }
    LayerSpec layer;
    layer.statement = statement;
    layer.from = std::exchange(pending_from, std::string());
    std::size_t i = 1;
    if (verb == "add") {
      layer.kind = LayerKind::kAdd;
      if (words.size() < 2 || words.size() > 3 || (words.size() == 3 && words[2] != "relu"))
        throw ModelError("model spec: expected 'add A [relu]', got '" + statement + "'");
      if (!names.contains(words[1]))
        throw ModelError("model spec: '" + statement + "': no tensor is named '" + words[1] +
                         "' before it");
      layer.added = words[1];
      layer.relu = words.size() == 3;
    } else if (verb == "conv1d") {
      layer.kind = LayerKind::kConv;
      layer.one_d = true;
      layer.same_padding = false;
      if (words.size() < 3)
        throw ModelError("model spec: expected 'conv1d OC K ...', got '" + statement + "'");
      layer.out_channels = parse_positive(words[1], statement);
      layer.kernel = parse_positive(words[2], statement);
      for (i = 3; i < words.size(); i++) {
        if (words[i] == "relu")
          layer.relu = true;
        else if (words[i] == "valid")
          layer.same_padding = false;
        else if (words[i] == "same")
          throw ModelError("model spec: '" + statement +
                           "': 'same' padding for conv1d is not supported yet (the 2-D ops pad "
                           "rows and columns alike); use 'valid'");
        else if (words[i] == "stride" && i + 1 < words.size())
          layer.stride = parse_positive(words[++i], statement);
        else
          throw ModelError("model spec: unexpected '" + words[i] + "' in '" + statement +
                           "' (conv1d OC K [stride S] [valid] [relu])");
      }
    } else if (verb == "conv") {
      layer.kind = LayerKind::kConv;
      if (words.size() < 3)
        throw ModelError("model spec: expected 'conv OC KxK ...', got '" + statement + "'");
      layer.out_channels = parse_positive(words[1], statement);
      layer.kernel = parse_square_kernel(words[2], statement);
      parse_conv_words(words, 3, true, "", layer, statement);
    } else if (verb == "deconv") {
      layer.kind = LayerKind::kDeconv;
      if (words.size() < 3)
        throw ModelError("model spec: expected 'deconv OC KxK ...', got '" + statement + "'");
      layer.out_channels = parse_positive(words[1], statement);
      layer.kernel = parse_square_kernel(words[2], statement);
      if (layer.kernel % 2 == 0)
        throw ModelError("model spec: deconv needs an odd kernel size: '" + statement + "'");
      parse_conv_words(words, 3, false, "", layer, statement);
    } else if (verb == "dwconv") {
      layer.kind = LayerKind::kDepthwiseConv;
      if (words.size() < 2)
        throw ModelError("model spec: expected 'dwconv KxK ...', got '" + statement + "'");
      layer.kernel = parse_square_kernel(words[1], statement);
      parse_conv_words(words, 2, true,
                       " (dwconv KxK [stride S] [same|valid] [relu]; the channel count is the "
                       "input's)",
                       layer, statement);
    } else if (verb == "avgpool") {
      layer.kind = LayerKind::kAvgPool;
      if (words.size() != 2)
        throw ModelError("model spec: expected 'avgpool K', got '" + statement + "'");
      layer.kernel = parse_positive(words[1], statement);
      if (layer.kernel < 2)
        throw ModelError("model spec: an avgpool window must be at least 2: '" + statement + "'");
    } else if (verb == "globalavgpool") {
      layer.kind = LayerKind::kGlobalAvgPool;
      if (words.size() != 1)
        throw ModelError("model spec: 'globalavgpool' takes no arguments: '" + statement + "'");
    } else if (verb == "dropout") {
      layer.kind = LayerKind::kDropout;
      float rate = -1;
      if (words.size() == 2) {
        std::size_t used = 0;
        try {
          rate = std::stof(words[1], &used);
        } catch (...) {
          used = 0;
        }
        if (used != words[1].size()) rate = -1;
      }
      if (!(rate > 0.0f && rate < 1.0f))  // also refuses NaN
        throw ModelError("model spec: expected 'dropout P' with P in (0, 1), got '" + statement +
                         "'");
      layer.rate = rate;
    } else if (verb == "groupnorm" || verb == "batchnorm") {
      const bool group = verb == "groupnorm";
      layer.kind = group ? LayerKind::kGroupNorm : LayerKind::kBatchNorm;
      i = 1;
      if (group) {
        if (words.size() < 2)
          throw ModelError("model spec: expected 'groupnorm G [relu]', got '" + statement + "'");
        layer.groups = parse_positive(words[1], statement);
        i = 2;
      }
      for (; i < words.size(); i++) {
        if (words[i] == "relu")
          layer.relu = true;
        else
          throw ModelError("model spec: unexpected '" + words[i] + "' in '" + statement + "' (" +
                           (group ? "groupnorm G [relu]" : "batchnorm [relu]") + ")");
      }
    } else if (verb == "maxpool") {
      layer.kind = LayerKind::kMaxPool;
      if (words.size() != 2 || words[1] != "2")
        throw ModelError("model spec: only 'maxpool 2' is supported, got '" + statement + "'");
    } else if (verb == "fc") {
      layer.kind = LayerKind::kFullyConnected;
      if (words.size() < 2)
        throw ModelError("model spec: expected 'fc N [relu]', got '" + statement + "'");
      if (words[1].find_first_of("xX") != std::string::npos) {
        auto d = parse_dims(words[1], 3, statement);
        layer.out_height = d[0];
        layer.out_width = d[1];
        layer.out_channels = d[2];
      } else {
        layer.out_channels = parse_positive(words[1], statement);
      }
      for (i = 2; i < words.size(); i++) {
        if (words[i] == "relu")
          layer.relu = true;
        else
          throw ModelError("model spec: unexpected '" + words[i] + "' in '" + statement + "'");
      }
    } else if (verb == "relu") {
      layer.kind = LayerKind::kRelu;
      if (words.size() != 1)
        throw ModelError("model spec: 'relu' takes no arguments: '" + statement + "'");
    } else {
      throw ModelError(
          "model spec: unknown layer '" + verb +
          "' (known: input, init, conv, conv1d, dwconv, deconv, maxpool, avgpool, globalavgpool, "
          "fc, relu, dropout, groupnorm, batchnorm, name, from, add)");
    }
    spec.layers.push_back(layer);
  }
  if (!have_input) throw ModelError("model spec: missing 'input HxWxC'");
  if (spec.layers.empty()) throw ModelError("model spec: no layers");
  if (!pending_from.empty())
    throw ModelError("model spec: 'from " + pending_from + "' is not followed by a layer");
  return spec;
}

namespace {
struct BuiltinModel {
  std::string_view name, spec;
};
constexpr BuiltinModel kBuiltinModels[] = {{"paper-cnn", kPaperCnnSpec},
                                           {"mlp", kMlpSpec},
                                           {"mobilenet-mini", kMobilenetMiniSpec},
                                           {"resnet-8", kResnet8Spec},
                                           {"resnet-8-32x32x3", kResnet8RgbSpec},
                                           {"ds-cnn", kDsCnnSpec},
                                           {"cnn1d", kCnn1dSpec}};
}  // namespace

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (const BuiltinModel& m : kBuiltinModels) names.emplace_back(m.name);
  return names;
}

ModelSpec builtin_model_spec(std::string_view name) {
  for (const BuiltinModel& m : kBuiltinModels)
    if (m.name == name) return parse_model_spec(m.spec, std::string(name));
  std::string known;
  for (const BuiltinModel& m : kBuiltinModels)
    known += std::string(known.empty() ? "" : ", ") + std::string(m.name);
  throw ModelError("unknown model '" + std::string(name) + "' (built in: " + known +
                   "; or give a spec such as '" + std::string(kMlpSpec) + "')");
}

ModelSpec model_spec_from_argument(std::string_view name_or_spec) {
  for (const auto& name : builtin_model_names()) {
    if (name_or_spec == name) return builtin_model_spec(name);
  }
  // A spec file (tools/onnx_to_edgetrain.py writes one): an argument of one line without ';'
  // that names a regular file. Its text is also its name, so a checkpoint's edgetrain.model
  // holds the whole spec and can be read back without the file.
  if (name_or_spec.find_first_of(";\n") == std::string_view::npos &&
      std::filesystem::is_regular_file(std::filesystem::path(name_or_spec))) {
    std::ifstream in{std::filesystem::path(name_or_spec)};
    std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!in && !in.eof()) throw ModelError("model: cannot read the spec file " + std::string(name_or_spec));
    try {
      return parse_model_spec(text, text);
    } catch (const ModelError& e) {
      throw ModelError("model: the spec file " + std::string(name_or_spec) + ": " + e.what());
    }
  }
  if (name_or_spec.find("input") == std::string_view::npos) return builtin_model_spec(name_or_spec);
  // Spec text is named by itself too (not "custom"), so a checkpoint of it can be read back
  // without --model (server/README.md, checkpoint_to_torch.py).
  return parse_model_spec(name_or_spec, std::string(name_or_spec));
}

Model::Model(ModelSpec spec, Arena arena) : spec_(std::move(spec)) {
  ExampleShape shape = spec_.input;
  if (shape.size() == 0) throw ModelError("model: empty input shape");
  std::size_t total = 0;
  int conv_count = 0, fc_count = 0, deconv_count = 0, dwconv_count = 0, gn_count = 0, bn_count = 0;
  auto add_tensor = [&](std::string name, std::vector<int> dims) {
    std::size_t size = 1;
    for (int d : dims) size *= static_cast<std::size_t>(d);
    if (total + size > static_cast<std::size_t>(kMaxParameters)) {
      throw ModelError("model: more than " + std::to_string(kMaxParameters) + " parameters");
    }
    tensors_.push_back({std::move(name), std::move(dims), total, size});
    total += size;
    return static_cast<int>(tensors_.size() - 1);
  };
  // The graph: which layer's output each name stands for (-1: the input), the layer whose
  // output is the current tensor, and each layer's statement (for errors found later).
  std::map<std::string, int, std::less<>> named;
  if (!spec_.input_name.empty()) named[spec_.input_name] = -1;
  int current = -1;
  std::vector<const std::string*> statement_of;
  auto shape_of = [&](int layer) { return layer < 0 ? spec_.input : layers_[layer].out; };
  auto describe = [](const ExampleShape& s) {
    return std::to_string(s.H) + "x" + std::to_string(s.W) + "x" + std::to_string(s.C);
  };
  for (const LayerSpec& spec : spec_.layers) {
    auto lookup = [&](const std::string& name) {
      auto it = named.find(name);
      if (it == named.end())
        throw ModelError("model: '" + spec.statement + "': no tensor is named '" + name + "'");
      return it->second;
    };
    const int input = spec.from.empty() ? current : lookup(spec.from);
    shape = shape_of(input);
    // Activations are held per example for a whole batch: bound them like parameters.
    if (shape.size() > static_cast<std::size_t>(kMaxParameters)) {
      throw ModelError("model: a layer input of " + std::to_string(shape.H) + "x" +
                       std::to_string(shape.W) + "x" + std::to_string(shape.C) +
                       " values is too large");
    }
    ResolvedLayer layer{spec.kind, shape, shape};
    layer.input = input;
    switch (spec.kind) {
      case LayerKind::kConv: {
        if (spec.one_d && shape.H != 1)
          throw ModelError("model: '" + spec.statement + "' reads a " + describe(shape) +
                           " tensor; conv1d needs a sequence (input LxC sequence: height 1)");
        layer.kernel = spec.kernel;
        layer.kernel_h = spec.one_d ? 1 : spec.kernel;
        layer.stride = spec.stride;
        layer.pad = spec.same_padding ? (spec.kernel - 1) / 2 : 0;
        const int oh = (shape.H + 2 * layer.pad - layer.kernel_h) / spec.stride + 1;
        const int ow = (shape.W + 2 * layer.pad - spec.kernel) / spec.stride + 1;
        if (shape.H + 2 * layer.pad < layer.kernel_h || shape.W + 2 * layer.pad < spec.kernel ||
            oh < 1 || ow < 1) {
          throw ModelError("model: conv kernel " + std::to_string(spec.kernel) +
                           " does not fit a " + std::to_string(shape.H) + "x" +
                           std::to_string(shape.W) + " input");
        }
        layer.out = {oh, ow, spec.out_channels};
        if (layer.out.size() > static_cast<std::size_t>(kMaxParameters))
          throw ModelError("model: conv output too large");
        const std::string name = "conv" + std::to_string(++conv_count);
        layer.weight_tensor =
            add_tensor(name + ".weight", {spec.out_channels, layer.kernel_h, spec.kernel, shape.C});
        layer.bias_tensor = add_tensor(name + ".bias", {spec.out_channels});
        break;
      }
      case LayerKind::kAdd: {
        layer.added = lookup(spec.added);
        if (shape_of(layer.added) != shape)
          throw ModelError("model: '" + spec.statement + "' adds tensor " + spec.added + " (" +
                           describe(shape_of(layer.added)) + ") to a " + describe(shape) +
                           " tensor; the shapes must be equal (a 1x1 conv on a 'from " +
                           spec.added + "' branch can project one to the other)");
        break;
      }
      case LayerKind::kDeconv: {
        // 'same' for a transposed convolution: the output is the input scaled by the stride.
        layer.kernel = spec.kernel;
        layer.stride = spec.stride;
        layer.pad = (spec.kernel - 1) / 2;
        layer.adj = spec.stride - 1;
        if (static_cast<long long>(shape.H) * spec.stride > kMaxDimension ||
            static_cast<long long>(shape.W) * spec.stride > kMaxDimension)
          throw ModelError("model: deconv output too large");
        layer.out = {shape.H * spec.stride, shape.W * spec.stride, spec.out_channels};
        if (layer.out.size() > static_cast<std::size_t>(kMaxParameters))
          throw ModelError("model: deconv output too large");
        const std::string name = "deconv" + std::to_string(++deconv_count);
        layer.weight_tensor =
            add_tensor(name + ".weight", {spec.out_channels, spec.kernel, spec.kernel, shape.C});
        layer.bias_tensor = add_tensor(name + ".bias", {spec.out_channels});
        break;
      }
      case LayerKind::kDepthwiseConv: {
        layer.kernel = layer.kernel_h = spec.kernel;
        layer.stride = spec.stride;
        layer.pad = spec.same_padding ? (spec.kernel - 1) / 2 : 0;
        if (shape.H + 2 * layer.pad < spec.kernel || shape.W + 2 * layer.pad < spec.kernel) {
          throw ModelError("model: dwconv kernel " + std::to_string(spec.kernel) +
                           " does not fit a " + std::to_string(shape.H) + "x" +
                           std::to_string(shape.W) + " input");
        }
        layer.out = {(shape.H + 2 * layer.pad - spec.kernel) / spec.stride + 1,
                     (shape.W + 2 * layer.pad - spec.kernel) / spec.stride + 1, shape.C};
        const std::string name = "dwconv" + std::to_string(++dwconv_count);
        layer.weight_tensor = add_tensor(name + ".weight", {shape.C, spec.kernel, spec.kernel, 1});
        layer.bias_tensor = add_tensor(name + ".bias", {shape.C});
        break;
      }
      case LayerKind::kAvgPool:
        if (shape.H < spec.kernel || shape.W < spec.kernel)
          throw ModelError("model: avgpool " + std::to_string(spec.kernel) + " on a " +
                           std::to_string(shape.H) + "x" + std::to_string(shape.W) + " input");
        layer.kernel = layer.stride = spec.kernel;
        layer.out = {shape.H / spec.kernel, shape.W / spec.kernel, shape.C};
        break;
      case LayerKind::kGlobalAvgPool:
        // Group norm with a group per channel (instance norm) leaves each channel with mean
        // beta over the image, so its global average is beta for every example: the logits
        // would not depend on the input. A ReLU between them (groupnorm C relu) breaks that.
        if (input >= 0 && layers_[input].kind == LayerKind::kGroupNorm &&
            layers_[input].groups == shape.C && shape.H * shape.W > 1)
          throw ModelError("model: '" + spec.statement + "' right after '" + *statement_of[input] +
                           "' (a group per channel): every channel's average is its beta, so "
                           "every example would get the same outputs; put a relu between them "
                           "or use fewer groups");
        layer.out = {1, 1, shape.C};
        break;
      case LayerKind::kDropout:
        layer.rate = spec.rate;
        break;
      case LayerKind::kGroupNorm:
      case LayerKind::kBatchNorm: {
        const bool group = spec.kind == LayerKind::kGroupNorm;
        if (group && (spec.groups > shape.C || shape.C % spec.groups != 0))
          throw ModelError("model: 'groupnorm " + std::to_string(spec.groups) +
                           "' after a layer of " + std::to_string(shape.C) +
                           " channels: the channel count must be a multiple of the group count");
        layer.groups = group ? spec.groups : shape.C;
        // A group of one value normalizes to 0: the layer would output its beta whatever the
        // input (batch norm's statistics run over the batch, so it has no such case).
        if (group && static_cast<long long>(shape.H) * shape.W * (shape.C / spec.groups) == 1)
          throw ModelError("model: '" + spec.statement + "' on a " + describe(shape) +
                           " tensor: each group holds one value, which normalizes to 0, so the "
                           "output would not depend on the input; use fewer groups");
        const std::string name =
            group ? "gn" + std::to_string(++gn_count) : "bn" + std::to_string(++bn_count);
        layer.weight_tensor = add_tensor(name + ".weight", {shape.C});
        layer.bias_tensor = add_tensor(name + ".bias", {shape.C});
        break;
      }
      case LayerKind::kMaxPool:
        if (shape.H < 2 || shape.W < 2)
          throw ModelError("model: maxpool 2 on a " + std::to_string(shape.H) + "x" +
                           std::to_string(shape.W) + " input");
        layer.kernel = 2;
        layer.stride = 2;
        layer.out = {shape.H / 2, shape.W / 2, shape.C};
        break;
      case LayerKind::kFullyConnected: {
        layer.out = {spec.out_height, spec.out_width, spec.out_channels};
        if (layer.out.size() > static_cast<std::size_t>(kMaxParameters))
          throw ModelError("model: fc output too large");
        const int outputs = static_cast<int>(layer.out.size());
        const std::string name = "fc" + std::to_string(++fc_count);
        layer.weight_tensor =
            add_tensor(name + ".weight", {outputs, static_cast<int>(shape.size())});
        layer.bias_tensor = add_tensor(name + ".bias", {outputs});
        break;
      }
      case LayerKind::kRelu:
        break;
    }
    layers_.push_back(layer);
    statement_of.push_back(&spec.statement);
    shape = layer.out;
    if (spec.relu && spec.kind != LayerKind::kRelu) {
      ResolvedLayer relu{LayerKind::kRelu, shape, shape};
      relu.input = static_cast<int>(layers_.size()) - 1;
      layers_.push_back(relu);
      statement_of.push_back(&spec.statement);
    }
    current = static_cast<int>(layers_.size()) - 1;
    if (!spec.name.empty()) named[spec.name] = current;
  }
  // A layer whose output nothing reads is a mistake in the spec (a branch left dangling by a
  // 'from'), not something to train: its gradient would be zero.
  std::vector<int> readers(layers_.size(), 0);
  for (std::size_t i = 0; i < layers_.size(); i++) {
    const ResolvedLayer& layer = layers_[i];
    if (layer.input >= 0) readers[layer.input]++;
    if (layer.kind == LayerKind::kAdd && layer.added >= 0) readers[layer.added]++;
    if (layer.input != static_cast<int>(i) - 1 || layer.kind == LayerKind::kAdd) is_graph_ = true;
  }
  for (std::size_t i = 0; i + 1 < layers_.size(); i++) {
    if (readers[i] == 0)
      throw ModelError("model: the output of '" + *statement_of[i] +
                       "' is read by no later layer (a 'from' left it behind)");
  }
  if (const LayerKind last = layers_.back().kind; last != LayerKind::kFullyConnected &&
                                                  last != LayerKind::kConv &&
                                                  last != LayerKind::kDeconv) {
    throw ModelError(
        "model: the last layer must be fc, conv or deconv (its outputs are the class logits)");
  }
  if (num_classes() < 2)
    throw ModelError("model: the last layer must have at least 2 outputs (classes)");
  parameter_count_ = total;
  if (arena == Arena::kZeros) parameters_.assign(total, 0.0f);
  layout_id_ = tensor_fingerprint(0xcbf29ce484222325ULL, tensors_);
  if (is_graph_) {
    // The same tensors wired another way are another model. Chains keep the fingerprint of
    // their tensors alone, as before graphs existed (checkpoints and WALs name it).
    std::string wiring = "graph:";
    for (const ResolvedLayer& layer : layers_)
      wiring += std::to_string(layer.input) + "+" + std::to_string(layer.added) + ";";
    layout_id_ = fnv1a(layout_id_, wiring);
  }
}

Model::Model(std::string name, std::vector<TensorInfo> tensors, std::string_view layout_salt)
    : tensors_(std::move(tensors)) {
  spec_.name = std::move(name);
  std::size_t total = 0;
  for (const TensorInfo& t : tensors_) {
    if (t.offset != total || t.size == 0)
      throw ModelError("model " + spec_.name + ": tensor " + t.name + " is not next in the arena");
    total += t.size;
  }
  if (total > static_cast<std::size_t>(kMaxParameters))
    throw ModelError("model: more than " + std::to_string(kMaxParameters) + " parameters");
  parameter_count_ = total;
  parameters_.assign(total, 0.0f);
  layout_id_ = tensor_fingerprint(fnv1a(0xcbf29ce484222325ULL, layout_salt), tensors_);
}

std::vector<std::uint32_t> Model::tensor_sizes() const {
  std::vector<std::uint32_t> sizes;
  sizes.reserve(tensors_.size());
  for (const auto& t : tensors_) sizes.push_back(static_cast<std::uint32_t>(t.size));
  return sizes;
}

int Model::tensor_index(std::string_view name) const {
  for (std::size_t i = 0; i < tensors_.size(); i++) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

void Model::require_arena() const {
  if (parameters_.size() != parameter_count_)
    throw ModelError("model " + spec_.name + " was made without a parameter arena (layout only)");
}

void Model::initialize(std::uint64_t seed) {
  require_arena();
  SplitMix64 rng{seed};
  for (const ResolvedLayer& layer : layers_) {
    if (layer.weight_tensor < 0) continue;
    const TensorInfo& w = tensors_[layer.weight_tensor];
    if (layer.kind == LayerKind::kGroupNorm || layer.kind == LayerKind::kBatchNorm) {
      // The identity map to start, as PyTorch's GroupNorm and BatchNorm2d; draws nothing, so
      // a model's other weights are the same with or without normalization layers.
      std::fill_n(parameters_.begin() + static_cast<std::ptrdiff_t>(w.offset), w.size, 1.0f);
      const TensorInfo& b = tensors_[layer.bias_tensor];
      std::fill_n(parameters_.begin() + static_cast<std::ptrdiff_t>(b.offset), b.size, 0.0f);
      continue;
    }
    // Glorot (Xavier) uniform, TensorFlow's default and so what the paper's reference code
    // trained with. He init made the paper CNN's first logits large (initial loss ~3.7
    // instead of ln 10) and early asynchronous steps at lr 0.1 could diverge.
    const std::size_t fan_in = w.size / static_cast<std::size_t>(w.shape[0]);
    // A deconv weight [OC][KH][KW][C] counts as a conv's: fan_in + fan_out = KH·KW·(C + OC) either
    // way.
    const bool spatial = layer.kind == LayerKind::kConv || layer.kind == LayerKind::kDeconv;
    const std::size_t receptive = spatial ? static_cast<std::size_t>(w.shape[1]) * w.shape[2] : 1;
    // A depthwise filter feeds one output channel only: its fan-out is its own KH·KW taps
    // (counting all C channels, as PyTorch's fan-out does, would shrink the bound with C).
    const std::size_t fan_out = layer.kind == LayerKind::kDepthwiseConv
                                    ? static_cast<std::size_t>(w.shape[1]) * w.shape[2]
                                    : static_cast<std::size_t>(w.shape[0]) * receptive;
    const float bound = spec_.init == WeightInit::kHe
                            ? std::sqrt(6.0f / static_cast<float>(fan_in))
                            : std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
    for (std::size_t i = 0; i < w.size; i++)
      parameters_[w.offset + i] = (2.0f * rng.uniform_float() - 1.0f) * bound;
    const TensorInfo& b = tensors_[layer.bias_tensor];
    std::fill_n(parameters_.begin() + static_cast<std::ptrdiff_t>(b.offset), b.size, 0.0f);
  }
}

std::vector<std::uint8_t> Model::safetensors_bytes(
    const std::map<std::string, std::string>& metadata) const {
  static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");
  require_arena();
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const auto& t : tensors_) {
    header[t.name] = {
        {"dtype", "F32"},
        {"shape", t.shape},
        {"data_offsets", {t.offset * sizeof(float), (t.offset + t.size) * sizeof(float)}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8,
              ' ');  // the format allows trailing spaces; keeps data 8-byte aligned
  const std::uint64_t length = json.size();
  std::vector<std::uint8_t> bytes(8 + json.size() + parameters_.size() * sizeof(float));
  std::memcpy(bytes.data(), &length, 8);
  std::memcpy(bytes.data() + 8, json.data(), json.size());
  std::memcpy(bytes.data() + 8 + json.size(), parameters_.data(),
              parameters_.size() * sizeof(float));
  return bytes;
}

void Model::save_safetensors(const std::string& path,
                             const std::map<std::string, std::string>& metadata) const {
  const std::vector<std::uint8_t> bytes = safetensors_bytes(metadata);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw ModelError("cannot write " + tmp);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) throw ModelError("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw ModelError("cannot rename " + tmp + " to " + path);
}

std::map<std::string, std::string> Model::load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path + ": cannot open");
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                        std::istreambuf_iterator<char>());
  if (in.bad()) throw ModelError(path + ": cannot read");
  return load_safetensors_bytes(bytes, path);
}

std::map<std::string, std::string> Model::load_safetensors_bytes(
    std::span<const std::uint8_t> bytes, const std::string& name) {
  require_arena();
  const std::uint64_t file_size = bytes.size();
  std::uint64_t length = 0;
  if (file_size < 8) throw ModelError(name + ": too short for safetensors");
  std::memcpy(&length, bytes.data(), 8);
  if (length > 100'000'000 || length > file_size - 8)
    throw ModelError(name + ": bad safetensors header length");
  const std::string json(reinterpret_cast<const char*>(bytes.data()) + 8, length);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    throw ModelError(name + ": header is not JSON: " + e.what());
  }
  if (!header.is_object()) throw ModelError(name + ": header is not a JSON object");
  const std::uint64_t data_size = file_size - 8 - length;
  const std::uint8_t* data = bytes.data() + 8 + length;
  std::map<std::string, std::string> metadata;
  std::vector<float> loaded(parameters_.size());
  std::size_t matched = 0;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_object()) {
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (m->is_string()) metadata[m.key()] = m->get<std::string>();
        }
      }
      continue;
    }
    const int index = tensor_index(it.key());
    if (index < 0)
      throw ModelError(name + ": tensor '" + it.key() + "' is not in model " + spec_.name);
    const TensorInfo& t = tensors_[index];
    try {
      if ((*it)["dtype"] != "F32") throw ModelError(name + ": tensor '" + t.name + "' is not F32");
      if ((*it)["shape"].get<std::vector<int>>() != t.shape)
        throw ModelError(name + ": tensor '" + t.name + "' has another shape");
      auto offsets = (*it)["data_offsets"].get<std::vector<std::uint64_t>>();
      if (offsets.size() != 2 || offsets[1] < offsets[0] ||
          offsets[1] - offsets[0] != t.size * sizeof(float)) {
        throw ModelError(name + ": tensor '" + t.name + "' has bad data offsets");
      }
      if (offsets[1] > data_size) throw ModelError(name + ": truncated data for '" + t.name + "'");
      std::memcpy(loaded.data() + t.offset, data + offsets[0], t.size * sizeof(float));
    } catch (const nlohmann::json::exception& e) {
      throw ModelError(name + ": tensor '" + t.name + "': " + e.what());
    }
    matched++;
  }
  if (matched != tensors_.size()) {
    throw ModelError(name + ": has " + std::to_string(matched) + " of the model's " +
                     std::to_string(tensors_.size()) + " tensors");
  }
  parameters_ = std::move(loaded);
  return metadata;
}

}  // namespace edgetrain::runtime
