#include "runtime/trainer.h"

#include <stdexcept>
#include <string>

#include "kernels/reference.h"

namespace edgetrain::runtime {
namespace k = edgetrain::kernels;

namespace {
k::Conv2dShape conv_shape(const ResolvedLayer& layer, int batch) {
  k::Conv2dShape s;
  s.B = batch;
  s.H = layer.in.H;
  s.W = layer.in.W;
  s.C = layer.in.C;
  s.OC = layer.out.C;
  s.KH = s.KW = layer.kernel;
  s.stride = layer.stride;
  s.pad = layer.pad;
  return s;
}
}  // namespace

Trainer::Trainer(const Model& model, int max_batch) : model_(model), max_batch_(max_batch) {
  if (max_batch < 1) throw std::invalid_argument("Trainer: batch size must be at least 1");
  const std::size_t B = static_cast<std::size_t>(max_batch);
  input_.resize(B * model.input_shape().size());
  for (const ResolvedLayer& layer : model.layers()) {
    activations_.emplace_back(B * layer.out.size());
    gradients_.emplace_back(B * layer.out.size());
    argmax_.emplace_back(layer.kind == LayerKind::kMaxPool ? B * layer.out.size() : 0);
  }
  probs_.resize(B * static_cast<std::size_t>(model.num_classes()));
}

BatchResult Trainer::forward(std::span<const float> params, const std::uint8_t* pixels, const std::int32_t* labels,
                             int count) {
  if (count < 1 || count > max_batch_) {
    throw std::invalid_argument("Trainer: batch of " + std::to_string(count) + " examples, built for 1.." +
                                std::to_string(max_batch_));
  }
  if (params.size() != model_.parameter_count()) throw std::invalid_argument("Trainer: parameter count mismatch");
  const int N = static_cast<int>(model_.input_shape().size());
  for (std::size_t i = 0; i < static_cast<std::size_t>(count) * N; i++) input_[i] = static_cast<float>(pixels[i]);
  k::standardize_per_image(input_.data(), input_.data(), count, N);

  const auto& layers = model_.layers();
  const auto& tensors = model_.tensors();
  const float* in = input_.data();
  for (std::size_t i = 0; i < layers.size(); i++) {
    const ResolvedLayer& layer = layers[i];
    float* out = activations_[i].data();
    const float* weight = layer.weight_tensor >= 0 ? params.data() + tensors[layer.weight_tensor].offset : nullptr;
    const float* bias = layer.bias_tensor >= 0 ? params.data() + tensors[layer.bias_tensor].offset : nullptr;
    switch (layer.kind) {
      case LayerKind::kConv:
        k::conv2d_forward_reference(out, in, weight, bias, conv_shape(layer, count));
        break;
      case LayerKind::kMaxPool:
        k::maxpool2x2_forward_reference(out, argmax_[i].data(), in, count, layer.in.H, layer.in.W, layer.in.C);
        break;
      case LayerKind::kFullyConnected:
        k::fully_connected_forward_reference(out, in, weight, bias, count, layer.in.size(), layer.out.size());
        break;
      case LayerKind::kRelu:
        k::relu_forward(out, in, static_cast<std::size_t>(count) * layer.out.size());
        break;
    }
    in = out;
  }
  BatchResult result;
  result.count = count;
  result.loss = k::softmax_cross_entropy_forward(probs_.data(), in, labels, count, model_.num_classes(), &result.correct);
  return result;
}

BatchResult Trainer::evaluate(std::span<const float> params, const std::uint8_t* pixels, const std::int32_t* labels,
                              int count) {
  return forward(params, pixels, labels, count);
}

BatchResult Trainer::compute_gradient(std::span<const float> params, const std::uint8_t* pixels,
                                      const std::int32_t* labels, int count, std::span<float> grad) {
  if (grad.size() != model_.parameter_count()) throw std::invalid_argument("Trainer: gradient size mismatch");
  BatchResult result = forward(params, pixels, labels, count);
  const auto& layers = model_.layers();
  const auto& tensors = model_.tensors();
  k::softmax_cross_entropy_backward(gradients_.back().data(), probs_.data(), labels, count, model_.num_classes());
  for (std::size_t i = layers.size(); i-- > 0;) {
    const ResolvedLayer& layer = layers[i];
    const float* dout = gradients_[i].data();
    float* dinp = i > 0 ? gradients_[i - 1].data() : nullptr;  // the input image needs no gradient
    const float* in = i > 0 ? activations_[i - 1].data() : input_.data();
    const float* weight = layer.weight_tensor >= 0 ? params.data() + tensors[layer.weight_tensor].offset : nullptr;
    float* dweight = layer.weight_tensor >= 0 ? grad.data() + tensors[layer.weight_tensor].offset : nullptr;
    float* dbias = layer.bias_tensor >= 0 ? grad.data() + tensors[layer.bias_tensor].offset : nullptr;
    switch (layer.kind) {
      case LayerKind::kConv:
        k::conv2d_backward_reference(dinp, dweight, dbias, dout, in, weight, conv_shape(layer, count));
        break;
      case LayerKind::kMaxPool:
        if (dinp) k::maxpool2x2_backward_reference(dinp, dout, argmax_[i].data(), count, layer.in.H, layer.in.W, layer.in.C);
        break;
      case LayerKind::kFullyConnected:
        k::fully_connected_backward_reference(dinp, dweight, dbias, dout, in, weight, count, layer.in.size(),
                                              layer.out.size());
        break;
      case LayerKind::kRelu:
        if (dinp) k::relu_backward(dinp, dout, activations_[i].data(), static_cast<std::size_t>(count) * layer.out.size());
        break;
    }
  }
  return result;
}

}  // namespace edgetrain::runtime
