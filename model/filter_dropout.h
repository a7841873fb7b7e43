// Filter dropout (DISTREAL, issue 14 part 2): each training step drops a random subset of
// every convolution layer's filters and computes the gradient of the kept sub-network only.
//
// How: the kept sub-network is itself a Model (the same spec with round(OC·(1−rate))
// filters per conv layer, at least one), built once with its own Trainer, so its kernel
// objects (XNNPACK operators and scratch) are made for fixed shapes at construction and a
// step allocates nothing. A step draws the kept filters, gathers the kept weights into the
// compact parameters, runs the compact Trainer and scatters its gradient back; every
// other gradient entry is exactly zero. A dropped filter takes with it the next conv
// layer's input channel and the FC columns it feeds (all positions of that channel).
//
// Rescaling (ours; the paper's choice is not known): with kInverted (the default) a kept
// filter's output is multiplied by 1/keep, keep = kept/OC, as inverted dropout, so the
// next layer sees activations of the full model's scale and the full model evaluates
// without correction. The scale is folded into the gathered weight and bias (s·(Wx+b))
// and into the scattered gradient (dL/dW = s·dL/dW'). kNone trains the plain sub-network.
#pragma once

#include <pthreadpool.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "common/splitmix64.h"
#include "model/trainer.h"

namespace edgetrain::runtime {

enum class DropoutRescale { kInverted, kNone };

// Parses "inverted" or "none"; throws std::invalid_argument otherwise.
DropoutRescale parse_dropout_rescale(const std::string& text);
const char* dropout_rescale_name(DropoutRescale rescale);

struct DropoutConfig {
  std::vector<float> conv_drop_rates;  // one per conv layer, in model order, each in [0, 1)
  DropoutRescale rescale = DropoutRescale::kInverted;
  std::uint64_t seed = 1;  // the draws repeat exactly for a seed
};

// Parses "0.25,0,0.5" (comma separated rates); throws std::invalid_argument naming the bad item.
std::vector<float> parse_drop_rates(const std::string& text);
std::string format_drop_rates(std::span<const float> rates);
// Number of conv layers of `model` (the length a drop-rate vector must have).
int conv_layer_count(const Model& model);
// Filters a conv layer with `out_channels` keeps at `rate`: round(OC·(1−rate)), at least 1.
int kept_filter_count(int out_channels, float rate);
// Throws std::invalid_argument with a clear message if `rates` does not fit `model`.
void validate_drop_rates(const Model& model, std::span<const float> rates);
// The sub-network spec: `model`'s spec with each conv layer's filters cut to the kept count.
ModelSpec sub_network_spec(const Model& model, std::span<const float> rates);
// Multiply-accumulates of one example's forward pass (conv + fc); the DSE's FLOP measure.
double forward_macs(const Model& model);

class FilterDropout {
 public:
  // Validates `config` against `model` (throws std::invalid_argument) and builds the
  // sub-network's Trainer for `max_batch` on `backend`/`pool` (see Trainer).
  FilterDropout(const Model& model, DropoutConfig config, int max_batch, KernelBackend backend,
                pthreadpool_t pool);
  ~FilterDropout();
  FilterDropout(const FilterDropout&) = delete;
  FilterDropout& operator=(const FilterDropout&) = delete;

  const DropoutConfig& config() const { return config_; }
  // Draws new kept filters (each conv layer: a uniformly random subset of its kept count).
  void draw();
  // The sub-network gradient for the current draw, scattered into `grad` (full layout,
  // fully overwritten; zero wherever the draw dropped). The loss is the sub-network's.
  BatchResult compute_gradient_for_current_draw(std::span<const float> params,
                                                const std::uint8_t* pixels,
                                                const std::int32_t* labels, int count,
                                                std::span<float> grad);
  // Kept filter indices of conv layer `conv_index` (0-based among conv layers), ascending.
  std::span<const std::uint32_t> kept_filters(int conv_index) const;
  const Model& sub_network() const { return *sub_model_; }
  // The sub-network's trainer (the full model's Trainer passes its input format on).
  Trainer& sub_trainer() { return *sub_trainer_; }

 private:
  template <class F>
  void for_each_run(F&& f) const;  // the compact <-> full mapping for the current draw

  const Model& model_;
  DropoutConfig config_;
  std::unique_ptr<Model> sub_model_;
  std::unique_ptr<Trainer> sub_trainer_;
  SplitMix64 rng_;
  std::vector<std::vector<std::uint32_t>> kept_;   // per conv layer, ascending
  std::vector<std::vector<std::uint32_t>> order_;  // per conv layer, scratch permutation
  std::vector<float> layer_scale_;                 // per conv layer: 1/keep (kInverted) or 1
  std::vector<float> sub_params_, sub_grad_;
};

}  // namespace edgetrain::runtime
