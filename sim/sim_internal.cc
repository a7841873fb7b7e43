#include "sim/sim_internal.h"

#include <algorithm>
#include <stdexcept>

namespace edgetrain::sim {

runtime::Model checked_model(const std::string& model_name, int workers, std::uint64_t seed,
                             const runtime::Dataset& train, const runtime::Dataset& test,
                             const std::string& init_from) {
  runtime::Model model(runtime::model_spec_from_argument(model_name));
  const runtime::ExampleShape in = model.input_shape();
  if (static_cast<std::uint32_t>(in.H) != train.height ||
      static_cast<std::uint32_t>(in.W) != train.width ||
      static_cast<std::uint32_t>(in.C) != train.channels ||
      train.image_bytes() != test.image_bytes()) {
    throw runtime::ModelError("sim: model input " + std::to_string(in.H) + "x" +
                              std::to_string(in.W) + "x" + std::to_string(in.C) +
                              " does not match the data's " + std::to_string(train.height) + "x" +
                              std::to_string(train.width) + "x" + std::to_string(train.channels));
  }
  if (model.num_classes() < static_cast<int>(train.num_classes)) {
    throw runtime::ModelError("sim: model has " + std::to_string(model.num_classes()) +
                              " outputs for " + std::to_string(train.num_classes) + " classes");
  }
  if (train.size() < static_cast<std::size_t>(workers))
    throw std::invalid_argument("sim: fewer examples than workers");
  model.initialize(seed);
  if (!init_from.empty()) {
    try {
      model.load_safetensors(init_from);
    } catch (const runtime::ModelError& e) {
      throw runtime::ModelError(std::string("--init-from: ") + e.what());
    }
  }
  return model;
}

std::vector<std::uint32_t> worker_shard(const runtime::Dataset& train, int worker, int workers,
                                        std::uint64_t seed, bool label_skewed,
                                        const runtime::LabelSkew& skew) {
  const runtime::ShardSpec spec{static_cast<std::uint32_t>(worker),
                                static_cast<std::uint32_t>(workers), seed};
  auto shard = label_skewed
                   ? runtime::shard_label_skewed(train.labels, train.num_classes, spec, skew)
                   : runtime::shard_iid(train.size(), spec);
  if (shard.empty())
    throw std::invalid_argument("sim: worker " + std::to_string(worker) + " got an empty shard");
  return shard;
}

TestScore evaluate_parameters(runtime::Trainer& evaluator, std::span<const float> parameters,
                              const runtime::Dataset& data, std::size_t count) {
  count = std::min(count, data.size());
  if (count == 0) return {};
  evaluator.set_input_format(data.format);
  const int batch = evaluator.max_batch();
  // batchnorm: running statistics recomputed for these parameters, as the server's
  // evaluator does (server/evaluator.cc; model/README.md, "Normalization state").
  if (evaluator.has_batch_norm()) {
    evaluator.begin_normalization_calibration();
    for (std::size_t start = 0; start < count; start += static_cast<std::size_t>(batch)) {
      const int n =
          static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(batch), count - start));
      evaluator.calibrate_normalization(parameters, data.pixels.data() + start * data.image_bytes(),
                                        data.labels.data() + start, n);
    }
    evaluator.finish_normalization_calibration();
  }
  std::size_t correct = 0;
  double loss_sum = 0;
  for (std::size_t start = 0; start < count; start += static_cast<std::size_t>(batch)) {
    const int n =
        static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(batch), count - start));
    const auto r = evaluator.evaluate(parameters, data.pixels.data() + start * data.image_bytes(),
                                      data.labels.data() + start, n);
    correct += static_cast<std::size_t>(r.correct);
    loss_sum += static_cast<double>(r.loss) * n;
  }
  return {static_cast<double>(correct) / static_cast<double>(count),
          loss_sum / static_cast<double>(count)};
}

TestScore evaluate_parameters(runtime::Trainer& evaluator, std::span<const float> parameters,
                              const runtime::Dataset& data,
                              std::span<const std::uint32_t> indices) {
  if (indices.empty()) return {};
  evaluator.set_input_format(data.format);
  const int batch = evaluator.max_batch();
  const std::size_t image = data.image_bytes();
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(batch) * image);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  // Gathers the batch from `start` into pixels/labels; returns its size.
  auto gather = [&](std::size_t start) {
    const int n = static_cast<int>(
        std::min<std::size_t>(static_cast<std::size_t>(batch), indices.size() - start));
    for (int k = 0; k < n; ++k) {
      const std::uint32_t example = indices[start + static_cast<std::size_t>(k)];
      std::copy_n(data.pixels.data() + example * image, image,
                  pixels.data() + static_cast<std::size_t>(k) * image);
      labels[static_cast<std::size_t>(k)] = data.labels[example];
    }
    return n;
  };
  if (evaluator.has_batch_norm()) {  // as in the overload above
    evaluator.begin_normalization_calibration();
    for (std::size_t start = 0; start < indices.size(); start += static_cast<std::size_t>(batch)) {
      const int n = gather(start);
      evaluator.calibrate_normalization(parameters, pixels.data(), labels.data(), n);
    }
    evaluator.finish_normalization_calibration();
  }
  std::size_t correct = 0;
  double loss_sum = 0;
  for (std::size_t start = 0; start < indices.size(); start += static_cast<std::size_t>(batch)) {
    const int n = gather(start);
    const auto r = evaluator.evaluate(parameters, pixels.data(), labels.data(), n);
    correct += static_cast<std::size_t>(r.correct);
    loss_sum += static_cast<double>(r.loss) * n;
  }
  return {static_cast<double>(correct) / static_cast<double>(indices.size()),
          loss_sum / static_cast<double>(indices.size())};
}

}  // namespace edgetrain::sim
