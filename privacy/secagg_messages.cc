#include "privacy/secagg_messages.h"

#include <string>

namespace edgetrain::privacy {
namespace {

class Writer {
 public:
  Writer(MessageType type, std::uint64_t round) {
    bytes_.push_back(static_cast<std::uint8_t>(type));
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
  std::vector<std::uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<std::uint8_t> bytes_;
};

class Reader {
 public:
  Reader(std::span<const std::uint8_t> bytes, MessageType type, const char* name) : bytes_(bytes), name_(name) {
    if (u8() != static_cast<std::uint8_t>(type)) fail("not this message type");
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

// The most shares one message can hold: one per other device of a round.
constexpr std::uint32_t kMaxEntries = kMaxSecAggDevices;
constexpr std::uint32_t kMaxSealedBytes = 1024;

}  // namespace

std::vector<std::uint8_t> serialize(const AdvertiseKeys& message) {
  Writer w(MessageType::kAdvertiseKeys, message.round);
  w.identity(message.identity);
  w.raw(message.cipher_public_key);
  w.raw(message.mask_public_key);
  return w.take();
}

AdvertiseKeys parse_advertise_keys(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, MessageType::kAdvertiseKeys, "AdvertiseKeys");
  AdvertiseKeys out;
  out.round = r.round();
  out.identity = r.identity();
  out.cipher_public_key = r.key();
  out.mask_public_key = r.key();
  r.finish();
  return out;
}

std::vector<std::uint8_t> serialize(const KeyDirectory& message) {
  if (message.config.neighbours != 0 || message.key_holders != 0 || !message.positions.empty()) {
    // SecAgg+ (ours): k, the graph's seed, |U1|, and each listed device's index in U1.
    Writer w(MessageType::kNeighbourKeyDirectory, message.config.round);
    w.u32(message.config.threshold);
    w.u32(message.config.vector_length);
    w.u32(message.config.neighbours);
    w.u64(message.config.graph_seed);
    w.u32(static_cast<std::uint32_t>(message.key_holder_count()));
    if (!message.positions.empty() && message.positions.size() != message.devices.size()) {
      throw SecAggError("a key directory with positions for some of its devices only");
    }
    w.u32(static_cast<std::uint32_t>(message.devices.size()));
    for (std::size_t i = 0; i < message.devices.size(); ++i) {
      w.u32(message.positions.empty() ? static_cast<std::uint32_t>(i) : message.positions[i]);
      w.identity(message.devices[i].identity);
      w.raw(message.devices[i].cipher_public_key);
      w.raw(message.devices[i].mask_public_key);
    }
    return w.take();
  }
  Writer w(MessageType::kKeyDirectory, message.config.round);
  w.u32(message.config.threshold);
  w.u32(message.config.vector_length);
  w.u32(static_cast<std::uint32_t>(message.devices.size()));
  for (const AdvertiseKeys& device : message.devices) {
    // Every entry is of the directory's round (SecAggDevice checks it): not repeated.
    w.identity(device.identity);
    w.raw(device.cipher_public_key);
    w.raw(device.mask_public_key);
  }
  return w.take();
}

namespace {

KeyDirectory parse_neighbour_key_directory(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, MessageType::kNeighbourKeyDirectory, "KeyDirectory (neighbours)");
  KeyDirectory out;
  out.config.round = r.round();
  out.config.threshold = r.u32();
  out.config.vector_length = r.u32();
  if (out.config.vector_length > kMaxVectorLength) r.fail("a vector longer than 2^28 values");
  out.config.neighbours = r.u32();
  out.config.graph_seed = r.u64();
  out.key_holders = r.u32();
  if (out.key_holders < 2 || out.key_holders > kMaxNeighbourGraphDevices) r.fail("a count of key holders out of range");
  const std::uint32_t n = r.count(out.key_holders, 4 + 2 + 2 * kKeyBytes);
  for (std::uint32_t i = 0; i < n; ++i) {
    out.positions.push_back(r.u32());
    AdvertiseKeys device;
    device.round = out.config.round;
    device.identity = r.identity();
    device.cipher_public_key = r.key();
    device.mask_public_key = r.key();
    out.devices.push_back(std::move(device));
  }
  r.finish();
  return out;
}

}  // namespace

KeyDirectory parse_key_directory(std::span<const std::uint8_t> bytes) {
  if (!bytes.empty() && bytes[0] == static_cast<std::uint8_t>(MessageType::kNeighbourKeyDirectory)) {
    return parse_neighbour_key_directory(bytes);
  }
  Reader r(bytes, MessageType::kKeyDirectory, "KeyDirectory");
  KeyDirectory out;
  out.config.round = r.round();
  out.config.threshold = r.u32();
  out.config.vector_length = r.u32();
  if (out.config.vector_length > kMaxVectorLength) r.fail("a vector longer than 2^28 values");
  const std::uint32_t n = r.count(kMaxEntries, 2 + 2 * kKeyBytes);
  for (std::uint32_t i = 0; i < n; ++i) {
    AdvertiseKeys device;
    device.round = out.config.round;
    device.identity = r.identity();
    device.cipher_public_key = r.key();
    device.mask_public_key = r.key();
    out.devices.push_back(std::move(device));
  }
  r.finish();
  return out;
}

std::vector<std::uint8_t> serialize(const EncryptedShares& message) {
  Writer w(MessageType::kEncryptedShares, message.round);
  w.u32(static_cast<std::uint32_t>(message.shares.size()));
  for (const EncryptedShare& share : message.shares) {
    w.identity(share.sender);
    w.identity(share.recipient);
    if (share.sealed.size() > kMaxSealedBytes) throw SecAggError("a sealed share longer than 1024 bytes");
    w.u32(static_cast<std::uint32_t>(share.sealed.size()));
    w.raw(share.sealed);
  }
  return w.take();
}

EncryptedShares parse_encrypted_shares(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, MessageType::kEncryptedShares, "EncryptedShares");
  EncryptedShares out;
  out.round = r.round();
  const std::uint32_t n = r.count(kMaxEntries, 2 + 2 + 4);
  for (std::uint32_t i = 0; i < n; ++i) {
    EncryptedShare share;
    share.sender = r.identity();
    share.recipient = r.identity();
    const std::uint32_t length = r.u32();
    if (length > kMaxSealedBytes) r.fail("a sealed share longer than 1024 bytes");
    auto sealed = r.take(length);
    share.sealed.assign(sealed.begin(), sealed.end());
    out.shares.push_back(std::move(share));
  }
  r.finish();
  return out;
}

std::vector<std::uint8_t> serialize(const MaskedInput& message) {
  Writer w(MessageType::kMaskedInput, message.round);
  w.identity(message.identity);
  if (message.masked.size() > kMaxVectorLength) throw SecAggError("a vector longer than 2^28 values");
  w.u32(static_cast<std::uint32_t>(message.masked.size()));
  for (std::uint32_t value : message.masked) w.u32(value);
  return w.take();
}

MaskedInput parse_masked_input(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, MessageType::kMaskedInput, "MaskedInput");
  MaskedInput out;
  out.round = r.round();
  out.identity = r.identity();
  const std::uint32_t n = r.count(kMaxVectorLength, 4);
  out.masked.resize(n);
  for (std::uint32_t& value : out.masked) value = r.u32();
  r.finish();
  return out;
}

std::vector<std::uint8_t> serialize(const SurvivorList& message) {
  Writer w(MessageType::kSurvivorList, message.round);
  w.u32(static_cast<std::uint32_t>(message.survivors.size()));
  for (const std::string& survivor : message.survivors) w.identity(survivor);
  return w.take();
}

SurvivorList parse_survivor_list(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, MessageType::kSurvivorList, "SurvivorList");
  SurvivorList out;
  out.round = r.round();
  const std::uint32_t n = r.count(kMaxEntries, 2);
  for (std::uint32_t i = 0; i < n; ++i) out.survivors.push_back(r.identity());
  r.finish();
  return out;
}

std::vector<std::uint8_t> serialize(const UnmaskingShares& message) {
  Writer w(MessageType::kUnmaskingShares, message.round);
  w.identity(message.identity);
  w.u32(static_cast<std::uint32_t>(message.shares.size()));
  for (const RevealedShare& revealed : message.shares) {
    w.identity(revealed.owner);
    w.u8(static_cast<std::uint8_t>(revealed.kind));
    w.u8(revealed.share.x);
    if (revealed.share.y.size() != kKeyBytes) throw SecAggError("a revealed share is not 32 bytes");
    w.raw(revealed.share.y);
  }
  return w.take();
}

UnmaskingShares parse_unmasking_shares(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, MessageType::kUnmaskingShares, "UnmaskingShares");
  UnmaskingShares out;
  out.round = r.round();
  out.identity = r.identity();
  const std::uint32_t n = r.count(kMaxEntries, 2 + 2 + kKeyBytes);
  for (std::uint32_t i = 0; i < n; ++i) {
    RevealedShare revealed;
    revealed.owner = r.identity();
    const std::uint8_t kind = r.u8();
    if (kind != static_cast<std::uint8_t>(SecretKind::kSelfMaskSeed) &&
        kind != static_cast<std::uint8_t>(SecretKind::kMaskPrivateKey)) {
      r.fail("an unknown secret kind");
    }
    revealed.kind = static_cast<SecretKind>(kind);
    revealed.share.x = r.u8();
    auto y = r.take(kKeyBytes);
    revealed.share.y.assign(y.begin(), y.end());
    out.shares.push_back(std::move(revealed));
  }
  r.finish();
  return out;
}

}  // namespace edgetrain::privacy
