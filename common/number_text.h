// A setting's or a measurement's value as log lines show it: printf's %g ("0.1", "30",
// "1e-06"). One definition for every program's lines.
#pragma once

#include <charconv>
#include <cstdio>
#include <string>

namespace edgetrain::common {

inline std::string short_number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

// A float as the double with its shortest decimal text, for JSON: 0.05f is 0.05, not the
// 0.05000000074505806 a plain widening writes.
inline double float_as_written(float value) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof(text), value).ptr;
  double widened = value;
  std::from_chars(text, end, widened);
  return widened;
}

}  // namespace edgetrain::common
