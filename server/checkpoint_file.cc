#include "server/checkpoint_file.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>

namespace edgetrain::server {
namespace {

constexpr std::size_t kDigits = 8;
constexpr std::string_view kZeroDigits = "00000000";

std::string_view header_of(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < 8) return {};
  std::uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  length = std::min<std::uint64_t>(length, bytes.size() - 8);
  return {reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(length)};
}

// Where the checksum's digits start in `bytes`, if the header holds the key.
std::optional<std::size_t> digits_offset(std::span<const std::uint8_t> bytes) {
  const std::string_view header = header_of(bytes);
  const std::string needle = std::string("\"") + kCheckpointChecksumKey + "\":\"";
  const std::size_t at = header.find(needle);
  if (at == std::string_view::npos || at + needle.size() + kDigits >= header.size())
    return std::nullopt;
  return 8 + at + needle.size();
}

std::uint32_t crc_of(std::uint32_t crc, const std::uint8_t* data, std::size_t size) {
  while (size > 0) {  // zlib takes 32-bit lengths
    const std::size_t piece = std::min<std::size_t>(size, 1u << 30);
    crc = static_cast<std::uint32_t>(crc32(crc, data, static_cast<uInt>(piece)));
    data += piece;
    size -= piece;
  }
  return crc;
}

// The CRC of `bytes` with the 8 digits at `offset` read as "00000000".
std::uint32_t checksum_with_zero_digits(std::span<const std::uint8_t> bytes, std::size_t offset) {
  std::uint32_t crc = static_cast<std::uint32_t>(crc32(0L, Z_NULL, 0));
  crc = crc_of(crc, bytes.data(), offset);
  crc = crc_of(crc, reinterpret_cast<const std::uint8_t*>(kZeroDigits.data()), kDigits);
  return crc_of(crc, bytes.data() + offset + kDigits, bytes.size() - offset - kDigits);
}

std::string hex8(std::uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", value);
  return text;
}

}  // namespace

std::vector<std::uint8_t> sealed_checkpoint_bytes(const runtime::Model& model,
                                                  std::map<std::string, std::string> metadata) {
  metadata[kCheckpointChecksumKey] = std::string(kZeroDigits);
  std::vector<std::uint8_t> bytes = model.safetensors_bytes(metadata);
  const std::optional<std::size_t> offset = digits_offset(bytes);
  if (!offset) throw std::logic_error("the checkpoint header lost its checksum placeholder");
  const std::string digits = hex8(checksum_with_zero_digits(bytes, *offset));
  std::memcpy(bytes.data() + *offset, digits.data(), kDigits);
  return bytes;
}

CheckpointCheck check_checkpoint_seal(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < 8)
    return {CheckpointSeal::kDamaged, "shorter than a safetensors length prefix"};
  const std::optional<std::size_t> offset = digits_offset(bytes);
  if (!offset) {
    // Checkpoints of state format 1 had no checksum. A damaged key in a newer one must not
    // pass for that, and cannot: its header says format 2.
    if (header_of(bytes).find("\"edgetrain.state_format\":\"1\"") != std::string_view::npos)
      return {CheckpointSeal::kNone, {}};
    return {CheckpointSeal::kDamaged,
            std::string("no ") + kCheckpointChecksumKey +
                " in its metadata, and it is not a state-format-1 checkpoint (which had none)"};
  }
  const std::string stored(reinterpret_cast<const char*>(bytes.data()) + *offset, kDigits);
  const std::string computed = hex8(checksum_with_zero_digits(bytes, *offset));
  if (stored != computed)
    return {CheckpointSeal::kDamaged,
            "checksum mismatch (" + std::string(kCheckpointChecksumKey) + " says " + stored +
                ", the file's " + std::to_string(bytes.size()) + " bytes give " + computed + ")"};
  return {CheckpointSeal::kIntact, {}};
}

}  // namespace edgetrain::server
