// What `edgetrain-server repair-wal` does with a write-ahead log whose middle is damaged
// (server/write_ahead_log.h tells that from a torn tail). Recovery refuses such a log and
// touches nothing; the operator looks at the listing and chooses:
//
//   skip the damaged records: every intact record is kept; each version the damage
//     covered is replaced by an empty placeholder update (no identity, no tensors, fetched
//     at the version before it), so the versions after it still replay to the versions
//     their workers were acknowledged. The damaged updates' own changes are lost.
//   cut at the damage: the log ends before the first damaged record, as a torn tail would;
//     every record after it (intact and acknowledged) is dropped.
//
// Either way the damaged file is kept under a new name (wal.log.damaged, or with .2, .3 …
// appended when that exists) and the repaired log replaces it atomically. The server must
// not be running. No networking, no model: the WAL header has what a placeholder needs.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "server/write_ahead_log.h"

namespace edgetrain::server {

enum class WalRepairChoice { kListOnly, kSkipDamaged, kCutAtDamage };

struct WalRepairResult {
  bool damaged = false;  // intact records follow damaged bytes (recovery refuses the file)
  bool changed = false;  // the file was rewritten (never with kListOnly, never when intact)
  std::filesystem::path kept_original;  // where the damaged file went, when changed
  std::vector<std::string> report;      // what was found and, if anything, done: one line each
};

// What stands in for a version lost to damage when it is skipped, and what the report calls
// it. The default (an empty `make`) is an empty sparse update, for wal.log; the GAN's log
// gets an iteration closed without a step (server/gan_coordinator.h).
struct WalPlaceholder {
  std::function<WalRecord(const WalHeader& header, std::uint64_t version)> make;
  std::string plural = "empty placeholder updates";
};

// Reads the log at `path` and, unless `choice` is kListOnly or the log has no damage
// (a torn tail alone is left for the server, which cuts it at start), repairs it.
// Throws WalError when the file cannot be read or written, its header is damaged, or the
// choice cannot be carried out (skipping damage that comes before any intact record: how
// many versions it covered is unknown).
WalRepairResult repair_wal(const std::filesystem::path& path, WalRepairChoice choice,
                           const WalPlaceholder& placeholder = {});

}  // namespace edgetrain::server
