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

// Reads an IDX file, gunzipping it when it starts with the gzip magic bytes 1f 8b.
IdxArray read_idx_file(const std::filesystem::path& path, const IdxLimits& limits = {});

}  // namespace edgetrain::runtime
