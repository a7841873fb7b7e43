// The one escaping of text that came from the network (PSK identities, certificate names,
// URIs and queries, diagnostics that quote what a peer sent) before it reaches a log line
// or /status. Raw, such text could forge whole log lines (a newline), drive the operator's
// terminal (ESC sequences) or break out of the quotes it is shown in; escaped, it is one
// visible token. Every place that shows such text calls this one function
// (tests/unit/wire_rules_test.cc).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace edgetrain::transport {

// Shown text is cut after this many bytes of input (identities are at most 255 bytes, a
// query option at most 255; a diagnostic has no business being longer).
inline constexpr std::size_t kMaxShownUntrustedBytes = 256;

// `text` with every byte outside printable ASCII (0x20..0x7e) and every quote or backslash
// (" ' \) written as \xNN (two lowercase hex digits), so the result is one line of
// printable ASCII that cannot be mistaken for a quote's end or another escape. Input beyond
// `max_bytes` is dropped and "...(N more bytes)" appended.
std::string escape_untrusted(std::string_view text,
                             std::size_t max_bytes = kMaxShownUntrustedBytes);

}  // namespace edgetrain::transport
