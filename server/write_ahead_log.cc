#include "server/write_ahead_log.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>

#include "server/durable_file.h"

namespace edgetrain::server {
namespace {

constexpr char kMagic[4] = {'E', 'T', 'W', 'L'};
constexpr std::uint16_t kFormat = 1;              // the 32-byte header alone
constexpr std::uint16_t kFormatWithExtension = 2;  // a learning-rate schedule follows it
// version, sequence, identity length
constexpr std::size_t kRecordFixedBody = 8 + 8 + 2;

std::uint32_t crc_of(std::span<const std::uint8_t> bytes) {
  return static_cast<std::uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), bytes.data(), static_cast<uInt>(bytes.size())));
}

void put_le(std::vector<std::uint8_t>& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}

std::uint64_t get_le(const std::uint8_t* in, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= std::uint64_t{in[i]} << (8 * i);
  return value;
}

// Bit 15 of the identity length: entry delays follow the identity (write_ahead_log.h).
constexpr std::uint16_t kEntryDelaysFlag = 0x8000;
constexpr std::size_t kMaxIdentityBytes = 0x7fff;

void put_varint(std::vector<std::uint8_t>& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<std::uint8_t>(value | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<std::uint8_t>(value));
}

// The varint at `at` (moved past it), or nullopt when it runs past `end` or beyond 32 bits.
std::optional<std::uint32_t> get_varint32(const std::uint8_t* end, const std::uint8_t*& at) {
  std::uint64_t value = 0;
  for (int shift = 0; shift <= 28; shift += 7) {
    if (at == end) return std::nullopt;
    const std::uint8_t byte = *at++;
    value |= std::uint64_t{byte & 0x7fu} << shift;
    if (!(byte & 0x80)) {
      if (value > UINT32_MAX) return std::nullopt;
      return static_cast<std::uint32_t>(value);
    }
  }
  return std::nullopt;
}

std::string errno_text() { return std::strerror(errno); }

bool write_all(int fd, std::span<const std::uint8_t> bytes) {
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    written += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

const char* wal_kind_name(WalKind kind) {
  switch (kind) {
    case WalKind::kUpdates:
      return "updates";
    case WalKind::kRoundDeltas:
      return "round deltas";
  }
  return "unknown";
}

std::vector<std::uint8_t> encode_wal_header(const WalHeader& header) {
  if (header.lr_decay_at.size() > kWalMaxLrMilestones)
    throw WalError("WAL: " + std::to_string(header.lr_decay_at.size()) +
                   " learning-rate milestones, a header holds at most " +
                   std::to_string(kWalMaxLrMilestones));
  const bool extended = !header.lr_decay_at.empty();
  std::vector<std::uint8_t> out(kMagic, kMagic + 4);
  put_le(out, extended ? kFormatWithExtension : kFormat, 2);
  put_le(out, static_cast<std::uint16_t>(header.kind), 2);
  put_le(out, header.model_id, 8);
  put_le(out, std::bit_cast<std::uint32_t>(header.learning_rate), 4);
  put_le(out, header.max_staleness, 4);
  put_le(out, header.staleness_rule, 4);
  put_le(out, crc_of(out), 4);
  if (!extended) return out;
  const std::size_t extension = out.size();
  put_le(out, 8 + 8 * header.lr_decay_at.size(), 4);
  put_le(out, std::bit_cast<std::uint32_t>(header.lr_decay_factor), 4);
  put_le(out, header.lr_decay_at.size(), 4);
  for (std::uint64_t milestone : header.lr_decay_at) put_le(out, milestone, 8);
  put_le(out, crc_of(std::span<const std::uint8_t>(out).subspan(extension)), 4);
  return out;
}

std::vector<std::uint8_t> encode_wal_record(const WalRecord& record) {
  if (record.identity.size() > kMaxIdentityBytes)
    throw WalError("WAL: identity longer than 32767 bytes");
  std::vector<std::uint8_t> delays;
  if (!record.entry_delays.empty()) {
    put_varint(delays, record.entry_delays.size());
    for (std::size_t j = 0; j < record.entry_delays.size(); ++j) {
      const WalEntryDelay& entry = record.entry_delays[j];
      if (j > 0 && entry.index <= record.entry_delays[j - 1].index)
        throw WalError("WAL: entry delays not in strictly ascending index order");
      if (entry.delay == 0) throw WalError("WAL: an entry delay of 0 (such entries are left out)");
      put_varint(delays, j == 0 ? entry.index : entry.index - record.entry_delays[j - 1].index - 1);
      put_varint(delays, entry.delay);
    }
  }
  const std::size_t body =
      kRecordFixedBody + record.identity.size() + delays.size() + record.update.size();
  if (body > kWalMaxRecordBody)
    throw WalError("WAL: record of " + std::to_string(body) + " bytes is above the cap");
  std::vector<std::uint8_t> out;
  out.reserve(8 + body);
  put_le(out, body, 4);
  put_le(out, 0, 4);  // CRC, filled in below
  put_le(out, record.version, 8);
  put_le(out, record.sequence, 8);
  put_le(out, record.identity.size() | (delays.empty() ? 0 : kEntryDelaysFlag), 2);
  out.insert(out.end(), record.identity.begin(), record.identity.end());
  out.insert(out.end(), delays.begin(), delays.end());
  out.insert(out.end(), record.update.begin(), record.update.end());
  const std::uint32_t crc = crc_of(std::span<const std::uint8_t>(out).subspan(8));
  for (int i = 0; i < 4; ++i) out[4 + i] = static_cast<std::uint8_t>(crc >> (8 * i));
  return out;
}

namespace {

// The record at `at` if it checks out (else nullopt and `why`). `least_version`: when set,
// a record must carry at least that version (what resynchronising after damage relies on).
std::optional<WalRecord> record_at(std::span<const std::uint8_t> bytes, std::size_t at,
                                   std::optional<std::uint64_t> least_version, std::string& why) {
  if (bytes.size() - at < 8) {
    why = "only " + std::to_string(bytes.size() - at) + " bytes left, a record header has 8";
    return std::nullopt;
  }
  const std::uint64_t body = get_le(bytes.data() + at, 4);
  const std::uint32_t crc = static_cast<std::uint32_t>(get_le(bytes.data() + at + 4, 4));
  if (body < kRecordFixedBody || body > kWalMaxRecordBody) {
    why = "impossible body length " + std::to_string(body);
    return std::nullopt;
  }
  if (body > bytes.size() - at - 8) {
    why = "body of " + std::to_string(body) + " bytes runs past the end of the file";
    return std::nullopt;
  }
  const std::uint8_t* b = bytes.data() + at + 8;
  const std::size_t identity_field = get_le(b + 16, 2);
  const bool has_delays = (identity_field & kEntryDelaysFlag) != 0;
  const std::size_t identity_length = identity_field & ~std::size_t{kEntryDelaysFlag};
  if (kRecordFixedBody + identity_length > body) {
    why = "identity length " + std::to_string(identity_length) + " exceeds the body";
    return std::nullopt;
  }
  const std::uint64_t version = get_le(b, 8);
  if (least_version && version < *least_version) {
    why = "version " + std::to_string(version) + " below " + std::to_string(*least_version);
    return std::nullopt;
  }
  if (crc_of(std::span(b, body)) != crc) {
    why = "CRC mismatch";
    return std::nullopt;
  }
  WalRecord record;
  record.version = version;
  record.sequence = get_le(b + 8, 8);
  record.identity.assign(reinterpret_cast<const char*>(b + kRecordFixedBody), identity_length);
  const std::uint8_t* rest = b + kRecordFixedBody + identity_length;
  const std::uint8_t* const end = b + body;
  if (has_delays) {
    // Checked like the rest although the CRC matched: a writer's bug must not become a
    // huge allocation or an index that wraps.
    const std::optional<std::uint32_t> count = get_varint32(end, rest);
    // Each pair takes at least 2 bytes.
    if (!count || *count == 0 || *count > static_cast<std::size_t>(end - rest) / 2) {
      why = "entry delays: bad count";
      return std::nullopt;
    }
    record.entry_delays.reserve(*count);
    std::uint64_t next_index = 0;
    for (std::uint32_t j = 0; j < *count; ++j) {
      const std::optional<std::uint32_t> gap = get_varint32(end, rest);
      const std::optional<std::uint32_t> delay = gap ? get_varint32(end, rest) : std::nullopt;
      if (!delay || *delay == 0 || next_index + *gap > UINT32_MAX) {
        why = "entry delays: entry " + std::to_string(j) + " is cut short or out of range";
        return std::nullopt;
      }
      const std::uint64_t index = next_index + *gap;
      record.entry_delays.push_back({static_cast<std::uint32_t>(index), *delay});
      next_index = index + 1;
    }
  }
  record.update.assign(rest, end);
  return record;
}

// Where the next intact record after a bad one at `bad` starts, or nullopt (a torn tail).
// Byte by byte, since a damaged length field says nothing about where the next record is;
// the cheap checks come before the CRC, so garbage costs little.
std::optional<std::size_t> next_intact_record(std::span<const std::uint8_t> bytes, std::size_t bad,
                                              std::optional<std::uint64_t> least_version) {
  std::string ignored;
  for (std::size_t at = bad + 1; bytes.size() - at >= 8 + kRecordFixedBody; ++at)
    if (record_at(bytes, at, least_version, ignored)) return at;
  return std::nullopt;
}

}  // namespace

namespace {

// The header at the start of `bytes` (its extension too, for format 2); `header_bytes` is
// set to its length. Throws WalError for anything that does not check out.
WalHeader parse_wal_header(std::span<const std::uint8_t> bytes, const std::string& name,
                           std::uint64_t& header_bytes) {
  WalHeader header;
  if (bytes.size() < kWalHeaderBytes || std::memcmp(bytes.data(), kMagic, 4) != 0)
    throw WalError(name + " is not an edgetrain WAL");
  if (get_le(bytes.data() + 28, 4) != crc_of(bytes.subspan(0, 28)))
    throw WalError(name + ": the WAL header is damaged (CRC mismatch)");
  const std::uint64_t format = get_le(bytes.data() + 4, 2);
  if (format != kFormat && format != kFormatWithExtension)
    throw WalError(name + ": unknown WAL format version " + std::to_string(format) +
                   " (this server reads 1 and 2)");
  const std::uint64_t kind = get_le(bytes.data() + 6, 2);
  if (kind > static_cast<std::uint16_t>(WalKind::kRoundDeltas))
    throw WalError(name + ": unknown WAL kind " + std::to_string(kind));
  header.kind = static_cast<WalKind>(kind);
  header.model_id = get_le(bytes.data() + 8, 8);
  header.learning_rate =
      std::bit_cast<float>(static_cast<std::uint32_t>(get_le(bytes.data() + 16, 4)));
  header.max_staleness = static_cast<std::uint32_t>(get_le(bytes.data() + 20, 4));
  header.staleness_rule = static_cast<std::uint32_t>(get_le(bytes.data() + 24, 4));
  header_bytes = kWalHeaderBytes;
  if (format == kFormat) return header;

  // The extension: its length is checked against what the file holds and against the one
  // body this format knows before anything is allocated.
  const std::span<const std::uint8_t> rest = bytes.subspan(kWalHeaderBytes);
  if (rest.size() < 4) throw WalError(name + ": the WAL header's extension is cut short");
  const std::uint64_t length = get_le(rest.data(), 4);
  if (length < 8 + 8 || length > 8 + 8 * kWalMaxLrMilestones || (length - 8) % 8 != 0)
    throw WalError(name + ": the WAL header's extension has a length of " +
                   std::to_string(length) + " bytes, not 8 + 8 per milestone (1 to " +
                   std::to_string(kWalMaxLrMilestones) + " milestones)");
  if (rest.size() < 4 + length + 4) throw WalError(name + ": the WAL header's extension is cut short");
  if (get_le(rest.data() + 4 + length, 4) != crc_of(rest.subspan(0, 4 + length)))
    throw WalError(name + ": the WAL header's extension is damaged (CRC mismatch)");
  const std::uint8_t* body = rest.data() + 4;
  header.lr_decay_factor = std::bit_cast<float>(static_cast<std::uint32_t>(get_le(body, 4)));
  const std::uint64_t count = get_le(body + 4, 4);
  if (count != (length - 8) / 8)
    throw WalError(name + ": the WAL header's extension counts " + std::to_string(count) +
                   " milestones in a body of " + std::to_string(length) + " bytes");
  for (std::uint64_t k = 0; k < count; ++k) header.lr_decay_at.push_back(get_le(body + 8 + 8 * k, 8));
  header_bytes = kWalHeaderBytes + 4 + length + 4;
  return header;
}

}  // namespace

WalContents parse_wal(std::span<const std::uint8_t> bytes, const std::string& name) {
  WalContents contents;
  contents.header = parse_wal_header(bytes, name, contents.header_bytes);

  std::size_t at = static_cast<std::size_t>(contents.header_bytes);
  while (at < bytes.size()) {
    std::string why;
    if (std::optional<WalRecord> record = record_at(bytes, at, std::nullopt, why)) {
      contents.record_offsets.push_back(at);
      at += 8 + get_le(bytes.data() + at, 4);
      contents.records.push_back(std::move(*record));
      continue;
    }
    // Updates have consecutive versions; a round's deltas share theirs. (Built by assignment:
    // GCC 12 warns that a ternary-built optional "may be used uninitialized".)
    std::optional<std::uint64_t> least_version;
    if (!contents.records.empty())
      least_version = contents.records.back().version +
                      (contents.header.kind == WalKind::kUpdates ? 1 : 0);
    const std::optional<std::size_t> next = next_intact_record(bytes, at, least_version);
    if (!next) break;  // nothing intact after it: a torn tail
    contents.damage.push_back({at, *next - at, why, contents.records.size()});
    at = *next;
  }
  contents.valid_bytes = at;
  contents.dropped_bytes = bytes.size() - at;
  return contents;
}

WalContents read_wal(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw WalError("cannot open the WAL " + path.string());
  const std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(in),
                                        std::istreambuf_iterator<char>()};
  if (in.bad()) throw WalError("cannot read the WAL " + path.string());
  return parse_wal(bytes, path.string());
}

WalHeader read_wal_header(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw WalError("cannot open the WAL " + path.string());
  std::vector<std::uint8_t> bytes(kWalMaxHeaderBytes);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  bytes.resize(static_cast<std::size_t>(in.gcount()));
  std::uint64_t header_bytes = 0;
  return parse_wal_header(bytes, path.string(), header_bytes);
}

std::string describe_wal_damage(const std::filesystem::path& path, const WalContents& contents) {
  if (contents.damage.empty()) return {};
  const WalDamage& damage = contents.damage.front();
  const std::size_t intact_after = contents.records.size() - damage.records_before;
  const WalRecord& next = contents.records[damage.records_before];
  // A round's deltas are named by their round, updates by the version they produced.
  const std::string unit = contents.header.kind == WalKind::kRoundDeltas ? "round" : "version";
  std::string text = path.string() + ": the record at byte " + std::to_string(damage.offset);
  text += damage.records_before == 0
              ? std::string(" (the first record)")
              : std::string(" (after ") + (unit == "round" ? "a delta of round " : "version ") +
                    std::to_string(contents.records[damage.records_before - 1].version) + ")";
  text += " is damaged (" + damage.reason + "; " + std::to_string(damage.length) +
          " bytes up to the next intact record)";
  text += ", and " + std::to_string(intact_after) + " intact records follow it (" + unit + "s " +
          std::to_string(next.version) + ".." + std::to_string(contents.records.back().version) +
          ")";
  if (contents.damage.size() > 1)
    text += "; " + std::to_string(contents.damage.size() - 1) + " more damaged regions after it";
  return text;
}

WalWriter WalWriter::append_to(const std::filesystem::path& path, std::uint64_t valid_bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw WalError("cannot open the WAL " + path.string() + ": " + errno_text());
  // The torn tail goes before anything new is written after it, and durably so: a later
  // crash must not resurrect it in the middle of the log.
  if (::ftruncate(fd, static_cast<off_t>(valid_bytes)) != 0 || ::fsync(fd) != 0 ||
      ::lseek(fd, static_cast<off_t>(valid_bytes), SEEK_SET) < 0) {
    const std::string why = errno_text();
    ::close(fd);
    throw WalError("cannot prepare the WAL " + path.string() + " for appending: " + why);
  }
  return WalWriter(fd, path, valid_bytes);
}

WalWriter WalWriter::replace(const std::filesystem::path& path, const WalHeader& header,
                             std::span<const WalRecord> records) {
  std::vector<std::uint8_t> bytes = encode_wal_header(header);
  for (const WalRecord& record : records) {
    std::vector<std::uint8_t> encoded = encode_wal_record(record);
    bytes.insert(bytes.end(), encoded.begin(), encoded.end());
  }
  try {
    write_file_atomically(path, bytes, 0600);
  } catch (const std::exception& e) {
    throw WalError(std::string("cannot write the WAL: ") + e.what());
  }
  return append_to(path, bytes.size());
}

WalWriter::WalWriter(WalWriter&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), size_(other.size_) {
  other.fd_ = -1;
}

WalWriter& WalWriter::operator=(WalWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    size_ = other.size_;
    other.fd_ = -1;
  }
  return *this;
}

WalWriter::~WalWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void WalWriter::append(const WalRecord& record) {
  if (fd_ < 0) throw WalError("WAL writer is closed");
  const std::vector<std::uint8_t> bytes = encode_wal_record(record);
  // fdatasync: the data and the file size are what replay needs; timestamps are not.
  if (!write_all(fd_, bytes) || ::fdatasync(fd_) != 0) {
    const std::string why = errno_text();
    // Leave no half record for the next append to follow; if even this fails, reading
    // will drop the tail as torn.
    if (::ftruncate(fd_, static_cast<off_t>(size_)) == 0)
      ::lseek(fd_, static_cast<off_t>(size_), SEEK_SET);
    throw WalError("cannot append to the WAL " + path_.string() + ": " + why);
  }
  size_ += bytes.size();
}

void WalWriter::write(const WalRecord& record) {
  if (fd_ < 0) throw WalError("WAL writer is closed");
  const std::vector<std::uint8_t> bytes = encode_wal_record(record);
  if (!write_all(fd_, bytes)) {
    const std::string why = errno_text();
    if (::ftruncate(fd_, static_cast<off_t>(size_)) == 0)
      ::lseek(fd_, static_cast<off_t>(size_), SEEK_SET);
    throw WalError("cannot write to the WAL " + path_.string() + ": " + why);
  }
  size_ += bytes.size();
}

void WalWriter::truncate_to(std::uint64_t size) {
  if (fd_ < 0) throw WalError("WAL writer is closed");
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0 || ::fdatasync(fd_) != 0 ||
      ::lseek(fd_, static_cast<off_t>(size), SEEK_SET) < 0)
    throw WalError("cannot cut the WAL " + path_.string() + " back to " + std::to_string(size) +
                   " bytes: " + errno_text());
  size_ = size;
}

}  // namespace edgetrain::server
