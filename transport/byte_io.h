// Little-endian byte writing and bounds-checked reading for transport/'s wire formats
// (codec.cc, gan_codec.cc). Private to transport/.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace edgetrain::transport::byte_io {

// Little-endian appends.
class Writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(v); }
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void f32(float v) { u32(std::bit_cast<std::uint32_t>(v)); }
  void bytes(const std::uint8_t* p, std::size_t n) { out_.insert(out_.end(), p, p + n); }
  void varint(std::uint32_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<std::uint8_t>(v | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<std::uint8_t>(v));
  }
  void reserve(std::size_t n) { out_.reserve(n); }
  std::vector<std::uint8_t>& buffer() { return out_; }
  std::vector<std::uint8_t> take() { return std::move(out_); }

 private:
  void put(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  std::vector<std::uint8_t> out_;
};

// Little-endian reads that never go past the end: each returns false when the bytes run out.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  std::size_t remaining() const { return bytes_.size() - pos_; }
  std::size_t position() const { return pos_; }
  bool u8(std::uint8_t& v) { return get(v, 1); }
  bool u16(std::uint16_t& v) { return get(v, 2); }
  bool u32(std::uint32_t& v) { return get(v, 4); }
  bool u64(std::uint64_t& v) { return get(v, 8); }
  bool span(std::size_t n, std::span<const std::uint8_t>& out) {
    if (remaining() < n) return false;
    out = bytes_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  // LEB128, at most 5 bytes, value < 2^32, and canonical (no redundant trailing zero group)
  // so every index list has exactly one encoding. Returns an empty string or the reason.
  const char* varint(std::uint32_t& v) {
    std::uint32_t result = 0;
    for (int i = 0; i < 5; ++i) {
      if (pos_ >= bytes_.size()) return "message ends inside a varint";
      const std::uint8_t byte = bytes_[pos_++];
      if (i == 4 && byte > 0x0f) return "varint exceeds 32 bits";
      result |= std::uint32_t{byte & 0x7fu} << (7 * i);
      if ((byte & 0x80) == 0) {
        if (i > 0 && byte == 0) return "varint is not in its shortest form";
        v = result;
        return "";
      }
    }
    return "varint longer than 5 bytes";
  }

 private:
  template <class T>
  bool get(T& v, int n) {
    if (remaining() < static_cast<std::size_t>(n)) return false;
    std::uint64_t acc = 0;
    for (int i = 0; i < n; ++i) acc |= std::uint64_t{bytes_[pos_ + i]} << (8 * i);
    v = static_cast<T>(acc);
    pos_ += n;
    return true;
  }
  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
};

}  // namespace edgetrain::transport::byte_io
