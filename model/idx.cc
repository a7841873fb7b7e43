#include "model/idx.h"

#include <zlib.h>

#include <fstream>
#include <limits>

namespace edgetrain::runtime {

DataError::DataError(std::string file, std::string reason)
    : std::runtime_error(file + ": " + reason),
      file_(std::move(file)),
      reason_(std::move(reason)) {}

namespace {

std::uint32_t read_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         p[3];
}

std::string hex_byte(std::uint8_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[value >> 4] + kDigits[value & 15];
}

std::string type_name(std::uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "unknown";
  }
}

std::vector<std::uint8_t> read_whole_file(const std::filesystem::path& path, std::size_t cap) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw DataError(path.string(), "cannot read: " + ec.message());
  if (size > cap)
    throw DataError(path.string(), "file is " + std::to_string(size) +
                                       " bytes, more than the cap of " + std::to_string(cap));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path.string(), "cannot open");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (static_cast<std::size_t>(in.gcount()) != bytes.size())
    throw DataError(path.string(), "short read");
  return bytes;
}

// Inflates one gzip member. The output is capped so that a small hostile file cannot make
// us allocate without bound; the IDX header check that follows is exact.
std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> compressed, const std::string& name,
                                 std::size_t cap) {
  z_stream stream{};
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK)
    throw DataError(name, "zlib inflateInit2 failed");
  struct Closer {
    z_stream* s;
    ~Closer() { inflateEnd(s); }
  } closer{&stream};
  stream.next_in = const_cast<Bytef*>(compressed.data());
  stream.avail_in = static_cast<uInt>(compressed.size());
  std::vector<std::uint8_t> out;
  std::uint8_t chunk[1 << 16];
  int status = Z_OK;
  while (status != Z_STREAM_END) {
    stream.next_out = chunk;
    stream.avail_out = sizeof chunk;
    status = inflate(&stream, Z_NO_FLUSH);
    if (status != Z_OK && status != Z_STREAM_END) {
      if (status == Z_BUF_ERROR) throw DataError(name, "gzip stream is truncated");
      throw DataError(name,
                      std::string("bad gzip data: ") + (stream.msg ? stream.msg : zError(status)));
    }
    const std::size_t produced = sizeof chunk - stream.avail_out;
    if (out.size() + produced > cap)
      throw DataError(name,
                      "decompressed data exceeds the cap of " + std::to_string(cap) + " bytes");
    out.insert(out.end(), chunk, chunk + produced);
    if (status == Z_OK && produced == 0 && stream.avail_in == 0)
      throw DataError(name, "gzip stream is truncated");
  }
  if (stream.avail_in != 0)
    throw DataError(name,
                    std::to_string(stream.avail_in) + " bytes after the end of the gzip stream");
  return out;
}

}  // namespace

IdxArray parse_idx(std::span<const std::uint8_t> bytes, std::string_view name_view,
                   const IdxLimits& limits) {
  const std::string name(name_view);
  if (bytes.empty()) throw DataError(name, "file is empty");
  if (bytes.size() < 4)
    throw DataError(name, "file is " + std::to_string(bytes.size()) +
                              " bytes, shorter than the 4-byte IDX magic");
  if (bytes[0] != 0 || bytes[1] != 0)
    throw DataError(name, "not an IDX file (magic does not start with two zero bytes)");
  if (bytes[2] != kIdxTypeUnsignedByte)
    throw DataError(name, "IDX type byte " + hex_byte(bytes[2]) + " (" + type_name(bytes[2]) +
                              ") is not supported; expected 0x08 (unsigned byte)");
  const std::uint32_t dim_count = bytes[3];
  if (dim_count == 0 || dim_count > limits.max_dimensions)
    throw DataError(name, "IDX has " + std::to_string(dim_count) + " dimensions; expected 1 to " +
                              std::to_string(limits.max_dimensions));
  const std::size_t header_bytes = 4 + 4 * std::size_t{dim_count};
  if (bytes.size() < header_bytes)
    throw DataError(name, "truncated header: " + std::to_string(bytes.size()) +
                              " bytes, the header needs " + std::to_string(header_bytes));

  IdxArray array;
  std::size_t payload_bytes = 1;
  for (std::uint32_t d = 0; d < dim_count; ++d) {
    const std::uint32_t dim = read_be32(bytes.data() + 4 + 4 * d);
    if (dim == 0) throw DataError(name, "dimension " + std::to_string(d) + " is zero (no data)");
    // Checked before multiplying so the product can neither overflow nor exceed the cap.
    if (payload_bytes > limits.max_payload_bytes / dim)
      throw DataError(name, "dimensions ask for more than the cap of " +
                                std::to_string(limits.max_payload_bytes) + " bytes");
    payload_bytes *= dim;
    array.dims.push_back(dim);
  }
  const std::size_t actual = bytes.size() - header_bytes;
  if (actual < payload_bytes)
    throw DataError(name, "truncated: header says " + std::to_string(payload_bytes) +
                              " data bytes, file has " + std::to_string(actual));
  if (actual > payload_bytes)
    throw DataError(name, std::to_string(actual - payload_bytes) + " bytes after the " +
                              std::to_string(payload_bytes) + " data bytes the header announces");
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header_bytes), bytes.end());
  return array;
}

IdxArray read_idx_file(const std::filesystem::path& path, const IdxLimits& limits) {
  const std::size_t max_header = 4 + 4 * std::size_t{limits.max_dimensions};
  const std::size_t cap = limits.max_payload_bytes + max_header;
  // A gzip file can be far smaller than its content, but never (meaningfully) larger.
  std::vector<std::uint8_t> bytes = read_whole_file(path, cap + (cap >> 4) + 1024);
  if (bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) {
    bytes = gunzip(bytes, path.string(), cap);
  }
  return parse_idx(bytes, path.string(), limits);
}

}  // namespace edgetrain::runtime
