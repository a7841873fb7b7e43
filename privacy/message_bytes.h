// The byte layout every secure-aggregation message shares (secagg_messages.h and
// secagg_signed.h): type (1 byte), format version (1), round (8, little-endian), then the
// message's fields. One writer and one reader for both, so that the plain and the signed
// messages cannot drift apart in how they bound what an untrusted sender may claim.
// Internal to privacy/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "privacy/secagg.h"
#include "privacy/secagg_crypto.h"
#include "privacy/secagg_messages.h"

namespace edgetrain::privacy {

class MessageWriter {
 public:
  MessageWriter(std::uint8_t type, std::uint64_t round) {
    bytes_.push_back(type);
    bytes_.push_back(kMessageFormatVersion);
    u64(round);
  }
  void u8(std::uint8_t value) { bytes_.push_back(value); }
  void u32(std::uint32_t value) {
    for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
  }
  void u64(std::uint64_t value) {
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
  }
  void identity(const std::string& text) {
    if (text.empty() || text.size() > kMaxIdentityBytes) throw SecAggError("an identity must have 1 to 255 bytes");
    u8(static_cast<std::uint8_t>(text.size()));
    bytes_.insert(bytes_.end(), text.begin(), text.end());
  }
  void raw(std::span<const std::uint8_t> data) { bytes_.insert(bytes_.end(), data.begin(), data.end()); }
  // 2-byte length, then the bytes: a certificate or a signature.
  void blob(std::span<const std::uint8_t> data, std::size_t limit, const char* what) {
    if (data.empty() || data.size() > limit)
      throw SecAggError(std::string("a ") + what + " of " + std::to_string(data.size()) + " bytes (1 to " +
                        std::to_string(limit) + ")");
    u8(static_cast<std::uint8_t>(data.size()));
    u8(static_cast<std::uint8_t>(data.size() >> 8));
    raw(data);
  }
  std::vector<std::uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<std::uint8_t> bytes_;
};

// Every read is bounded by the bytes left; anything else is a SecAggError naming the message.
class MessageReader {
 public:
  MessageReader(std::span<const std::uint8_t> bytes, std::uint8_t type, const char* name)
      : bytes_(bytes), name_(name) {
    if (u8() != type) fail("not this message type");
    if (u8() != kMessageFormatVersion) fail("an unknown format version");
    round_ = u64();
  }
  std::uint64_t round() const { return round_; }
  [[noreturn]] void fail(const std::string& why) const { throw SecAggError(std::string(name_) + ": " + why); }
  std::span<const std::uint8_t> take(std::size_t n) {
    if (n > bytes_.size() - offset_) fail("truncated");
    auto out = bytes_.subspan(offset_, n);
    offset_ += n;
    return out;
  }
  std::uint8_t u8() { return take(1)[0]; }
  std::uint32_t u32() {
    auto b = take(4);
    return std::uint32_t{b[0]} | std::uint32_t{b[1]} << 8 | std::uint32_t{b[2]} << 16 | std::uint32_t{b[3]} << 24;
  }
  std::uint64_t u64() {
    std::uint64_t value = 0;
    auto b = take(8);
    for (int i = 0; i < 8; ++i) value |= std::uint64_t{b[i]} << (8 * i);
    return value;
  }
  std::string identity() {
    const std::uint8_t length = u8();
    if (length == 0) fail("an empty identity");
    auto b = take(length);
    return {b.begin(), b.end()};
  }
  Key32 key() {
    Key32 out{};
    auto b = take(kKeyBytes);
    std::copy(b.begin(), b.end(), out.begin());
    return out;
  }
  std::vector<std::uint8_t> blob(std::size_t limit, const char* what) {
    auto b = take(2);
    const std::size_t length = std::size_t{b[0]} | std::size_t{b[1]} << 8;
    if (length == 0 || length > limit) fail(std::string("a ") + what + " of " + std::to_string(length) + " bytes");
    auto data = take(length);
    return {data.begin(), data.end()};
  }
  // A count of items each at least `min_item_bytes` long: bounded by `limit` and by the
  // bytes left, so that a forged count cannot make the parser reserve memory.
  std::uint32_t count(std::uint32_t limit, std::size_t min_item_bytes) {
    const std::uint32_t n = u32();
    if (n > limit || n * min_item_bytes > bytes_.size() - offset_) fail("a count larger than the message allows");
    return n;
  }
  void finish() const {
    if (offset_ != bytes_.size()) fail("trailing bytes");
  }

 private:
  std::span<const std::uint8_t> bytes_;
  const char* name_;
  std::size_t offset_ = 0;
  std::uint64_t round_ = 0;
};

}  // namespace edgetrain::privacy
