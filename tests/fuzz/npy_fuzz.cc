// libFuzzer target for the NumPy reader (model/numpy_file.cc): a .npy file, or an .npz archive
// (zip central directory, zip64 fields, local headers, stored and deflated members), from
// bytes a user's data directory may hold. The first input byte picks how it is read (as a
// .npy, or as an .npz's array "x"; all rows, some rows, or in place); the rest is the file.
// Whatever the reader accepts must hold exactly what its header announces; everything else
// must be refused with DataError, never a crash, a hang or an out-of-bounds read.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/numpy_file.h"

using namespace edgetrain::runtime;

namespace {
void require(bool condition) {
  if (!condition) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  // The reader opens a path: an anonymous memory file, reached through /proc/self/fd.
  static const int fd = memfd_create("npy_fuzz", 0);
  require(fd >= 0);
  require(ftruncate(fd, 0) == 0);
  if (size > 1) require(pwrite(fd, data + 1, size - 1, 0) == static_cast<ssize_t>(size - 1));
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    NpyReader reader(path, (mode & 1) ? "x" : "");
    const std::uint64_t rows = reader.rows();
    const std::size_t row_bytes = reader.row_bytes();
    // Caps what an accepted header may make us allocate (the file itself is small).
    if (rows * row_bytes > (std::uint64_t{1} << 24)) return 0;
    switch ((mode >> 1) % 3) {
      case 0: {
        const std::vector<std::uint8_t> all = reader.read_all();
        require(all.size() == rows * row_bytes);
        break;
      }
      case 1: {
        std::vector<std::uint32_t> some;
        for (std::uint64_t r = 0; r < rows && r < 64; r += 1 + (mode >> 4))
          some.push_back(static_cast<std::uint32_t>(r));
        const std::vector<std::uint8_t> got = reader.read_rows(some);
        require(got.size() == some.size() * row_bytes);
        break;
      }
      default: {
        const auto in_place = reader.rows_in_place();
        if (in_place && rows > 0 && row_bytes <= (1u << 16)) {
          std::vector<std::uint8_t> row(row_bytes);
          in_place->read(static_cast<std::uint32_t>(rows - 1), row.data());
        }
        break;
      }
    }
  } catch (const DataError&) {
  }
  return 0;
}
