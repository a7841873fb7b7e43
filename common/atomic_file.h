// Files other programs read while we run (port files, JSON stats files): written whole to
// a temporary file in the same directory and renamed over the target, so a reader sees
// either the previous complete content or the new one, never a half-written file.
#pragma once

#include <string>
#include <string_view>

namespace edgetrain::common {

// Replaces `path` with `content` atomically (rename(2) within one directory). Throws
// std::runtime_error naming the file when it cannot be written. Not synced to disk: these
// files describe a running process, not state that must survive a crash.
void write_file_atomically(const std::string& path, std::string_view content);

}  // namespace edgetrain::common
