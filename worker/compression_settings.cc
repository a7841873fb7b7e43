#include "worker/compression_settings.h"

namespace edgetrain::runtime {

void declare_compression_settings(settings::Table& table, CompressorOptions& options,
                                  CompressionSettings& settings,
                                  std::initializer_list<std::string_view> choices) {
  table
      .add("compressor", settings.compressor,
           "adacomp (the paper's per-tensor top-k) or none (dense ASGD)" +
               std::string(choices.size() > 2 ? "; both: compare the two" : ""))
      .choices(choices);
  table
      .add("rate", options.compression_rate,
           "AdaComp compression rate c: k = max(1, floor(n*c)) per tensor")
      .range(1e-6, 1.0);
  table.add("error-feedback", options.error_feedback,
            "option: keep unsent values and add them to the next step's");
  table.add("fp16", settings.fp16, "option: send values as fp16 (excludes --sign-scale)");
  table.add("sign-scale", settings.sign_scale,
            "option: send each tensor's values as one fp32 scale (their mean |v|) and one sign bit "
            "per entry (with "
            "--error-feedback the quantization error is fed back; excludes --fp16)");
}

CompressorOptions compressor_options(CompressorOptions options, const CompressionSettings& settings,
                                     bool bin_local) {
  options.value_encoding = value_encoding_from_flags(settings.fp16, settings.sign_scale);
  options.method = settings.compressor == "none" ? CompressionMethod::kNone
                   : bin_local                   ? CompressionMethod::kBinLocal
                                                 : CompressionMethod::kTopK;
  return options;
}

}  // namespace edgetrain::runtime
