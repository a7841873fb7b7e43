// The local minibatch gradient: forward and backward of a Model on one batch, on the
// kernels. All buffers (and, for the XNNPACK backend, all kernel objects) are made when
// the Trainer is built for a batch size, so a step allocates nothing.
//
// Two backends compute the same thing:
//   kXnnpack   (default) kernels/training_xnn.h; a ReLU layer right after a conv, fc or
//              add layer, and its one reader, is fused into that op (XNNPACK's output
//              clamp, or our loop for an add; the forward output as the backward mask).
//              The ops are built for max_batch: a smaller batch is zero-padded to
//              max_batch and the padded rows of the loss gradient are zero, so they add
//              nothing to any parameter gradient.
//   kReference the plain loops of kernels/reference.h, one layer at a time, exactly the
//              definition; slow, for tests and as a yardstick.
//
// With set_dropout() every compute_gradient() trains a random sub-network with some conv
// filters dropped (model/filter_dropout.h); evaluate() always runs the full model.
#pragma once

#include <pthreadpool.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/input_format.h"
#include "model/model.h"

namespace edgetrain::runtime {

enum class KernelBackend { kXnnpack, kReference };

class FilterDropout;
struct DropoutConfig;

struct BatchResult {
  float loss = 0;   // mean softmax cross-entropy over the batch
  int correct = 0;  // examples whose argmax logit equals the label
  int count = 0;    // examples in the batch
};

class Trainer {
 public:
  // `model` supplies the layer structure (not the parameters) and must outlive the Trainer.
  // `pool` (not owned, may be null = run on the calling thread) must outlive the Trainer;
  // only the XNNPACK backend uses it.
  Trainer(const Model& model, int max_batch, KernelBackend backend = KernelBackend::kXnnpack,
          pthreadpool_t pool = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  int max_batch() const { return max_batch_; }
  KernelBackend backend() const { return backend_; }

  // Gradient of the mean loss over `count` examples (count <= max_batch) at `params`,
  // written to `grad` (same layout as the model's arena; fully overwritten).
  // `pixels` holds count examples' bytes as input_format() says (by default input size
  // grey values 0..255 each, standardized per example here).
  BatchResult compute_gradient(std::span<const float> params, const std::uint8_t* pixels,
                               const std::int32_t* labels, int count, std::span<float> grad);

  // Forward only: loss and number correct. Dropout layers are the identity here.
  BatchResult evaluate(std::span<const float> params, const std::uint8_t* pixels,
                       const std::int32_t* labels, int count);

  // The class logits of the last evaluate() or compute_gradient(): `count` rows (at most that
  // call's count) of num_classes() floats each, valid until the next call. What a converted
  // model is checked against PyTorch with (tools/README.md).
  std::span<const float> logits(int count) const;

  // Filter dropout for the following compute_gradient() calls (each draws new kept
  // filters); validates `config` against the model (std::invalid_argument) and builds the
  // sub-network's kernels now. clear_dropout() returns to the full model.
  void set_dropout(const DropoutConfig& config);
  void clear_dropout();
  FilterDropout* dropout() { return dropout_.get(); }

  // How the following calls read and scale the examples' bytes (model/input_format.h; a data
  // set's Dataset::format), filter dropout's sub-network included. Default: uint8 values,
  // standardized per example.
  void set_input_format(const InputFormat& format);
  const InputFormat& input_format() const { return input_format_; }
  // Dropout layers (spec 'dropout P'): the next compute_gradient() draws their masks from
  // this seed (each layer its own stream, model/trainer.cc), so a step repeats exactly for
  // its seed and inputs, on either backend; every compute_gradient() then moves the seed on
  // (splitmix64), so consecutive steps drop differently without the caller's help.
  void set_step_seed(std::uint64_t seed) { step_seed_ = seed; }
  std::uint64_t step_seed() const { return step_seed_; }

  // Batch normalization's running statistics (spec 'batchnorm'): the normalization state,
  // every batchnorm layer's running mean [C] then running variance [C], in layer order;
  // empty without batchnorm layers. Not parameters: they live here, outside the arena, and
  // never travel with updates (model/README.md, "Normalization state"). compute_gradient()
  // moves them towards each batch's statistics (momentum 0.1), evaluate() normalizes with
  // them. Starts at mean 0, variance 1.
  std::span<const float> normalization_state() const { return running_statistics_; }
  void set_normalization_state(std::span<const float> state);  // std::invalid_argument on size
  // An evaluator that never trains (the async server's, the simulators') recomputes the
  // state from the parameters it evaluates: begin, calibrate() on batches of examples
  // (batch statistics, as in training; nothing else changes), then finish, which sets the
  // running statistics to the mean and unbiased variance over all calibrated positions.
  // Does nothing for a model without batchnorm (has_batch_norm()).
  bool has_batch_norm() const { return !running_statistics_.empty(); }
  void begin_normalization_calibration();
  void calibrate_normalization(std::span<const float> params, const std::uint8_t* pixels,
                               const std::int32_t* labels, int count);
  void finish_normalization_calibration();

 private:
  struct Stage;  // one kernel call: a layer, or a conv/fc layer with the ReLU layer after it

  // `training`: dropout layers drop (compute_gradient) or pass their input on (evaluate).
  BatchResult forward(std::span<const float> params, const std::uint8_t* pixels,
                      const std::int32_t* labels, int count, bool training);
  // A batchnorm stage's forward: batch statistics of the first `count` rows while training
  // (and then the momentum update) or calibrating (and then the calibration sums), else the
  // running statistics.
  void batch_norm_forward(Stage& stage, float* out, const float* in, const float* gamma,
                          const float* beta, int rows, int count, bool training);
  // The mask seed of the dropout layer at `layer` for the current step.
  std::uint64_t dropout_seed(std::size_t layer) const;
  // Whether stage s is a max pool (XNNPACK) reading a stage with a fused ReLU whose output
  // nothing else reads: its backward then masks its gradient and unpools it into that
  // stage's output buffer.
  bool unpools_into_activation(std::size_t s) const;
  // The output of `layer` (-1: the standardized input batch).
  const float* activation(int layer) const {
    return layer < 0 ? input_.data() : activations_[layer].data();
  }
  // Rows every kernel runs on: max_batch for XNNPACK (ops built for it), else `count`.
  int rows_for(int count) const { return backend_ == KernelBackend::kXnnpack ? max_batch_ : count; }

  const Model& model_;
  int max_batch_;
  KernelBackend backend_;
  pthreadpool_t pool_;
  std::unique_ptr<FilterDropout> dropout_;  // null: no dropout
  InputFormat input_format_;
  std::vector<Stage> stages_;
  std::vector<float> input_;  // standardized batch
  std::vector<std::vector<float>>
      activations_;                            // output of each layer (empty if no stage writes it)
  // d(loss)/d(output) of each stage's output, gradient_of_[layer], in buffers shared by
  // tensors whose gradients are never live at once (live from the backward of the tensor's
  // last reader to that of its producer): for a chain, two buffers taken in turn, as a stage
  // reads its own and writes its input's. A stage whose output feeds only a max pool gets its
  // gradient in its output's buffer instead (unpools_into_activation): for the paper CNN at
  // batch 10, 0.25 MB instead of 1.9 MB.
  std::vector<std::vector<float>> gradient_buffers_;
  std::vector<float*> gradient_of_;  // per layer; null for a layer no stage writes
  // A tensor read by several layers (a residual graph's skip) gets the sum of their input
  // gradients: the first written in place, later ones in the scratch and then added.
  std::vector<char> gradient_written_;  // per layer, during one backward
  std::vector<float> gradient_scratch_;
  std::vector<int> readers_;         // per layer: how many layers read its output
  std::vector<int> producer_stage_;  // per layer: the stage writing its output, -1 if none
  std::vector<std::vector<std::uint32_t>>
      argmax_;  // per max-pool layer (XNNPACK: index within the window)
  std::vector<float> probs_;
  // Normalization layers: the reference backend's saved statistics per layer (mean and
  // invstd, [rows][G] or [C]; the fast ops keep their own), batchnorm's running statistics
  // and each batchnorm layer's offset into them, and the calibration's sums (Σ x, Σ x² per
  // channel, over calibrated_positions_ per layer).
  std::vector<std::vector<float>> norm_mean_, norm_invstd_;
  std::vector<float> running_statistics_;
  std::vector<std::size_t> running_offset_;  // per layer; for batchnorm layers only
  bool calibrating_ = false;
  std::vector<double> calibration_sums_;
  std::size_t calibrated_positions_ = 0;
  std::uint64_t step_seed_ = 0x5eed;
};

}  // namespace edgetrain::runtime
