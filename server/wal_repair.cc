#include "server/wal_repair.h"

#include <system_error>

#include "server/durable_file.h"
#include "server/write_ahead_log.h"
#include "transport/codec.h"

namespace edgetrain::server {
namespace {

std::string versions_text(std::uint64_t first, std::uint64_t last) {
  return first == last ? "version " + std::to_string(first)
                       : "versions " + std::to_string(first) + ".." + std::to_string(last);
}

// An update that changes nothing and moves the version on by one: the stand-in for a
// record lost to damage, so that the records after it replay to their logged versions.
WalRecord placeholder(const WalHeader& header, std::uint64_t version) {
  transport::SparseUpdate empty;
  empty.model_id = header.model_id;
  empty.fetched_version = version - 1;  // delay 0: σ counts nothing for it
  auto bytes = transport::encode_sparse_update(empty);
  if (!bytes) throw WalError("cannot encode a placeholder update: " + bytes.error().message);
  return WalRecord{version, std::string(), 0, std::move(bytes).value(), {}};
}

std::vector<std::string> listing(const std::filesystem::path& path, const WalContents& wal) {
  std::vector<std::string> lines;
  std::string summary =
      path.string() + ": " + std::to_string(wal.records.size()) + " intact records";
  if (!wal.records.empty() && wal.header.kind == WalKind::kRoundDeltas)
    summary += " (deltas of round " + std::to_string(wal.records.back().version) + ")";
  else if (!wal.records.empty())
    summary += " (" + versions_text(wal.records.front().version, wal.records.back().version) + ")";
  lines.push_back(summary);
  for (const WalDamage& d : wal.damage) {
    const std::size_t after = wal.records.size() - d.records_before;
    std::string line = "  damaged: bytes " + std::to_string(d.offset) + ".." +
                       std::to_string(d.offset + d.length - 1) + " (" + d.reason + ")";
    const std::uint64_t next = wal.records[d.records_before].version;
    if (wal.header.kind == WalKind::kRoundDeltas) {
      line += ", among the deltas of round " + std::to_string(next);
    } else if (d.records_before > 0) {
      const std::uint64_t previous = wal.records[d.records_before - 1].version;
      line += next > previous + 1 ? ", held " + versions_text(previous + 1, next - 1)
                                  : ", held no whole record";
    } else {
      line += ", before version " + std::to_string(next) + " (the first records of the file)";
    }
    lines.push_back(line + "; " + std::to_string(after) + " intact records after it");
  }
  if (wal.dropped_bytes > 0)
    lines.push_back("  a torn tail of " + std::to_string(wal.dropped_bytes) + " bytes at byte " +
                    std::to_string(wal.valid_bytes) + " (the server cuts it off at start)");
  return lines;
}

std::vector<WalRecord> skipping_damage(const WalContents& wal, const WalPlaceholder& stand_in) {
  // A round's deltas are no sequence of versions: what damage held is simply lost.
  if (wal.header.kind == WalKind::kRoundDeltas) return wal.records;
  std::vector<WalRecord> records;
  std::size_t next_damage = 0;
  for (std::size_t i = 0; i < wal.records.size(); ++i) {
    for (; next_damage < wal.damage.size() && wal.damage[next_damage].records_before == i;
         ++next_damage) {
      if (i == 0)
        throw WalError(
            "the damage comes before every intact record, so how many versions it held is unknown: "
            "--skip-damaged cannot rebuild the versions; use --cut-at-damage or restore the file");
      for (std::uint64_t v = wal.records[i - 1].version + 1; v < wal.records[i].version; ++v)
        records.push_back(stand_in.make ? stand_in.make(wal.header, v) : placeholder(wal.header, v));
    }
    records.push_back(wal.records[i]);
  }
  return records;
}

std::filesystem::path free_name(const std::filesystem::path& path) {
  std::filesystem::path kept = path;
  kept += ".damaged";
  for (int n = 2; std::filesystem::exists(kept); ++n) {
    kept = path;
    kept += ".damaged." + std::to_string(n);
  }
  return kept;
}

}  // namespace

WalRepairResult repair_wal(const std::filesystem::path& path, WalRepairChoice choice,
                           const WalPlaceholder& stand_in) {
  const WalContents wal = read_wal(path);
  WalRepairResult result;
  result.report = listing(path, wal);
  result.damaged = !wal.damage.empty();
  if (!result.damaged) {
    result.report.push_back("  no damage with intact records after it: nothing to repair");
    return result;
  }
  const WalDamage& first = wal.damage.front();
  const std::size_t lost_by_cut = wal.records.size() - first.records_before;
  if (choice == WalRepairChoice::kListOnly) {
    result.report.push_back(
        wal.header.kind == WalKind::kRoundDeltas
            ? "  --skip-damaged would keep all " + std::to_string(wal.records.size()) +
                  " intact records (the damaged deltas are lost: their round closes without them)"
            : "  --skip-damaged would keep all " + std::to_string(wal.records.size()) +
                  " intact records and put " + stand_in.plural + " where damaged ones were "
                  "(their changes to the parameters are lost)");
    result.report.push_back("  --cut-at-damage would end the log at byte " +
                            std::to_string(first.offset) + ", dropping " +
                            std::to_string(lost_by_cut) + " intact, acknowledged records");
    return result;
  }

  std::vector<WalRecord> kept;
  if (choice == WalRepairChoice::kSkipDamaged) {
    kept = skipping_damage(wal, stand_in);
  } else {
    kept.assign(wal.records.begin(),
                wal.records.begin() + static_cast<std::ptrdiff_t>(first.records_before));
  }
  std::vector<std::uint8_t> bytes = encode_wal_header(wal.header);
  for (const WalRecord& record : kept) {
    const std::vector<std::uint8_t> encoded = encode_wal_record(record);
    bytes.insert(bytes.end(), encoded.begin(), encoded.end());
  }
  result.kept_original = free_name(path);
  try {
    // The damaged file keeps its bytes under a second name before the repaired one
    // replaces it (write_file_atomically syncs the directory, and with it the link).
    std::filesystem::create_hard_link(path, result.kept_original);
    write_file_atomically(path, bytes, 0600);
  } catch (const std::exception& e) {
    throw WalError("cannot rewrite " + path.string() + ": " + e.what());
  }
  result.changed = true;
  if (choice == WalRepairChoice::kSkipDamaged) {
    result.report.push_back(
        "  skipped the damage: kept " + std::to_string(wal.records.size()) +
        " intact records, added " + std::to_string(kept.size() - wal.records.size()) +
        " " + stand_in.plural + (wal.dropped_bytes ? ", dropped the torn tail" : ""));
    // (a round-delta log gets no placeholders: kept.size() == wal.records.size())
  } else {
    result.report.push_back("  cut at byte " + std::to_string(first.offset) + ": kept " +
                            std::to_string(first.records_before) + " records, dropped " +
                            std::to_string(lost_by_cut) + " intact records after the damage");
  }
  result.report.push_back("  the damaged file is kept as " + result.kept_original.string());
  return result;
}

}  // namespace edgetrain::server
