#include "privacy/secagg_messages.h"

#include <string>

#include "privacy/message_bytes.h"

namespace edgetrain::privacy {
namespace {

// The shared layout (message_bytes.h), typed by this file's MessageType.
class Writer : public MessageWriter {
 public:
  Writer(MessageType type, std::uint64_t round) : MessageWriter(static_cast<std::uint8_t>(type), round) {}
};
class Reader : public MessageReader {
 public:
  Reader(std::span<const std::uint8_t> bytes, MessageType type, const char* name)
      : MessageReader(bytes, static_cast<std::uint8_t>(type), name) {}
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
