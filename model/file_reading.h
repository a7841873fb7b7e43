// Reading data files by descriptor, shared by the IDX and NumPy readers (model-internal).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>

#include "model/idx.h"

namespace edgetrain::runtime::detail {

inline std::string errno_text() {
  return std::error_code(errno, std::generic_category()).message();
}

// Closes its descriptor when the last reader lets go of it.
struct FileDescriptor {
  int fd = -1;
  FileDescriptor() = default;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly `n` bytes at `offset`; false when the file ends first. A read error throws
// DataError naming `name`.
inline bool pread_fully(int fd, std::uint8_t* out, std::size_t n, std::uint64_t offset,
                        const std::string& name) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw DataError(name, "cannot read: " + errno_text());
    if (got == 0) return false;
    done += static_cast<std::size_t>(got);
  }
  return true;
}

}  // namespace edgetrain::runtime::detail
