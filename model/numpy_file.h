// Reading NumPy arrays: a .npy file, or one array of an .npz archive (a zip file whose
// members are .npy files, stored or deflated, as np.savez and np.savez_compressed write).
//
// Only what a data set needs: C-order arrays of a little-endian (or one-byte) numeric dtype.
// Fortran order, big-endian, structured and object (pickled) arrays are refused by name
// rather than converted, with the file and the reason (DataError, model/idx.h). As for IDX
// files, every size read is checked before it is trusted: the header's length and syntax, the
// product of the shape against overflow, the payload's exact length (a truncated file and
// trailing bytes are errors), a deflated member's length and CRC-32.
//
// Rows (the items along the first axis) are read as IdxReader reads IDX items: all, some
// (a stored array is read at those rows only; a deflated one is inflated once through a 64
// KiB buffer, keeping those rows), or left in the file and read one pread each
// (rows_in_place: a .npy file or a stored .npz member).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/idx.h"

namespace edgetrain::runtime {

struct NpyHeader {
  std::string descr;  // as the header spells it: "<f4", "|u1", "<i8"
  char kind = 0;      // 'f' float, 'i' signed, 'u' unsigned integer, 'b' bool, ...
  std::size_t item_bytes = 0;
  std::vector<std::uint64_t> shape;
};

// "(100, 8, 8, 1)", as NumPy prints a shape.
std::string shape_text(std::span<const std::uint64_t> shape);

class NpyReader {
 public:
  // Opens `path` and reads and checks the array's header. For an .npz file (recognised by its
  // zip signature), `array` names the member ("x" is "x.npy" inside, as np.savez names it);
  // for a .npy file it must be empty. Throws DataError naming "<path>" or "<path>:<array>".
  explicit NpyReader(const std::filesystem::path& path, const std::string& array = "");
  ~NpyReader();
  NpyReader(NpyReader&&) noexcept;
  NpyReader& operator=(NpyReader&&) noexcept;

  // What errors call the array: "<path>" or "<path>:<array>".
  const std::string& name() const;
  const NpyHeader& header() const;
  // The first axis's length (an array of no dimensions is refused), and bytes per row.
  std::uint64_t rows() const;
  std::size_t row_bytes() const;

  // The rows at `rows` (strictly ascending, each below rows(), else std::invalid_argument),
  // back to back; then checks the rest of the array (length; a deflated member's CRC). Once.
  std::vector<std::uint8_t> read_rows(std::span<const std::uint32_t> rows);
  std::vector<std::uint8_t> read_all();
  // A .npy file or a stored member: its rows, read where they lie (the file's length was
  // checked at construction). A deflated member: nullptr, nothing read. Once, as the reads.
  std::shared_ptr<const IdxItemFile> rows_in_place();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace edgetrain::runtime
