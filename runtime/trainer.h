// The local minibatch gradient: forward and backward of a Model on one batch, on the
// kernels. All buffers are allocated when the Trainer is built for a batch size, so a
// step allocates nothing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/model.h"

namespace edgetrain::runtime {

struct BatchResult {
  float loss = 0;   // mean softmax cross-entropy over the batch
  int correct = 0;  // examples whose argmax logit equals the label
  int count = 0;    // examples in the batch
};

class Trainer {
 public:
  // `model` supplies the layer structure (not the parameters) and must outlive the Trainer.
  Trainer(const Model& model, int max_batch);

  int max_batch() const { return max_batch_; }

  // Gradient of the mean loss over `count` examples (count <= max_batch) at `params`,
  // written to `grad` (same layout as the model's arena; fully overwritten).
  // `pixels` holds count × input size raw grey values (0..255), standardized per image here.
  BatchResult compute_gradient(std::span<const float> params, const std::uint8_t* pixels, const std::int32_t* labels,
                               int count, std::span<float> grad);

  // Forward only: loss and number correct.
  BatchResult evaluate(std::span<const float> params, const std::uint8_t* pixels, const std::int32_t* labels, int count);

 private:
  BatchResult forward(std::span<const float> params, const std::uint8_t* pixels, const std::int32_t* labels, int count);

  const Model& model_;
  int max_batch_;
  std::vector<float> input_;                    // standardized batch
  std::vector<std::vector<float>> activations_;  // output of each layer
  std::vector<std::vector<float>> gradients_;    // d(loss)/d(output of each layer)
  std::vector<std::vector<std::uint32_t>> argmax_;  // per max-pool layer
  std::vector<float> probs_;
};

}  // namespace edgetrain::runtime
