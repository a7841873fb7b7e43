// Model specs, parameter layout and safetensors files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <fstream>
#include <string>

#include "model/model.h"
#include "model/trainer.h"

namespace {

using namespace edgetrain::runtime;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "-" + std::to_string(::getpid());
}

TEST(ModelSpec, PaperCnnHasThePapersParameterCountAndLayout) {
  Model model(builtin_model_spec("paper-cnn"));
  EXPECT_EQ(model.parameter_count(), 421642u);
  ASSERT_EQ(model.tensors().size(), 8u);
  const std::vector<std::pair<std::string, std::vector<int>>> expected = {
      {"conv1.weight", {32, 3, 3, 1}},  {"conv1.bias", {32}},
      {"conv2.weight", {64, 3, 3, 32}}, {"conv2.bias", {64}},
      {"fc1.weight", {128, 3136}},      {"fc1.bias", {128}},
      {"fc2.weight", {10, 128}},        {"fc2.bias", {10}}};
  std::size_t offset = 0;
  for (std::size_t i = 0; i < expected.size(); i++) {
    EXPECT_EQ(model.tensors()[i].name, expected[i].first);
    EXPECT_EQ(model.tensors()[i].shape, expected[i].second);
    EXPECT_EQ(model.tensors()[i].offset, offset);
    offset += model.tensors()[i].size;
  }
  EXPECT_EQ(model.num_classes(), 10);
  // conv, relu, pool, conv, relu, pool, fc, relu, fc
  ASSERT_EQ(model.layers().size(), 9u);
  EXPECT_EQ(model.layers()[2].out, (ExampleShape{14, 14, 32}));
  EXPECT_EQ(model.layers()[5].out, (ExampleShape{7, 7, 64}));
}

TEST(ModelSpec, MlpAndCustomSpecs) {
  Model mlp(builtin_model_spec("mlp"));
  EXPECT_EQ(mlp.parameter_count(), 784u * 128 + 128 + 128 * 10 + 10);
  Model custom(
      parse_model_spec("# a tiny net\ninput 8x8x3\nconv 4 3x3 valid relu; maxpool 2\nfc 5"));
  EXPECT_EQ(custom.layers()[0].out, (ExampleShape{6, 6, 4}));
  EXPECT_EQ(custom.layers()[2].out, (ExampleShape{3, 3, 4}));
  EXPECT_EQ(custom.num_classes(), 5);
  EXPECT_EQ(custom.parameter_count(), (4u * 27 + 4) + (5u * 36 + 5));
  EXPECT_EQ(model_spec_from_argument("mlp").name, "mlp");
  EXPECT_EQ(model_spec_from_argument("input 4x4x1; fc 2").layers.size(), 1u);
}

// --model FILE (tools/onnx_to_edgetrain.py writes one): the file's text is the spec and its
// name; a bad spec in a file is refused naming the file and the statement.
TEST(ModelSpec, ASpecFileIsReadAndNamedByItsText) {
  const std::string path = temp_path("spec-file") + ".spec";
  const std::string text = "# converted\ninput 6x6x2\nconv 3 3x3 same relu\nname t1\nconv 3 3x3 same\nadd t1\nfc 4\n";
  std::ofstream(path) << text;
  const ModelSpec spec = model_spec_from_argument(path);
  EXPECT_EQ(spec.name, text);
  EXPECT_EQ(Model(spec).layout_id(), Model(parse_model_spec(text)).layout_id());
  EXPECT_EQ(model_spec_from_argument(spec.name).layers.size(), spec.layers.size());
  std::ofstream(path) << "input 6x6x2\nconv 3 3x3 sideways\nfc 4\n";
  try {
    model_spec_from_argument(path);
    ADD_FAILURE() << "a bad spec file was accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sideways"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
  // A missing file is not a spec: the argument is then an unknown built-in name.
  EXPECT_THROW(model_spec_from_argument(path), ModelError);
}

// --model 'spec text' (issue 35): named by its text as a spec file is, not "custom", so a
// checkpoint's edgetrain.model holds the spec and reads back without --model.
TEST(ModelSpec, InlineSpecTextIsNamedByItself) {
  const std::string text = "input 6x6x2; conv 3 3x3 same relu; name t1; conv 3 3x3 same; add t1; fc 4";
  const ModelSpec spec = model_spec_from_argument(text);
  EXPECT_EQ(spec.name, text);
  const ModelSpec again = model_spec_from_argument(spec.name);
  EXPECT_EQ(Model(again).layout_id(), Model(spec).layout_id());
  EXPECT_EQ(again.name, text);
}

// Trainer::logits() gives the last forward pass's logits: their softmax cross-entropy is the
// loss evaluate() returned, on both backends.
TEST(Model, TrainerLogitsAreTheLastForwardPass) {
  Model model(parse_model_spec("input 4x4x1; conv 2 3x3 same relu; fc 3"));
  model.initialize(7);
  std::vector<std::uint8_t> pixels(2 * 16);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * 37 % 251);
  const std::vector<std::int32_t> labels = {2, 0};
  for (KernelBackend backend : {KernelBackend::kReference, KernelBackend::kXnnpack}) {
    Trainer trainer(model, 2, backend);
    const BatchResult result = trainer.evaluate(model.parameters(), pixels.data(), labels.data(), 2);
    const auto logits = trainer.logits(2);
    ASSERT_EQ(logits.size(), 6u);
    double loss = 0;
    for (int i = 0; i < 2; ++i) {
      const float* z = logits.data() + 3 * i;
      const double top = *std::max_element(z, z + 3);
      double sum = 0;
      for (int c = 0; c < 3; ++c) sum += std::exp(z[c] - top);
      loss += top + std::log(sum) - z[labels[i]];
    }
    EXPECT_NEAR(loss / 2, result.loss, 1e-5);
    EXPECT_THROW(trainer.logits(3), std::invalid_argument);
  }
}

// MD-GAN's CNN generator (model/gan_network.h) is written in the spec language: an fc
// layer whose output is an image, then transposed convolutions that double it.
TEST(ModelSpec, ShapedFcAndDeconvDescribeAGenerator) {
  Model g(
      parse_model_spec("input 1x1x110; fc 7x7x128; deconv 64 5x5 stride 2; deconv 1 5x5 stride 2"));
  ASSERT_EQ(g.layers().size(), 3u);
  EXPECT_EQ(g.layers()[0].out, (ExampleShape{7, 7, 128}));
  EXPECT_EQ(g.layers()[1].kind, LayerKind::kDeconv);
  EXPECT_EQ(g.layers()[1].out, (ExampleShape{14, 14, 64}));
  EXPECT_EQ(g.layers()[1].pad, 2);
  EXPECT_EQ(g.layers()[1].adj, 1);
  EXPECT_EQ(g.layers()[2].out, (ExampleShape{28, 28, 1}));
  const std::vector<std::pair<std::string, std::vector<int>>> expected = {
      {"fc1.weight", {6272, 110}},         {"fc1.bias", {6272}},
      {"deconv1.weight", {64, 5, 5, 128}}, {"deconv1.bias", {64}},
      {"deconv2.weight", {1, 5, 5, 64}},   {"deconv2.bias", {1}}};
  ASSERT_EQ(g.tensors().size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); i++) {
    EXPECT_EQ(g.tensors()[i].name, expected[i].first);
    EXPECT_EQ(g.tensors()[i].shape, expected[i].second);
  }
  EXPECT_EQ(g.parameter_count(), 6272u * 111 + (64u * 25 * 128 + 64) + (25u * 64 + 1));
  // Stride 1 keeps the size; 'relu' fuses as after conv.
  Model same(parse_model_spec("input 5x5x2; deconv 3 3x3 relu; fc 4"));
  EXPECT_EQ(same.layers()[0].out, (ExampleShape{5, 5, 3}));
  EXPECT_EQ(same.layers()[1].kind, LayerKind::kRelu);
  same.initialize(1);  // deconv weights are initialised like conv weights
  const float bound = std::sqrt(6.0f / (9.0f * (2 + 3)));
  for (float v : same.tensor(same.tensor_index("deconv1.weight"))) EXPECT_LE(std::fabs(v), bound);
  // The classifier's Trainer does not train deconv layers; it says so instead of misbehaving.
  EXPECT_THROW(Trainer(g, 2, KernelBackend::kReference), ModelError);
  EXPECT_THROW(Trainer(same, 2), ModelError);
}

// Issue 35's layers: strided and pointwise conv, depthwise conv, average pooling and global
// average pooling, with their shapes, tensor names and parameter counts.
TEST(ModelSpec, DepthwisePointwiseStridedAndAveragePooling) {
  Model m(parse_model_spec(
      "input 28x28x1; conv 8 3x3 stride 2 same relu; dwconv 3x3 same relu; conv 16 1x1; "
      "dwconv 5x5 stride 2 valid; avgpool 2; dwconv 3x3; globalavgpool; fc 10"));
  const auto& l = m.layers();
  ASSERT_EQ(l.size(), 10u);  // conv, relu, dwconv, relu, conv, dwconv, avgpool, dwconv, gap, fc
  EXPECT_EQ(l[0].out, (ExampleShape{14, 14, 8}));
  EXPECT_EQ(l[0].stride, 2);
  EXPECT_EQ(l[2].kind, LayerKind::kDepthwiseConv);
  EXPECT_EQ(l[2].out, (ExampleShape{14, 14, 8}));
  EXPECT_EQ(l[2].pad, 1);
  EXPECT_EQ(l[3].kind, LayerKind::kRelu);
  EXPECT_EQ(l[4].out, (ExampleShape{14, 14, 16}));  // pointwise
  EXPECT_EQ(l[4].pad, 0);
  EXPECT_EQ(l[5].out, (ExampleShape{5, 5, 16}));  // (14 - 5) / 2 + 1
  EXPECT_EQ(l[6].kind, LayerKind::kAvgPool);
  EXPECT_EQ(l[6].out, (ExampleShape{2, 2, 16}));
  EXPECT_EQ(l[7].out, (ExampleShape{2, 2, 16}));
  EXPECT_EQ(l[8].kind, LayerKind::kGlobalAvgPool);
  EXPECT_EQ(l[8].out, (ExampleShape{1, 1, 16}));
  const std::vector<std::pair<std::string, std::vector<int>>> expected = {
      {"conv1.weight", {8, 3, 3, 1}},    {"conv1.bias", {8}},
      {"dwconv1.weight", {8, 3, 3, 1}},  {"dwconv1.bias", {8}},
      {"conv2.weight", {16, 1, 1, 8}},   {"conv2.bias", {16}},
      {"dwconv2.weight", {16, 5, 5, 1}}, {"dwconv2.bias", {16}},
      {"dwconv3.weight", {16, 3, 3, 1}}, {"dwconv3.bias", {16}},
      {"fc1.weight", {10, 16}},          {"fc1.bias", {10}}};
  ASSERT_EQ(m.tensors().size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); i++) {
    EXPECT_EQ(m.tensors()[i].name, expected[i].first);
    EXPECT_EQ(m.tensors()[i].shape, expected[i].second);
  }
  // A depthwise filter's Glorot bound counts its own taps both ways: sqrt(6 / (9 + 9)).
  m.initialize(3);
  const float bound = std::sqrt(6.0f / 18.0f);
  float largest = 0;
  for (float v : m.tensor(m.tensor_index("dwconv1.weight")))
    largest = std::max(largest, std::fabs(v));
  EXPECT_LE(largest, bound);
  EXPECT_GT(largest, 0.5f * bound);
  // Another pooling or kernel is another layout.
  EXPECT_NE(m.layout_id(), Model(parse_model_spec("input 28x28x1; conv 8 3x3 stride 2 same relu; "
                                                  "dwconv 3x3 same relu; conv 16 1x1; dwconv "
                                                  "3x3 stride 2 valid; avgpool 2; dwconv 3x3; "
                                                  "globalavgpool; fc 10"))
                               .layout_id());
}

TEST(ModelSpec, MobilenetMiniIsBuiltIn) {
  Model m(builtin_model_spec("mobilenet-mini"));
  EXPECT_EQ(m.spec().name, "mobilenet-mini");
  EXPECT_EQ(m.parameter_count(), 30794u);
  EXPECT_EQ(m.num_classes(), 10);
  EXPECT_EQ(m.layers()[0].out, (ExampleShape{14, 14, 32}));
  EXPECT_EQ(m.layers().back().in, (ExampleShape{1, 1, 128}));
  EXPECT_EQ(model_spec_from_argument("mobilenet-mini").name, "mobilenet-mini");
  const auto names = builtin_model_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "mobilenet-mini"), names.end());
}

// Errors name the statement at fault, so a user of a long spec knows which line to fix.
TEST(ModelSpec, NewLayerErrorsNameTheStatement) {
  const std::pair<const char*, const char*> cases[] = {
      {"input 8x8x2; dwconv 3x2 same; fc 2", "dwconv 3x2 same"},
      {"input 8x8x2; dwconv 4x4 same; fc 2", "dwconv 4x4 same"},
      {"input 8x8x2; dwconv 16 3x3; fc 2", "dwconv 16 3x3"},  // no channel count
      {"input 8x8x2; dwconv 3x3 stride 0; fc 2", "dwconv 3x3 stride 0"},
      {"input 8x8x2; dwconv; fc 2", "dwconv"},
      {"input 8x8x2; avgpool 1; fc 2", "avgpool 1"},
      {"input 8x8x2; avgpool; fc 2", "avgpool"},
      {"input 8x8x2; avgpool 2 2; fc 2", "avgpool 2 2"},
      {"input 8x8x2; globalavgpool 2; fc 2", "globalavgpool 2"},
      {"input 8x8x2; dropout; fc 2", "dropout"},
      {"input 8x8x2; dropout 0; fc 2", "dropout 0"},
      {"input 8x8x2; dropout 1; fc 2", "dropout 1"},
      {"input 8x8x2; dropout 0.5x; fc 2", "dropout 0.5x"},
      {"input 8x8x2; dropout nan; fc 2", "dropout nan"},
      {"input 8x8x2; init xavier; fc 2", "init xavier"},
      {"input 8x8x2; groupnorm; fc 2", "groupnorm"},
      {"input 8x8x2; groupnorm 0; fc 2", "groupnorm 0"},
      {"input 8x8x2; groupnorm 2 same; fc 2", "groupnorm 2 same"},
      {"input 8x8x2; batchnorm 2; fc 2", "batchnorm 2"},
  };
  for (const auto& [spec, statement] : cases) {
    try {
      parse_model_spec(spec);
      ADD_FAILURE() << "accepted: " << spec;
    } catch (const ModelError& e) {
      EXPECT_NE(std::string(e.what()).find(statement), std::string::npos) << e.what();
    }
  }
  Model dropped(parse_model_spec("input 8x8x2; fc 6 relu; dropout 0.25; fc 2"));
  ASSERT_EQ(dropped.layers().size(), 4u);
  EXPECT_EQ(dropped.layers()[2].kind, LayerKind::kDropout);
  EXPECT_FLOAT_EQ(dropped.layers()[2].rate, 0.25f);
  EXPECT_EQ(dropped.layers()[2].out, (ExampleShape{1, 1, 6}));
  // Shapes that do not fit are refused when the model is built.
  for (const char* spec :
       {"input 4x4x2; dwconv 5x5 valid; fc 2", "input 3x3x2; avgpool 4; fc 2",
        "input 8x8x2; conv 4 3x3; globalavgpool",  // pooling gives no logits
        "input 8x8x2; fc 4; dropout 0.5", "input 8x8x2; fc 4; avgpool 2; fc 2"}) {  // 1x1 after fc
    EXPECT_THROW(Model{parse_model_spec(spec)}, ModelError) << spec;
  }
}

// groupnorm G / batchnorm: gamma and beta per channel in the arena, named gnN / bnN,
// starting as the identity map (gamma 1, beta 0); G must divide the channel count, and the
// error names the statement.
TEST(ModelSpec, NormalizationLayersHoldGammaAndBetaPerChannel) {
  Model m(parse_model_spec(
      "input 8x8x2; conv 6 3x3 same; groupnorm 3 relu; conv 4 3x3; batchnorm relu; fc 2"));
  ASSERT_EQ(m.layers().size(), 7u);
  EXPECT_EQ(m.layers()[1].kind, LayerKind::kGroupNorm);
  EXPECT_EQ(m.layers()[1].groups, 3);
  EXPECT_EQ(m.layers()[2].kind, LayerKind::kRelu);
  EXPECT_EQ(m.layers()[4].kind, LayerKind::kBatchNorm);
  EXPECT_EQ(m.layers()[4].out, (ExampleShape{8, 8, 4}));
  for (const char* name : {"gn1.weight", "gn1.bias"})
    EXPECT_EQ(m.tensors()[m.tensor_index(name)].shape, std::vector<int>{6}) << name;
  for (const char* name : {"bn1.weight", "bn1.bias"})
    EXPECT_EQ(m.tensors()[m.tensor_index(name)].shape, std::vector<int>{4}) << name;
  m.initialize(5);
  for (float g : m.tensor(m.tensor_index("gn1.weight"))) EXPECT_EQ(g, 1.0f);
  for (float b : m.tensor(m.tensor_index("bn1.bias"))) EXPECT_EQ(b, 0.0f);
  // The other weights are drawn as without the normalization layers.
  Model plain(parse_model_spec("input 8x8x2; conv 6 3x3 same relu; conv 4 3x3 relu; fc 2"));
  plain.initialize(5);
  const auto w = m.tensor(m.tensor_index("conv2.weight"));
  const auto w_plain = plain.tensor(plain.tensor_index("conv2.weight"));
  EXPECT_TRUE(std::equal(w.begin(), w.end(), w_plain.begin()));
  try {
    Model bad(parse_model_spec("input 8x8x2; conv 6 3x3 same; groupnorm 4; fc 2"));
    ADD_FAILURE() << "groupnorm 4 of 6 channels accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("groupnorm 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("6 channels"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Model{parse_model_spec("input 8x8x2; groupnorm 3; fc 2")}, ModelError);
  // Normalization that would make the outputs constant is refused, naming the statements:
  // a group per channel right before a global average pool, and groups of one value.
  auto refusal = [](const char* spec) {
    try {
      Model bad(parse_model_spec(spec));
    } catch (const ModelError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string pooled = refusal("input 8x8x2; conv 6 3x3 same; groupnorm 6; globalavgpool; fc 2");
  EXPECT_NE(pooled.find("'groupnorm 6'"), std::string::npos) << pooled;
  EXPECT_NE(pooled.find("same outputs"), std::string::npos) << pooled;
  const std::string single = refusal("input 8x8x2; fc 4; groupnorm 4; fc 2");
  EXPECT_NE(single.find("'groupnorm 4' on a 1x1x4 tensor"), std::string::npos) << single;
  for (const char* fine : {"input 8x8x2; conv 6 3x3 same; groupnorm 6 relu; globalavgpool; fc 2",
                           "input 8x8x2; conv 6 3x3 same; groupnorm 3; globalavgpool; fc 2",
                           "input 8x8x2; conv 6 3x3 same; batchnorm; globalavgpool; fc 2",
                           "input 8x8x2; fc 4; groupnorm 2; fc 2", "input 8x8x2; fc 4; batchnorm; fc 2"})
    EXPECT_EQ(refusal(fine), "accepted") << fine;
}

// The spec as a graph: 'name', 'from' and 'add' wire each layer to the tensor it reads.
TEST(ModelSpec, ResidualConnectionsWireTheLayers) {
  Model m(parse_model_spec(
      "input 8x8x2; name x; conv 4 3x3 same relu; name a; conv 4 3x3 stride 2 same; name b; "
      "from a; conv 4 1x1 stride 2 valid; add b relu; name s; from x; conv 4 3x3 stride 2 same; "
      "add s; fc 3"));
  // conv1 relu conv2 conv3(projection) add relu conv4 add fc: conv4 restarts at the input.
  const auto& l = m.layers();
  ASSERT_EQ(l.size(), 9u);
  EXPECT_TRUE(m.is_graph());
  EXPECT_EQ(l[0].input, -1);
  EXPECT_EQ(l[2].input, 1);  // conv2 reads a = conv1's ReLU
  EXPECT_EQ(l[3].input, 1);  // from a
  EXPECT_EQ(l[3].out, (ExampleShape{4, 4, 4}));
  EXPECT_EQ(l[4].kind, LayerKind::kAdd);
  EXPECT_EQ(l[4].input, 3);
  EXPECT_EQ(l[4].added, 2);
  EXPECT_EQ(l[5].kind, LayerKind::kRelu);
  EXPECT_EQ(l[6].input, -1);  // from x, the input
  EXPECT_EQ(l[6].in, (ExampleShape{8, 8, 2}));
  EXPECT_EQ(l[7].kind, LayerKind::kAdd);
  EXPECT_EQ(l[7].input, 6);
  EXPECT_EQ(l[7].added, 5);  // s: the ReLU after the first add
  EXPECT_EQ(l[8].in, (ExampleShape{4, 4, 4}));
  EXPECT_FALSE(Model(builtin_model_spec("paper-cnn")).is_graph());
}

TEST(ModelSpec, GraphErrorsNameTheStatement) {
  const std::pair<const char*, const char*> cases[] = {
      {"input 8x8x2; conv 2 3x3; add y; fc 2", "add y"},            // no such name
      {"input 8x8x2; from y; fc 2", "from y"},                      // no such name
      {"input 8x8x2; name a; conv 2 3x3; name a; fc 2", "name a"},  // taken
      {"input 8x8x2; name a b; fc 2", "name a b"},
      {"input 8x8x2; name a.b; fc 2", "name a.b"},
      {"input 8x8x2; name a; from a; from a; fc 2", "from a"},
      {"input 8x8x2; name a; from a; name b; fc 2", "name b"},
      {"input 8x8x2; conv 2 3x3; name a; name b; fc 2", "name b"},  // named twice
      {"input 8x8x2; name a; conv 2 3x3; add a sum; fc 2", "add a sum"},
      {"input 8x8x2; conv 2 3x3; conv1d 2 3; fc 2", "conv1d 2 3"},  // not a sequence
      {"input 9x2 sequence; conv1d 2 3 same; fc 2", "conv1d 2 3 same"},
      {"input 9x2 sequence; conv1d 2 3x3; fc 2", "conv1d 2 3x3"},
      {"input 9x2 sequence; conv1d 2 3 dilation 2; fc 2", "conv1d 2 3 dilation 2"},
      {"input 9x2x1 sequence; fc 2", "input 9x2x1 sequence"},
  };
  for (const auto& [spec, statement] : cases) {
    try {
      Model{parse_model_spec(spec)};
      ADD_FAILURE() << "accepted: " << spec;
    } catch (const ModelError& e) {
      EXPECT_NE(std::string(e.what()).find(statement), std::string::npos) << e.what();
    }
  }
  // Shapes are checked when the model is built, and the error still names the statement.
  try {
    Model{parse_model_spec("input 8x8x2; name x; conv 4 3x3 stride 2 same; add x relu; fc 2")};
    ADD_FAILURE() << "a 4x4x4 plus an 8x8x2 tensor was accepted";
  } catch (const ModelError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("add x relu"), std::string::npos) << what;
    EXPECT_NE(what.find("8x8x2"), std::string::npos) << what;
    EXPECT_NE(what.find("4x4x4"), std::string::npos) << what;
  }
  // A branch nothing reads: 'from x' leaves the first conv's output behind.
  try {
    Model{parse_model_spec("input 8x8x2; name x; conv 4 3x3 same; from x; fc 2")};
    ADD_FAILURE() << "a dangling branch was accepted";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("conv 4 3x3 same"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_model_spec("input 8x8x2; name x; fc 2; from x"), ModelError);
}

TEST(ModelSpec, Conv1dReadsASequence) {
  Model m(parse_model_spec("input 128x9 sequence; conv1d 16 5 stride 2 relu; conv1d 8 3; fc 2"));
  EXPECT_TRUE(m.spec().sequence);
  EXPECT_EQ(m.input_shape(), (ExampleShape{1, 128, 9}));
  EXPECT_EQ(m.layers()[0].out, (ExampleShape{1, 62, 16}));  // (128 - 5) / 2 + 1
  EXPECT_EQ(m.layers()[0].kernel_h, 1);
  EXPECT_EQ(m.layers()[2].out, (ExampleShape{1, 60, 8}));
  EXPECT_EQ(m.tensors()[0].shape, (std::vector<int>{16, 1, 5, 9}));
  EXPECT_FALSE(m.is_graph());
}

// The same tensors wired otherwise are another layout; a chain keeps its tensors' id.
TEST(Model, LayoutIdCoversTheWiring) {
  const char* identity = "input 8x8x2; conv 2 3x3 same relu; name a; conv 2 3x3 same; add a; fc 3";
  const char* from_input =
      "input 8x8x2; name x; conv 2 3x3 same relu; conv 2 3x3 same; add x; fc 3";
  const char* chain = "input 8x8x2; conv 2 3x3 same relu; conv 2 3x3 same; fc 3";
  Model a(parse_model_spec(identity)), b(parse_model_spec(from_input)), c(parse_model_spec(chain));
  ASSERT_EQ(a.tensors().size(), c.tensors().size());
  EXPECT_NE(a.layout_id(), b.layout_id());
  EXPECT_NE(a.layout_id(), c.layout_id());
  EXPECT_EQ(a.layout_id(), Model(parse_model_spec(identity)).layout_id());
  // A chain's id is its tensors' fingerprint alone, as before graphs (saved WALs name it):
  // FNV-1a over the paper CNN's tensor names and shapes, worked out apart in Python.
  EXPECT_EQ(Model(builtin_model_spec("paper-cnn")).layout_id(), 0xe7acc875809c7aa1ULL);
}

// Parameter counts of the built-in edge models, worked out by hand in model/README.md.
TEST(ModelSpec, EdgeModelsAreBuiltIn) {
  const std::pair<const char*, std::size_t> counts[] = {
      {"resnet-8", 77418}, {"resnet-8-32x32x3", 77706}, {"ds-cnn", 20620}, {"cnn1d", 37862}};
  for (const auto& [name, parameters] : counts) {
    Model m(builtin_model_spec(name));
    EXPECT_EQ(m.parameter_count(), parameters) << name;
    EXPECT_EQ(model_spec_from_argument(name).name, name);
  }
  Model resnet(builtin_model_spec("resnet-8"));
  EXPECT_TRUE(resnet.is_graph());
  EXPECT_EQ(resnet.layers().back().in, (ExampleShape{1, 1, 64}));
  EXPECT_EQ(Model(builtin_model_spec("resnet-8-32x32x3")).input_shape(), (ExampleShape{32, 32, 3}));
  EXPECT_EQ(Model(builtin_model_spec("ds-cnn")).num_classes(), 12);
  EXPECT_EQ(Model(builtin_model_spec("cnn1d")).input_shape(), (ExampleShape{1, 128, 9}));
}

TEST(ModelSpec, BadSpecsAreRefusedWithAReason) {
  const char* bad[] = {
      "",                                   // nothing
      "fc 10",                              // no input
      "input 28x28; fc 10",                 // input needs 3 sizes
      "input 28x28x1; conv 32 3x2; fc 10",  // non-square kernel
      "input 28x28x1; conv 32 4x4 same; fc 10",
      "input 28x28x1; pool 2; fc 10",  // unknown layer
      "input 28x28x1; fc 0",           // zero size
      "input 28x28x1; fc -3",
      "input 28x28x1; fc 10 sigmoid",
      "input 28x28x1; maxpool 3; fc 10",
      "input 28x28x1; fc 10; relu",           // last layer is not fc/conv
      "input 28x28x1; fc 1",                  // one class
      "input 2x2x1; conv 4 5x5 valid; fc 2",  // kernel larger than input
      "input 4096x4096x4096; fc 10",          // too many parameters
      "input 28x28x1; fc 99999999999999999999",
      "input 7x7x8; deconv 4 4x4 stride 2",  // deconv needs an odd kernel
      "input 7x7x8; deconv 4 5x3",
      "input 7x7x8; deconv 4 5x5 same",
      "input 1x1x4; fc 2x2",  // an fc shape needs HxWxC
      "input 1x1x4; fc 2x0x3",
  };
  for (const char* spec : bad) {
    EXPECT_THROW(Model{parse_model_spec(spec)}, ModelError) << spec;
  }
  EXPECT_THROW(builtin_model_spec("resnet"), ModelError);
  try {
    parse_model_spec("input 28x28x1; pool 2");
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("pool"), std::string::npos) << e.what();
  }
}

TEST(Model, InitializationIsDeterministicAndScaled) {
  Model a(builtin_model_spec("paper-cnn")), b(builtin_model_spec("paper-cnn")),
      c(builtin_model_spec("paper-cnn"));
  a.initialize(7);
  b.initialize(7);
  c.initialize(8);
  EXPECT_TRUE(std::equal(a.parameters().begin(), a.parameters().end(), b.parameters().begin()));
  EXPECT_FALSE(std::equal(a.parameters().begin(), a.parameters().end(), c.parameters().begin()));
  auto fc1 = a.tensor(a.tensor_index("fc1.weight"));
  const float bound = std::sqrt(6.0f / (3136.0f + 128.0f));  // Glorot: fan in + fan out
  float max_abs = 0;
  for (float v : fc1) max_abs = std::max(max_abs, std::fabs(v));
  EXPECT_LE(max_abs, bound);
  EXPECT_GT(max_abs, 0.9f * bound);
  for (float v : a.tensor(a.tensor_index("fc1.bias"))) EXPECT_EQ(v, 0.0f);
}

TEST(Model, LayoutIdSeparatesIncompatibleModels) {
  Model cnn(builtin_model_spec("paper-cnn")), cnn2(builtin_model_spec("paper-cnn")),
      mlp(builtin_model_spec("mlp"));
  EXPECT_EQ(cnn.layout_id(), cnn2.layout_id());
  EXPECT_NE(cnn.layout_id(), mlp.layout_id());
  EXPECT_NE(Model(parse_model_spec("input 28x28x1; fc 10")).layout_id(),
            Model(parse_model_spec("input 28x28x1; fc 11")).layout_id());
}

// A model for its layout only (the worker's): everything but the arena, which it refuses.
TEST(Model, ALayoutOnlyModelHasNoArena) {
  const Model full(builtin_model_spec("paper-cnn"));
  Model layout(builtin_model_spec("paper-cnn"), Model::Arena::kNone);
  EXPECT_EQ(layout.parameter_count(), full.parameter_count());
  EXPECT_EQ(layout.layout_id(), full.layout_id());
  EXPECT_EQ(layout.tensor_sizes(), full.tensor_sizes());
  EXPECT_EQ(layout.layers().size(), full.layers().size());
  EXPECT_TRUE(layout.parameters().empty());
  EXPECT_THROW(layout.initialize(1), ModelError);
  EXPECT_THROW(layout.tensor(0), ModelError);
  EXPECT_THROW(layout.safetensors_bytes(), ModelError);
  EXPECT_THROW(layout.load_safetensors_bytes(full.safetensors_bytes(), "model"), ModelError);
}

TEST(Safetensors, RoundTripKeepsEveryBitAndTheMetadata) {
  Model a(builtin_model_spec("paper-cnn"));
  a.initialize(3);
  const std::string path = temp_path("roundtrip.safetensors");
  a.save_safetensors(path, {{"version", "42"}});
  Model b(builtin_model_spec("paper-cnn"));
  auto metadata = b.load_safetensors(path);
  EXPECT_EQ(metadata["version"], "42");
  EXPECT_EQ(0, std::memcmp(a.parameters().data(), b.parameters().data(),
                           a.parameter_count() * sizeof(float)));
  // The header is readable by other tools: 8-byte length, JSON, aligned data.
  std::ifstream in(path, std::ios::binary);
  std::uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), 8);
  EXPECT_EQ(length % 8, 0u);
  std::string json(length, '\0');
  in.read(json.data(), static_cast<std::streamsize>(length));
  EXPECT_NE(
      json.find(
          "\"conv1.weight\":{\"dtype\":\"F32\",\"shape\":[32,3,3,1],\"data_offsets\":[0,1152]}"),
      std::string::npos)
      << json.substr(0, 300);
  std::remove(path.c_str());
}

TEST(Safetensors, BadFilesAreRefusedAndLeaveTheModelUnchanged) {
  Model cnn(builtin_model_spec("paper-cnn"));
  cnn.initialize(1);
  Model mlp(builtin_model_spec("mlp"));
  mlp.initialize(2);
  const std::string path = temp_path("bad.safetensors");
  mlp.save_safetensors(path);
  const std::vector<float> before(cnn.parameters().begin(), cnn.parameters().end());
  EXPECT_THROW(cnn.load_safetensors(path), ModelError);  // another model's tensors
  EXPECT_THROW(cnn.load_safetensors(path + ".missing"), ModelError);

  cnn.save_safetensors(path);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& content) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
  };
  write(bytes.substr(0, bytes.size() - 4));  // truncated data
  EXPECT_THROW(cnn.load_safetensors(path), ModelError);
  write(bytes.substr(0, 5));  // truncated length
  EXPECT_THROW(cnn.load_safetensors(path), ModelError);
  std::string huge = bytes;
  huge[7] = '\x7f';  // absurd header length
  write(huge);
  EXPECT_THROW(cnn.load_safetensors(path), ModelError);
  std::string garbage = bytes;
  garbage[8] = '[';  // header not an object
  write(garbage);
  EXPECT_THROW(cnn.load_safetensors(path), ModelError);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), cnn.parameters().begin()));
  std::remove(path.c_str());
}

}  // namespace
