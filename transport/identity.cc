#include "transport/identity.h"

namespace edgetrain::transport {

bool is_plain_identity(std::string_view name) {
  if (name.empty() || name.size() > kMaxIdentityLength) return false;
  for (char c : name) {
    // Spelled out rather than std::isalnum, whose answer depends on the C locale.
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '_' || c == '-';
    if (!plain) return false;
  }
  return true;
}

}  // namespace edgetrain::transport
