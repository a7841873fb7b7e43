// The compression settings every program that compresses shares (edgetrain-worker,
// edgetrain-sim): one declaration, so their flags, TOML keys, ranges and help agree, and the
// two value-encoding flags turn into the one enum in one place.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "common/settings.h"
#include "worker/compressor.h"

namespace edgetrain::runtime {

// What the table fills besides CompressorOptions' own fields.
struct CompressionSettings {
  std::string compressor = "adacomp";  // one of the choices given to declare_compression_settings
  bool fp16 = false, sign_scale = false;
};

// Adds --compressor (with `choices`), --rate, --error-feedback, --fp16 and --sign-scale to
// `table`, bound to `options` and `settings`, which must outlive the table's parse().
void declare_compression_settings(settings::Table& table, CompressorOptions& options,
                                  CompressionSettings& settings,
                                  std::initializer_list<std::string_view> choices);

// After parse(): the options with the chosen value encoding (throws std::invalid_argument
// for --fp16 with --sign-scale) and method (`compressor` "none": dense; otherwise top-k, or
// bin-local when `bin_local`).
CompressorOptions compressor_options(CompressorOptions options, const CompressionSettings& settings,
                                     bool bin_local = false);

}  // namespace edgetrain::runtime
