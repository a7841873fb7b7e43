#include "runtime/filter_dropout.h"

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
  if (rates.empty()) throw std::invalid_argument("empty drop-rate vector (give one rate per conv layer, e.g. 0.25,0.5)");
  return rates;
}

std::string format_drop_rates(std::span<const float> rates) {
  std::ostringstream out;
  for (std::size_t i = 0; i < rates.size(); i++) out << (i ? "," : "") << rates[i];
  return out.str();
}

int conv_layer_count(const Model& model) {
  return static_cast<int>(std::count_if(model.layers().begin(), model.layers().end(),
                                        [](const ResolvedLayer& l) { return l.kind == LayerKind::kConv; }));
}

int kept_filter_count(int out_channels, float rate) {
  return std::max(1, static_cast<int>(std::lround(out_channels * (1.0 - static_cast<double>(rate)))));
}

void validate_drop_rates(const Model& model, std::span<const float> rates) {
  const int convs = conv_layer_count(model);
  if (static_cast<int>(rates.size()) != convs) {
    throw std::invalid_argument("dropout: " + std::to_string(rates.size()) + " drop rate(s) given, but model '" +
                                model.spec().name + "' has " + std::to_string(convs) +
                                " conv layer(s); give one rate per conv layer");
  }
  for (std::size_t i = 0; i < rates.size(); i++) {
    if (!(rates[i] >= 0.0f && rates[i] < 1.0f)) {  // also refuses NaN
      throw std::invalid_argument("dropout: drop rate " + std::to_string(rates[i]) + " of conv layer " +
                                  std::to_string(i + 1) + " is outside [0, 1)");
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
    }
  }
  return macs;
}

FilterDropout::FilterDropout(const Model& model, DropoutConfig config, int max_batch, KernelBackend backend,
                             pthreadpool_t pool)
    : model_(model), config_(std::move(config)), rng_{config_.seed} {
  sub_model_ = std::make_unique<Model>(sub_network_spec(model, config_.conv_drop_rates));  // validates
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
  tensor_scale_.assign(sub_model_->tensors().size(), 1.0f);
  std::size_t conv = 0;
  for (const ResolvedLayer& layer : sub_model_->layers()) {
    if (layer.kind != LayerKind::kConv) continue;
    for (int t : {layer.weight_tensor, layer.bias_tensor})
      if (t >= 0) tensor_scale_[t] = layer_scale_[conv];
    conv++;
  }
  full_index_.resize(sub_model_->parameter_count());
  sub_params_.resize(sub_model_->parameter_count());
  sub_grad_.resize(sub_model_->parameter_count());
  build_index();
}

FilterDropout::~FilterDropout() = default;

std::span<const std::uint32_t> FilterDropout::kept_filters(int conv_index) const { return kept_.at(conv_index); }

void FilterDropout::draw() {
  for (std::size_t c = 0; c < kept_.size(); c++) {
    std::vector<std::uint32_t>& order = order_[c];
    const std::size_t n = order.size(), k = kept_[c].size();
    // Partial Fisher-Yates: the first k entries become a uniform random k-subset.
    for (std::size_t j = 0; j < k; j++) {
      const std::size_t pick = j + static_cast<std::size_t>(rng_.uniform_double() * static_cast<double>(n - j));
      std::swap(order[j], order[std::min(pick, n - 1)]);
    }
    std::copy(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), kept_[c].begin());
    std::sort(kept_[c].begin(), kept_[c].end());
  }
  build_index();
}

void FilterDropout::build_index() {
  const auto& full_layers = model_.layers();
  const auto& sub_layers = sub_model_->layers();
  const auto& full_tensors = model_.tensors();
  const auto& sub_tensors = sub_model_->tensors();
  int channels_from = -1;  // conv layer whose kept filters are the current channels; -1: all channels
  std::size_t conv = 0;
  // Full channel index of compact channel c at the current point of the network.
  auto full_channel = [&](std::uint32_t c) { return channels_from < 0 ? c : kept_[channels_from][c]; };
  for (std::size_t i = 0; i < full_layers.size(); i++) {
    const ResolvedLayer& full = full_layers[i];
    const ResolvedLayer& sub = sub_layers[i];
    if (full.kind == LayerKind::kConv) {
      const auto& out_kept = kept_[conv];
      const std::size_t taps = static_cast<std::size_t>(full.kernel) * full.kernel;
      const std::size_t C = full.in.C, sub_C = sub.in.C;
      std::uint32_t* w = full_index_.data() + sub_tensors[sub.weight_tensor].offset;
      const std::size_t w_full = full_tensors[full.weight_tensor].offset;
      for (std::size_t o = 0; o < out_kept.size(); o++)
        for (std::size_t t = 0; t < taps; t++)
          for (std::size_t c = 0; c < sub_C; c++)
            *w++ = static_cast<std::uint32_t>(w_full + (out_kept[o] * taps + t) * C + full_channel(c));
      if (sub.bias_tensor >= 0) {
        std::uint32_t* b = full_index_.data() + sub_tensors[sub.bias_tensor].offset;
        const std::size_t b_full = full_tensors[full.bias_tensor].offset;
        for (std::size_t o = 0; o < out_kept.size(); o++) b[o] = static_cast<std::uint32_t>(b_full + out_kept[o]);
      }
      channels_from = static_cast<int>(conv++);
    } else if (full.kind == LayerKind::kFullyConnected) {
      // Columns are NHWC positions (h, w, c) of the input; only the channels change.
      const std::size_t HW = static_cast<std::size_t>(full.in.H) * full.in.W;
      const std::size_t C = full.in.C, sub_C = sub.in.C, cols = HW * C;
      std::uint32_t* w = full_index_.data() + sub_tensors[sub.weight_tensor].offset;
      const std::size_t w_full = full_tensors[full.weight_tensor].offset;
      for (std::size_t o = 0; o < full.out.size(); o++)
        for (std::size_t p = 0; p < HW; p++)
          for (std::size_t c = 0; c < sub_C; c++)
            *w++ = static_cast<std::uint32_t>(w_full + o * cols + p * C + full_channel(c));
      if (sub.bias_tensor >= 0) {
        std::uint32_t* b = full_index_.data() + sub_tensors[sub.bias_tensor].offset;
        const std::size_t b_full = full_tensors[full.bias_tensor].offset;
        for (std::size_t o = 0; o < full.out.size(); o++) b[o] = static_cast<std::uint32_t>(b_full + o);
      }
      channels_from = -1;
    }
  }
}

BatchResult FilterDropout::compute_gradient_for_current_draw(std::span<const float> params,
                                                             const std::uint8_t* pixels, const std::int32_t* labels,
                                                             int count, std::span<float> grad) {
  if (params.size() != model_.parameter_count() || grad.size() != model_.parameter_count()) {
    throw std::invalid_argument("FilterDropout: parameter or gradient size mismatch");
  }
  const auto& sub_tensors = sub_model_->tensors();
  for (std::size_t t = 0; t < sub_tensors.size(); t++) {
    const float s = tensor_scale_[t];
    const std::size_t begin = sub_tensors[t].offset, end = begin + sub_tensors[t].size;
    for (std::size_t i = begin; i < end; i++) sub_params_[i] = s * params[full_index_[i]];
  }
  const BatchResult result = sub_trainer_->compute_gradient(sub_params_, pixels, labels, count, sub_grad_);
  std::fill(grad.begin(), grad.end(), 0.0f);
  for (std::size_t t = 0; t < sub_tensors.size(); t++) {
    const float s = tensor_scale_[t];
    const std::size_t begin = sub_tensors[t].offset, end = begin + sub_tensors[t].size;
    for (std::size_t i = begin; i < end; i++) grad[full_index_[i]] = s * sub_grad_[i];
  }
  return result;
}

}  // namespace edgetrain::runtime
