#include "model/input_format.h"

#include <bit>
#include <cstring>

#include "kernels/reference.h"

namespace edgetrain::runtime {

// Float32 examples are the file's little-endian bytes copied as they are (model/user_data.cc).
static_assert(std::endian::native == std::endian::little,
              "float32 examples are stored little-endian, as NumPy writes them on every board");

std::string example_type_name(ExampleType type) {
  return type == ExampleType::kUint8 ? "uint8" : "float32";
}

std::string scaling_name(Scaling scaling) {
  switch (scaling) {
    case Scaling::kPerExampleStandardize:
      return "per-example-standardize";
    case Scaling::kAffine:
      return "scale";
    case Scaling::kNone:
      return "none";
  }
  return "?";
}

void examples_to_input(const InputFormat& format, const std::uint8_t* bytes, int count,
                       std::size_t values, float* out) {
  const std::size_t n = static_cast<std::size_t>(count) * values;
  if (format.type == ExampleType::kUint8) {
    for (std::size_t i = 0; i < n; i++) out[i] = static_cast<float>(bytes[i]);
  } else {
    std::memcpy(out, bytes, n * sizeof(float));
  }
  switch (format.scaling) {
    case Scaling::kPerExampleStandardize:
      kernels::standardize_per_image(out, out, count, static_cast<int>(values));
      break;
    case Scaling::kAffine:
      for (std::size_t i = 0; i < n; i++) out[i] = out[i] * format.scale + format.offset;
      break;
    case Scaling::kNone:
      break;
  }
}

}  // namespace edgetrain::runtime
