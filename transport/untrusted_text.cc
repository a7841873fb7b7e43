#include "transport/untrusted_text.h"

namespace edgetrain::transport {

std::string escape_untrusted(std::string_view text, std::size_t max_bytes) {
  static const char digits[] = "0123456789abcdef";
  const std::string_view shown = text.substr(0, max_bytes);
  std::string escaped;
  escaped.reserve(shown.size());
  for (char c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    const bool plain = byte >= 0x20 && byte <= 0x7e && c != '"' && c != '\'' && c != '\\';
    if (plain) {
      escaped += c;
    } else {
      escaped += "\\x";
      escaped += digits[byte >> 4];
      escaped += digits[byte & 15];
    }
  }
  if (text.size() > shown.size())
    escaped += "...(" + std::to_string(text.size() - shown.size()) + " more bytes)";
  return escaped;
}

}  // namespace edgetrain::transport
