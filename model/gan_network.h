// The networks of MD-GAN (Hardy, Le Merrer, Sericola 2019; issue 16), behind one interface,
// GanNetwork, so that the GAN steps (model/gan_training.h) run either architecture. Their
// parameters live in a runtime::Model arena (so tensors have names and offsets, travel through
// the codec, and are checkpointed as safetensors like the classifier's); forward and backward
// run on the kernels, XNNPACK or reference (KernelBackend).
//
// MLP (MlpNetwork), fully connected layers:
//   generator     z (100) + one-hot class (10) → 512 leaky → 512 leaky → 784 tanh
//   discriminator 784 → 512 leaky → 512 leaky → 11: one real/fake logit, then 10 class logits
// CNN (ConvGanNetwork on a model spec, kCnnGeneratorSpec / kCnnDiscriminatorSpec):
//   generator     z + one-hot (110) → fc 7·7·128 leaky → 5×5 deconv stride 2 → 14×14×64 leaky
//                 → 5×5 deconv stride 2 → 28×28×1 tanh                          902,657 parameters
//   discriminator 28×28×1 → 3×3 conv stride 2 → 14×14×16 leaky → 7×7×32 leaky → 4×4×64 leaky
//                 → 2×2×128 leaky → fc 11 (the MLP's outputs)                   102,795 parameters
// Both generators output 784 values per sample, row-major 28×28, one channel; both
// discriminators take that and output 11 values per sample.
//
// What the paper does not give and we chose (issue 16 says so): leaky ReLU slope 0.2, tanh
// output (images scaled to [-1, 1]), class conditioning by concatenating a one-hot label to z
// (ACGAN-style), the discriminator's losses BCE on the real/fake logit plus softmax
// cross-entropy on the class logits. For the CNN: the paper's "3×3 convolutions 16→…→512"
// does not reconcile with its parameter counts, so the discriminator is ours: four 3×3
// convolutions of 16, 32, 64, 128 channels, each stride 2 with padding 1, no pooling; the
// deconvolutions pad 2 and add one row and column (PyTorch's output_padding 1) so 7 → 14 → 28;
// the fc layer's 6272 outputs are read as a 7×7×128 NHWC image; no batch normalisation;
// Glorot-uniform weights (a deconv weight [OC][5][5][C] counted as a conv's) and zero biases,
// runtime::Model::initialize.
#pragma once

#include <pthreadpool.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/training_xnn.h"
#include "model/model.h"
#include "model/trainer.h"

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

// A GAN's generator or discriminator. The parameters' layout is model()'s (its own arena holds
// the initial values); forward() and backward() take any arena of that layout, so one network
// object serves the server's generator and a copy sent by a peer alike. Every buffer is
// allocated by the constructor; forward and backward run on the calling thread (and `pool`).
class GanNetwork {
 public:
  virtual ~GanNetwork() = default;
  virtual Model& model() = 0;
  virtual const Model& model() const = 0;
  virtual int inputs() const = 0;   // values per sample in
  virtual int outputs() const = 0;  // values per sample out
  virtual int max_batch() const = 0;

  // out [B][outputs()] for inp [B][inputs()], 1 <= B <= max_batch; the pointer stays valid
  // until the next forward().
  virtual const float* forward(std::span<const float> params, const float* inp, int batch) = 0;
  // After forward() on the same params, input and batch: the gradient of a loss whose
  // gradient with respect to the output is `dout` [B][outputs()]. `dparams` (same layout as the
  // arena) is overwritten; `dinp` [B][inputs()] may be null. An empty `dparams` asks for the
  // input gradient alone (a discriminator's feedback to the generator): fully connected
  // layers then skip their weight gradients, about a third of a backward pass.
  virtual void backward(std::span<const float> params, const float* dout, std::span<float> dparams,
                        float* dinp) = 0;
};

// A multilayer perceptron with its own activations: tensors fc1.weight, fc1.bias, ...
class MlpNetwork final : public GanNetwork {
 public:
  MlpNetwork(std::string name, int inputs, std::vector<GanLayerSpec> layers, int max_batch,
             KernelBackend backend = KernelBackend::kXnnpack, pthreadpool_t pool = nullptr);
  ~MlpNetwork() override;
  MlpNetwork(const MlpNetwork&) = delete;
  MlpNetwork& operator=(const MlpNetwork&) = delete;

  Model& model() override { return model_; }
  const Model& model() const override { return model_; }
  int inputs() const override { return inputs_; }
  int outputs() const override { return layers_.back().outputs; }
  int max_batch() const override { return max_batch_; }
  const float* forward(std::span<const float> params, const float* inp, int batch) override;
  void backward(std::span<const float> params, const float* dout, std::span<float> dparams,
                float* dinp) override;

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

// A network of fc, conv and deconv layers written in the model spec language
// (model/model.h), one activation after each layer (`activations`, one per spec layer; the
// spec's own 'relu' and maxpool are refused): tensors fc1.*, conv1.*, deconv1.*, ... Each
// layer runs on XNNPACK (FullyConnectedTrainXnn, Conv2dXnn, Deconv2dXnn, built here for
// max_batch) or on the reference kernels.
class ConvGanNetwork final : public GanNetwork {
 public:
  ConvGanNetwork(std::string name, std::string_view spec, std::vector<GanActivation> activations,
                 int max_batch, KernelBackend backend = KernelBackend::kXnnpack,
                 pthreadpool_t pool = nullptr);
  ~ConvGanNetwork() override;
  ConvGanNetwork(const ConvGanNetwork&) = delete;
  ConvGanNetwork& operator=(const ConvGanNetwork&) = delete;

  Model& model() override { return model_; }
  const Model& model() const override { return model_; }
  int inputs() const override { return inputs_; }
  int outputs() const override { return outputs_; }
  int max_batch() const override { return max_batch_; }
  const float* forward(std::span<const float> params, const float* inp, int batch) override;
  void backward(std::span<const float> params, const float* dout, std::span<float> dparams,
                float* dinp) override;

 private:
  struct Layer;
  int inputs_, outputs_, max_batch_;
  Model model_;
  std::vector<std::unique_ptr<Layer>> stages_;
  int batch_ = 0;
  const float* input_ = nullptr;
  std::vector<float> input_buffer_, dinput_buffer_;  // [max_batch][inputs]
  std::vector<float>
      unused_gradients_;  // conv and deconv layers' weight gradients when only dinp is asked for
};

// The architecture of the MLP: generator (inputs z + one-hot class) and discriminator.
std::vector<GanLayerSpec> mlp_generator_layers();
std::vector<GanLayerSpec> mlp_discriminator_layers();

// The CNN architecture (see the top of this file) and the activation after each of its layers.
inline constexpr std::string_view kCnnGeneratorSpec =
    "input 1x1x110; fc 7x7x128; deconv 64 5x5 stride 2; deconv 1 5x5 stride 2";
inline constexpr std::string_view kCnnDiscriminatorSpec =
    "input 28x28x1; conv 16 3x3 stride 2; conv 32 3x3 stride 2; conv 64 3x3 stride 2; conv 128 3x3 "
    "stride 2; fc 11";
std::vector<GanActivation> cnn_generator_activations();
std::vector<GanActivation> cnn_discriminator_activations();

enum class GanArchitecture { kMlp, kCnn };
// "mlp" or "cnn"; throws std::invalid_argument otherwise.
GanArchitecture parse_gan_architecture(std::string_view name);
const char* gan_architecture_name(GanArchitecture architecture);

// The generator (inputs z + one-hot class, outputs 784) or discriminator (784 in, 11 out) of
// `architecture`, its parameters not yet initialised. `pool` may be null, not owned.
std::unique_ptr<GanNetwork> make_generator_network(GanArchitecture architecture, int max_batch,
                                                   KernelBackend backend,
                                                   pthreadpool_t pool = nullptr);
std::unique_ptr<GanNetwork> make_discriminator_network(GanArchitecture architecture, int max_batch,
                                                       KernelBackend backend,
                                                       pthreadpool_t pool = nullptr);

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
DiscriminatorLoss discriminator_loss(const float* outputs, const std::int32_t* labels, int batch,
                                     bool real, float* doutputs);

// The generator's loss as the discriminator sees it (non-saturating: BCE against "real" plus
// the class cross-entropy) and its gradient with respect to D's outputs.
float generator_loss(const float* outputs, const std::int32_t* labels, int batch, float* doutputs);

}  // namespace edgetrain::runtime
