// The networks of MD-GAN's MLP architecture (Hardy, Le Merrer, Sericola 2019; issue 16):
// stacks of fully connected layers with leaky ReLU or tanh after each, their parameters in a
// runtime::Model arena (so tensors have names and offsets, travel through the codec, and are
// checkpointed as safetensors like the classifier's), forward and backward on the kernels.
//
//   generator     z (100) + one-hot class (10) → 512 leaky → 512 leaky → 784 tanh
//   discriminator 784 → 512 leaky → 512 leaky → 11: one real/fake logit, then 10 class logits
//
// What the paper does not give and we chose (issue 16 says so): leaky ReLU slope 0.2, tanh
// output (images scaled to [-1, 1]), class conditioning by concatenating a one-hot label to z
// (ACGAN-style), the discriminator's losses BCE on the real/fake logit plus softmax
// cross-entropy on the class logits.
#pragma once

#include <pthreadpool.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/training_xnn.h"
#include "runtime/model.h"
#include "runtime/trainer.h"

namespace edgetrain::runtime {

enum class GanActivation { kNone, kLeakyRelu, kTanh };

struct GanLayerSpec {
  int outputs = 0;
  GanActivation activation = GanActivation::kLeakyRelu;
};

inline constexpr int kGanNoiseSize = 100;
inline constexpr int kGanClasses = 10;
inline constexpr int kGanImageSize = 28 * 28;
inline constexpr float kGanLeakySlope = 0.2f;

// A multilayer perceptron with its own activations. The parameters live in model().parameters()
// (tensors fc1.weight, fc1.bias, ...); forward() and backward() take any arena of that layout,
// so one network object serves the server's generator and a copy sent by a peer alike.
class MlpNetwork {
 public:
  MlpNetwork(std::string name, int inputs, std::vector<GanLayerSpec> layers, int max_batch,
             KernelBackend backend = KernelBackend::kXnnpack, pthreadpool_t pool = nullptr);
  ~MlpNetwork();
  MlpNetwork(const MlpNetwork&) = delete;
  MlpNetwork& operator=(const MlpNetwork&) = delete;

  Model& model() { return model_; }
  const Model& model() const { return model_; }
  int inputs() const { return inputs_; }
  int outputs() const { return layers_.back().outputs; }
  int max_batch() const { return max_batch_; }

  // out [B][outputs()] for inp [B][inputs()], B <= max_batch; the pointer stays valid until
  // the next forward().
  const float* forward(std::span<const float> params, const float* inp, int batch);
  // After forward() on the same params, input and batch: the gradient of a loss whose
  // gradient with respect to the output is `dout` [B][outputs()]. `dparams` (same layout as the
  // arena) is overwritten; `dinp` [B][inputs()] may be null.
  void backward(std::span<const float> params, const float* dout, std::span<float> dparams, float* dinp);

 private:
  struct Layer;
  int inputs_, max_batch_;
  KernelBackend backend_;
  std::vector<GanLayerSpec> layers_;
  Model model_;
  std::vector<std::unique_ptr<Layer>> stages_;
  int batch_ = 0;
  const float* input_ = nullptr;
  std::vector<float> input_buffer_, dinput_buffer_;  // [max_batch][inputs]
};

// The architecture of the MLP: generator (inputs z + one-hot class) and discriminator.
std::vector<GanLayerSpec> mlp_generator_layers();
std::vector<GanLayerSpec> mlp_discriminator_layers();

// The generator's input rows: z from `noise` (B × 100) and a one-hot class label each.
void generator_inputs(float* out, const float* noise, const std::int32_t* labels, int batch);

struct DiscriminatorLoss {
  float adversarial = 0;  // mean BCE of the real/fake logit
  float classes = 0;      // mean cross-entropy of the class logits
  int correct_real_fake = 0;
};

// The discriminator's loss on one batch of D's outputs [B][11] (column 0 the real/fake logit,
// columns 1..10 the class logits) and its gradient with respect to those outputs: BCE against
// `real` (1) or fake (0), plus the class cross-entropy, both means over the batch, so a batch
// of real images and one of generated images each contribute their own mean.
DiscriminatorLoss discriminator_loss(const float* outputs, const std::int32_t* labels, int batch, bool real,
                                     float* doutputs);

// The generator's loss as the discriminator sees it (non-saturating: BCE against "real" plus
// the class cross-entropy) and its gradient with respect to D's outputs.
float generator_loss(const float* outputs, const std::int32_t* labels, int batch, float* doutputs);

}  // namespace edgetrain::runtime
