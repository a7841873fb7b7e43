// Reading data files by descriptor, shared by the IDX and NumPy readers (model-internal).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>
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

// The records at `indices` (strictly ascending, each below the payload's record count; the
// callers check) of a payload read front to back, each run of consecutive records in one
// read: `take(out, from, to)` copies payload bytes [from, to) to `out`, or skips them when
// `out` is null. The rest of the payload is skipped to its end, so a gzip or deflate source
// reaches its trailer and can be checked.
template <typename Take>
std::vector<std::uint8_t> read_ascending_records(std::span<const std::uint32_t> indices,
                                                 std::size_t record_bytes,
                                                 std::uint64_t payload_bytes, Take&& take) {
  std::vector<std::uint8_t> data(indices.size() * record_bytes);
  std::uint64_t at = 0;  // where the source stands in the payload
  for (std::size_t i = 0; i < indices.size();) {
    std::size_t j = i + 1;
    while (j < indices.size() && indices[j] == indices[j - 1] + 1) ++j;
    const std::uint64_t begin = std::uint64_t{indices[i]} * record_bytes,
                        end = (std::uint64_t{indices[j - 1]} + 1) * record_bytes;
    take(nullptr, at, begin);
    take(data.data() + i * record_bytes, begin, end);
    at = end;
    i = j;
  }
  take(nullptr, at, payload_bytes);
  return data;
}

}  // namespace edgetrain::runtime::detail
