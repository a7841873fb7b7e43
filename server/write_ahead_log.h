// The write-ahead log: every accepted update, appended and fsynced before the server
// acknowledges it, so that after a crash the server can replay to exactly the version it
// acknowledged. Layout (all integers little-endian; see server/README.md):
//
//   header (32 bytes): "ETWL", u16 format (1 or 2), u16 kind (WalKind), u64 model id,
//                      f32 learning rate, u32 max staleness, u32 staleness rule,
//                      u32 crc32 of the previous 28 bytes
//   format 2 only, the header's extension right after it: u32 length L of the body, body
//                      (L bytes: f32 lr decay factor, u32 milestone count n ≥ 1, n × u64
//                      milestones; L = 8 + 8n), u32 crc32 of the length and the body
//   record:            u32 body length, u32 crc32 of the body, body:
//                      u64 version it produced, u64 sequence, u16 identity length,
//                      identity bytes, [entry delays], the update exactly as received
//                      (codec bytes)
//
// Entry delays (σ per entry, --entry-staleness; ours): bit 15 of the identity length says
// they are there (so identities are at most 32767 bytes; a record without them reads as
// before). They are what replay needs of the server's record of the sender's copy, which is
// not durable: varint n, then n pairs of varints (index gap, delay), flat parameter indices
// ascending (the first pair's gap is its index, each later one's is index − previous − 1),
// each delay t_fetch − h_i ≥ 1 for a touched entry whose value in the sender's copy was
// last the model's at version h_i < t_fetch, capped at the header's max staleness D (the
// store counts no further back). Entries not listed were the model's at t_fetch.
//
// Two kinds of log share the format. kUpdates (0; the field was a reserved 0 before the
// kinds came, so older logs read as this kind): the main WAL, one record per applied update,
// versions consecutive; MD-GAN's gan/gan.wal (one record per generator step) is of this
// kind too, its model id the run's. kRoundDeltas (1): rounds.wal of federated rounds, one
// record per acknowledged delta of the open round (version = the round, sequence = the
// examples it was trained on, the delta's codec bytes), many records per version.
//
// Format 2 is written only for a log with a learning-rate schedule (server/parameter_store.h,
// "Learning-rate schedule"), which the 32 bytes have no room for; every other log is written
// as format 1, byte for byte as before the schedule came, and a format-1 log reads as one
// without a schedule.
//
// The settings in the header are the ones replay needs to reproduce the same parameters:
// a server started with other settings on the same state refuses to start rather than
// silently replaying to different parameters.
//
// A crash can leave a torn last record (short, or with a wrong CRC): nothing that checks
// out follows it. Damage in the middle of the log (a flipped byte, a bad sector) is
// different: intact, acknowledged records follow it. Reading tells the two apart by
// scanning forward from a record that does not check out for the next intact one (a
// plausible length, a version after the last good one (kRoundDeltas: not before it), and
// the body's CRC): none means a
// torn tail, which read_wal() reports as dropped bytes and the writer cuts off before
// appending; one means damage, which read_wal() reports with every intact record after it
// and which nothing here ever cuts off (recovery refuses to start, server/wal_repair.h
// lets the operator choose).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace edgetrain::server {

class WalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class WalKind : std::uint16_t { kUpdates = 0, kRoundDeltas = 1 };
const char* wal_kind_name(WalKind kind);

struct WalHeader {
  std::uint64_t model_id = 0;
  float learning_rate = 0;
  std::uint32_t max_staleness = 0;
  // StalenessRule as a number in the low 16 bits; the high 16 bits hold the offline step
  // credit (server/parameter_store.h, "Offline updates"; 0 in logs written before it), which
  // replay needs as much as the rule. Packed so the header keeps its 32 bytes.
  std::uint32_t staleness_rule = 0;
  WalKind kind = WalKind::kUpdates;   // after the first four, so older initializers keep their meaning
  // The learning-rate schedule (format 2; empty and 0 in a format-1 log, a log without one):
  // ParameterStoreOptions::lr_schedule's milestones and factor. A writer with no milestones
  // leaves the factor 0 too, so that headers compare equal whatever the unused factor.
  std::vector<std::uint64_t> lr_decay_at = {};
  float lr_decay_factor = 0;
  bool operator==(const WalHeader&) const = default;
};

// One entry of a σ-per-entry update whose value in the sender's copy was older than the
// update's t_fetch (above, "Entry delays").
struct WalEntryDelay {
  std::uint32_t index = 0;  // flat parameter index
  std::uint32_t delay = 0;  // t_fetch − h_i, at least 1
  bool operator==(const WalEntryDelay&) const = default;
};

struct WalRecord {
  std::uint64_t version = 0;         // the model version this update produced
  std::string identity;              // DTLS identity that sent it
  std::uint64_t sequence = 0;        // the worker's sequence number
  std::vector<std::uint8_t> update;  // the update's codec bytes
  // Empty: every entry as old as t_fetch (the paper's σ). Indices strictly ascending.
  std::vector<WalEntryDelay> entry_delays;
};

// WalHeader::staleness_rule for a rule (a StalenessRule's number, bits 0-7), the offline
// average (bit 8: ParameterStoreOptions::offline_average), σ per entry (bit 9: the server's
// --entry-staleness, its records carry entry delays) and an offline step credit (bits
// 16-31, at most 65535).
inline constexpr std::uint32_t kWalOfflineAverageBit = 0x100;
inline constexpr std::uint32_t kWalEntryStalenessBit = 0x200;
inline std::uint32_t wal_staleness_rule(auto rule, std::uint32_t offline_step_credit,
                                        bool offline_average = false,
                                        bool entry_staleness = false) {
  return static_cast<std::uint32_t>(rule) | (offline_average ? kWalOfflineAverageBit : 0) |
         (entry_staleness ? kWalEntryStalenessBit : 0) | (offline_step_credit << 16);
}
inline bool wal_offline_average(std::uint32_t staleness_rule) {
  return (staleness_rule & kWalOfflineAverageBit) != 0;
}
inline bool wal_entry_staleness(std::uint32_t staleness_rule) {
  return (staleness_rule & kWalEntryStalenessBit) != 0;
}
inline std::uint32_t wal_offline_step_credit(std::uint32_t staleness_rule) {
  return staleness_rule >> 16;
}

inline constexpr std::size_t kWalHeaderBytes = 32;  // format 1; format 2 adds its extension
// The most milestones a format-2 header holds (server::kMaxLearningRateMilestones).
inline constexpr std::size_t kWalMaxLrMilestones = 64;
// The longest header: format 2 with kWalMaxLrMilestones milestones.
inline constexpr std::size_t kWalMaxHeaderBytes = kWalHeaderBytes + 4 + 8 + 8 * kWalMaxLrMilestones + 4;
// A record body above this is treated as damage, never allocated.
inline constexpr std::uint32_t kWalMaxRecordBody = 256u << 20;

// Bytes in the middle of a log that do not form a record, with intact records after them.
struct WalDamage {
  std::uint64_t offset = 0;        // of the first damaged byte (where a record should start)
  std::uint64_t length = 0;        // up to the next intact record
  std::string reason;              // why the record at `offset` does not check out
  std::size_t records_before = 0;  // intact records before it: records[records_before] follows it
};

struct WalContents {
  WalHeader header;
  std::uint64_t header_bytes = kWalHeaderBytes;  // where the first record starts
  std::vector<WalRecord> records;             // every intact record, also those after damage
  std::vector<std::uint64_t> record_offsets;  // where each of them starts in the file
  std::vector<WalDamage> damage;              // empty unless the middle of the log is damaged
  std::uint64_t valid_bytes = 0;              // up to the end of the last intact record
  std::uint64_t dropped_bytes = 0;            // after it: a torn tail (nothing intact follows)
};

// Throws WalError when the file cannot be read or its header is not a valid WAL header
// (a log whose header is damaged cannot be trusted at all).
WalContents read_wal(const std::filesystem::path& path);
// Only the header of the log at `path` (its first 32 bytes, and format 2's extension): the
// settings replay needs.
// Throws WalError as read_wal() does.
WalHeader read_wal_header(const std::filesystem::path& path);
WalContents parse_wal(std::span<const std::uint8_t> bytes, const std::string& name);

// One line for the operator about the first damaged region of `contents` (read from
// `path`): where, why, and the intact records after it.
std::string describe_wal_damage(const std::filesystem::path& path, const WalContents& contents);

// Format 1 without a schedule, format 2 with one. Throws WalError for more than
// kWalMaxLrMilestones milestones.
std::vector<std::uint8_t> encode_wal_header(const WalHeader& header);
std::vector<std::uint8_t> encode_wal_record(const WalRecord& record);

// Appends records durably. Not thread-safe.
class WalWriter {
 public:
  // Opens an existing log for appending after its first `valid_bytes` bytes (what
  // read_wal found), cutting off a torn tail first.
  static WalWriter append_to(const std::filesystem::path& path, std::uint64_t valid_bytes);
  // Replaces the log at `path` with one holding `header` and `records` (written to a
  // temporary file, fsynced, renamed over it) and opens it for appending.
  static WalWriter replace(const std::filesystem::path& path, const WalHeader& header,
                           std::span<const WalRecord> records);
  WalWriter(WalWriter&& other) noexcept;
  WalWriter& operator=(WalWriter&& other) noexcept;
  WalWriter(const WalWriter&) = delete;
  WalWriter& operator=(const WalWriter&) = delete;
  ~WalWriter();

  // Writes the record and fdatasyncs; when this returns the record survives a crash. On
  // failure the file is cut back to where it was and WalError is thrown.
  void append(const WalRecord& record);
  std::uint64_t size_bytes() const { return size_; }

  // Group commit uses the two halves of append() separately. write() puts the record after
  // the others without syncing (on failure the file is cut back and WalError thrown);
  // descriptor() is then fdatasync()ed, possibly on another thread while write() goes on:
  // a completed fdatasync covers every record written before it started. After a failed
  // sync, truncate_to() cuts off the records it was meant to cover (and all later ones) and
  // syncs the cut; WalError if that fails too.
  void write(const WalRecord& record);
  int descriptor() const { return fd_; }
  void truncate_to(std::uint64_t size);

 private:
  WalWriter(int fd, std::filesystem::path path, std::uint64_t size)
      : fd_(fd), path_(std::move(path)), size_(size) {}
  int fd_ = -1;
  std::filesystem::path path_;
  std::uint64_t size_ = 0;
};

}  // namespace edgetrain::server
