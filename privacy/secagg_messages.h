// The bytes of secure aggregation's messages (secagg.h), for the rounds mode to carry as CoAP
// resource bodies later. Ours, little-endian throughout:
//   byte 0: the message's type (1..6 below), byte 1: the format version (1), then the round
//   (8 bytes); an identity is its length (1 byte, 1..255) and its bytes; a key is 32 bytes; a
//   count is 4 bytes. privacy/README.md lists each message's size.
// Parsers take untrusted bytes: they check every length against what remains and against the
// protocol's limits (255 devices, 255-byte identities, 2^28 ring values) and throw
// SecAggError for anything else than exactly one well-formed message.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "privacy/secagg.h"

namespace edgetrain::privacy {

enum class MessageType : std::uint8_t {
  kAdvertiseKeys = 1,
  kKeyDirectory = 2,
  kEncryptedShares = 3,
  kMaskedInput = 4,
  kSurvivorList = 5,
  kUnmaskingShares = 6,
  // A KeyDirectory of a round with neighbours (SecAgg+, secagg_graph.h): after the round,
  // threshold and length, k (4 bytes), the graph's seed (8), |U1| (4), the count, and each
  // entry's index in U1 (4) before its identity and keys. parse_key_directory reads both.
  kNeighbourKeyDirectory = 7,
};
inline constexpr std::uint8_t kMessageFormatVersion = 1;
inline constexpr std::uint32_t kMaxVectorLength = 1u << 28;

std::vector<std::uint8_t> serialize(const AdvertiseKeys& message);
std::vector<std::uint8_t> serialize(const KeyDirectory& message);
std::vector<std::uint8_t> serialize(const EncryptedShares& message);
std::vector<std::uint8_t> serialize(const MaskedInput& message);
std::vector<std::uint8_t> serialize(const SurvivorList& message);
std::vector<std::uint8_t> serialize(const UnmaskingShares& message);

AdvertiseKeys parse_advertise_keys(std::span<const std::uint8_t> bytes);
KeyDirectory parse_key_directory(std::span<const std::uint8_t> bytes);
EncryptedShares parse_encrypted_shares(std::span<const std::uint8_t> bytes);
MaskedInput parse_masked_input(std::span<const std::uint8_t> bytes);
SurvivorList parse_survivor_list(std::span<const std::uint8_t> bytes);
UnmaskingShares parse_unmasking_shares(std::span<const std::uint8_t> bytes);

}  // namespace edgetrain::privacy
