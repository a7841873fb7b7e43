// Small POSIX helpers for files that must survive a crash: write through a temporary file,
// fsync it, rename it over the target and fsync the directory, so a reader sees either the
// old or the new file, never a mix. Errors throw std::system_error naming the path.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

namespace edgetrain::server {

// fsync of an existing file or directory.
void sync_path(const std::filesystem::path& path);
// rename(from, to), then fsync of to's directory so the rename itself is durable.
void durable_rename(const std::filesystem::path& from, const std::filesystem::path& to);
// Writes `bytes` to `path` atomically (temporary file in the same directory, fsync, rename)
// with permission bits `mode` (e.g. 0600 for secrets).
void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes,
                           unsigned mode = 0644);

}  // namespace edgetrain::server
