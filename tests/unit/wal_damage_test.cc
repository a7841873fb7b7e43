// Damage in the middle of the write-ahead log is not a torn tail (issue 18): intact,
// acknowledged records after a damaged one are never deleted. Recovery refuses the log,
// naming the record, and leaves every file as it was; repair_wal() (edgetrain-server
// repair-wal) then skips the damage, keeping every intact record with an empty placeholder
// for each lost version, or cuts the log there, as the operator chooses. A torn tail is
// still cut off by recovery itself.
#include <gtest/gtest.h>

#include <zlib.h>

#include <bit>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "server/server_state.h"
#include "server/wal_repair.h"
#include "server/write_ahead_log.h"
#include "tests/support/served_resources.h"

namespace {

using edgetrain::testing::directory_bytes;
using edgetrain::testing::file_bytes;

using namespace edgetrain;
using edgetrain::testing::TempDir;
using edgetrain::testing::tensor_sizes;
using server::ServerState;
using server::ServerStateOptions;
using server::SubmitOutcome;

runtime::Model small_model() {
  return edgetrain::testing::initialized_model("input 4x4x1; fc 8 relu; fc 3", "tiny", 5);
}

ServerStateOptions options_for(const TempDir& dir) {
  ServerStateOptions options;
  options.state_dir = dir.path();
  options.store.learning_rate = 0.05f;
  options.store.max_staleness = 4;
  options.checkpoint_every =
      20;  // checkpoints at 20 and 40; the WAL holds 37..40 (history) and 41..45
  return options;
}

constexpr std::size_t kUpdates = 45;
constexpr std::uint64_t kCheckpointVersion = 40;

// kUpdates random updates from three identities, each fetched up to D versions back.
std::vector<std::pair<std::string, std::vector<std::uint8_t>>> updates_for(
    const ServerStateOptions& options) {
  std::mt19937 rng(18);
  const runtime::Model model = small_model();
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> updates;
  std::uint64_t sequences[3] = {0, 0, 0};
  for (std::uint64_t version = 0; version < kUpdates; ++version) {
    const int w = static_cast<int>(rng() % 3);
    const std::uint64_t fetched =
        version - rng() % (std::min<std::uint64_t>(version, options.store.max_staleness) + 1);
    updates.emplace_back("device-" + std::to_string(w), edgetrain::testing::random_sparse_update(
                                                            rng, model, ++sequences[w], fetched));
  }
  return updates;
}

// The parameters of an uninterrupted store after every update, with update number
// `lost` (1-based version) replaced by an empty one, as --skip-damaged replays it.
std::vector<float> parameters_without(
    const ServerStateOptions& options,
    const std::vector<std::pair<std::string, std::vector<std::uint8_t>>>& updates,
    std::uint64_t lost) {
  const runtime::Model model = small_model();
  server::ParameterStore store(model.layout_id(), tensor_sizes(model),
                               {model.parameters().begin(), model.parameters().end()},
                               options.store);
  for (std::uint64_t version = 1; version <= updates.size(); ++version) {
    transport::SparseUpdate update;
    if (version == lost) {
      update.model_id = model.layout_id();
      update.fetched_version = version - 1;
    } else {
      update = transport::decode_sparse_update(updates[version - 1].second,
                                               {model.layout_id(), tensor_sizes(model)})
                   .value();
    }
    EXPECT_TRUE(store.apply(update).applied()) << version;
  }
  return {store.parameters().begin(), store.parameters().end()};
}

void flip_byte(const std::filesystem::path& path, std::uint64_t offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(offset));
  const char byte = static_cast<char>(file.get() ^ 0x40);
  file.seekp(static_cast<std::streamoff>(offset));
  file.put(byte);
}

// Where in a record the flipped byte lands: its length field, its CRC, or its body.
enum class Where { kLength, kCrc, kBody };

class DamagedWalRecord : public ::testing::TestWithParam<Where> {
 protected:
  // A crash after kUpdates acknowledged updates, then one flipped byte in the record of
  // the first version after the checkpoint (issue 18's case). Returns that record's offset.
  std::uint64_t crash_and_damage() {
    {
      ServerState state(small_model(), options_);
      for (const auto& [identity, bytes] : updates_) {
        const auto result = state.submit(identity, bytes);
        EXPECT_EQ(result.outcome, SubmitOutcome::kApplied) << result.diagnostic;
      }
      EXPECT_EQ(state.checkpoint_version(), kCheckpointVersion);
    }
    const server::WalContents intact = server::read_wal(wal_);
    EXPECT_TRUE(intact.damage.empty());
    std::size_t index = 0;
    while (intact.records[index].version != kCheckpointVersion + 1) ++index;
    const std::uint64_t offset = intact.record_offsets[index];
    flip_byte(wal_, offset + (GetParam() == Where::kLength ? 1
                              : GetParam() == Where::kCrc  ? 5
                                                           : 8 + 20));
    return offset;
  }

  TempDir dir_{"edgetrain-wal-damage"};
  ServerStateOptions options_ = options_for(dir_);
  std::filesystem::path wal_ = dir_.path() / "wal.log";
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> updates_ = updates_for(options_);
};

// The header's staleness-rule field: the rule, --offline-average's bit and the credit apart,
// so that a log written with one of them is told from one written without.
TEST(WalHeaderRule, TheRuleTheOfflineAverageAndTheCreditAreReadBackApart) {
  const std::uint32_t field = server::wal_staleness_rule(2, 1000, true);
  EXPECT_EQ(field & 0xff, 2u);
  EXPECT_TRUE(server::wal_offline_average(field));
  EXPECT_EQ(server::wal_offline_step_credit(field), 1000u);
  const std::uint32_t without = server::wal_staleness_rule(2, 1000);
  EXPECT_FALSE(server::wal_offline_average(without));
  EXPECT_EQ(server::wal_offline_step_credit(without), 1000u);
  EXPECT_NE(field, without);
}

TEST(WalHeaderRule, EntryStalenessHasItsOwnBit) {
  const std::uint32_t field = server::wal_staleness_rule(0, 7, true, true);
  EXPECT_TRUE(server::wal_entry_staleness(field));
  EXPECT_TRUE(server::wal_offline_average(field));
  EXPECT_EQ(server::wal_offline_step_credit(field), 7u);
  EXPECT_EQ(field & 0xff, 0u);
  EXPECT_FALSE(server::wal_entry_staleness(server::wal_staleness_rule(0, 7, true)));
}

// ---- Entry delays (σ per entry, write_ahead_log.h): a record carries them behind bit 15 of
// its identity length; records without them are the format as it was.

// CRC-32 (zlib's polynomial) written out, so that a test can seal a body it built by hand.
std::uint32_t reference_crc32(std::span<const std::uint8_t> bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (const std::uint8_t byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::vector<std::uint8_t> log_of(std::span<const server::WalRecord> records) {
  std::vector<std::uint8_t> bytes = server::encode_wal_header({7, 0.1f, 64, 0x200});
  for (const server::WalRecord& record : records) {
    const std::vector<std::uint8_t> encoded = server::encode_wal_record(record);
    bytes.insert(bytes.end(), encoded.begin(), encoded.end());
  }
  return bytes;
}

server::WalRecord record_with_delays() {
  return {12, "pi-07", 3, {1, 2, 3, 4, 5}, {{0, 1}, {1, 64}, {200, 3}, {70000, 300}}};
}

TEST(WalEntryDelays, RoundTripAndRecordsWithoutThemAreTheOldFormat) {
  const server::WalRecord plain{11, "pi-07", 2, {9, 8, 7}, {}};
  const std::vector<server::WalRecord> records = {plain, record_with_delays()};
  const std::vector<std::uint8_t> bytes = log_of(records);
  const server::WalContents read = server::parse_wal(bytes, "test log");
  ASSERT_EQ(read.records.size(), 2u);
  EXPECT_TRUE(read.damage.empty());
  EXPECT_EQ(read.dropped_bytes, 0u);
  EXPECT_TRUE(server::wal_entry_staleness(read.header.staleness_rule));
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(read.records[i].version, records[i].version);
    EXPECT_EQ(read.records[i].identity, records[i].identity);
    EXPECT_EQ(read.records[i].sequence, records[i].sequence);
    EXPECT_EQ(read.records[i].update, records[i].update);
    EXPECT_EQ(read.records[i].entry_delays, records[i].entry_delays);
  }
  // The old format, byte by byte (server/README.md before entry delays): length, CRC,
  // version, sequence, u16 identity length, identity, update.
  std::vector<std::uint8_t> old_body = {11, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 5, 0,
                                        'p', 'i', '-', '0', '7', 9, 8, 7};
  const std::uint32_t crc = reference_crc32(old_body);
  std::vector<std::uint8_t> old_record = {static_cast<std::uint8_t>(old_body.size()), 0, 0, 0};
  for (int i = 0; i < 4; ++i) old_record.push_back(static_cast<std::uint8_t>(crc >> (8 * i)));
  old_record.insert(old_record.end(), old_body.begin(), old_body.end());
  EXPECT_EQ(server::encode_wal_record(plain), old_record);
  // Delays: varint n = 4, (0, 1), (0, 64), (198, 3), (69799, 300): 13 bytes.
  EXPECT_EQ(server::encode_wal_record(record_with_delays()).size(),
            8 + 18 + 5 + 13 + 5u);
  EXPECT_THROW(server::encode_wal_record({1, "a", 1, {}, {{5, 1}, {5, 2}}}), server::WalError);
  EXPECT_THROW(server::encode_wal_record({1, "a", 1, {}, {{5, 0}}}), server::WalError);
}

TEST(WalEntryDelays, ATornRecordWithDelaysIsDroppedAndTheOnesBeforeItKept) {
  const std::vector<server::WalRecord> records = {{11, "pi-07", 2, {9}, {{4, 2}}},
                                                  record_with_delays()};
  const std::vector<std::uint8_t> whole = log_of(records);
  const std::size_t last = server::encode_wal_record(records.back()).size();
  // Cut anywhere inside the last record's delays or update: the first record stays.
  for (std::size_t cut = 1; cut < last; ++cut) {
    const std::vector<std::uint8_t> torn(whole.begin(), whole.end() - static_cast<long>(cut));
    const server::WalContents read = server::parse_wal(torn, "torn log");
    ASSERT_EQ(read.records.size(), 1u) << cut;
    EXPECT_EQ(read.records[0].entry_delays, records[0].entry_delays);
    EXPECT_EQ(read.dropped_bytes, last - cut);
  }
  // A flipped byte anywhere in the last record: never read back as another record.
  for (std::size_t at = whole.size() - last; at < whole.size(); ++at) {
    std::vector<std::uint8_t> damaged = whole;
    damaged[at] ^= 0x40;
    const server::WalContents read = server::parse_wal(damaged, "damaged log");
    ASSERT_EQ(read.records.size(), 1u) << at;
  }
}

// Delays that do not parse are refused even under a matching CRC (a writer's bug must not
// become an allocation or an index that wraps): the record reads as a torn tail.
TEST(WalEntryDelays, MalformedDelaysUnderAGoodCrcAreRefused) {
  const std::vector<std::uint8_t> good = server::encode_wal_record(record_with_delays());
  const std::size_t delays_at = 8 + 18 + 5;
  auto resealed = [&](std::vector<std::uint8_t> record) {
    const std::uint32_t crc = reference_crc32(std::span(record).subspan(8));
    for (int i = 0; i < 4; ++i) record[4 + i] = static_cast<std::uint8_t>(crc >> (8 * i));
    std::vector<std::uint8_t> bytes = server::encode_wal_header({7, 0.1f, 64, 0x200});
    bytes.insert(bytes.end(), record.begin(), record.end());
    return bytes;
  };
  EXPECT_EQ(server::parse_wal(resealed(good), "resealed").records.size(), 1u);
  std::vector<std::uint8_t> huge_count = good;
  huge_count[delays_at] = 0x7f;  // 127 pairs in 18 bytes
  std::vector<std::uint8_t> zero_count = good;
  zero_count[delays_at] = 0;
  std::vector<std::uint8_t> zero_delay = good;
  zero_delay[delays_at + 2] = 0;  // the first pair's delay
  std::vector<std::uint8_t> endless_varint = good;
  for (std::size_t i = delays_at + 1; i < delays_at + 7; ++i) endless_varint[i] = 0xff;
  for (const auto& bad : {huge_count, zero_count, zero_delay, endless_varint}) {
    const server::WalContents read = server::parse_wal(resealed(bad), "malformed");
    EXPECT_TRUE(read.records.empty());
    EXPECT_EQ(read.dropped_bytes, bad.size());
  }
}

// The learning-rate schedule in the header (format 2, server/README.md): read back as written,
// with a record after it; a log without a schedule is written as format 1, 32 bytes.
TEST(WalHeaderSchedule, RoundTripsInFormat2AndALogWithoutOneStaysFormat1) {
  server::WalHeader header{7, 0.1f, 64, server::wal_staleness_rule(0, 3)};
  EXPECT_EQ(server::encode_wal_header(header).size(), server::kWalHeaderBytes);
  EXPECT_EQ(server::encode_wal_header(header)[4], 1);
  header.lr_decay_at = {3000, 4500, 1ull << 40};
  header.lr_decay_factor = 0.3f;
  std::vector<std::uint8_t> bytes = server::encode_wal_header(header);
  EXPECT_EQ(bytes[4], 2);
  EXPECT_EQ(bytes.size(), server::kWalHeaderBytes + 4 + 8 + 3 * 8 + 4);
  const std::vector<std::uint8_t> record = server::encode_wal_record({1, "device-0", 5, {1, 2, 3}, {}});
  bytes.insert(bytes.end(), record.begin(), record.end());
  const server::WalContents contents = server::parse_wal(bytes, "scheduled.log");
  EXPECT_EQ(contents.header, header);
  EXPECT_EQ(contents.header_bytes, server::kWalHeaderBytes + 4 + 8 + 3 * 8 + 4);
  ASSERT_EQ(contents.records.size(), 1u);
  EXPECT_EQ(contents.records[0].identity, "device-0");
  EXPECT_EQ(contents.dropped_bytes, 0u);
  EXPECT_TRUE(contents.damage.empty());
  header.lr_decay_at.assign(server::kWalMaxLrMilestones + 1, 1);
  EXPECT_THROW(server::encode_wal_header(header), server::WalError);
}

// A format-1 header as logs were written before the schedule came (built here byte by byte,
// not by the encoder): read as a log without a schedule.
TEST(WalHeaderSchedule, AFormat1LogReadsAsOneWithoutASchedule) {
  std::vector<std::uint8_t> old = {'E', 'T', 'W', 'L', 1, 0, 0, 0};
  const auto put = [&old](std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) old.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
  };
  put(42, 8);
  put(std::bit_cast<std::uint32_t>(0.05f), 4);
  put(16, 4);
  put(0, 4);
  put(crc32(crc32(0L, Z_NULL, 0), old.data(), static_cast<uInt>(old.size())), 4);
  ASSERT_EQ(old.size(), server::kWalHeaderBytes);
  const server::WalContents contents = server::parse_wal(old, "old.log");
  EXPECT_EQ(contents.header, (server::WalHeader{42, 0.05f, 16, 0}));
  EXPECT_TRUE(contents.header.lr_decay_at.empty());
  EXPECT_EQ(contents.header.lr_decay_factor, 0.0f);
  EXPECT_EQ(server::encode_wal_header(contents.header), old);  // and written as it was
}

// The extension is covered by its own CRC and its length is checked before anything is read.
TEST(WalHeaderSchedule, ADamagedOrCutExtensionIsRefusedNamingIt) {
  const std::vector<std::uint8_t> good = server::encode_wal_header(
      {.model_id = 7, .learning_rate = 0.1f, .lr_decay_at = {10, 20}, .lr_decay_factor = 0.5f});
  const auto refusal = [](std::vector<std::uint8_t> bytes) -> std::string {
    try {
      server::parse_wal(bytes, "x.log");
    } catch (const server::WalError& e) {
      return e.what();
    }
    return "accepted";
  };
  std::vector<std::uint8_t> flipped = good;
  flipped[server::kWalHeaderBytes + 4 + 9] ^= 0x01;  // a milestone's byte
  EXPECT_NE(refusal(flipped).find("extension is damaged (CRC mismatch)"), std::string::npos);
  EXPECT_NE(refusal({good.begin(), good.end() - 3}).find("extension is cut short"),
            std::string::npos);
  std::vector<std::uint8_t> long_length = good;
  long_length[server::kWalHeaderBytes + 2] = 0x10;  // a length of about a megabyte
  EXPECT_NE(refusal(long_length).find("extension has a length of"), std::string::npos);
}

TEST_P(DamagedWalRecord, StopsRecoveryNamingTheRecordAndTouchesNoFile) {
  const std::uint64_t offset = crash_and_damage();
  const auto before = directory_bytes(dir_.path());
  try {
    ServerState refused(small_model(), options_);
    ADD_FAILURE() << "recovered to version " << refused.version() << " past a damaged record";
  } catch (const server::StateError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("record at byte " + std::to_string(offset) + " (after version 40)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("4 intact records follow it (versions 42..45)"), std::string::npos)
        << message;
    EXPECT_NE(message.find("repair-wal"), std::string::npos) << message;
  }
  EXPECT_EQ(directory_bytes(dir_.path()), before) << "recovery changed a file";

  const server::WalRepairResult listed =
      server::repair_wal(wal_, server::WalRepairChoice::kListOnly);
  EXPECT_TRUE(listed.damaged);
  EXPECT_FALSE(listed.changed);
  EXPECT_EQ(directory_bytes(dir_.path()), before) << "listing changed a file";
}

TEST_P(DamagedWalRecord, SkippingKeepsEveryIntactAcknowledgedRecord) {
  crash_and_damage();
  const std::string damaged_bytes = file_bytes(wal_);
  const server::WalRepairResult repaired =
      server::repair_wal(wal_, server::WalRepairChoice::kSkipDamaged);
  ASSERT_TRUE(repaired.changed);
  EXPECT_EQ(file_bytes(repaired.kept_original), damaged_bytes);
  EXPECT_EQ(repaired.kept_original, dir_.path() / "wal.log.damaged");

  ServerState restarted(small_model(), options_);
  EXPECT_EQ(restarted.version(), kUpdates) << "an acknowledged version was lost";
  EXPECT_EQ(restarted.recovery().replayed_updates, kUpdates - kCheckpointVersion);
  EXPECT_EQ(restarted.snapshot().parameters,
            parameters_without(options_, updates_, kCheckpointVersion + 1));
  // The intact records' senders keep their sequence numbers: their replays apply once.
  for (std::size_t n = kCheckpointVersion + 1; n < kUpdates; ++n) {
    const auto again = restarted.submit(updates_[n].first, updates_[n].second);
    if (again.outcome == SubmitOutcome::kDuplicate) {
      EXPECT_EQ(again.version, n + 1);
    }
  }
  EXPECT_EQ(restarted.version(), kUpdates);
}

TEST_P(DamagedWalRecord, CuttingEndsTheLogBeforeTheDamage) {
  crash_and_damage();
  const server::WalRepairResult repaired =
      server::repair_wal(wal_, server::WalRepairChoice::kCutAtDamage);
  ASSERT_TRUE(repaired.changed);
  ServerState restarted(small_model(), options_);
  EXPECT_EQ(restarted.version(), kCheckpointVersion);
  EXPECT_EQ(restarted.recovery().dropped_wal_bytes, 0u);
  EXPECT_EQ(server::read_wal(repaired.kept_original).records.size(),
            4u + kUpdates - kCheckpointVersion - 1);
}

INSTANTIATE_TEST_SUITE_P(LengthCrcOrBody, DamagedWalRecord,
                         ::testing::Values(Where::kLength, Where::kCrc, Where::kBody),
                         [](const auto& info) {
                           return std::string(info.param == Where::kLength ? "Length"
                                              : info.param == Where::kCrc  ? "Crc"
                                                                           : "Body");
                         });

// A torn tail — an incomplete last record, or garbage with nothing intact after it — is
// still cut off by recovery, and repair_wal finds nothing to repair.
TEST(WalDamage, TornTailIsStillCutByRecovery) {
  for (const bool garbage : {false, true}) {
    SCOPED_TRACE(garbage ? "garbage after the last record" : "last record cut short");
    TempDir dir("edgetrain-wal-damage");
    const ServerStateOptions options = options_for(dir);
    const auto updates = updates_for(options);
    {
      ServerState state(small_model(), options);
      for (std::size_t n = 0; n < 43; ++n) state.submit(updates[n].first, updates[n].second);
    }
    const auto wal = dir.path() / "wal.log";
    if (garbage) {
      std::ofstream(wal, std::ios::app | std::ios::binary) << std::string(3000, '\x5a');
    } else {
      std::filesystem::resize_file(wal, std::filesystem::file_size(wal) - 7);
    }
    const server::WalRepairResult listed =
        server::repair_wal(wal, server::WalRepairChoice::kSkipDamaged);
    EXPECT_FALSE(listed.damaged);
    EXPECT_FALSE(listed.changed);
    ServerState restarted(small_model(), options);
    EXPECT_GT(restarted.recovery().dropped_wal_bytes, 0u);
    EXPECT_EQ(restarted.version(), garbage ? 43u : 42u);
  }
}

// Damage before every intact record leaves the number of lost versions unknown: skipping
// is refused, cutting works.
TEST(WalDamage, SkippingDamageBeforeEveryIntactRecordIsRefused) {
  TempDir dir("edgetrain-wal-damage");
  const ServerStateOptions options = options_for(dir);
  const auto updates = updates_for(options);
  {
    ServerState state(small_model(), options);
    for (std::size_t n = 0; n < 43; ++n) state.submit(updates[n].first, updates[n].second);
  }
  const auto wal = dir.path() / "wal.log";
  flip_byte(wal, server::kWalHeaderBytes + 30);
  const std::string before = file_bytes(wal);
  EXPECT_THROW(server::repair_wal(wal, server::WalRepairChoice::kSkipDamaged), server::WalError);
  EXPECT_EQ(file_bytes(wal), before);
}

}  // namespace
