#include "model/filter_dropout.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace edgetrain::runtime {

DropoutRescale parse_dropout_rescale(const std::string& text) {
  if (text == "inverted") return DropoutRescale::kInverted;
  if (text == "none") return DropoutRescale::kNone;
  throw std::invalid_argument("dropout rescale '" + text + "': expected inverted or none");
}

const char* dropout_rescale_name(DropoutRescale rescale) {
  return rescale == DropoutRescale::kInverted ? "inverted" : "none";
}

std::vector<float> parse_drop_rates(const std::string& text) {
  std::vector<float> rates;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    std::size_t used = 0;
    float rate = 0;
    try {
      rate = std::stof(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || item.find_first_not_of(" \t", used) != std::string::npos) {
      throw std::invalid_argument("drop rate '" + item + "' in '" + text + "' is not a number");
    }
    rates.push_back(rate);
  }
  if (rates.empty())
    throw std::invalid_argument(
        "empty drop-rate vector (give one rate per conv layer, e.g. 0.25,0.5)");
  return rates;
}

std::string format_drop_rates(std::span<const float> rates) {
  std::ostringstream out;
  for (std::size_t i = 0; i < rates.size(); i++) out << (i ? "," : "") << rates[i];
  return out.str();
}

int conv_layer_count(const Model& model) {
  return static_cast<int>(
      std::count_if(model.layers().begin(), model.layers().end(),
                    [](const ResolvedLayer& l) { return l.kind == LayerKind::kConv; }));
}

int kept_filter_count(int out_channels, float rate) {
  return std::max(1,
                  static_cast<int>(std::lround(out_channels * (1.0 - static_cast<double>(rate)))));
}

void validate_drop_rates(const Model& model, std::span<const float> rates) {
  // Our choice (DISTREAL's paper thins plain conv stacks only): a layer whose channels a
  // dropped filter cannot be cut from consistently is refused, naming its statement, rather
  // than a wrong sub-network trained. A depthwise layer's filters follow its input channels
  // one to one, so a dropped conv filter would have to drop a depthwise filter too; a
  // residual add (and a `from` branch) needs both summands to keep the same filters; a
  // conv1d's sub-network would need its 1-D kernel carried over; a normalization layer's
  // groups and gamma/beta follow the channels, so a dropped filter would change what its
  // statistics are taken over. The gather and scatter below do none of that yet. Average
  // pools need nothing: they keep channels as a max pool does.
  for (const LayerSpec& layer : model.spec().layers) {
    const char* what = nullptr;
    if (layer.kind == LayerKind::kAdd)
      what = "a residual connection (add)";
    else if (!layer.from.empty())
      what = "a branch of a residual block (from)";
    else if (layer.kind == LayerKind::kConv && layer.one_d)
      what = "a conv1d layer";
    else if (layer.kind == LayerKind::kDepthwiseConv)
      what = "a depthwise convolution (dwconv)";
    else if (layer.kind == LayerKind::kGroupNorm)
      what = "a normalization layer (groupnorm)";
    else if (layer.kind == LayerKind::kBatchNorm)
      what = "a normalization layer (batchnorm)";
    if (what == nullptr) continue;
    throw std::invalid_argument(
        "dropout: model '" + model.spec().name + "', statement '" + layer.statement + "': " + what +
        "; filter dropout (DISTREAL) thins plain conv, pool and fc stacks only (no residual "
        "connections, dwconv, conv1d or normalization layers yet): train this model without "
        "drop rates or a dropout table");
  }
  if (model.is_graph())  // every graph has an add or a from above; kept as the last guard
    throw std::invalid_argument("dropout: model '" + model.spec().name +
                                "' has residual connections; filter dropout does not support them");
  const int convs = conv_layer_count(model);
  if (static_cast<int>(rates.size()) != convs) {
    throw std::invalid_argument("dropout: " + std::to_string(rates.size()) +
                                " drop rate(s) given, but model '" + model.spec().name + "' has " +
                                std::to_string(convs) +
                                " conv layer(s); give one rate per conv layer");
  }
  for (std::size_t i = 0; i < rates.size(); i++) {
    if (!(rates[i] >= 0.0f && rates[i] < 1.0f)) {  // also refuses NaN
      throw std::invalid_argument("dropout: drop rate " + std::to_string(rates[i]) +
                                  " of conv layer " + std::to_string(i + 1) + " is outside [0, 1)");
    }
  }
}

ModelSpec sub_network_spec(const Model& model, std::span<const float> rates) {
  validate_drop_rates(model, rates);
  ModelSpec spec = model.spec();
  std::size_t conv = 0;
  for (LayerSpec& layer : spec.layers) {
    if (layer.kind != LayerKind::kConv) continue;
    layer.out_channels = kept_filter_count(layer.out_channels, rates[conv++]);
  }
  spec.name += "/dropout " + format_drop_rates(rates);
  return spec;
}

double forward_macs(const Model& model) {
  double macs = 0;
  for (const ResolvedLayer& l : model.layers()) {
    if (l.kind == LayerKind::kConv) {
      macs += static_cast<double>(l.out.size()) * l.kernel * l.kernel * l.in.C;
    } else if (l.kind == LayerKind::kFullyConnected) {
      macs += static_cast<double>(l.in.size()) * l.out.size();
    } else if (l.kind == LayerKind::kDepthwiseConv) {
      macs += static_cast<double>(l.out.size()) * l.kernel * l.kernel;
    } else if (l.kind == LayerKind::kDeconv) {
      macs += static_cast<double>(l.in.size()) * l.kernel * l.kernel * l.out.C;
    }
  }
  return macs;
}

FilterDropout::FilterDropout(const Model& model, DropoutConfig config, int max_batch,
                             KernelBackend backend, pthreadpool_t pool)
    : model_(model), config_(std::move(config)), rng_{config_.seed} {
  sub_model_ =
      std::make_unique<Model>(sub_network_spec(model, config_.conv_drop_rates));  // validates
  sub_trainer_ = std::make_unique<Trainer>(*sub_model_, max_batch, backend, pool);
  for (const ResolvedLayer& layer : model.layers()) {
    if (layer.kind != LayerKind::kConv) continue;
    const int OC = layer.out.C;
    const int kept = kept_filter_count(OC, config_.conv_drop_rates[kept_.size()]);
    order_.emplace_back(OC);
    std::iota(order_.back().begin(), order_.back().end(), 0u);
    kept_.emplace_back(order_.back().begin(), order_.back().begin() + kept);
    const bool inverted = config_.rescale == DropoutRescale::kInverted;
    layer_scale_.push_back(inverted ? static_cast<float>(OC) / static_cast<float>(kept) : 1.0f);
  }
  sub_params_.resize(sub_model_->parameter_count());
  sub_grad_.resize(sub_model_->parameter_count());
}

FilterDropout::~FilterDropout() = default;

std::span<const std::uint32_t> FilterDropout::kept_filters(int conv_index) const {
  return kept_.at(conv_index);
}

void FilterDropout::draw() {
  for (std::size_t c = 0; c < kept_.size(); c++) {
    std::vector<std::uint32_t>& order = order_[c];
    const std::size_t n = order.size(), k = kept_[c].size();
    // Partial Fisher-Yates: the first k entries become a uniform random k-subset.
    for (std::size_t j = 0; j < k; j++) {
      const std::size_t pick =
          j + static_cast<std::size_t>(rng_.uniform_double() * static_cast<double>(n - j));
      std::swap(order[j], order[std::min(pick, n - 1)]);
    }
    std::copy(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), kept_[c].begin());
    std::sort(kept_[c].begin(), kept_[c].end());
  }
}

// Calls f(full, sub, kept, n, scale) for every run of the mapping between the arenas:
// compact entries sub..sub+n-1 are full entries full + kept[c] (kept null: full + c),
// scaled by `scale` in the sub-network. Runs are the innermost channel axis (conv: per
// kept filter and tap; fc: per output and input position), so each is short and the
// kept list stays in L1; no per-entry index is stored or rebuilt.
template <class F>
void FilterDropout::for_each_run(F&& f) const {
  const auto& full_layers = model_.layers();
  const auto& sub_layers = sub_model_->layers();
  const auto& full_tensors = model_.tensors();
  const auto& sub_tensors = sub_model_->tensors();
  const std::uint32_t* channels = nullptr;  // kept filters feeding the current layer; null: all
  std::size_t conv = 0;
  for (std::size_t i = 0; i < full_layers.size(); i++) {
    const ResolvedLayer& full = full_layers[i];
    const ResolvedLayer& sub = sub_layers[i];
    if (full.kind != LayerKind::kConv && full.kind != LayerKind::kFullyConnected) continue;
    const std::size_t w_full = full_tensors[full.weight_tensor].offset,
                      w_sub = sub_tensors[sub.weight_tensor].offset;
    const std::size_t C = full.in.C, sub_C = sub.in.C;
    if (full.kind == LayerKind::kConv) {
      const std::vector<std::uint32_t>& out_kept = kept_[conv];
      const float scale = layer_scale_[conv];
      const std::size_t taps = static_cast<std::size_t>(full.kernel) * full.kernel;
      for (std::size_t o = 0; o < out_kept.size(); o++)
        for (std::size_t t = 0; t < taps; t++)
          f(w_full + (out_kept[o] * taps + t) * C, w_sub + (o * taps + t) * sub_C, channels, sub_C,
            scale);
      if (sub.bias_tensor >= 0) {
        f(full_tensors[full.bias_tensor].offset, sub_tensors[sub.bias_tensor].offset,
          out_kept.data(), out_kept.size(), scale);
      }
      channels = out_kept.data();
      conv++;
    } else {
      // Columns are the NHWC positions (h, w, c) of the input; only the channels thin out.
      const std::size_t positions = static_cast<std::size_t>(full.in.H) * full.in.W,
                        OC = full.out.size();
      for (std::size_t o = 0; o < OC; o++)
        for (std::size_t p = 0; p < positions; p++)
          f(w_full + (o * positions + p) * C, w_sub + (o * positions + p) * sub_C, channels, sub_C,
            1.0f);
      if (sub.bias_tensor >= 0) {
        f(full_tensors[full.bias_tensor].offset, sub_tensors[sub.bias_tensor].offset, nullptr, OC,
          1.0f);
      }
      channels = nullptr;
    }
  }
}

BatchResult FilterDropout::compute_gradient_for_current_draw(std::span<const float> params,
                                                             const std::uint8_t* pixels,
                                                             const std::int32_t* labels, int count,
                                                             std::span<float> grad) {
  if (params.size() != model_.parameter_count() || grad.size() != model_.parameter_count()) {
    throw std::invalid_argument("FilterDropout: parameter or gradient size mismatch");
  }
  float* __restrict sub_params = sub_params_.data();
  const float* full_params = params.data();
  for_each_run([&](std::size_t full, std::size_t sub, const std::uint32_t* kept, std::size_t n,
                   float scale) {
    if (kept) {
      for (std::size_t c = 0; c < n; c++) sub_params[sub + c] = scale * full_params[full + kept[c]];
    } else {
      for (std::size_t c = 0; c < n; c++) sub_params[sub + c] = scale * full_params[full + c];
    }
  });
  const BatchResult result =
      sub_trainer_->compute_gradient(sub_params_, pixels, labels, count, sub_grad_);
  std::fill(grad.begin(), grad.end(), 0.0f);  // everything dropped stays exactly zero
  float* __restrict full_grad = grad.data();
  const float* sub_grad = sub_grad_.data();
  for_each_run([&](std::size_t full, std::size_t sub, const std::uint32_t* kept, std::size_t n,
                   float scale) {
    if (kept) {
      for (std::size_t c = 0; c < n; c++) full_grad[full + kept[c]] = scale * sub_grad[sub + c];
    } else {
      for (std::size_t c = 0; c < n; c++) full_grad[full + c] = scale * sub_grad[sub + c];
    }
  });
  return result;
}

}  // namespace edgetrain::runtime
