// How a data set's example bytes become the model's input: the value type the examples are
// stored in and the scaling applied to each batch in the trainer.
//
// A data set keeps its examples as the file gave them (uint8 values, or float32 ones in the
// host's byte order), so a worker holding a shard of MNIST still holds one byte a pixel; the
// Trainer reads the bytes by this format and scales them into its input buffer, once per
// batch. IDX data sets are uint8 standardized per example (zero mean, unit variance over
// each example's values), as before this format existed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace edgetrain::runtime {

enum class ExampleType : std::uint8_t { kUint8, kFloat32 };

enum class Scaling : std::uint8_t {
  kPerExampleStandardize,  // each example to zero mean and unit variance (the default)
  kAffine,                 // x * scale + offset: "scale" in a data description
  kNone,                   // the values as they are
};

struct InputFormat {
  ExampleType type = ExampleType::kUint8;
  Scaling scaling = Scaling::kPerExampleStandardize;
  float scale = 1.0f;   // kAffine only
  float offset = 0.0f;  // kAffine only

  std::size_t value_bytes() const { return type == ExampleType::kUint8 ? 1 : 4; }
};

// "uint8" / "float32"; "per-example-standardize" / "scale" / "none": the words of a data
// description (model/user_data.h) and of error messages.
std::string example_type_name(ExampleType type);
std::string scaling_name(Scaling scaling);

// Writes `count` examples of `values` values each, read from `bytes` by `format`, scaled, to
// `out` (count * values floats). `bytes` need not be aligned for float32.
void examples_to_input(const InputFormat& format, const std::uint8_t* bytes, int count,
                       std::size_t values, float* out);

}  // namespace edgetrain::runtime
