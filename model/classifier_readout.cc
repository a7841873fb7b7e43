#include "model/classifier_readout.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/normalization.h"
#include "kernels/reference.h"

namespace edgetrain::runtime {
namespace k = kernels;

ClassifierReadout::ClassifierReadout(const Model& model, int max_batch)
    : model_(model), max_batch_(max_batch) {
  const auto& layers = model.layers();
  if (layers.empty() || layers.back().kind != LayerKind::kFullyConnected)
    throw std::invalid_argument(
        "classifier readout: the model's last layer must be fully connected");
  if (max_batch < 1) throw std::invalid_argument("classifier readout: batch must be at least 1");
  if (model.is_graph())
    throw std::invalid_argument("classifier readout: model '" + model.spec().name +
                                "' has residual connections (add/from), which it does not run");
  for (const auto& layer : layers)
    if (layer.kind == LayerKind::kDeconv)
      throw std::invalid_argument("classifier readout: a classifier has no deconv layers");
  for (const auto& layer : layers)
    if (layer.kind == LayerKind::kBatchNorm)
      throw std::invalid_argument(
          "classifier readout: batchnorm needs running statistics, which a readout of "
          "parameters alone does not have (model/README.md, \"Normalization state\")");
  feature_size_ = static_cast<int>(layers.back().in.size());
  std::size_t pool_outputs = 0, group_statistics = 0;
  for (const auto& layer : layers) {
    buffers_.emplace_back(static_cast<std::size_t>(max_batch) * layer.out.size());
    if (layer.kind == LayerKind::kMaxPool) pool_outputs = std::max(pool_outputs, layer.out.size());
    if (layer.kind == LayerKind::kGroupNorm)
      group_statistics = std::max(group_statistics, static_cast<std::size_t>(layer.groups));
  }
  input_.resize(static_cast<std::size_t>(max_batch) * model.input_shape().size());
  argmax_.resize(static_cast<std::size_t>(max_batch) * pool_outputs);
  group_mean_.resize(static_cast<std::size_t>(max_batch) * group_statistics);
  group_invstd_.resize(group_mean_.size());
}

void ClassifierReadout::read(std::span<const float> params, const std::uint8_t* pixels, int count,
                             float* probs, float* features) {
  if (params.size() != model_.parameter_count())
    throw std::invalid_argument("classifier readout: parameters of another model");
  const auto& layers = model_.layers();
  const auto& tensors = model_.tensors();
  const std::size_t N = model_.input_shape().size();
  const int classes = model_.num_classes();
  for (int first = 0; first < count; first += max_batch_) {
    const int rows = std::min(max_batch_, count - first);
    for (std::size_t i = 0; i < static_cast<std::size_t>(rows) * N; i++)
      input_[i] = static_cast<float>(pixels[static_cast<std::size_t>(first) * N + i]);
    k::standardize_per_image(input_.data(), input_.data(), rows, static_cast<int>(N));
    const float* in = input_.data();
    for (std::size_t l = 0; l < layers.size(); l++) {
      const ResolvedLayer& layer = layers[l];
      float* out = buffers_[l].data();
      const float* weight =
          layer.weight_tensor >= 0 ? params.data() + tensors[layer.weight_tensor].offset : nullptr;
      const float* bias =
          layer.bias_tensor >= 0 ? params.data() + tensors[layer.bias_tensor].offset : nullptr;
      if (l + 1 == layers.size() && features)
        std::copy(in, in + static_cast<std::size_t>(rows) * feature_size_,
                  features + static_cast<std::size_t>(first) * feature_size_);
      switch (layer.kind) {
        case LayerKind::kConv:
          k::conv2d_forward_reference(
              out, in, weight, bias,
              k::Conv2dShape{rows, layer.in.H, layer.in.W, layer.in.C, layer.out.C, layer.kernel_h,
                             layer.kernel, layer.stride, layer.pad});
          break;
        case LayerKind::kMaxPool:
          k::maxpool2x2_forward_reference(out, argmax_.data(), in, rows, layer.in.H, layer.in.W,
                                          layer.in.C);
          break;
        case LayerKind::kFullyConnected:
          k::fully_connected_forward_reference(out, in, weight, bias, rows, layer.in.size(),
                                               layer.out.size());
          break;
        case LayerKind::kDepthwiseConv:
          k::depthwise_conv2d_forward_reference(
              out, in, weight, bias,
              k::Conv2dShape{rows, layer.in.H, layer.in.W, layer.in.C, layer.out.C, layer.kernel_h,
                             layer.kernel, layer.stride, layer.pad});
          break;
        case LayerKind::kAvgPool:
          k::avgpool_forward_reference(out, in, rows, layer.in.H, layer.in.W, layer.in.C,
                                       layer.kernel);
          break;
        case LayerKind::kGlobalAvgPool:
          k::global_avgpool_forward_reference(out, in, rows, layer.in.H * layer.in.W, layer.in.C);
          break;
        case LayerKind::kDropout:  // the identity when evaluating
          std::copy(in, in + static_cast<std::size_t>(rows) * layer.out.size(), out);
          break;
        case LayerKind::kGroupNorm:
          k::group_norm_forward_reference(out, group_mean_.data(), group_invstd_.data(), in, weight,
                                          bias, rows, layer.in.H * layer.in.W, layer.in.C,
                                          layer.groups);
          break;
        case LayerKind::kBatchNorm:  // refused by the constructor
          break;
        case LayerKind::kRelu:
          k::relu_forward(out, in, static_cast<std::size_t>(rows) * layer.out.size());
          break;
        case LayerKind::kDeconv:  // refused by the constructor
        case LayerKind::kAdd:
          break;
      }
      in = out;
    }
    if (!probs) continue;
    for (int r = 0; r < rows; r++) {
      const float* logits = in + static_cast<std::size_t>(r) * classes;
      float* p = probs + static_cast<std::size_t>(first + r) * classes;
      const float top = *std::max_element(logits, logits + classes);
      double total = 0;
      for (int c = 0; c < classes; c++) total += std::exp(static_cast<double>(logits[c] - top));
      for (int c = 0; c < classes; c++)
        p[c] = static_cast<float>(std::exp(static_cast<double>(logits[c] - top)) / total);
    }
  }
}

double mnist_score(const float* probs, int count, int classes) {
  if (count < 1) throw std::invalid_argument("mnist score: no samples");
  std::vector<double> marginal(classes, 0.0);
  for (int i = 0; i < count; i++)
    for (int c = 0; c < classes; c++)
      marginal[c] += probs[static_cast<std::size_t>(i) * classes + c] / count;
  double kl = 0;
  for (int i = 0; i < count; i++)
    for (int c = 0; c < classes; c++) {
      const double p = probs[static_cast<std::size_t>(i) * classes + c];
      if (p > 0 && marginal[c] > 0) kl += p * std::log(p / marginal[c]);
    }
  return std::exp(kl / count);
}

void symmetric_eigen(std::vector<double> a, int n, std::vector<double>& values,
                     std::vector<double>& vectors) {
  vectors.assign(static_cast<std::size_t>(n) * n, 0.0);
  for (int i = 0; i < n; i++) vectors[static_cast<std::size_t>(i) * n + i] = 1.0;
  auto at = [n](std::vector<double>& m, int r, int c) -> double& {
    return m[static_cast<std::size_t>(r) * n + c];
  };
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0, total = 0;
    for (int r = 0; r < n; r++)
      for (int c = 0; c < n; c++) (r == c ? total : off) += at(a, r, c) * at(a, r, c);
    if (off <= 1e-22 * (total + off) || off == 0) break;
    for (int p = 0; p < n - 1; p++)
      for (int q = p + 1; q < n; q++) {
        const double apq = at(a, p, q);
        if (apq == 0) continue;
        const double theta = (at(a, q, q) - at(a, p, p)) / (2 * apq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double cs = 1 / std::sqrt(t * t + 1), sn = t * cs;
        for (int r = 0; r < n; r++) {  // columns p, q
          const double arp = at(a, r, p), arq = at(a, r, q);
          at(a, r, p) = cs * arp - sn * arq;
          at(a, r, q) = sn * arp + cs * arq;
        }
        for (int c = 0; c < n; c++) {  // rows p, q
          const double apc = at(a, p, c), aqc = at(a, q, c);
          at(a, p, c) = cs * apc - sn * aqc;
          at(a, q, c) = sn * apc + cs * aqc;
        }
        for (int r = 0; r < n; r++) {
          const double vrp = at(vectors, r, p), vrq = at(vectors, r, q);
          at(vectors, r, p) = cs * vrp - sn * vrq;
          at(vectors, r, q) = sn * vrp + cs * vrq;
        }
      }
  }
  values.resize(n);
  for (int i = 0; i < n; i++) values[i] = at(a, i, i);
}

namespace {

void mean_and_covariance(const float* rows, int count, int dim, std::vector<double>& mean,
                         std::vector<double>& cov) {
  if (count < 2) throw std::invalid_argument("frechet distance: needs at least two rows per set");
  mean.assign(dim, 0.0);
  for (int i = 0; i < count; i++)
    for (int d = 0; d < dim; d++) mean[d] += rows[static_cast<std::size_t>(i) * dim + d];
  for (auto& m : mean) m /= count;
  cov.assign(static_cast<std::size_t>(dim) * dim, 0.0);
  std::vector<double> centered(dim);
  for (int i = 0; i < count; i++) {
    for (int d = 0; d < dim; d++)
      centered[d] = rows[static_cast<std::size_t>(i) * dim + d] - mean[d];
    for (int r = 0; r < dim; r++)
      for (int c = 0; c < dim; c++)
        cov[static_cast<std::size_t>(r) * dim + c] += centered[r] * centered[c];
  }
  for (auto& v : cov) v /= count - 1;
}

// V diag(f(λ)) Vᵀ
std::vector<double> apply_to_eigenvalues(const std::vector<double>& values,
                                         const std::vector<double>& vectors, int n,
                                         double (*f)(double)) {
  std::vector<double> out(static_cast<std::size_t>(n) * n, 0.0);
  for (int j = 0; j < n; j++) {
    const double fj = f(values[j]);
    for (int r = 0; r < n; r++)
      for (int c = 0; c < n; c++)
        out[static_cast<std::size_t>(r) * n + c] += vectors[static_cast<std::size_t>(r) * n + j] *
                                                    fj *
                                                    vectors[static_cast<std::size_t>(c) * n + j];
  }
  return out;
}

double clamped_sqrt(double x) { return std::sqrt(std::max(x, 0.0)); }

}  // namespace

double frechet_distance(const float* a, int count_a, const float* b, int count_b, int dim) {
  std::vector<double> mean_a, cov_a, mean_b, cov_b;
  mean_and_covariance(a, count_a, dim, mean_a, cov_a);
  mean_and_covariance(b, count_b, dim, mean_b, cov_b);
  double distance = 0;
  for (int d = 0; d < dim; d++) distance += (mean_a[d] - mean_b[d]) * (mean_a[d] - mean_b[d]);
  for (int d = 0; d < dim; d++)
    distance +=
        cov_a[static_cast<std::size_t>(d) * dim + d] + cov_b[static_cast<std::size_t>(d) * dim + d];
  std::vector<double> values, vectors;
  symmetric_eigen(cov_a, dim, values, vectors);
  const std::vector<double> root_a = apply_to_eigenvalues(values, vectors, dim, clamped_sqrt);
  // M = Σa^½ Σb Σa^½, symmetric positive semi-definite: Tr(M^½) = Σ √μ.
  std::vector<double> tmp(static_cast<std::size_t>(dim) * dim, 0.0),
      m(static_cast<std::size_t>(dim) * dim, 0.0);
  for (int r = 0; r < dim; r++)
    for (int k = 0; k < dim; k++) {
      const double x = root_a[static_cast<std::size_t>(r) * dim + k];
      for (int c = 0; c < dim; c++)
        tmp[static_cast<std::size_t>(r) * dim + c] +=
            x * cov_b[static_cast<std::size_t>(k) * dim + c];
    }
  for (int r = 0; r < dim; r++)
    for (int k = 0; k < dim; k++) {
      const double x = tmp[static_cast<std::size_t>(r) * dim + k];
      for (int c = 0; c < dim; c++)
        m[static_cast<std::size_t>(r) * dim + c] +=
            x * root_a[static_cast<std::size_t>(k) * dim + c];
    }
  for (int r = 0; r < dim; r++)  // symmetric up to rounding: make it exactly so for Jacobi
    for (int c = r + 1; c < dim; c++) {
      const double s = 0.5 * (m[static_cast<std::size_t>(r) * dim + c] +
                              m[static_cast<std::size_t>(c) * dim + r]);
      m[static_cast<std::size_t>(r) * dim + c] = m[static_cast<std::size_t>(c) * dim + r] = s;
    }
  symmetric_eigen(m, dim, values, vectors);
  double trace_root = 0;
  for (double v : values) trace_root += clamped_sqrt(v);
  return distance - 2 * trace_root;
}

GanJudge::GanJudge(const Model& classifier, const std::uint8_t* reference_pixels,
                   int reference_count)
    : model_(classifier), readout_(model_) {
  if (reference_count < 2)
    throw std::invalid_argument("GAN scores: at least two reference images are needed");
  reference_features_.resize(static_cast<std::size_t>(reference_count) * readout_.feature_size());
  readout_.read(model_.parameters(), reference_pixels, reference_count, nullptr,
                reference_features_.data());
}

GanScores GanJudge::score(const std::uint8_t* pixels, const std::int32_t* labels, int count) {
  const int classes = readout_.classes();
  probs_.resize(static_cast<std::size_t>(count) * classes);
  features_.resize(static_cast<std::size_t>(count) * readout_.feature_size());
  readout_.read(model_.parameters(), pixels, count, probs_.data(), features_.data());
  GanScores scores;
  scores.mnist_score = mnist_score(probs_.data(), count, classes);
  scores.frechet_distance =
      frechet_distance(features_.data(), count, reference_features_.data(),
                       static_cast<int>(reference_features_.size() / readout_.feature_size()),
                       readout_.feature_size());
  int correct = 0;
  for (int i = 0; i < count; i++) {
    const float* row = probs_.data() + static_cast<std::size_t>(i) * classes;
    correct += (std::max_element(row, row + classes) - row) == labels[i];
  }
  scores.conditional_accuracy = count ? static_cast<double>(correct) / count : 0.0;
  return scores;
}

}  // namespace edgetrain::runtime
