// edgetrain-model-logits: the class logits edgetrain computes for a model, its weights and
// the first examples of a data set's test split, one row per example. The converted model's
// check against PyTorch (tests/integration/onnx_converter_test.py) compares these with the
// PyTorch model's own logits; a test program, not installed.
//
//   edgetrain-model-logits MODEL WEIGHTS.safetensors DATA [EXAMPLES]
//
// MODEL is a built-in name, a spec or a spec file (as --model); WEIGHTS a safetensors file
// of exactly that model's tensors (a checkpoint, or what tools/onnx_to_edgetrain.py writes);
// DATA a data set name or directory (as --data). Runs the reference kernels, the definition,
// and the XNNPACK kernels, and prints both blocks ("reference", then "xnnpack"). A model with
// batchnorm layers first recalibrates their running statistics on those examples.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "model/dataset.h"
#include "model/model.h"
#include "model/trainer.h"

namespace {

void print_logits(edgetrain::runtime::Trainer& trainer, const edgetrain::runtime::Model& model,
                  const edgetrain::runtime::Dataset& data, int count) {
  std::vector<std::uint8_t> examples(static_cast<std::size_t>(count) * data.image_bytes());
  for (int i = 0; i < count; ++i)
    data.copy_image(static_cast<std::size_t>(i), examples.data() + i * data.image_bytes());
  trainer.set_input_format(data.format);
  // batchnorm's running statistics are not in a checkpoint (model/README.md, "Normalization
  // state"): recalibrated on the examples scored, in batches of 100, as the server's
  // evaluator does (server/evaluator.cc) and checkpoint_to_torch.py does with --data.
  if (trainer.has_batch_norm()) {
    constexpr int kCalibrationBatch = 100;
    trainer.begin_normalization_calibration();
    for (int start = 0; start < count; start += kCalibrationBatch) {
      const std::uint8_t* batch = examples.data() + static_cast<std::size_t>(start) * data.image_bytes();
      trainer.calibrate_normalization(model.parameters(), batch, data.labels.data() + start,
                                      std::min(kCalibrationBatch, count - start));
    }
    trainer.finish_normalization_calibration();
  }
  trainer.evaluate(model.parameters(), examples.data(), data.labels.data(), count);
  const auto logits = trainer.logits(count);
  const int classes = model.num_classes();
  for (int i = 0; i < count; ++i) {
    for (int c = 0; c < classes; ++c)
      std::printf("%s%.9g", c ? " " : "", static_cast<double>(logits[i * classes + c]));
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace edgetrain::runtime;
  if (argc < 4 || argc > 5 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr,
                 "usage: edgetrain-model-logits MODEL WEIGHTS.safetensors DATA [EXAMPLES]\n"
                 "prints the logits of the first EXAMPLES (default 16) test examples of DATA,\n"
                 "computed by the reference kernels and then by XNNPACK\n");
    return argc == 2 ? 0 : 2;
  }
  try {
    Model model(model_spec_from_argument(argv[1]));
    model.load_safetensors(argv[2]);
    const Dataset data = load_named_dataset(argv[3], DataSplit::kTest);
    int count = argc == 5 ? std::stoi(argv[4]) : 16;
    if (count < 1) throw std::invalid_argument("EXAMPLES must be at least 1");
    if (static_cast<std::size_t>(count) > data.size()) count = static_cast<int>(data.size());
    if (data.image_bytes() != model.input_shape().size() * data.format.value_bytes())
      throw std::invalid_argument(std::string(argv[3]) + ": examples do not have the model's input shape");
    std::printf("reference\n");
    Trainer reference(model, count, KernelBackend::kReference);
    print_logits(reference, model, data, count);
    std::printf("xnnpack\n");
    Trainer fast(model, count, KernelBackend::kXnnpack);
    print_logits(fast, model, data, count);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgetrain-model-logits: %s\n", e.what());
    return 2;
  }
  return 0;
}
