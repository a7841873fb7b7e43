// The integrity check of checkpoint files. A checkpoint stays a plain safetensors file that
// NumPy, PyTorch and the `safetensors` package open as before; its __metadata__ carries one
// more string, `edgetrain.crc32`: 8 lowercase hex digits of the CRC-32 (zlib's, as in the
// WAL) of the whole file — length prefix, JSON header and data — computed with those 8
// digits written as "00000000". Checking it needs no JSON re-serialisation: the digits are
// found in the header bytes, zeroed, and the CRC recomputed. A flipped data or metadata
// byte, or a truncated file, no longer matches.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace edgetrain::server {

inline constexpr const char* kCheckpointChecksumKey = "edgetrain.crc32";

// The safetensors bytes of `model` with `metadata` and the checksum filled in.
std::vector<std::uint8_t> sealed_checkpoint_bytes(const runtime::Model& model,
                                                  std::map<std::string, std::string> metadata);

enum class CheckpointSeal {
  kIntact,   // the checksum matches
  kNone,     // no checksum, and the header says state format 1 (written before checksums)
  kDamaged,  // the checksum does not match, or is missing where it must be, or no header
};

struct CheckpointCheck {
  CheckpointSeal seal = CheckpointSeal::kDamaged;
  std::string problem;  // for kDamaged: what is wrong, for a person
};

CheckpointCheck check_checkpoint_seal(std::span<const std::uint8_t> bytes);

}  // namespace edgetrain::server
