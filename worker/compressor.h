// Gradient compression on the worker: a dense gradient (one arena, tensors at offsets) in,
// a transport::SparseUpdate out.
//
// The default is the method of the AdaComp paper (Hardy, Le Merrer, Sericola 2017): for
// each tensor of size n, send the k = max(1, floor(n·c)) entries of largest |g| and drop
// the rest. Everything else is an opt-in setting and never changes that default:
//   - kNone: dense ASGD, every entry sent (the paper's baseline);
//   - error_feedback: unsent values are kept in a residual and added to the next gradient
//     (Aji & Heafield 2017; DGC, Lin et al. 2018);
//   - kBinLocal: the bin-local selection of Chen et al. 2018 (IBM's "AdaComp"), see below;
//   - value_encoding kFp16: values rounded to what the fp16 wire encoding carries, so that
//     with error feedback the rounding error is fed back too;
//   - value_encoding kSignScale: each tensor's sent values replaced by sign(v)·s, s = mean |v| over
//     its sent entries, for the sign + scale wire encoding (Chen et al. 2018 quantise their
//     selected residuals this way; Sattler et al.'s sparse ternary compression likewise);
//     with error feedback v − sign(v)·s stays in the residual.
//
// Selection is O(n) per tensor (the k-th largest magnitude by worker/magnitude_select.h's
// histogram of the magnitudes' top bits, then one pass), never a full sort. All buffers are sized
// at construction; compress() only reuses them and the output's vectors, so a steady-state call
// does not allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "worker/magnitude_select.h"
#include "transport/codec.h"

namespace edgetrain::runtime {

// One tensor inside the parameter (and gradient) arena.
struct TensorSlice {
  std::size_t offset = 0;
  std::uint32_t size = 0;
};

enum class CompressionMethod {
  kNone,      // dense ASGD
  kTopK,      // the AdaComp paper: per-tensor top-k of |g|
  kBinLocal,  // Chen et al. 2018: per-bin local-max selection, residuals always on
};

struct CompressorOptions {
  CompressionMethod method = CompressionMethod::kTopK;
  // c of the paper; k = max(1, floor(n·c)) per tensor, at most n. kTopK only.
  double compression_rate = 0.01;
  // Keep unsent values and add them to the next gradient. Off in the paper's method.
  bool error_feedback = false;
  // kBinLocal: entries per bin (Chen et al. use 50 for convolutional and 500 for
  // fully-connected layers).
  std::uint32_t bin_size = 50;
  // How the update's values go on the wire, and so what the compressor sends (the one
  // place the choice is stored: the caller encodes with this same value). kFp32: exact.
  // kFp16: sent values rounded to fp16 precision. kSignScale: each tensor's selected
  // entries sent as ±(mean |v| over them), which keeps the update's L1 mass; selected
  // entries that are exactly zero are left out (the encoding has no zero, and ±s would
  // add a value that was not there).
  transport::ValueEncoding value_encoding = transport::ValueEncoding::kFp32;
};

// The value encoding the programs' two option flags (--fp16, --sign-scale) choose; the one
// place that turns them into the enum. Throws std::invalid_argument when both are set.
transport::ValueEncoding value_encoding_from_flags(bool fp16, bool sign_scale);

// One tensor's selected values as sign + scale (value_encoding kSignScale): each becomes
// ±(mean |v| over the nonzero ones), zeros are left out. With a `residual` (error feedback),
// residual[i] becomes values[i] − the value sent for each sent index i. Allocates nothing.
void quantize_sign_scale(transport::SparseTensor& out, std::span<const float> values = {},
                         std::span<float> residual = {});

class Compressor {
 public:
  // Throws std::invalid_argument for an empty tensor, a rate outside (0, 1] or bin_size 0.
  Compressor(std::vector<TensorSlice> layout, CompressorOptions options = {});

  // Fills update.tensors (one entry per tensor, in layout order, indices increasing); the
  // header fields (model id, sequence, fetched version) are the caller's. `gradient` is the
  // whole arena. Throws std::invalid_argument on a wrong length or a non-finite gradient
  // (a diverged step must not reach the server).
  void compress(std::span<const float> gradient, transport::SparseUpdate& update);

  // The values not yet sent (all zero unless error feedback is on or the method is
  // kBinLocal); arena layout.
  std::span<const float> residual() const { return residual_; }
  const CompressorOptions& options() const { return options_; }
  // c for the next compress() calls (the link-adaptive worker changes it per update:
  // worker/link_adaptation.h). Throws std::invalid_argument outside (0, 1].
  void set_compression_rate(double rate);

  // k = max(1, floor(n·rate)), at most n: the paper's rule.
  static std::uint32_t top_k_count(std::uint32_t n, double rate);

 private:
  void compress_dense(std::span<const float> values, transport::SparseTensor& out,
                      std::span<float> residual);
  void compress_top_k(std::span<const float> values, std::uint32_t k, transport::SparseTensor& out,
                      std::span<float> residual);
  void compress_bin_local(std::span<const float> gradient, std::span<const float> accumulated,
                          transport::SparseTensor& out, std::span<float> residual);
  float sent_value(float v) const;

  std::vector<TensorSlice> layout_;
  CompressorOptions options_;
  bool keeps_residual_;
  std::size_t arena_size_ = 0;
  std::vector<float> residual_;     // arena-sized when kept, else empty
  std::vector<float> accumulated_;  // residual + gradient of one tensor
  MagnitudeSelector selector_;      // the top-k threshold
};

}  // namespace edgetrain::runtime
