// A setting's or a measurement's value as log lines show it: printf's %g ("0.1", "30",
// "1e-06"). One definition for every program's lines.
#pragma once

#include <cstdio>
#include <string>

namespace edgetrain::common {

inline std::string short_number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

}  // namespace edgetrain::common
