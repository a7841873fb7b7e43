// Reading IDX files, the format MNIST and Fashion-MNIST ship in, gzip-compressed or raw.
//
// IDX layout (big-endian): two zero bytes, a type byte, the number of dimensions d, then d
// 32-bit dimension sizes, then the items. Only the unsigned-byte type (0x08) is accepted:
// it is what image and label files use, and anything else in a data directory is a mistake
// worth reporting rather than converting.
//
// Everything read comes from outside the program, so every size is checked before it is
// trusted: the header against caps, the payload length against the header (a truncated or
// over-long file is an error), and the product of the dimensions against overflow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace edgetrain::runtime {

// A data file that cannot be used. what() reads "<file>: <reason>".
class DataError : public std::runtime_error {
 public:
  DataError(std::string file, std::string reason);
  const std::string& file() const { return file_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string file_;
  std::string reason_;
};

struct IdxLimits {
  std::uint32_t max_dimensions = 4;
  // Caps the allocation a header can ask for; the largest real file (Fashion-MNIST train
  // images) is 47 MB.
  std::size_t max_payload_bytes = std::size_t{1} << 30;
};

struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;  // row-major, dims[0] items
};

constexpr std::uint8_t kIdxTypeUnsignedByte = 0x08;

// Parses a complete IDX byte string (already decompressed). `name` only labels errors.
IdxArray parse_idx(std::span<const std::uint8_t> bytes, std::string_view name,
                   const IdxLimits& limits = {});

// Reads an IDX file, gunzipping it when it starts with the gzip magic bytes 1f 8b
// (IdxReader::read_all: the file's payload is the only copy held).
IdxArray read_idx_file(const std::filesystem::path& path, const IdxLimits& limits = {});

// The items of a raw (uncompressed) IDX file, read where they lie, one pread each: a
// worker's images when its image file is raw (Dataset::image_file). Made by
// IdxReader::items_in_place() once the whole file has been checked; it keeps the file open.
// Safe to read from several threads.
class IdxItemFile {
 public:
  IdxItemFile(int fd, std::string name, std::size_t payload_offset, std::uint32_t count,
              std::size_t item_bytes);
  ~IdxItemFile();
  IdxItemFile(const IdxItemFile&) = delete;
  IdxItemFile& operator=(const IdxItemFile&) = delete;

  std::uint32_t count() const { return count_; }
  std::size_t item_bytes() const { return item_bytes_; }
  // Copies item `i` (below count()) to `out` (item_bytes() bytes). Throws DataError when the
  // file cannot be read there (it shrank or failed since it was checked).
  void read(std::uint32_t i, std::uint8_t* out) const;

 private:
  int fd_;
  std::string name_;
  std::size_t payload_offset_;
  std::uint32_t count_;
  std::size_t item_bytes_;
};

// An IDX file read front to back without holding more of it than is asked for: the header
// at construction (checked as parse_idx checks it), then all the items or some of them.
// A raw file is read with pread, only the items asked for and the header; a gzip file
// (gzip magic 1f 8b) is inflated once through a 64 KiB buffer, keeping only the items
// asked for. Either way the rest of the file is checked as read_idx_file checks it (the
// exact payload length, gzip integrity, nothing after the gzip stream), so a file that
// read_idx_file refuses is refused here too. What it holds besides the items it returns:
// the header and, for gzip, zlib's state and two 64 KiB buffers.
class IdxReader {
 public:
  // Opens the file and reads and checks its header; throws DataError.
  explicit IdxReader(const std::filesystem::path& path, const IdxLimits& limits = {});
  ~IdxReader();
  IdxReader(IdxReader&&) noexcept;
  IdxReader& operator=(IdxReader&&) noexcept;

  const std::vector<std::uint32_t>& dims() const;
  // Bytes per item (the product of dims()[1..]; 1 for a one-dimensional file).
  std::size_t item_bytes() const;

  // The items at `items` (strictly ascending, each below dims()[0], else
  // std::invalid_argument), back to back in that order; then checks the rest of the file.
  // A reader reads once: a second call throws std::logic_error.
  std::vector<std::uint8_t> read_items(std::span<const std::uint32_t> items);
  // Every item: the whole payload.
  std::vector<std::uint8_t> read_all();
  // A raw file: checks its length as the reads above do and returns its items to be read
  // where they lie, holding none of them. A gzip file: nullptr (its items can only be read
  // in order), and nothing is read. Once per reader, as the reads.
  std::shared_ptr<const IdxItemFile> items_in_place();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace edgetrain::runtime
