#include "model/gan_network.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/gan_ops.h"
#include "kernels/reference.h"

namespace edgetrain::runtime {
namespace {

std::string mlp_spec(int inputs, const std::vector<GanLayerSpec>& layers) {
  std::string spec = "input 1x1x" + std::to_string(inputs);
  for (const auto& layer : layers) spec += "; fc " + std::to_string(layer.outputs);
  return spec;
}

void activate(GanActivation activation, float* out, const float* pre, std::size_t n) {
  switch (activation) {
    case GanActivation::kNone:
      std::copy(pre, pre + n, out);
      break;
    case GanActivation::kLeakyRelu:
      kernels::leaky_relu_forward(out, pre, n, kGanLeakySlope);
      break;
    case GanActivation::kTanh:
      kernels::tanh_forward(out, pre, n);
      break;
  }
}

// d(loss)/d(pre-activation) from d(loss)/d(activation); leaky ReLU needs the input, tanh the
// output.
void activation_backward(GanActivation activation, float* dpre, const float* dout, const float* pre,
                         const float* out, std::size_t n) {
  switch (activation) {
    case GanActivation::kNone:
      std::copy(dout, dout + n, dpre);
      break;
    case GanActivation::kLeakyRelu:
      kernels::leaky_relu_backward(dpre, dout, pre, n, kGanLeakySlope);
      break;
    case GanActivation::kTanh:
      kernels::tanh_backward(dpre, dout, out, n);
      break;
  }
}

// Mean softmax cross-entropy of `classes` logits per row (stride `stride`), gradient into
// `dlogits` (same stride) scaled by 1/batch.
float class_cross_entropy(const float* logits, std::size_t stride, const std::int32_t* labels,
                          int batch, float* dlogits) {
  double sum = 0;
  for (int b = 0; b < batch; b++) {
    const float* row = logits + static_cast<std::size_t>(b) * stride;
    float* drow = dlogits + static_cast<std::size_t>(b) * stride;
    const float top = *std::max_element(row, row + kGanClasses);
    double total = 0;
    for (int c = 0; c < kGanClasses; c++) total += std::exp(static_cast<double>(row[c] - top));
    const int label = labels[b];
    if (label < 0 || label >= kGanClasses)
      throw std::invalid_argument("gan: label " + std::to_string(label) + " out of range");
    sum += std::log(total) - (row[label] - top);
    for (int c = 0; c < kGanClasses; c++) {
      const double p = std::exp(static_cast<double>(row[c] - top)) / total;
      drow[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) / batch);
    }
  }
  return static_cast<float>(sum / batch);
}

}  // namespace

struct MlpNetwork::Layer {
  int in = 0, out = 0;
  GanActivation activation = GanActivation::kNone;
  int weight = -1, bias = -1;  // tensor indexes
  std::unique_ptr<kernels::FullyConnectedTrainXnn> fast;
  std::vector<float> pre, post, dpre, dpost;  // [max_batch][out]
};

MlpNetwork::MlpNetwork(std::string name, int inputs, std::vector<GanLayerSpec> layers,
                       int max_batch, KernelBackend backend, pthreadpool_t pool)
    : inputs_(inputs),
      max_batch_(max_batch),
      backend_(backend),
      layers_(std::move(layers)),
      model_(parse_model_spec(mlp_spec(inputs, layers_), std::move(name))) {
  if (max_batch < 1) throw std::invalid_argument("MlpNetwork: batch must be at least 1");
  input_buffer_.assign(static_cast<std::size_t>(max_batch) * inputs, 0.0f);
  dinput_buffer_.assign(input_buffer_.size(), 0.0f);
  int in = inputs;
  for (std::size_t i = 0; i < layers_.size(); i++) {
    auto layer = std::make_unique<Layer>();
    layer->in = in;
    layer->out = layers_[i].outputs;
    layer->activation = layers_[i].activation;
    layer->weight = model_.layers()[i].weight_tensor;
    layer->bias = model_.layers()[i].bias_tensor;
    const std::size_t n = static_cast<std::size_t>(max_batch) * layer->out;
    layer->pre.resize(n);
    layer->post.resize(n);
    layer->dpre.resize(n);
    layer->dpost.resize(n);
    if (backend == KernelBackend::kXnnpack)
      layer->fast = std::make_unique<kernels::FullyConnectedTrainXnn>(
          max_batch, in, layer->out, kernels::Activation::none, pool);
    in = layer->out;
    stages_.push_back(std::move(layer));
  }
}

MlpNetwork::~MlpNetwork() = default;

const float* MlpNetwork::forward(std::span<const float> params, const float* inp, int batch) {
  if (batch < 1 || batch > max_batch_)
    throw std::invalid_argument("MlpNetwork: batch " + std::to_string(batch) + " beyond 1.." +
                                std::to_string(max_batch_));
  if (params.size() != model_.parameter_count())
    throw std::invalid_argument("MlpNetwork: parameters of another layout");
  batch_ = batch;
  // The XNNPACK ops run on max_batch rows: the input is copied into rows that are always there
  // (the padding rows stay zero), so the caller passes only `batch` rows.
  std::copy(inp, inp + static_cast<std::size_t>(batch) * inputs_, input_buffer_.begin());
  input_ = input_buffer_.data();
  const float* x = input_;
  for (auto& layer : stages_) {
    const float* w = params.data() + model_.tensors()[layer->weight].offset;
    const float* b = params.data() + model_.tensors()[layer->bias].offset;
    if (layer->fast) {
      // The XNNPACK op is built for max_batch rows; rows past `batch` are computed from
      // whatever the input holds there and never read.
      layer->fast->forward(layer->pre.data(), x, w, b);
    } else {
      kernels::fully_connected_forward_reference(layer->pre.data(), x, w, b, batch, layer->in,
                                                 layer->out);
    }
    activate(layer->activation, layer->post.data(), layer->pre.data(),
             static_cast<std::size_t>(batch) * layer->out);
    x = layer->post.data();
  }
  return x;
}

void MlpNetwork::backward(std::span<const float> params, const float* dout,
                          std::span<float> dparams, float* dinp) {
  if (!input_) throw std::logic_error("MlpNetwork: backward() before forward()");
  const bool parameter_gradients = !dparams.empty();
  if (parameter_gradients && dparams.size() != model_.parameter_count())
    throw std::invalid_argument("MlpNetwork: gradient of another layout");
  const int batch = batch_;
  const float* d = dout;
  for (std::size_t i = stages_.size(); i-- > 0;) {
    Layer& layer = *stages_[i];
    const std::size_t n = static_cast<std::size_t>(batch) * layer.out;
    activation_backward(layer.activation, layer.dpre.data(), d, layer.pre.data(), layer.post.data(),
                        n);
    // Rows past `batch` must add nothing to the parameter gradients.
    std::fill(layer.dpre.begin() + static_cast<std::ptrdiff_t>(n), layer.dpre.end(), 0.0f);
    const float* x = i == 0 ? input_ : stages_[i - 1]->post.data();
    float* dx = i == 0 ? (dinp ? dinput_buffer_.data() : nullptr) : stages_[i - 1]->dpost.data();
    const float* w = params.data() + model_.tensors()[layer.weight].offset;
    float* dw =
        parameter_gradients ? dparams.data() + model_.tensors()[layer.weight].offset : nullptr;
    float* db =
        parameter_gradients ? dparams.data() + model_.tensors()[layer.bias].offset : nullptr;
    if (layer.fast) {
      layer.fast->backward(dx, dw, db, layer.dpre.data(), nullptr, x, w);
    } else {
      kernels::fully_connected_backward_reference(dx, dw, db, layer.dpre.data(), x, w, batch,
                                                  layer.in, layer.out);
    }
    d = dx;
  }
  if (dinp)
    std::copy(dinput_buffer_.begin(),
              dinput_buffer_.begin() + static_cast<std::ptrdiff_t>(batch) * inputs_, dinp);
}

struct ConvGanNetwork::Layer {
  LayerKind kind = LayerKind::kFullyConnected;
  ExampleShape in, out;
  GanActivation activation = GanActivation::kNone;
  int weight = -1, bias = -1;  // tensor indexes
  kernels::Conv2dShape conv{};
  kernels::Deconv2dShape deconv{};
  std::unique_ptr<kernels::FullyConnectedTrainXnn> fast_fc;
  std::unique_ptr<kernels::Conv2dXnn> fast_conv;
  std::unique_ptr<kernels::Deconv2dXnn> fast_deconv;
  std::vector<float> pre, post, dpre, dpost;  // [max_batch][out]
};

ConvGanNetwork::ConvGanNetwork(std::string name, std::string_view spec,
                               std::vector<GanActivation> activations, int max_batch,
                               KernelBackend backend, pthreadpool_t pool)
    : max_batch_(max_batch), model_(parse_model_spec(spec, std::move(name))) {
  if (max_batch < 1) throw std::invalid_argument("ConvGanNetwork: batch must be at least 1");
  const auto& layers = model_.layers();
  if (activations.size() != layers.size())
    throw std::invalid_argument("ConvGanNetwork: " + std::to_string(activations.size()) +
                                " activations for " + std::to_string(layers.size()) +
                                " layers of '" + std::string(spec) + "'");
  if (model_.is_graph() || model_.spec().sequence)
    throw std::invalid_argument(
        "ConvGanNetwork: a chain of image layers only (no add/from, no "
        "sequence input): '" +
        std::string(spec) + "'");
  inputs_ = static_cast<int>(model_.input_shape().size());
  outputs_ = static_cast<int>(layers.back().out.size());
  input_buffer_.assign(static_cast<std::size_t>(max_batch) * inputs_, 0.0f);
  dinput_buffer_.assign(input_buffer_.size(), 0.0f);
  const bool xnnpack = backend == KernelBackend::kXnnpack;
  for (std::size_t i = 0; i < layers.size(); i++) {
    const ResolvedLayer& resolved = layers[i];
    auto layer = std::make_unique<Layer>();
    layer->kind = resolved.kind;
    layer->in = resolved.in;
    layer->out = resolved.out;
    layer->activation = activations[i];
    layer->weight = resolved.weight_tensor;
    layer->bias = resolved.bias_tensor;
    const ExampleShape& a = resolved.in;
    switch (resolved.kind) {
      case LayerKind::kFullyConnected:
        if (xnnpack)
          layer->fast_fc = std::make_unique<kernels::FullyConnectedTrainXnn>(
              max_batch, a.size(), resolved.out.size(), kernels::Activation::none, pool);
        break;
      case LayerKind::kConv:
        layer->conv = {max_batch,
                       a.H,
                       a.W,
                       a.C,
                       resolved.out.C,
                       resolved.kernel,
                       resolved.kernel,
                       resolved.stride,
                       resolved.pad};
        if (xnnpack)
          layer->fast_conv =
              std::make_unique<kernels::Conv2dXnn>(layer->conv, kernels::Activation::none, pool);
        break;
      case LayerKind::kDeconv:
        layer->deconv = {max_batch,
                         a.H,
                         a.W,
                         a.C,
                         resolved.out.C,
                         resolved.kernel,
                         resolved.kernel,
                         resolved.stride,
                         resolved.pad,
                         resolved.adj};
        if (xnnpack)
          layer->fast_deconv = std::make_unique<kernels::Deconv2dXnn>(layer->deconv, pool);
        break;
      case LayerKind::kMaxPool:
      case LayerKind::kAvgPool:
      case LayerKind::kGlobalAvgPool:
      case LayerKind::kDepthwiseConv:
      case LayerKind::kDropout:
      case LayerKind::kGroupNorm:
      case LayerKind::kBatchNorm:
      case LayerKind::kAdd:
      case LayerKind::kRelu:
        throw std::invalid_argument(
            "ConvGanNetwork: only fc, conv and deconv layers (activations are given apart): '" +
            std::string(spec) + "'");
    }
    const std::size_t n = static_cast<std::size_t>(max_batch) * resolved.out.size();
    layer->pre.assign(n, 0.0f);
    layer->post.assign(n, 0.0f);
    layer->dpre.assign(n, 0.0f);
    layer->dpost.assign(n, 0.0f);
    stages_.push_back(std::move(layer));
  }
}

ConvGanNetwork::~ConvGanNetwork() = default;

const float* ConvGanNetwork::forward(std::span<const float> params, const float* inp, int batch) {
  if (batch < 1 || batch > max_batch_)
    throw std::invalid_argument("ConvGanNetwork: batch " + std::to_string(batch) + " beyond 1.." +
                                std::to_string(max_batch_));
  if (params.size() != model_.parameter_count())
    throw std::invalid_argument("ConvGanNetwork: parameters of another layout");
  batch_ = batch;
  // As MlpNetwork: the XNNPACK ops run on max_batch rows, the rows past `batch` are computed
  // from whatever (finite) values their buffers hold and never read.
  std::copy(inp, inp + static_cast<std::size_t>(batch) * inputs_, input_buffer_.begin());
  input_ = input_buffer_.data();
  const float* x = input_;
  for (auto& layer : stages_) {
    const float* w = params.data() + model_.tensors()[layer->weight].offset;
    const float* b = params.data() + model_.tensors()[layer->bias].offset;
    float* pre = layer->pre.data();
    switch (layer->kind) {
      case LayerKind::kFullyConnected:
        if (layer->fast_fc)
          layer->fast_fc->forward(pre, x, w, b);
        else
          kernels::fully_connected_forward_reference(pre, x, w, b, batch, layer->in.size(),
                                                     layer->out.size());
        break;
      case LayerKind::kConv: {
        if (layer->fast_conv) {
          layer->fast_conv->forward(pre, x, w, b);
        } else {
          kernels::Conv2dShape shape = layer->conv;
          shape.B = batch;
          kernels::conv2d_forward_reference(pre, x, w, b, shape);
        }
        break;
      }
      case LayerKind::kDeconv: {
        if (layer->fast_deconv) {
          layer->fast_deconv->forward(pre, x, w, b);
        } else {
          kernels::Deconv2dShape shape = layer->deconv;
          shape.B = batch;
          kernels::deconv2d_forward_reference(pre, x, w, b, shape);
        }
        break;
      }
      case LayerKind::kMaxPool:
      case LayerKind::kAvgPool:
      case LayerKind::kGlobalAvgPool:
      case LayerKind::kDepthwiseConv:
      case LayerKind::kDropout:
      case LayerKind::kGroupNorm:
      case LayerKind::kBatchNorm:
      case LayerKind::kAdd:
      case LayerKind::kRelu:
        break;  // refused by the constructor
    }
    activate(layer->activation, layer->post.data(), pre,
             static_cast<std::size_t>(batch) * layer->out.size());
    x = layer->post.data();
  }
  return x;
}

void ConvGanNetwork::backward(std::span<const float> params, const float* dout,
                              std::span<float> dparams, float* dinp) {
  if (!input_) throw std::logic_error("ConvGanNetwork: backward() before forward()");
  const bool parameter_gradients = !dparams.empty();
  if (parameter_gradients && dparams.size() != model_.parameter_count())
    throw std::invalid_argument("ConvGanNetwork: gradient of another layout");
  // The conv and deconv kernels always write their weight gradients: somewhere to put them.
  if (!parameter_gradients && unused_gradients_.size() != model_.parameter_count())
    unused_gradients_.assign(model_.parameter_count(), 0.0f);
  const std::span<float> gradients =
      parameter_gradients ? dparams : std::span<float>(unused_gradients_);
  const int batch = batch_;
  const float* d = dout;
  for (std::size_t i = stages_.size(); i-- > 0;) {
    Layer& layer = *stages_[i];
    const std::size_t n = static_cast<std::size_t>(batch) * layer.out.size();
    activation_backward(layer.activation, layer.dpre.data(), d, layer.pre.data(), layer.post.data(),
                        n);
    // Rows past `batch` must add nothing to the parameter gradients.
    std::fill(layer.dpre.begin() + static_cast<std::ptrdiff_t>(n), layer.dpre.end(), 0.0f);
    const float* x = i == 0 ? input_ : stages_[i - 1]->post.data();
    float* dx = i == 0 ? (dinp ? dinput_buffer_.data() : nullptr) : stages_[i - 1]->dpost.data();
    const float* w = params.data() + model_.tensors()[layer.weight].offset;
    float* dw = gradients.data() + model_.tensors()[layer.weight].offset;
    float* db = gradients.data() + model_.tensors()[layer.bias].offset;
    const float* dpre = layer.dpre.data();
    switch (layer.kind) {
      case LayerKind::kFullyConnected:
        if (!parameter_gradients) dw = db = nullptr;
        if (layer.fast_fc)
          layer.fast_fc->backward(dx, dw, db, dpre, nullptr, x, w);
        else
          kernels::fully_connected_backward_reference(dx, dw, db, dpre, x, w, batch,
                                                      layer.in.size(), layer.out.size());
        break;
      case LayerKind::kConv: {
        if (layer.fast_conv) {
          layer.fast_conv->backward(dx, dw, db, dpre, nullptr, x, w);
        } else {
          kernels::Conv2dShape shape = layer.conv;
          shape.B = batch;
          kernels::conv2d_backward_reference(dx, dw, db, dpre, x, w, shape);
        }
        break;
      }
      case LayerKind::kDeconv: {
        if (layer.fast_deconv) {
          layer.fast_deconv->backward(dx, dw, db, dpre, x, w);
        } else {
          kernels::Deconv2dShape shape = layer.deconv;
          shape.B = batch;
          kernels::deconv2d_backward_reference(dx, dw, db, dpre, x, w, shape);
        }
        break;
      }
      case LayerKind::kMaxPool:
      case LayerKind::kAvgPool:
      case LayerKind::kGlobalAvgPool:
      case LayerKind::kDepthwiseConv:
      case LayerKind::kDropout:
      case LayerKind::kGroupNorm:
      case LayerKind::kBatchNorm:
      case LayerKind::kAdd:
      case LayerKind::kRelu:
        break;  // refused by the constructor
    }
    d = dx;
  }
  if (dinp)
    std::copy(dinput_buffer_.begin(),
              dinput_buffer_.begin() + static_cast<std::ptrdiff_t>(batch) * inputs_, dinp);
}

std::vector<GanLayerSpec> mlp_generator_layers() {
  return {{512, GanActivation::kLeakyRelu},
          {512, GanActivation::kLeakyRelu},
          {kGanImageSize, GanActivation::kTanh}};
}

std::vector<GanLayerSpec> mlp_discriminator_layers() {
  return {{512, GanActivation::kLeakyRelu},
          {512, GanActivation::kLeakyRelu},
          {1 + kGanClasses, GanActivation::kNone}};
}

std::vector<GanActivation> cnn_generator_activations() {
  return {GanActivation::kLeakyRelu, GanActivation::kLeakyRelu, GanActivation::kTanh};
}

std::vector<GanActivation> cnn_discriminator_activations() {
  return {GanActivation::kLeakyRelu, GanActivation::kLeakyRelu, GanActivation::kLeakyRelu,
          GanActivation::kLeakyRelu, GanActivation::kNone};
}

GanArchitecture parse_gan_architecture(std::string_view name) {
  if (name == "mlp") return GanArchitecture::kMlp;
  if (name == "cnn") return GanArchitecture::kCnn;
  throw std::invalid_argument("gan: architecture '" + std::string(name) + "' (known: mlp, cnn)");
}

const char* gan_architecture_name(GanArchitecture architecture) {
  return architecture == GanArchitecture::kCnn ? "cnn" : "mlp";
}

std::unique_ptr<GanNetwork> make_generator_network(GanArchitecture architecture, int max_batch,
                                                   KernelBackend backend, pthreadpool_t pool) {
  if (architecture == GanArchitecture::kCnn)
    return std::make_unique<ConvGanNetwork>("generator", kCnnGeneratorSpec,
                                            cnn_generator_activations(), max_batch, backend, pool);
  return std::make_unique<MlpNetwork>("generator", kGanNoiseSize + kGanClasses,
                                      mlp_generator_layers(), max_batch, backend, pool);
}

std::unique_ptr<GanNetwork> make_discriminator_network(GanArchitecture architecture, int max_batch,
                                                       KernelBackend backend, pthreadpool_t pool) {
  if (architecture == GanArchitecture::kCnn)
    return std::make_unique<ConvGanNetwork>("discriminator", kCnnDiscriminatorSpec,
                                            cnn_discriminator_activations(), max_batch, backend,
                                            pool);
  return std::make_unique<MlpNetwork>("discriminator", kGanImageSize, mlp_discriminator_layers(),
                                      max_batch, backend, pool);
}

void generator_inputs(float* out, const float* noise, const std::int32_t* labels, int batch) {
  const int width = kGanNoiseSize + kGanClasses;
  for (int b = 0; b < batch; b++) {
    float* row = out + static_cast<std::size_t>(b) * width;
    std::copy(noise + static_cast<std::size_t>(b) * kGanNoiseSize,
              noise + static_cast<std::size_t>(b + 1) * kGanNoiseSize, row);
    std::fill(row + kGanNoiseSize, row + width, 0.0f);
    if (labels[b] < 0 || labels[b] >= kGanClasses)
      throw std::invalid_argument("gan: label out of range");
    row[kGanNoiseSize + labels[b]] = 1.0f;
  }
}

DiscriminatorLoss discriminator_loss(const float* outputs, const std::int32_t* labels, int batch,
                                     bool real, float* doutputs) {
  const std::size_t stride = 1 + kGanClasses;
  DiscriminatorLoss loss;
  double bce = 0;
  const double target = real ? 1.0 : 0.0;
  for (int b = 0; b < batch; b++) {
    const double x = outputs[b * stride];
    bce += std::max(x, 0.0) - x * target + std::log1p(std::exp(-std::fabs(x)));
    const double p = 1.0 / (1.0 + std::exp(-x));
    doutputs[b * stride] = static_cast<float>((p - target) / batch);
    loss.correct_real_fake += (x > 0) == real;
  }
  loss.adversarial = static_cast<float>(bce / batch);
  loss.classes = class_cross_entropy(outputs + 1, stride, labels, batch, doutputs + 1);
  return loss;
}

float generator_loss(const float* outputs, const std::int32_t* labels, int batch, float* doutputs) {
  const DiscriminatorLoss loss =
      discriminator_loss(outputs, labels, batch, /*real=*/true, doutputs);
  return loss.adversarial + loss.classes;
}

}  // namespace edgetrain::runtime
