#include "worker/compressor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>

namespace edgetrain::runtime {

void Compressor::set_compression_rate(double rate) {
  if (!(rate > 0.0 && rate <= 1.0))
    throw std::invalid_argument("compressor: compression rate must lie in (0, 1]");
  options_.compression_rate = rate;
}

std::uint32_t Compressor::top_k_count(std::uint32_t n, double rate) {
  const double product = std::floor(static_cast<double>(n) * rate);
  if (product < 1.0) return std::min<std::uint32_t>(1, n);
  if (product >= static_cast<double>(n)) return n;
  return static_cast<std::uint32_t>(product);
}

transport::ValueEncoding value_encoding_from_flags(bool fp16, bool sign_scale) {
  if (fp16 && sign_scale)
    throw std::invalid_argument(
        "fp16 and sign-scale values exclude each other (--fp16 / fp16 and --sign-scale / "
        "sign_scale in --config): choose one value encoding");
  return fp16         ? transport::ValueEncoding::kFp16
         : sign_scale ? transport::ValueEncoding::kSignScale
                      : transport::ValueEncoding::kFp32;
}

Compressor::Compressor(std::vector<TensorSlice> layout, CompressorOptions options)
    : layout_(std::move(layout)),
      options_(options),
      keeps_residual_(options.error_feedback || options.method == CompressionMethod::kBinLocal) {
  if (!(options_.compression_rate > 0.0 && options_.compression_rate <= 1.0))
    throw std::invalid_argument("compressor: compression rate must lie in (0, 1]");
  if (options_.method == CompressionMethod::kBinLocal && options_.bin_size == 0)
    throw std::invalid_argument("compressor: bin_size must be at least 1");
  std::size_t largest = 0;
  for (const TensorSlice& t : layout_) {
    if (t.size == 0) throw std::invalid_argument("compressor: empty tensor in the layout");
    arena_size_ = std::max(arena_size_, t.offset + t.size);
    largest = std::max<std::size_t>(largest, t.size);
  }
  if (keeps_residual_) {
    residual_.assign(arena_size_, 0.0f);
    accumulated_.resize(largest);
  }
  selector_ = MagnitudeSelector(largest);
}

float Compressor::sent_value(float v) const {
  return options_.value_encoding == transport::ValueEncoding::kFp16 ? transport::round_to_fp16(v)
                                                                    : v;
}

namespace {

// No early exit, so that the loop vectorises: the largest magnitude's bits, compared once
// with infinity's (NaN's bits lie above it).
bool all_finite(std::span<const float> values) {
  std::uint32_t largest = 0;
  for (float v : values) largest = std::max(largest, std::bit_cast<std::uint32_t>(v) & 0x7fffffffu);
  return largest < 0x7f800000u;
}

}  // namespace

void Compressor::compress(std::span<const float> gradient, transport::SparseUpdate& update) {
  if (gradient.size() != arena_size_)
    throw std::invalid_argument("compressor: gradient has " + std::to_string(gradient.size()) +
                                " entries, the layout " + std::to_string(arena_size_));
  update.tensors.resize(layout_.size());
  for (std::size_t t = 0; t < layout_.size(); ++t) {
    const TensorSlice slice = layout_[t];
    std::span<const float> g = gradient.subspan(slice.offset, slice.size);
    transport::SparseTensor& out = update.tensors[t];
    out.tensor = static_cast<std::uint32_t>(t);
    out.size = slice.size;
    out.indices.clear();
    out.values.clear();

    std::span<const float> values = g;
    std::span<float> residual;
    if (keeps_residual_) {
      residual = std::span(residual_).subspan(slice.offset, slice.size);
      for (std::uint32_t i = 0; i < slice.size; ++i) accumulated_[i] = residual[i] + g[i];
      values = std::span<const float>(accumulated_).first(slice.size);
    }
    if (!all_finite(values))
      throw std::invalid_argument("compressor: non-finite gradient in tensor " + std::to_string(t));

    switch (options_.method) {
      case CompressionMethod::kNone:
        compress_dense(values, out, residual);
        break;
      case CompressionMethod::kTopK:
        compress_top_k(values, top_k_count(slice.size, options_.compression_rate), out, residual);
        break;
      case CompressionMethod::kBinLocal:
        compress_bin_local(g, values, out, residual);
        break;
    }
    if (options_.value_encoding == transport::ValueEncoding::kSignScale)
      quantize_sign_scale(out, values, residual);
  }
}

// Runs after selection, which sent the values unrounded (sent_value() is the identity here)
// and left a zero residual on the sent entries. Shrinking `out` keeps its capacity, so this
// allocates nothing.
void quantize_sign_scale(transport::SparseTensor& out, std::span<const float> values,
                         std::span<float> residual) {
  double magnitude_sum = 0.0;  // double: 400k float magnitudes would lose low bits
  std::size_t kept = 0;
  for (std::size_t j = 0; j < out.values.size(); ++j) {
    if (out.values[j] == 0.0f) continue;  // its residual, if kept, is already 0
    magnitude_sum += std::fabs(out.values[j]);
    out.indices[kept] = out.indices[j];
    out.values[kept] = out.values[j];
    ++kept;
  }
  out.indices.resize(kept);
  out.values.resize(kept);
  if (kept == 0) return;
  // The mean of finite nonzero magnitudes lies between their minimum and maximum, so the
  // float scale is finite and > 0 as the wire encoding requires.
  const float scale = static_cast<float>(magnitude_sum / static_cast<double>(kept));
  for (std::size_t j = 0; j < kept; ++j) {
    const float sent = std::signbit(out.values[j]) ? -scale : scale;
    out.values[j] = sent;
    // One float subtraction: exact whenever scale/2 ≤ |v| ≤ 2·scale (Sterbenz), else within
    // half an ulp of the residual.
    if (!residual.empty()) residual[out.indices[j]] = values[out.indices[j]] - sent;
  }
}

void Compressor::compress_dense(std::span<const float> values, transport::SparseTensor& out,
                                std::span<float> residual) {
  out.indices.resize(values.size());
  out.values.resize(values.size());
  for (std::uint32_t i = 0; i < values.size(); ++i) {
    out.indices[i] = i;
    out.values[i] = sent_value(values[i]);
    if (!residual.empty()) residual[i] = values[i] - out.values[i];
  }
}

// The k entries of largest magnitude, ties broken towards the lower index, so the result
// is a function of the values alone (the reference test relies on it).
void Compressor::compress_top_k(std::span<const float> values, std::uint32_t k,
                                transport::SparseTensor& out, std::span<float> residual) {
  const std::size_t n = values.size();
  if (k >= n) {
    compress_dense(values, out, residual);
    return;
  }
  // Entries strictly above the k-th largest magnitude are all taken, the rest of the k
  // slots go to entries equal to it, lowest index first.
  const MagnitudeRank rank = selector_.select(values, k);
  const float threshold = rank.threshold;
  std::uint32_t ties_left = k - static_cast<std::uint32_t>(rank.above);
  out.indices.resize(k);
  out.values.resize(k);
  std::uint32_t taken = 0;
  for (std::uint32_t i = 0; i < n && taken < k; ++i) {
    const float magnitude = std::fabs(values[i]);
    bool take = magnitude > threshold;
    if (!take && magnitude == threshold && ties_left > 0) {
      take = true;
      --ties_left;
    }
    if (take) {
      out.indices[taken] = i;
      out.values[taken] = sent_value(values[i]);
      ++taken;
    }
  }
  if (!residual.empty()) {
    // Unsent entries keep their accumulated value; sent ones keep only the fp16 rounding error.
    std::copy(values.begin(), values.end(), residual.begin());
    for (std::uint32_t j = 0; j < k; ++j)
      residual[out.indices[j]] = values[out.indices[j]] - out.values[j];
  }
}

// Chen et al. 2018, "AdaComp: Adaptive Residual Gradient Compression for Data-Parallel
// Distributed Training" (AAAI). With G = residual + g (accumulated) and H = G + g, the
// tensor is cut into bins of bin_size entries; in each bin, with m = max |G| over the bin,
// every entry with |H| ≥ m and G ≠ 0 is sent (its value G), the rest stays in the residual.
// H gives entries whose latest gradient pushes the same way as their backlog a head start.
// They also quantise the sent values to ±(per-layer scale); the kSignScale value encoding does that
// with our choice of scale, the mean |G| of the sent entries (not checked against theirs).
void Compressor::compress_bin_local(std::span<const float> gradient,
                                    std::span<const float> accumulated,
                                    transport::SparseTensor& out, std::span<float> residual) {
  const std::size_t n = accumulated.size();
  const std::size_t bin = options_.bin_size;
  for (std::size_t start = 0; start < n; start += bin) {
    const std::size_t end = std::min(n, start + bin);
    float bin_max = 0.0f;
    for (std::size_t i = start; i < end; ++i)
      bin_max = std::max(bin_max, std::fabs(accumulated[i]));
    for (std::size_t i = start; i < end; ++i) {
      const float g_acc = accumulated[i];
      if (g_acc != 0.0f && std::fabs(g_acc + gradient[i]) >= bin_max) {
        const float sent = sent_value(g_acc);
        out.indices.push_back(static_cast<std::uint32_t>(i));
        out.values.push_back(sent);
        residual[i] = g_acc - sent;
      } else {
        residual[i] = g_acc;
      }
    }
  }
}

}  // namespace edgetrain::runtime
