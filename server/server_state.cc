#include "server/server_state.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#include "server/checkpoint_file.h"
#include "server/durable_file.h"
#include "server/model_changes.h"
#include "transport/untrusted_text.h"

namespace edgetrain::server {
namespace {

constexpr const char* kVersionKey = "edgetrain.version";
constexpr const char* kModelIdKey = "edgetrain.model_id";
constexpr const char* kSequencesKey = "edgetrain.sequences";
constexpr const char* kStateFormatKey = "edgetrain.state_format";

std::vector<float> parameters_of(const runtime::Model& model) {
  return {model.parameters().begin(), model.parameters().end()};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::uint64_t parse_u64(const std::map<std::string, std::string>& metadata, const char* key,
                        const std::filesystem::path& path) {
  auto it = metadata.find(key);
  if (it == metadata.end()) throw StateError(path.string() + " has no " + key + " in its metadata");
  try {
    std::size_t used = 0;
    const std::uint64_t value = std::stoull(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing characters");
    return value;
  } catch (const std::exception&) {
    throw StateError(path.string() + ": " + key + " is not a number: '" + it->second + "'");
  }
}

// σ per entry: what the WAL record of `update` keeps of the sender's entry versions
// (write_ahead_log.h, "Entry delays"): its touched entries held since before its t_fetch,
// each delay capped at `max_staleness` (the store counts no further back).
std::vector<WalEntryDelay> entry_delays_of(const transport::SparseUpdate& update,
                                           std::span<const std::uint32_t> tensor_sizes,
                                           std::span<const std::uint64_t> entry_versions,
                                           std::uint32_t max_staleness) {
  std::vector<WalEntryDelay> delays;
  if (entry_versions.empty()) return delays;
  std::vector<std::size_t> offsets(tensor_sizes.size(), 0);
  for (std::size_t t = 1; t < tensor_sizes.size(); ++t)
    offsets[t] = offsets[t - 1] + tensor_sizes[t - 1];
  const std::uint64_t fetched = update.fetched_version;
  for (const transport::SparseTensor& tensor : update.tensors)
    for (const std::uint32_t i : tensor.indices) {
      const std::size_t flat = offsets[tensor.tensor] + i;
      if (entry_versions[flat] >= fetched) continue;
      delays.push_back({static_cast<std::uint32_t>(flat),
                        static_cast<std::uint32_t>(std::min<std::uint64_t>(
                            fetched - entry_versions[flat], max_staleness))});
    }
  // Tensors may come in any order; within one, indices ascend.
  std::sort(delays.begin(), delays.end(),
            [](const WalEntryDelay& a, const WalEntryDelay& b) { return a.index < b.index; });
  return delays;
}

std::vector<std::uint8_t> read_whole_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::system_error(errno, std::generic_category(), "cannot open " + path.string());
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
  if (in.bad())
    throw std::system_error(errno, std::generic_category(), "cannot read " + path.string());
  return bytes;
}

// Temporaries of a checkpoint or WAL write that never completed (checkpoint.*.tmp,
// wal.*.tmp): never renamed into place, so never part of the state. Other files in the
// directory are left alone. Returns what was removed.
std::vector<std::filesystem::path> remove_leftover_temporaries(
    const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> removed;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name.starts_with("checkpoint.") || name.starts_with("wal.");
    if (!ours || !name.ends_with(".tmp") || !entry.is_regular_file()) continue;
    std::filesystem::remove(entry.path());
    removed.push_back(entry.path());
  }
  return removed;
}

}  // namespace

const char* submit_outcome_name(SubmitOutcome outcome) {
  switch (outcome) {
    case SubmitOutcome::kApplied:
      return "applied";
    case SubmitOutcome::kDuplicate:
      return "duplicate";
    case SubmitOutcome::kTooLarge:
      return "too large";
    case SubmitOutcome::kMalformed:
      return "malformed";
    case SubmitOutcome::kWrongModel:
      return "wrong model";
    case SubmitOutcome::kTooStale:
      return "too stale";
    case SubmitOutcome::kOldSequence:
      return "old sequence";
    case SubmitOutcome::kNotDurable:
      return "not durable";
    case SubmitOutcome::kOutOfBounds:
      return "out of bounds";
    case SubmitOutcome::kQuarantined:
      return "quarantined";
  }
  return "unknown";
}

ServerState::ServerState(runtime::Model model, ServerStateOptions options)
    : model_(std::move(model)),
      options_(std::move(options)),
      checkpoint_path_(options_.state_dir / "checkpoint.safetensors"),
      wal_path_(options_.state_dir / "wal.log"),
      previous_checkpoint_path_(options_.state_dir / "checkpoint.prev.safetensors"),
      previous_wal_path_(options_.state_dir / "wal.prev.log"),
      tensor_sizes_(model_.tensor_sizes()),
      store_(model_.layout_id(), tensor_sizes_, parameters_of(model_), options_.store),
      commit_(options_.wal_sync, options_.on_staged) {
  if (options_.replica_pull.enabled() && options_.publish.enabled())
    throw std::invalid_argument(
        "the cheap pull (--pull-fraction) and the published model (--publish-every) are two ways "
        "to cut pulls: choose one");
  // The seeded first pull (ours): a worker starts from the model built from the run's seed,
  // which is `model` as given (before a checkpoint is loaded), and asks GET /model?since=0.
  // Exact pulls need nothing here (the store's change record answers from version 0 while it
  // reaches back that far); the cheap pull starts that worker's record from this model.
  std::vector<float> version_zero;
  if (options_.replica_pull.enabled()) version_zero = parameters_of(model_);
  recover();
  if (options_.publish.enabled())
    published_.emplace(tensor_sizes_, store_.parameters(), store_.version(), options_.publish);
  // Not durable: the records start empty, so after a start a device's first pull is dense
  // unless it asks from version 0 (the seeded first pull).
  if (options_.replica_pull.enabled())
    replicas_.emplace(model_.layout_id(), tensor_sizes_, options_.replica_pull,
                      std::move(version_zero));
}

namespace {
// "none", or "at 3000,4500 by 0.5": a log's schedule for a refusal.
std::string lr_schedule_text(const WalHeader& header) {
  if (header.lr_decay_at.empty()) return "none";
  std::ostringstream text;
  text << "at " << format_lr_decay_at(header.lr_decay_at) << " by " << header.lr_decay_factor;
  return text.str();
}
}  // namespace

static_assert(kWalMaxLrMilestones == kMaxLearningRateMilestones,
              "a WAL header must hold every schedule the store accepts");

WalHeader ServerState::wal_header() const {
  WalHeader header{model_.layout_id(), options_.store.learning_rate, options_.store.max_staleness,
                   wal_staleness_rule(options_.store.rule, options_.store.offline_step_credit,
                                      options_.store.offline_average,
                                      options_.replica_pull.pull.entry_staleness)};
  if (options_.store.lr_schedule.enabled()) {
    header.lr_decay_at = options_.store.lr_schedule.decay_at;
    header.lr_decay_factor = options_.store.lr_schedule.factor;
  }
  return header;
}

float ServerState::current_learning_rate() const {
  return learning_rate_at(options_.store.learning_rate, options_.store.lr_schedule,
                          version() + 1);
}

std::size_t ServerState::history_length() const {
  return options_.store.rule == StalenessRule::kPerParameterSigma ? options_.store.max_staleness
                                                                  : 0;
}

void ServerState::remember_recent(WalRecord record) {
  if (history_length() == 0) return;
  recent_.push_back(std::move(record));
  while (recent_.size() > history_length()) recent_.pop_front();
}

transport::SparseUpdate ServerState::decode_logged(const WalRecord& record) const {
  // A logged update passed the limits in force when it arrived; replay must not refuse it
  // because a limit was lowered since.
  transport::DecodeLimits limits;
  limits.max_message_bytes = std::max(limits.max_message_bytes, record.update.size());
  auto decoded =
      transport::decode_sparse_update(record.update, {model_.layout_id(), tensor_sizes_}, limits);
  if (!decoded)
    throw StateError("WAL record for version " + std::to_string(record.version) +
                     " does not decode: " + decoded.error().message);
  return std::move(decoded).value();
}

std::span<const std::uint64_t> ServerState::logged_entry_versions(
    const WalRecord& record, const transport::SparseUpdate& update,
    std::vector<std::uint64_t>& scratch) const {
  if (record.entry_delays.empty()) return {};
  const std::string where = "WAL record for version " + std::to_string(record.version);
  if (!options_.replica_pull.pull.entry_staleness)
    throw StateError(where +
                     " carries entry delays (σ per entry) in a log whose header says none");
  const std::size_t parameters = store_.parameters().size();
  // UINT64_MAX: an entry not listed counts from t_fetch (the store takes min(h_i, t_fetch)).
  if (scratch.size() != parameters) scratch.assign(parameters, UINT64_MAX);
  for (const WalEntryDelay& entry : record.entry_delays) {
    if (entry.index >= parameters || entry.delay > update.fetched_version) {
      for (const WalEntryDelay& set : record.entry_delays)
        if (set.index < parameters) scratch[set.index] = UINT64_MAX;
      throw StateError(where + ": entry delay " + std::to_string(entry.delay) + " at index " +
                       std::to_string(entry.index) + " does not fit a model of " +
                       std::to_string(parameters) + " parameters and t_fetch " +
                       std::to_string(update.fetched_version));
    }
    scratch[entry.index] = update.fetched_version - entry.delay;
  }
  return scratch;
}

void ServerState::recover() {
  std::filesystem::create_directories(options_.state_dir);
  for (const std::filesystem::path& leftover : remove_leftover_temporaries(options_.state_dir))
    recovery_.notes.push_back(
        "removed " + leftover.string() +
        ", a temporary file of a checkpoint or WAL write that never completed");

  const bool have_checkpoint = std::filesystem::exists(checkpoint_path_);
  const bool have_previous = std::filesystem::exists(previous_checkpoint_path_);
  if (!have_checkpoint && !have_previous) {
    if (std::filesystem::exists(wal_path_))
      throw StateError(wal_path_.string() + " exists without " + checkpoint_path_.string() +
                       ": refusing to start from fresh parameters and lose the logged updates");
    recovery_.fresh = true;
    checkpoint();  // version 0: from now on every start has a checkpoint to load
    return;
  }

  std::string damage = "missing (a crash while it was being replaced)";
  std::map<std::string, SequenceEntry, std::less<>> sequences;
  bool non_finite = false;
  if (have_checkpoint) {
    if (const auto version = load_checkpoint(checkpoint_path_, sequences, damage, non_finite)) {
      sequences_ = std::move(sequences);
      Replay replay = replay_with_rollback(checkpoint_path_, *version, {wal_path_});
      if (replay.stopped_before) roll_back(replay, {wal_path_});
      return;
    }
  }

  // checkpoint.safetensors cannot be used: start from the previous checkpoint and replay
  // both logs, or refuse. Never start from damaged parameters.
  const std::string refusal = "the checkpoint " + checkpoint_path_.string() + " is " + damage;
  if (non_finite && !options_.rollback_non_finite)
    throw StateError(
        refusal +
        ". Refusing to serve it: start with --rollback-non-finite to resume from the previous "
        "checkpoint and the WAL before the first update that made a parameter non-finite (the "
        "files "
        "as they are now are kept)");
  if (!have_previous)
    throw StateError(refusal + "; there is no previous checkpoint (" +
                     previous_checkpoint_path_.string() +
                     ") to fall back to. Refusing to start: restore the file, or move the state "
                     "directory aside");
  std::string previous_damage;
  sequences.clear();
  bool previous_non_finite = false;
  const auto previous_version =
      load_checkpoint(previous_checkpoint_path_, sequences, previous_damage, previous_non_finite);
  if (!previous_version)
    throw StateError(refusal + ", and the previous checkpoint " +
                     previous_checkpoint_path_.string() + " is " + previous_damage +
                     ". Refusing to start");
  sequences_ = std::move(sequences);
  std::vector<std::filesystem::path> logs;
  if (std::filesystem::exists(previous_wal_path_)) logs.push_back(previous_wal_path_);
  logs.push_back(wal_path_);
  Replay replay;
  try {
    replay = replay_with_rollback(previous_checkpoint_path_, *previous_version, logs);
  } catch (const StateError& e) {
    throw StateError(refusal + "; the previous checkpoint " + previous_checkpoint_path_.string() +
                     " (version " + std::to_string(*previous_version) +
                     ") cannot be used instead: " + e.what() + ". Refusing to start");
  }
  recovery_.used_previous_checkpoint = true;
  recovery_.notes.push_back(refusal + ": recovered from " + previous_checkpoint_path_.string() +
                            " (version " + std::to_string(*previous_version) +
                            ") and the WAL instead");
  if (have_checkpoint) {
    std::filesystem::path damaged = checkpoint_path_;
    damaged += non_finite ? ".non-finite" : ".damaged";
    durable_rename(checkpoint_path_, damaged);
    recovery_.notes.push_back("kept the " + std::string(non_finite ? "non-finite" : "damaged") +
                              " checkpoint as " + damaged.string() + " for inspection");
  }
  if (replay.stopped_before) {
    roll_back(replay, logs);
    return;
  }
  // Consistent again: one WAL holding everything since the previous checkpoint's history,
  // then a new checkpoint at the recovered version (the previous one stays where it is).
  wal_ = WalWriter::replace(wal_path_, wal_header(), replay.records);
  checkpoint();
}

namespace {
// `path` + ".rolled-back-at-V", with ".2", ".3"… if that name is taken: never overwrite.
std::filesystem::path unused_rollback_name(const std::filesystem::path& path,
                                           std::uint64_t version) {
  std::filesystem::path name = path;
  name += ".rolled-back-at-" + std::to_string(version);
  for (int n = 2; std::filesystem::exists(name); ++n) {
    name = path;
    name += ".rolled-back-at-" + std::to_string(version) + "." + std::to_string(n);
  }
  return name;
}
}  // namespace

ServerState::Replay ServerState::replay_with_rollback(
    const std::filesystem::path& checkpoint, std::uint64_t version,
    const std::vector<std::filesystem::path>& wal_paths) {
  Replay replay = replay_wal(version, wal_paths);
  if (!replay.non_finite_at) return replay;
  // Back to the checkpoint, and this time stop before the first update the bound refuses:
  // the state a server with today's checks would have reached.
  std::map<std::string, SequenceEntry, std::less<>> sequences;
  std::string damage;
  bool non_finite = false;
  if (!load_checkpoint(checkpoint, sequences, damage, non_finite))
    throw StateError("cannot load " + checkpoint.string() + " again for the rollback: " + damage);
  sequences_ = std::move(sequences);
  recent_.clear();
  recovery_.replayed_updates = 0;
  const std::uint64_t non_finite_at = *replay.non_finite_at;
  replay = replay_wal(version, wal_paths, replay.first_beyond_bound.value_or(non_finite_at));
  replay.non_finite_at = non_finite_at;
  return replay;
}

void ServerState::roll_back(const Replay& replay, const std::vector<std::filesystem::path>& logs) {
  const std::uint64_t first_bad = *replay.stopped_before;
  Rollback rollback{replay.non_finite_at.value_or(first_bad), first_bad, replay.dropped, {}};
  // Second names of the logs as they are (nothing copied): the acknowledged records from
  // first_bad on stay on disk for the operator.
  for (const std::filesystem::path& log : logs) {
    const std::filesystem::path kept = unused_rollback_name(log, first_bad);
    try {
      std::filesystem::create_hard_link(log, kept);
    } catch (const std::exception& e) {
      throw StateError("cannot keep " + log.string() + " as " + kept.string() +
                       " before rolling back: " + e.what());
    }
    rollback.kept_files.push_back(kept.string());
  }
  std::string kept_list;
  for (const std::string& f : rollback.kept_files) kept_list += (kept_list.empty() ? "" : ", ") + f;
  recovery_.notes.push_back(
      "ROLLED BACK: the update logged as version " + std::to_string(rollback.non_finite_version) +
      " made a parameter non-finite; resumed at version " + std::to_string(store_.version()) +
      ", before the first update beyond the bound (version " + std::to_string(first_bad) +
      "): " + std::to_string(replay.dropped) +
      " acknowledged update(s) from there on are NOT applied; the logs as they were are kept as " +
      kept_list);
  recovery_.rollback = std::move(rollback);
  wal_ = WalWriter::replace(wal_path_, wal_header(), replay.records);
  checkpoint();
}

std::optional<std::uint64_t> ServerState::load_checkpoint(
    const std::filesystem::path& path, std::map<std::string, SequenceEntry, std::less<>>& sequences,
    std::string& damage, bool& non_finite) {
  std::vector<std::uint8_t> bytes;
  try {
    bytes = read_whole_file(path);
  } catch (const std::exception& e) {
    throw StateError("cannot read the checkpoint " + path.string() + ": " + e.what());
  }
  const CheckpointCheck check = check_checkpoint_seal(bytes);
  if (check.seal == CheckpointSeal::kDamaged) {
    damage = "damaged: " + check.problem;
    return std::nullopt;
  }
  if (check.seal == CheckpointSeal::kNone)
    recovery_.notes.push_back(path.string() +
                              " has no checksum (written before checkpoints carried one): loaded " +
                              "without verification; the next checkpoint will carry one");
  std::map<std::string, std::string> metadata;
  try {
    metadata = model_.load_safetensors_bytes(bytes, path.string());
  } catch (const std::exception& e) {
    throw StateError("cannot load the checkpoint " + path.string() + ": " + e.what());
  }
  if (parse_u64(metadata, kModelIdKey, path) != model_.layout_id())
    throw StateError(path.string() + " holds another model than '" + model_.spec().name + "'");
  const std::uint64_t version = parse_u64(metadata, kVersionKey, path);
  if (const std::ptrdiff_t i = ParameterStore::first_non_finite(model_.parameters()); i >= 0) {
    damage = "holding a non-finite parameter (flat index " + std::to_string(i) + ", version " +
             std::to_string(version) + ")";
    non_finite = true;
    return std::nullopt;
  }
  try {
    const nlohmann::json table = nlohmann::json::parse(metadata.at(kSequencesKey));
    for (const auto& [identity, entry] : table.items())
      sequences[identity] = {entry.at("sequence").get<std::uint64_t>(),
                             entry.at("version").get<std::uint64_t>()};
  } catch (const std::exception& e) {
    throw StateError(path.string() + ": unreadable sequence table: " + e.what());
  }
  return version;
}

ServerState::Replay ServerState::replay_wal(std::uint64_t checkpoint_version,
                                            const std::vector<std::filesystem::path>& wal_paths,
                                            std::optional<std::uint64_t> stop_before) {
  checkpoint_version_ = checkpoint_version;
  recovery_.checkpoint_version = checkpoint_version;

  if (wal_paths.size() == 1 && !std::filesystem::exists(wal_paths[0])) {
    // Only a crash between the first checkpoint and the first WAL leaves this state.
    if (checkpoint_version != 0 && history_length() > 0)
      throw StateError(wal_paths[0].string() +
                       " is missing: the staleness history after the checkpoint is lost");
    wal_ = WalWriter::replace(wal_path_, wal_header(), {});
    store_.restore(checkpoint_version, model_.parameters(), {});
    return {};
  }

  // The logs in order (wal.prev.log, then wal.log), merged: both hold the staleness history
  // before the newer checkpoint, so records the first one has are skipped in the second.
  WalContents wal;
  std::uint64_t wal_log_valid_bytes = 0;
  for (const std::filesystem::path& path : wal_paths) {
    WalContents contents;
    try {
      contents = read_wal(path);
    } catch (const WalError& e) {
      throw StateError(e.what());
    }
    if (!contents.damage.empty())
      throw StateError(
          describe_wal_damage(path, contents) +
          ". That is damage, not a torn tail: refusing to start, every file is left as it is. "
          "`edgetrain-server repair-wal --state-dir " +
          options_.state_dir.string() +
          "` lists the damage and the choices (--skip-damaged keeps the intact records, "
          "--cut-at-damage drops everything from the damaged record on)");
    if (!(contents.header == wal_header()))
      throw StateError(path.string() +
                       " was written with another model or other settings (learning rate " +
                       std::to_string(contents.header.learning_rate) + ", max staleness " +
                       std::to_string(contents.header.max_staleness) + ", rule " +
                       std::to_string(contents.header.staleness_rule & 0xff) +
                       ", offline step credit " +
                       std::to_string(wal_offline_step_credit(contents.header.staleness_rule)) +
                       (wal_offline_average(contents.header.staleness_rule) ? " averaged" : "") +
                       (wal_entry_staleness(contents.header.staleness_rule)
                            ? ", σ per entry (--entry-staleness)"
                            : ", no σ per entry (no --entry-staleness)") +
                       ", lr decay " + lr_schedule_text(contents.header) +
                       "): start with the same settings or a new state directory");
    for (WalRecord& record : contents.records)
      if (wal.records.empty() || record.version > wal.records.back().version)
        wal.records.push_back(std::move(record));
    wal.dropped_bytes += contents.dropped_bytes;
    wal_log_valid_bytes = contents.valid_bytes;
  }
  for (std::size_t i = 1; i < wal.records.size(); ++i)
    if (wal.records[i].version != wal.records[i - 1].version + 1)
      throw StateError(wal_paths.back().string() + ": versions jump from " +
                       std::to_string(wal.records[i - 1].version) + " to " +
                       std::to_string(wal.records[i].version));
  recovery_.dropped_wal_bytes = wal.dropped_bytes;

  // Records up to the checkpoint are history (already in the parameters); the rest replay.
  auto first_new = std::find_if(wal.records.begin(), wal.records.end(),
                                [&](const WalRecord& r) { return r.version > checkpoint_version; });
  if (first_new != wal.records.end() && first_new->version != checkpoint_version + 1)
    throw StateError(wal_paths.back().string() + " continues at version " +
                     std::to_string(first_new->version) + ", the checkpoint is at " +
                     std::to_string(checkpoint_version));
  const std::size_t history_available = static_cast<std::size_t>(first_new - wal.records.begin());
  const std::size_t history_needed =
      static_cast<std::size_t>(std::min<std::uint64_t>(checkpoint_version, history_length()));
  if (history_available < history_needed)
    throw StateError(wal_paths.back().string() + " holds " + std::to_string(history_available) +
                     " updates before the checkpoint, replay needs " +
                     std::to_string(history_needed));
  const auto first_kept = first_new - static_cast<std::ptrdiff_t>(history_needed);
  std::vector<transport::SparseUpdate> history;
  for (auto it = first_kept; it != first_new; ++it) {
    history.push_back(decode_logged(*it));
    remember_recent(*it);
  }
  try {
    store_.restore(checkpoint_version, model_.parameters(), history);
  } catch (const std::invalid_argument& e) {
    throw StateError(std::string("cannot restore the staleness history: ") + e.what());
  }

  std::size_t placeholders = 0;
  // Logged updates were acknowledged under the bound in force then: replay only refuses
  // one that would make a parameter non-finite (a log written before updates were checked).
  auto replayed_end = wal.records.end();
  Replay replay;
  std::vector<std::uint64_t> entry_versions_scratch;  // logged_entry_versions()
  for (auto it = first_new; it != wal.records.end(); ++it) {
    if (stop_before && it->version >= *stop_before) {
      replay.stopped_before = it->version;
      replay.dropped = static_cast<std::uint64_t>(wal.records.end() - it);
      replayed_end = it;
      break;
    }
    const transport::SparseUpdate update = decode_logged(*it);
    const std::span<const std::uint64_t> entry_versions =
        logged_entry_versions(*it, update, entry_versions_scratch);
    // With rollback_non_finite, note where a rollback would stop; apply as logged either way.
    ApplyResult result;
    if (options_.rollback_non_finite)
      result = store_.apply(update, ValueCheck::kBound, entry_versions);
    if (!options_.rollback_non_finite || result.status == ApplyStatus::kOutOfBounds) {
      if (options_.rollback_non_finite && !replay.first_beyond_bound)
        replay.first_beyond_bound = it->version;
      result = store_.apply(update, ValueCheck::kFiniteOnly, entry_versions);
    }
    if (!entry_versions.empty())
      for (const WalEntryDelay& entry : it->entry_delays)
        entry_versions_scratch[entry.index] = UINT64_MAX;
    if (result.status == ApplyStatus::kOutOfBounds) {
      const std::string what = "replaying the update logged as version " +
                               std::to_string(it->version) + " (from '" +
                               transport::escape_untrusted(it->identity) + "', sequence " +
                               std::to_string(it->sequence) + "): " + result.reason;
      if (!options_.rollback_non_finite)
        throw StateError(
            what +
            ". The state was poisoned by an update applied before updates were checked. "
            "Refusing to start: with --rollback-non-finite the server resumes before the first "
            "update "
            "that left a parameter beyond the bound, and keeps the logs as they are aside");
      replay.non_finite_at = it->version;
      return replay;  // replay_with_rollback() starts again
    }
    if (!result.applied() || result.version != it->version)
      throw StateError("replaying the update logged as version " + std::to_string(it->version) +
                       " gave " + apply_status_name(result.status) + " at version " +
                       std::to_string(result.version) + " " + result.reason);
    // A placeholder (no identity) stands for a record lost to damage (server/wal_repair.h).
    if (it->identity.empty())
      ++placeholders;
    else
      sequences_[it->identity] = {it->sequence, it->version};
    remember_recent(*it);
    ++recovery_.replayed_updates;
  }
  if (placeholders > 0)
    recovery_.notes.push_back(
        "replayed " + std::to_string(placeholders) +
        " empty placeholder updates that repair-wal put where damaged WAL records were");
  updates_since_checkpoint_ = recovery_.replayed_updates;
  if (wal_paths.size() == 1 && !replay.stopped_before)
    wal_ = WalWriter::append_to(wal_path_, wal_log_valid_bytes);
  replay.records.assign(std::make_move_iterator(first_kept), std::make_move_iterator(replayed_end));
  return replay;
}

SubmitResult ServerState::submit(std::string_view identity, std::span<const std::uint8_t> body) {
  if (commit_.staged() > 0)
    throw std::logic_error("submit() while updates are staged: finish_commit() first");
  StagedSubmit staged = stage(identity, body);
  if (staged.settled) return std::move(*staged.settled);
  for (;;) {
    start_commit();
    for (SettledSubmit& settled : finish_commit(true))
      if (settled.ticket == staged.ticket) return std::move(settled.result);
  }
}

StagedSubmit ServerState::stage(std::string_view identity, std::span<const std::uint8_t> body) {
  return stage(identity, body, decode_body(body));
}

ServerState::DecodedBody ServerState::decode_body(std::span<const std::uint8_t> body) const {
  const auto started = std::chrono::steady_clock::now();
  DecodedBody result;
  if (body.size() > options_.max_update_bytes) {
    result.outcome = SubmitOutcome::kTooLarge;
    result.diagnostic = "update of " + std::to_string(body.size()) + " bytes, the limit is " +
                        std::to_string(options_.max_update_bytes);
    return result;
  }
  transport::DecodeLimits limits;
  limits.max_message_bytes = options_.max_update_bytes;
  auto decoded = transport::decode_sparse_update(body, {model_.layout_id(), tensor_sizes_}, limits);
  if (!decoded) {
    const auto& error = decoded.error();
    result.outcome =
        error.code == transport::CodecErrorCode::kWrongModel ? SubmitOutcome::kWrongModel
        : error.code == transport::CodecErrorCode::kTooLarge ? SubmitOutcome::kTooLarge
                                                             : SubmitOutcome::kMalformed;
    result.diagnostic = std::string(transport::codec_error_name(error.code)) + ": " + error.message;
    return result;
  }
  result.update = std::move(decoded).value();
  result.seconds = seconds_since(started);
  return result;
}

StagedSubmit ServerState::stage(std::string_view identity, std::span<const std::uint8_t> body,
                                DecodedBody decoded) {
  if (identity.empty())
    throw std::invalid_argument("submit: an update needs the sender's identity");
  if (quarantined(identity)) {
    const DeviceRefusals& device = devices_.find(identity)->second;
    std::string why = "this device sent " + std::to_string(device.consecutive_bad) +
                      " bad updates in a row and is quarantined ";
    if (device.quarantined_until) {
      const double left =
          std::chrono::duration<double>(*device.quarantined_until - options_.now()).count();
      why += "for " + std::to_string(static_cast<long long>(std::ceil(left))) + " more seconds";
    } else {
      why += "until the server restarts";
    }
    note_device(identity, SubmitOutcome::kQuarantined);
    return {SubmitResult{SubmitOutcome::kQuarantined, store_.version(), why}, 0};
  }
  StagedSubmit staged = stage_update(identity, body, std::move(decoded));
  if (!staged.settled) {
    note_device(identity, SubmitOutcome::kApplied);
  } else if (!staged.settled->acknowledged()) {
    staged.settled->diagnostic += note_device(identity, staged.settled->outcome);
  }
  return staged;
}

bool ServerState::quarantined(std::string_view identity) {
  auto it = devices_.find(identity);
  if (it == devices_.end() || !it->second.quarantined) return false;
  DeviceRefusals& device = it->second;
  if (device.quarantined_until && options_.now() >= *device.quarantined_until) {
    device.quarantined = false;  // its time is up; the next bad update quarantines it again
    device.quarantined_until.reset();
    device.consecutive_bad = 0;
    return false;
  }
  return true;
}

std::string ServerState::note_device(std::string_view identity, SubmitOutcome outcome) {
  const bool bad = outcome == SubmitOutcome::kOutOfBounds || outcome == SubmitOutcome::kMalformed;
  auto it = devices_.find(identity);
  if (outcome == SubmitOutcome::kApplied) {
    if (it != devices_.end()) it->second.consecutive_bad = 0;
    return {};
  }
  if (it == devices_.end()) it = devices_.emplace(std::string(identity), DeviceRefusals{}).first;
  DeviceRefusals& device = it->second;
  ++device.refused[submit_outcome_name(outcome)];
  if (!bad) return {};
  ++device.consecutive_bad;
  std::string note;
  if (device.reported())
    note =
        " (" + std::to_string(device.consecutive_bad) + " bad updates in a row from this device)";
  if (options_.quarantine_after > 0 && device.consecutive_bad >= options_.quarantine_after) {
    device.quarantined = true;
    ++device.quarantines;
    if (options_.quarantine_seconds > 0) {
      device.quarantined_until =
          options_.now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(options_.quarantine_seconds));
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%g", options_.quarantine_seconds);
      note += std::string("; QUARANTINED for ") + seconds + " s";
    } else {
      note += "; QUARANTINED until the server restarts";
    }
  }
  return note;
}

bool ServerState::forget_device(std::string_view identity) {
  auto it = devices_.find(identity);
  if (it == devices_.end() || it->second.quarantined) return false;
  devices_.erase(it);
  return true;
}

bool ServerState::clip(transport::SparseUpdate& update) const {
  if (options_.clip_update_norm <= 0) return false;
  bool clipped = false;
  for (auto& t : update.tensors) {
    double squares = 0;  // double: a float sum of squares of large values overflows
    for (float v : t.values) squares += static_cast<double>(v) * static_cast<double>(v);
    const double norm = std::sqrt(squares);
    if (!(norm > options_.clip_update_norm)) continue;
    const double scale = options_.clip_update_norm / norm;
    for (float& v : t.values) v = static_cast<float>(static_cast<double>(v) * scale);
    clipped = true;
  }
  return clipped;
}

StagedSubmit ServerState::stage_update(std::string_view identity,
                                       std::span<const std::uint8_t> body, DecodedBody decoded) {
  const auto decode_started = std::chrono::steady_clock::now();
  const std::uint64_t now = store_.version();  // the durable version, which refusals report
  auto settle = [&](SubmitOutcome outcome, std::uint64_t version, std::string diagnostic) {
    return StagedSubmit{SubmitResult{outcome, version, std::move(diagnostic)}, 0};
  };
  if (!wal_broken_.empty()) return settle(SubmitOutcome::kNotDurable, now, wal_broken_);
  if (!decoded.update) return settle(decoded.outcome, now, std::move(decoded.diagnostic));
  transport::SparseUpdate& update = *decoded.update;

  // The same (identity, sequence) again: a staged original is answered when it is durable,
  // an applied one at once. Below the identity's latest accepted sequence: refused.
  const SequenceEntry* staged_entry = commit_.staged_sequence(identity);
  const auto applied_entry = sequences_.find(identity);
  if (staged_entry && update.sequence == staged_entry->sequence)
    return {std::nullopt, staged_entry->version};
  if (applied_entry != sequences_.end() && update.sequence == applied_entry->second.sequence)
    return settle(SubmitOutcome::kDuplicate, applied_entry->second.version, {});
  const SequenceEntry* latest = staged_entry                        ? staged_entry
                                : applied_entry != sequences_.end() ? &applied_entry->second
                                                                    : nullptr;
  if (latest && update.sequence < latest->sequence)
    return settle(SubmitOutcome::kOldSequence, now,
                  "sequence " + std::to_string(update.sequence) + " is below the last applied " +
                      std::to_string(latest->sequence) + " of this identity");

  // Clipped: the WAL holds the update as applied (fp32), so replay needs no setting.
  std::vector<std::uint8_t> clipped_body;
  if (clip(update)) {
    auto encoded = transport::encode_sparse_update(update);
    if (!encoded)
      return settle(SubmitOutcome::kMalformed, now,
                    "cannot encode the clipped update: " + encoded.error().message);
    clipped_body = std::move(encoded).value();
  }

  // Checked against the parameters the staged updates will leave, in version order; from
  // here on the store holds the update's values and touched set until it is applied or
  // cancelled.
  // σ per entry: each entry's σ counts from the version the sender's copy holds it since
  // (the record of its copy, when that is the copy this update was computed on).
  const std::span<const std::uint64_t> entry_versions =
      replicas_ ? replicas_->entry_versions(identity, update.fetched_version)
                : std::span<const std::uint64_t>();
  const ApplyResult verdict = store_.reserve(update, ValueCheck::kBound, entry_versions);
  switch (verdict.status) {
    case ApplyStatus::kApplied:
      break;
    case ApplyStatus::kWrongModel:
      return settle(SubmitOutcome::kWrongModel, now, verdict.reason);
    case ApplyStatus::kTooStale:
      return settle(SubmitOutcome::kTooStale, now, verdict.reason);
    case ApplyStatus::kOutOfBounds:
      return settle(SubmitOutcome::kOutOfBounds, now, verdict.reason);
    case ApplyStatus::kFromTheFuture:
    case ApplyStatus::kMalformed:
      return settle(SubmitOutcome::kMalformed, now, verdict.reason);
  }

  const double decode_seconds = decoded.seconds + seconds_since(decode_started);
  const auto write_started = std::chrono::steady_clock::now();
  const std::uint64_t version = now + commit_.staged() + 1;
  const std::uint64_t offset = wal_->size_bytes();
  if (!clipped_body.empty()) ++updates_clipped_;
  const std::span<const std::uint8_t> logged =
      clipped_body.empty() ? body : std::span<const std::uint8_t>(clipped_body);
  WalRecord record{
      version, std::string(identity), update.sequence, {logged.begin(), logged.end()}, {}};
  // The records are not durable: the log keeps what replay needs of the entry versions.
  record.entry_delays =
      entry_delays_of(update, tensor_sizes_, entry_versions, options_.store.max_staleness);
  try {
    wal_->write(record);
  } catch (const WalError& e) {
    store_.cancel_last_reserved();
    if (!clipped_body.empty()) --updates_clipped_;
    return settle(SubmitOutcome::kNotDurable, now, e.what());
  }
  if (replicas_) replicas_->count_update(!entry_versions.empty());
  commit_.stage(
      {std::move(record), std::move(update), offset, decode_seconds, seconds_since(write_started)});
  return {std::nullopt, version};
}

void ServerState::start_commit() { commit_.start_sync(wal_->descriptor()); }

bool ServerState::collect_sync(bool wait, std::vector<SettledSubmit>& out) {
  std::optional<GroupCommit::SyncResult> synced = commit_.finish_sync(wait);
  if (!synced) return false;
  if (synced->error != 0) {
    // Not durable, so never acknowledged: cut every staged record off the log (replay must
    // not apply what the workers were told failed) and refuse them all.
    const std::string why =
        "cannot sync the WAL " + wal_path_.string() + ": " + std::strerror(synced->error);
    store_.cancel_reserved();  // every staged update is handed back: their reservations go
    for (const StagedUpdate& staged : synced->updates)
      out.push_back({staged.record.version, {SubmitOutcome::kNotDurable, store_.version(), why}});
    try {
      wal_->truncate_to(synced->updates.front().wal_offset);
    } catch (const WalError& e) {
      wal_broken_ =
          std::string(e.what()) + " after a failed sync: refusing updates until a restart";
    }
    return true;
  }
  const double sync_share = synced->seconds / static_cast<double>(synced->updates.size());
  for (StagedUpdate& staged : synced->updates) {
    const auto apply_started = std::chrono::steady_clock::now();
    ApplyResult result;
    {
      std::lock_guard lock(parameters_mutex_);
      result = store_.apply_reserved();
    }
    // stage() reserved exactly this version, and reservations are applied in order:
    // anything else is a bug, and the logged record would replay to a version this process
    // never reached.
    if (result.version != staged.record.version)
      throw std::logic_error("parameter store applied version " + std::to_string(result.version) +
                             " for the update staged as " + std::to_string(staged.record.version));
    submit_timings_.applied_updates += 1;
    submit_timings_.decode_seconds += staged.decode_seconds;
    submit_timings_.wal_seconds += staged.write_seconds + sync_share;
    submit_timings_.apply_seconds += seconds_since(apply_started);
    sequences_[staged.record.identity] = {staged.record.sequence, result.version};
    const std::uint64_t staleness =
        result.version - 1 - std::min(staged.update.fetched_version, result.version - 1);
    out.push_back(
        {staged.record.version, {SubmitOutcome::kApplied, result.version, {}, staleness}});
    publish_after_apply();
    remember_recent(std::move(staged.record));
    ++updates_since_checkpoint_;
  }
  return true;
}

std::vector<SettledSubmit> ServerState::finish_commit(bool wait) {
  std::vector<SettledSubmit> settled;
  if (!collect_sync(wait, settled)) {
    start_commit();
    return settled;
  }
  if (options_.checkpoint_every && updates_since_checkpoint_ >= options_.checkpoint_every) {
    // The new WAL holds only applied records: settle what is staged first.
    while (commit_.staged() > 0) {
      start_commit();
      collect_sync(true, settled);
    }
    const auto checkpoint_started = std::chrono::steady_clock::now();
    try {
      checkpoint();
      checkpoint_error_.clear();
    } catch (const std::exception& e) {
      checkpoint_error_ = e.what();  // the updates are durable in the WAL all the same
    }
    submit_timings_.checkpoint_seconds += seconds_since(checkpoint_started);
  }
  start_commit();
  return settled;
}

void ServerState::checkpoint() {
  if (commit_.staged() > 0 || commit_.sync_running())
    throw std::logic_error("checkpoint() while updates are staged: finish_commit() first");
  std::copy(store_.parameters().begin(), store_.parameters().end(), model_.parameters().begin());
  nlohmann::json sequences = nlohmann::json::object();
  for (const auto& [identity, entry] : sequences_)
    sequences[identity] = {{"sequence", entry.sequence}, {"version", entry.version}};
  const std::map<std::string, std::string> metadata = {
      {kStateFormatKey, "2"},  // 2: with the checksum (server/checkpoint_file.h)
      {kVersionKey, std::to_string(store_.version())},
      {kModelIdKey, std::to_string(model_.layout_id())},
      {kSequencesKey, sequences.dump()},
      {"edgetrain.model", model_.spec().name},
  };
  try {
    const std::vector<std::uint8_t> bytes = sealed_checkpoint_bytes(model_, metadata);
    // The current checkpoint becomes the previous one (a crash right after this leaves no
    // checkpoint.safetensors: recovery then starts from the previous one, whose updates
    // wal.log still holds). One temporary file and one rename for the new one.
    if (std::filesystem::exists(checkpoint_path_))
      durable_rename(checkpoint_path_, previous_checkpoint_path_);
    write_file_atomically(checkpoint_path_, bytes);
  } catch (const std::exception& e) {
    throw StateError("cannot write the checkpoint " + checkpoint_path_.string() + ": " + e.what());
  }
  // The checkpoint is in place; a crash from here on replays the old WAL's records up to
  // the checkpoint as history. The WAL until now stays as wal.prev.log (a second name of
  // the same file: nothing is copied), which a fall-back to the previous checkpoint needs.
  if (std::filesystem::exists(wal_path_)) {
    std::filesystem::path linking = previous_wal_path_;
    linking += ".tmp";
    std::error_code ignored;
    std::filesystem::remove(linking, ignored);
    try {
      std::filesystem::create_hard_link(wal_path_, linking);
      durable_rename(linking, previous_wal_path_);
    } catch (const std::exception& e) {
      throw StateError("cannot keep " + wal_path_.string() + " as " + previous_wal_path_.string() +
                       ": " + e.what());
    }
  }
  const std::vector<WalRecord> history(recent_.begin(), recent_.end());
  wal_ = WalWriter::replace(wal_path_, wal_header(), history);
  checkpoint_version_ = store_.version();
  updates_since_checkpoint_ = 0;
}

ServerState::Snapshot ServerState::snapshot() const {
  std::lock_guard lock(parameters_mutex_);
  return {store_.version(), {store_.parameters().begin(), store_.parameters().end()}};
}

std::span<const std::uint8_t> ServerState::encoded_model() {
  // With a published model, workers get P (named by its publish version), never W.
  const ChangeRecord served =
      served_changes(model_.layout_id(), tensor_sizes_, store_, published());
  if (encoded_version_ != served.version) {
    auto encoded = transport::encode_dense_model(model_.layout_id(), served.version, tensor_sizes_,
                                                 served.parameters);
    if (!encoded) throw std::logic_error("cannot encode the model: " + encoded.error().message);
    encoded_model_ = std::move(encoded).value();
    encoded_version_ = served.version;
  }
  return encoded_model_;
}

void ServerState::publish_after_apply() {
  if (published_) published_->advance(store_.parameters(), store_.version());
}

ServerState::ModelReply ServerState::encoded_model_since(std::uint64_t since) {
  ChangeRecord record = served_changes(model_.layout_id(), tensor_sizes_, store_, published());
  if (since > record.version || since < record.known_since) return {encoded_model(), false};
  if (digest_version_ != record.version) {
    digest_ = transport::parameter_digest(record.parameters);
    digest_version_ = record.version;
  }
  record.digest = digest_;
  auto encoded = encode_changes_since(record, since);
  if (!encoded) return {encoded_model(), false};
  encoded_delta_ = std::move(*encoded);
  return {encoded_delta_, true};
}

ServerState::DeviceModelReply ServerState::pull_for_device(std::string_view identity,
                                                           std::optional<std::uint64_t> since,
                                                           bool fp16_increments) {
  if (!replicas_) throw std::logic_error("pull_for_device() without the cheap pull");
  const ReplicaRecords::Pull pull =
      replicas_->pull(identity, since, store_.parameters(), store_.version(), fp16_increments);
  if (pull.kind == ReplicaRecords::Kind::kDense) return {encoded_model(), false, store_.version()};
  // The record keeps the body until this device's next pull; the copy here keeps it for the
  // caller even if that pushes the record out first.
  encoded_delta_.assign(pull.body->begin(), pull.body->end());
  return {encoded_delta_, true, pull.etag};
}

}  // namespace edgetrain::server
