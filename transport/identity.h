// The one rule for what may be an identity: PSK identities (keystore device names),
// certificate subject CNs and the names plain CoAP peers declare (?id=NAME). Identities
// end up in logs, the write-ahead log and /status, so they are plain names only: never
// control characters, separators or unbounded strings. It guards security, so every check
// in the tree calls this one function (tested in tests/unit/wire_rules_test.cc).
#pragma once

#include <cstddef>
#include <string_view>

namespace edgetrain::transport {

inline constexpr std::size_t kMaxIdentityLength = 64;

// 1..64 characters of [A-Za-z0-9._-].
bool is_plain_identity(std::string_view name);

}  // namespace edgetrain::transport
