// Every compressor setting worth testing and timing: unit/compressor_test.cc checks each
// one (CompressorVariants/EveryCompressorVariant.*), bench/compressor_bench.cc times each.
#pragma once

#include <vector>

#include "worker/compressor.h"
#include "tests/support/paper_cnn_tensor_sizes.h"
#include "tests/support/variant.h"
#include "transport/codec.h"

namespace edgetrain::testing {

using CompressorVariant = Variant<runtime::CompressorOptions>;

inline const std::vector<CompressorVariant>& compressor_variants() {
  using runtime::CompressionMethod;
  using runtime::CompressorOptions;
  auto with = [](auto change) {
    CompressorOptions o;
    change(o);
    return o;
  };
  static const std::vector<CompressorVariant> variants = {
      {"TopK", "top-k c=0.01 (paper default)", {}},
      {"TopKRate0_1", "top-k c=0.1", with([](auto& o) { o.compression_rate = 0.1; })},
      {"TopKErrorFeedback", "top-k c=0.01 + error feedback",
       with([](auto& o) { o.error_feedback = true; })},
      {"TopKErrorFeedbackFp16", "top-k c=0.01 + error feedback + fp16", with([](auto& o) {
         o.error_feedback = true;
         o.value_encoding = transport::ValueEncoding::kFp16;
       })},
      {"TopKErrorFeedbackSignScale", "top-k c=0.01 + EF + sign-scale", with([](auto& o) {
         o.error_feedback = true;
         o.value_encoding = transport::ValueEncoding::kSignScale;
       })},
      {"BinLocal", "bin-local T=50 (Chen et al.)",
       with([](auto& o) { o.method = CompressionMethod::kBinLocal; })},
      {"BinLocalBin500", "bin-local T=500", with([](auto& o) {
         o.method = CompressionMethod::kBinLocal;
         o.bin_size = 500;
       })},
      {"Dense", "none (dense ASGD)", with([](auto& o) { o.method = CompressionMethod::kNone; })},
  };
  return variants;
}

// The wire encoding a setting's values are made for (what the worker pairs it with).
inline transport::ValueEncoding wire_encoding_of(const runtime::CompressorOptions& options) {
  return options.value_encoding;
}

}  // namespace edgetrain::testing
