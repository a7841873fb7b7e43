#include "model/trainer.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/splitmix64.h"
#include "kernels/normalization.h"
#include "kernels/reference.h"
#include "kernels/training_xnn.h"
#include "model/filter_dropout.h"

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
  s.KH = layer.kernel_h;
  s.KW = layer.kernel;
  s.stride = layer.stride;
  s.pad = layer.pad;
  return s;
}
}  // namespace

struct Trainer::Stage {
  std::size_t layer = 0;  // the layer this stage computes (index into Model::layers())
  std::size_t output =
      0;  // the layer whose output it writes: `layer`, or layer + 1 with a fused ReLU
  bool fused_relu = false;
  bool gradient_in_activation = false;  // its output gradient is unpooled into its output
  // XNNPACK backend only, built for max_batch; at most one is set.
  std::unique_ptr<k::Conv2dXnn> conv;
  std::unique_ptr<k::FullyConnectedTrainXnn> fc;
  std::unique_ptr<k::MaxPool2x2Xnn> pool;
  std::unique_ptr<k::DepthwiseConv2dXnn> dwconv;
  std::unique_ptr<k::AvgPoolXnn> avgpool;
  std::unique_ptr<k::GlobalAvgPoolXnn> global_avgpool;
  std::unique_ptr<k::GroupNormOp> group_norm;  // our loops, not XNNPACK (it has none)
  std::unique_ptr<k::BatchNormOp> batch_norm;
};

Trainer::Trainer(const Model& model, int max_batch, KernelBackend backend, pthreadpool_t pool)
    : model_(model), max_batch_(max_batch), backend_(backend), pool_(pool) {
  if (max_batch < 1) throw std::invalid_argument("Trainer: batch size must be at least 1");
  const std::size_t B = static_cast<std::size_t>(max_batch);
  const auto& layers = model.layers();
  const bool xnnpack = backend == KernelBackend::kXnnpack;
  for (const ResolvedLayer& layer : layers) {
    if (layer.kind == LayerKind::kDeconv)
      throw ModelError(
          "Trainer: model '" + model.spec().name +
          "' has a deconv layer; those are trained by the GAN networks (model/gan_network.h)");
  }
  readers_.assign(layers.size(), 0);
  for (const ResolvedLayer& layer : layers) {
    if (layer.input >= 0) readers_[layer.input]++;
    if (layer.kind == LayerKind::kAdd && layer.added >= 0) readers_[layer.added]++;
  }
  for (std::size_t i = 0; i < layers.size(); i++) {
    Stage stage;
    stage.layer = stage.output = i;
    const ResolvedLayer& layer = layers[i];
    const bool can_fuse = layer.kind == LayerKind::kConv ||
                          layer.kind == LayerKind::kDepthwiseConv ||
                          layer.kind == LayerKind::kFullyConnected || layer.kind == LayerKind::kAdd;
    // Fused only where the ReLU is the layer's one reader: a residual graph may read the
    // output before the ReLU too.
    if (xnnpack && can_fuse && i + 1 < layers.size() && layers[i + 1].kind == LayerKind::kRelu &&
        layers[i + 1].input == static_cast<int>(i) && readers_[i] == 1) {
      stage.fused_relu = true;
      stage.output = i + 1;
    }
    if (xnnpack) {
      const k::Activation activation = stage.fused_relu ? k::Activation::relu : k::Activation::none;
      switch (layer.kind) {
        case LayerKind::kConv:
          stage.conv =
              std::make_unique<k::Conv2dXnn>(conv_shape(layer, max_batch), activation, pool);
          break;
        case LayerKind::kFullyConnected:
          stage.fc = std::make_unique<k::FullyConnectedTrainXnn>(
              B, layer.in.size(), layer.out.size(), activation, pool);
          break;
        case LayerKind::kMaxPool:
          stage.pool = std::make_unique<k::MaxPool2x2Xnn>(max_batch, layer.in.H, layer.in.W,
                                                          layer.in.C, pool);
          break;
        case LayerKind::kDepthwiseConv:
          stage.dwconv = std::make_unique<k::DepthwiseConv2dXnn>(conv_shape(layer, max_batch),
                                                                 activation, pool);
          break;
        case LayerKind::kAvgPool:
          stage.avgpool = std::make_unique<k::AvgPoolXnn>(max_batch, layer.in.H, layer.in.W,
                                                          layer.in.C, layer.kernel, pool);
          break;
        case LayerKind::kGlobalAvgPool:
          stage.global_avgpool = std::make_unique<k::GlobalAvgPoolXnn>(
              max_batch, layer.in.H * layer.in.W, layer.in.C, pool);
          break;
        case LayerKind::kGroupNorm:
          stage.group_norm = std::make_unique<k::GroupNormOp>(max_batch, layer.in.H * layer.in.W,
                                                              layer.in.C, layer.groups);
          break;
        case LayerKind::kBatchNorm:
          stage.batch_norm =
              std::make_unique<k::BatchNormOp>(max_batch, layer.in.H * layer.in.W, layer.in.C);
          break;
        case LayerKind::kRelu:
        case LayerKind::kDropout:  // our loop, no operator
        case LayerKind::kAdd:      // our loop (one pass the compiler vectorizes)
        case LayerKind::kDeconv:   // refused above
          break;
      }
    }
    i = stage.output;
    stages_.push_back(std::move(stage));
  }
  input_.resize(B * model.input_shape().size());
  activations_.resize(layers.size());
  argmax_.resize(layers.size());
  producer_stage_.assign(layers.size(), -1);
  for (std::size_t s = 0; s < stages_.size(); s++) {
    const Stage& stage = stages_[s];
    producer_stage_[stage.output] = static_cast<int>(s);
    const std::size_t size = B * layers[stage.output].out.size();
    activations_[stage.output].resize(size);
    if (layers[stage.layer].kind == LayerKind::kMaxPool) argmax_[stage.layer].resize(size);
  }
  // Each stage output's gradient is live from the backward of its last reader down to its
  // own stage's: tensors taken in stage order get the first buffer free by then (optimal for
  // intervals), each buffer as large as the largest tensor it holds.
  std::vector<std::size_t> last_reader(stages_.size());
  for (std::size_t s = 0; s < stages_.size(); s++) {
    last_reader[s] = s;  // the last stage: read by the loss alone
    if (unpools_into_activation(s)) {
      const int producer = producer_stage_[layers[stages_[s].layer].input];
      stages_[producer].gradient_in_activation = true;
    }
  }
  for (std::size_t s = 0; s < stages_.size(); s++) {
    const ResolvedLayer& layer = layers[stages_[s].layer];
    for (int read : {layer.input, layer.kind == LayerKind::kAdd ? layer.added : -1})
      if (read >= 0) last_reader[producer_stage_[read]] = s;
  }
  std::vector<int> buffer_of(stages_.size(), -1);
  std::vector<std::size_t> buffer_free_after, buffer_size;
  std::size_t scratch = 0;
  for (std::size_t s = 0; s < stages_.size(); s++) {
    const std::size_t output = stages_[s].output;
    const std::size_t size = B * layers[output].out.size();
    if (readers_[output] > 1) scratch = std::max(scratch, size);
    if (stages_[s].gradient_in_activation) continue;
    std::size_t b = 0;
    while (b < buffer_size.size() && buffer_free_after[b] >= s) b++;
    if (b == buffer_size.size()) {
      buffer_size.push_back(0);
      buffer_free_after.push_back(0);
    }
    buffer_size[b] = std::max(buffer_size[b], size);
    buffer_free_after[b] = last_reader[s];
    buffer_of[s] = static_cast<int>(b);
  }
  gradient_buffers_.resize(buffer_size.size());
  for (std::size_t b = 0; b < buffer_size.size(); b++) gradient_buffers_[b].resize(buffer_size[b]);
  gradient_of_.assign(layers.size(), nullptr);
  for (std::size_t s = 0; s < stages_.size(); s++) {
    const std::size_t output = stages_[s].output;
    gradient_of_[output] = stages_[s].gradient_in_activation
                               ? activations_[output].data()
                               : gradient_buffers_[buffer_of[s]].data();
  }
  gradient_written_.assign(layers.size(), 0);
  gradient_scratch_.resize(scratch);
  probs_.resize(B * static_cast<std::size_t>(model.num_classes()));
  norm_mean_.resize(layers.size());
  norm_invstd_.resize(layers.size());
  running_offset_.assign(layers.size(), 0);
  for (std::size_t i = 0; i < layers.size(); i++) {
    const ResolvedLayer& layer = layers[i];
    if (layer.kind != LayerKind::kGroupNorm && layer.kind != LayerKind::kBatchNorm) continue;
    const std::size_t statistics = layer.kind == LayerKind::kGroupNorm
                                       ? B * static_cast<std::size_t>(layer.groups)
                                       : static_cast<std::size_t>(layer.in.C);
    if (!xnnpack) {
      norm_mean_[i].resize(statistics);
      norm_invstd_[i].resize(statistics);
    }
    if (layer.kind == LayerKind::kBatchNorm) {
      running_offset_[i] = running_statistics_.size();
      running_statistics_.insert(running_statistics_.end(), layer.in.C, 0.0f);  // mean
      running_statistics_.insert(running_statistics_.end(), layer.in.C, 1.0f);  // variance
    }
  }
  calibration_sums_.resize(running_statistics_.size());
}

Trainer::~Trainer() = default;

bool Trainer::unpools_into_activation(std::size_t s) const {
  if (s >= stages_.size() || !stages_[s].pool) return false;
  const int input = model_.layers()[stages_[s].layer].input;
  return input >= 0 && stages_[producer_stage_[input]].fused_relu && readers_[input] == 1;
}

std::uint64_t Trainer::dropout_seed(std::size_t layer) const {
  // One stream per layer: the step seed mixed with the layer's index, so two dropout layers
  // of one step (and one layer in two steps) draw unrelated masks.
  SplitMix64 mix{step_seed_ ^ (0x632be59bd9b4e019ULL * (layer + 1))};
  return mix.next();
}

BatchResult Trainer::forward(std::span<const float> params, const std::uint8_t* pixels,
                             const std::int32_t* labels, int count, bool training) {
  if (count < 1 || count > max_batch_) {
    throw std::invalid_argument("Trainer: batch of " + std::to_string(count) +
                                " examples, built for 1.." + std::to_string(max_batch_));
  }
  if (params.size() != model_.parameter_count())
    throw std::invalid_argument("Trainer: parameter count mismatch");
  const std::size_t N = model_.input_shape().size();
  const std::size_t given = static_cast<std::size_t>(count) * N;
  examples_to_input(input_format_, pixels, count, N, input_.data());
  const int rows = rows_for(count);
  // Padding rows are zero rather than left over from an earlier batch, so the step does not
  // depend on history (and stale values can never be non-finite).
  std::fill(input_.begin() + static_cast<std::ptrdiff_t>(given),
            input_.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(rows) * N), 0.0f);

  const auto& layers = model_.layers();
  const auto& tensors = model_.tensors();
  for (Stage& stage : stages_) {
    const ResolvedLayer& layer = layers[stage.layer];
    float* out = activations_[stage.output].data();
    const float* in = activation(layer.input);
    const float* weight =
        layer.weight_tensor >= 0 ? params.data() + tensors[layer.weight_tensor].offset : nullptr;
    const float* bias =
        layer.bias_tensor >= 0 ? params.data() + tensors[layer.bias_tensor].offset : nullptr;
    const bool reference = backend_ == KernelBackend::kReference;
    switch (layer.kind) {
      case LayerKind::kConv:
        if (reference) {
          k::conv2d_forward_reference(out, in, weight, bias, conv_shape(layer, rows));
        } else {
          stage.conv->forward(out, in, weight, bias);
        }
        break;
      case LayerKind::kMaxPool:
        if (reference) {
          k::maxpool2x2_forward_reference(out, argmax_[stage.layer].data(), in, rows, layer.in.H,
                                          layer.in.W, layer.in.C);
        } else {
          stage.pool->forward(out, argmax_[stage.layer].data(), in);
        }
        break;
      case LayerKind::kFullyConnected:
        if (reference) {
          k::fully_connected_forward_reference(out, in, weight, bias, rows, layer.in.size(),
                                               layer.out.size());
        } else {
          stage.fc->forward(out, in, weight, bias);
        }
        break;
      case LayerKind::kDepthwiseConv:
        if (reference) {
          k::depthwise_conv2d_forward_reference(out, in, weight, bias, conv_shape(layer, rows));
        } else {
          stage.dwconv->forward(out, in, weight, bias);
        }
        break;
      case LayerKind::kAvgPool:
        if (reference) {
          k::avgpool_forward_reference(out, in, rows, layer.in.H, layer.in.W, layer.in.C,
                                       layer.kernel);
        } else {
          stage.avgpool->forward(out, in);
        }
        break;
      case LayerKind::kGlobalAvgPool:
        if (reference) {
          k::global_avgpool_forward_reference(out, in, rows, layer.in.H * layer.in.W, layer.in.C);
        } else {
          stage.global_avgpool->forward(out, in);
        }
        break;
      case LayerKind::kDropout: {
        // Our loop on either backend (XNNPACK has no dropout); in evaluate() the identity.
        const std::size_t n = static_cast<std::size_t>(rows) * layer.out.size();
        if (training) {
          k::dropout_forward(out, in, n, layer.rate, dropout_seed(stage.layer));
        } else {
          std::memcpy(out, in, sizeof(float) * n);
        }
        break;
      }
      case LayerKind::kGroupNorm:
        if (reference) {
          k::group_norm_forward_reference(out, norm_mean_[stage.layer].data(),
                                          norm_invstd_[stage.layer].data(), in, weight, bias, rows,
                                          layer.in.H * layer.in.W, layer.in.C, layer.groups);
        } else {
          stage.group_norm->forward(out, in, weight, bias);
        }
        break;
      case LayerKind::kBatchNorm:
        batch_norm_forward(stage, out, in, weight, bias, rows, count, training);
        break;
      case LayerKind::kRelu:
        k::relu_forward(out, in, static_cast<std::size_t>(rows) * layer.out.size());
        break;
      case LayerKind::kAdd: {
        const std::size_t n = static_cast<std::size_t>(rows) * layer.out.size();
        k::add_forward(out, in, activation(layer.added), n);
        // A fused ReLU (XNNPACK backend) saves the pre-ReLU sum's buffer and a pass.
        if (stage.fused_relu) k::relu_forward(out, out, n);
        break;
      }
      case LayerKind::kDeconv:  // refused by the constructor
        break;
    }
  }
  BatchResult result;
  result.count = count;
  result.loss =
      k::softmax_cross_entropy_forward(probs_.data(), activations_[stages_.back().output].data(),
                                       labels, count, model_.num_classes(), &result.correct);
  return result;
}

std::span<const float> Trainer::logits(int count) const {
  const std::vector<float>& out = activations_[stages_.back().output];
  const std::size_t n = static_cast<std::size_t>(count) * static_cast<std::size_t>(model_.num_classes());
  if (count < 0 || n > out.size()) throw std::invalid_argument("Trainer::logits: count above the batch");
  return {out.data(), n};
}

void Trainer::batch_norm_forward(Stage& stage, float* out, const float* in, const float* gamma,
                                 const float* beta, int rows, int count, bool training) {
  const ResolvedLayer& layer = model_.layers()[stage.layer];
  const int HW = layer.in.H * layer.in.W, C = layer.in.C;
  float* running_mean = running_statistics_.data() + running_offset_[stage.layer];
  float* running_var = running_mean + C;
  if (!training && !calibrating_) {
    k::batch_norm_inference(out, in, gamma, beta, running_mean, running_var, rows, HW, C);
    return;
  }
  const float* mean;
  const float* invstd;
  if (backend_ == KernelBackend::kReference) {
    k::batch_norm_forward_reference(out, norm_mean_[stage.layer].data(),
                                    norm_invstd_[stage.layer].data(), in, gamma, beta, rows, HW, C);
    mean = norm_mean_[stage.layer].data();
    invstd = norm_invstd_[stage.layer].data();
  } else {
    stage.batch_norm->forward_training(out, in, gamma, beta, count);
    mean = stage.batch_norm->mean();
    invstd = stage.batch_norm->invstd();
  }
  const std::size_t positions = static_cast<std::size_t>(count) * HW;
  if (training) {
    k::batch_norm_update_running(running_mean, running_var, mean, invstd, C, positions);
    return;
  }
  // Calibrating: Σ x and Σ x² per channel, from the batch's mean and biased variance.
  double* sums = calibration_sums_.data() + running_offset_[stage.layer];
  for (int c = 0; c < C; c++) {
    const double m = mean[c];
    const double var =
        std::max(0.0, 1.0 / (static_cast<double>(invstd[c]) * invstd[c]) - k::kNormalizationEps);
    sums[c] += m * static_cast<double>(positions);
    sums[C + c] += (var + m * m) * static_cast<double>(positions);
  }
}

void Trainer::set_normalization_state(std::span<const float> state) {
  if (state.size() != running_statistics_.size())
    throw std::invalid_argument("Trainer: normalization state of " + std::to_string(state.size()) +
                                " values, model '" + model_.spec().name + "' has " +
                                std::to_string(running_statistics_.size()));
  std::copy(state.begin(), state.end(), running_statistics_.begin());
}

void Trainer::begin_normalization_calibration() {
  std::fill(calibration_sums_.begin(), calibration_sums_.end(), 0.0);
  calibrated_positions_ = 0;
}

void Trainer::calibrate_normalization(std::span<const float> params, const std::uint8_t* pixels,
                                      const std::int32_t* labels, int count) {
  if (!has_batch_norm()) return;
  calibrating_ = true;
  try {
    forward(params, pixels, labels, count, /*training=*/false);
  } catch (...) {
    calibrating_ = false;
    throw;
  }
  calibrating_ = false;
  calibrated_positions_ += static_cast<std::size_t>(count);
}

void Trainer::finish_normalization_calibration() {
  if (!has_batch_norm() || calibrated_positions_ == 0) return;
  const auto& layers = model_.layers();
  for (std::size_t i = 0; i < layers.size(); i++) {
    if (layers[i].kind != LayerKind::kBatchNorm) continue;
    const int C = layers[i].in.C;
    // calibrated_positions_ counts examples; each contributes H·W positions per channel.
    const double n = static_cast<double>(calibrated_positions_) * layers[i].in.H * layers[i].in.W;
    const double unbias = n > 1 ? n / (n - 1) : 1.0;
    const double* sums = calibration_sums_.data() + running_offset_[i];
    float* running = running_statistics_.data() + running_offset_[i];
    for (int c = 0; c < C; c++) {
      const double mean = sums[c] / n;
      running[c] = static_cast<float>(mean);
      running[C + c] = static_cast<float>(std::max(0.0, sums[C + c] / n - mean * mean) * unbias);
    }
  }
}

void Trainer::set_dropout(const DropoutConfig& config) {
  dropout_ = std::make_unique<FilterDropout>(model_, config, max_batch_, backend_, pool_);
  dropout_->sub_trainer().set_input_format(input_format_);
}

void Trainer::set_input_format(const InputFormat& format) {
  input_format_ = format;
  if (dropout_) dropout_->sub_trainer().set_input_format(format);
}

void Trainer::clear_dropout() { dropout_.reset(); }

BatchResult Trainer::evaluate(std::span<const float> params, const std::uint8_t* pixels,
                              const std::int32_t* labels, int count) {
  return forward(params, pixels, labels, count, /*training=*/false);
}

BatchResult Trainer::compute_gradient(std::span<const float> params, const std::uint8_t* pixels,
                                      const std::int32_t* labels, int count,
                                      std::span<float> grad) {
  if (grad.size() != model_.parameter_count())
    throw std::invalid_argument("Trainer: gradient size mismatch");
  if (dropout_) {
    dropout_->draw();
    return dropout_->compute_gradient_for_current_draw(params, pixels, labels, count, grad);
  }
  BatchResult result = forward(params, pixels, labels, count, /*training=*/true);
  const auto& layers = model_.layers();
  const auto& tensors = model_.tensors();
  const int rows = rows_for(count);
  const std::size_t classes = static_cast<std::size_t>(model_.num_classes());
  std::fill(gradient_written_.begin(), gradient_written_.end(), 0);
  float* dlogits = gradient_of_[stages_.back().output];
  k::softmax_cross_entropy_backward(dlogits, probs_.data(), labels, count, model_.num_classes());
  // Padding rows get a zero loss gradient: every parameter gradient is a sum over rows of
  // (gradient row) x (activation row), so they contribute exactly nothing.
  std::fill(dlogits + static_cast<std::ptrdiff_t>(count * classes),
            dlogits + static_cast<std::ptrdiff_t>(rows * classes), 0.0f);

  for (std::size_t s = stages_.size(); s-- > 0;) {
    Stage& stage = stages_[s];
    const ResolvedLayer& layer = layers[stage.layer];
    // A stage's output gradient: summed by its readers' backwards (all later stages), or,
    // for a fused ReLU before a max pool, unpooled where its output was, masked already.
    const bool pooled = stage.gradient_in_activation;
    float* dout = gradient_of_[stage.output];
    const float* out = activations_[stage.output].data();
    // The model's input needs no gradient. A tensor another reader has given its gradient
    // already gets this one in the scratch, added below.
    const int input = layer.input;
    const bool accumulate = input >= 0 && gradient_written_[input];
    float* dinp = input < 0 ? nullptr : accumulate ? gradient_scratch_.data() : gradient_of_[input];
    const float* in = activation(input);
    const float* weight =
        layer.weight_tensor >= 0 ? params.data() + tensors[layer.weight_tensor].offset : nullptr;
    float* dweight =
        layer.weight_tensor >= 0 ? grad.data() + tensors[layer.weight_tensor].offset : nullptr;
    float* dbias =
        layer.bias_tensor >= 0 ? grad.data() + tensors[layer.bias_tensor].offset : nullptr;
    const bool reference = backend_ == KernelBackend::kReference;
    switch (layer.kind) {
      case LayerKind::kConv:
        if (reference) {
          k::conv2d_backward_reference(dinp, dweight, dbias, dout, in, weight,
                                       conv_shape(layer, rows));
        } else {
          // The stage's gradient buffer is not read again: masked in place (or before the
          // max pool's backward, when it was pooled into the output's buffer).
          stage.conv->backward_overwriting_dout(dinp, dweight, dbias, dout,
                                                stage.fused_relu && !pooled ? out : nullptr, in,
                                                weight);
        }
        break;
      case LayerKind::kMaxPool:
        if (!dinp) break;
        if (reference) {
          k::maxpool2x2_backward_reference(dinp, dout, argmax_[stage.layer].data(), rows,
                                           layer.in.H, layer.in.W, layer.in.C);
        } else {
          if (unpools_into_activation(s)) {
            // The stage before is a conv (or fc) with its ReLU fused, whose output only that
            // ReLU's mask still needs. Where a pooled gradient lands, the input is the window's
            // maximum, equal to this stage's output: masking the pooled gradient by this
            // output > 0 and unpooling gives exactly the masked gradient, written over the
            // conv's output (its gradient buffer needs no room: 1.5 MB for the paper CNN).
            k::relu_backward(dout, dout, out, static_cast<std::size_t>(rows) * layer.out.size());
          }
          stage.pool->backward(dinp, dout, argmax_[stage.layer].data());
        }
        break;
      case LayerKind::kFullyConnected:
        if (reference) {
          k::fully_connected_backward_reference(dinp, dweight, dbias, dout, in, weight, rows,
                                                layer.in.size(), layer.out.size());
        } else {
          stage.fc->backward(dinp, dweight, dbias, dout, stage.fused_relu ? out : nullptr, in,
                             weight);
        }
        break;
      case LayerKind::kDepthwiseConv:
        if (reference) {
          k::depthwise_conv2d_backward_reference(dinp, dweight, dbias, dout, in, weight,
                                                 conv_shape(layer, rows));
        } else {
          stage.dwconv->backward_overwriting_dout(
              dinp, dweight, dbias, dout, stage.fused_relu && !pooled ? out : nullptr, in, weight);
        }
        break;
      case LayerKind::kAvgPool:
        if (!dinp) break;
        if (reference) {
          k::avgpool_backward_reference(dinp, dout, rows, layer.in.H, layer.in.W, layer.in.C,
                                        layer.kernel);
        } else {
          stage.avgpool->backward(dinp, dout);
        }
        break;
      case LayerKind::kGlobalAvgPool:
        if (!dinp) break;
        if (reference) {
          k::global_avgpool_backward_reference(dinp, dout, rows, layer.in.H * layer.in.W,
                                               layer.in.C);
        } else {
          stage.global_avgpool->backward(dinp, dout);
        }
        break;
      case LayerKind::kDropout:
        if (dinp)
          k::dropout_backward(dinp, dout, static_cast<std::size_t>(rows) * layer.out.size(),
                              layer.rate, dropout_seed(stage.layer));
        break;
      case LayerKind::kGroupNorm:
        if (reference) {
          k::group_norm_backward_reference(dinp, dweight, dbias, dout, in,
                                           norm_mean_[stage.layer].data(),
                                           norm_invstd_[stage.layer].data(), weight, rows,
                                           layer.in.H * layer.in.W, layer.in.C, layer.groups);
        } else {
          stage.group_norm->backward(dinp, dweight, dbias, dout, in, weight);
        }
        break;
      case LayerKind::kBatchNorm:
        if (reference) {
          // rows == count on this backend: the statistics are over exactly the batch.
          k::batch_norm_backward_reference(
              dinp, dweight, dbias, dout, in, norm_mean_[stage.layer].data(),
              norm_invstd_[stage.layer].data(), weight, rows, layer.in.H * layer.in.W, layer.in.C);
        } else {
          stage.batch_norm->backward(dinp, dweight, dbias, dout, in, weight, count);
        }
        break;
      case LayerKind::kRelu:
        if (dinp)
          k::relu_backward(dinp, dout, out, static_cast<std::size_t>(rows) * layer.out.size());
        break;
      case LayerKind::kAdd: {
        // d(a + b)/da = d(a + b)/db = 1: dout goes to both summands (twice to one read twice),
        // masked first by a fused ReLU's output (in place: the buffer is not read again).
        const std::size_t n = static_cast<std::size_t>(rows) * layer.out.size();
        if (stage.fused_relu && !pooled) k::relu_backward(dout, dout, out, n);
        for (int summand : {layer.input, layer.added}) {
          if (summand < 0) continue;
          if (gradient_written_[summand]) {
            k::accumulate(gradient_of_[summand], dout, n);
          } else {
            std::memcpy(gradient_of_[summand], dout, sizeof(float) * n);
            gradient_written_[summand] = 1;
          }
        }
        continue;
      }
      case LayerKind::kDeconv:  // refused by the constructor
        break;
    }
    if (input >= 0) {
      if (accumulate)
        k::accumulate(gradient_of_[input], gradient_scratch_.data(),
                      static_cast<std::size_t>(rows) * layer.in.size());
      gradient_written_[input] = 1;
    }
  }
  SplitMix64 next{step_seed_};
  step_seed_ = next.next();  // the next step's masks
  return result;
}

}  // namespace edgetrain::runtime
