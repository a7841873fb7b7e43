#include "server/replica_records.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <stdexcept>

#include "transport/codec.h"

namespace edgetrain::server {
namespace {

// FNV-1a over the body: two bodies differ in their bytes, one body is always the same ETag.
std::uint64_t body_etag(std::span<const std::uint8_t> body) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (const std::uint8_t byte : body) {
    hash ^= byte;
    hash *= 0x100000001b3ull;
  }
  return hash == 0 ? 1 : hash;  // libcoap 4.3.1 replaces an ETag of 0 with its own
}

}  // namespace

void check_replica_record_options(const ReplicaRecordOptions& options) {
  check_replica_pull_options(options.pull);
  if (options.pull.values == transport::ValueEncoding::kFp16)
    throw std::invalid_argument(
        "--pull-values fp16 is not served by edgetrain-server (the simulator's only): use "
        "fp16-increment");
  if (options.enabled() && options.max_devices == 0)
    throw std::invalid_argument("--pull-max-devices must be at least 1");
}

ReplicaRecords::ReplicaRecords(std::uint64_t model_id, std::vector<std::uint32_t> tensor_sizes,
                               ReplicaRecordOptions options, std::vector<float> version_zero)
    : model_id_(model_id),
      tensor_sizes_(std::move(tensor_sizes)),
      options_(options),
      version_zero_(std::move(version_zero)) {
  check_replica_record_options(options_);
  for (const std::uint32_t size : tensor_sizes_) parameter_count_ += size;
  if (!version_zero_.empty() && version_zero_.size() != parameter_count_)
    throw std::invalid_argument("replica records: version 0's model has " +
                                std::to_string(version_zero_.size()) +
                                " parameters for a layout of " + std::to_string(parameter_count_));
}

ReplicaRecords::Record& ReplicaRecords::record_for(std::string_view identity) {
  auto found = records_.find(identity);
  if (found != records_.end()) return found->second;
  if (records_.size() >= options_.max_devices) {
    auto oldest = std::min_element(records_.begin(), records_.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    });
    records_.erase(oldest);
    ++counters_.records_evicted;
  }
  return records_.emplace(std::string(identity), Record{}).first->second;
}

ReplicaRecords::Pull ReplicaRecords::dense(Record& record, std::span<const float> parameters,
                                           std::uint64_t version) {
  record.held.assign(parameters.begin(), parameters.end());
  record.held_version = version;
  if (options_.pull.entry_staleness) record.held_since.assign(parameter_count_, version);
  record.last_body.reset();
  ++counters_.dense_pulls;
  return {Kind::kDense, nullptr, 0};
}

ReplicaRecords::Pull ReplicaRecords::pull(std::string_view identity,
                                          std::optional<std::uint64_t> since,
                                          std::span<const float> parameters,
                                          std::uint64_t version, bool fp16_increments) {
  if (parameters.size() != parameter_count_)
    throw std::invalid_argument("replica records: " + std::to_string(parameters.size()) +
                                " parameters for a layout of " + std::to_string(parameter_count_));
  bool known = records_.find(identity) != records_.end();
  Record& record = record_for(identity);
  record.last_used = ++pulls_;
  // The seeded first pull: a worker that holds version 0's model (a new one, or one that
  // restarted) while the record, if any, is not at version 0. R starts over as version 0's
  // model, unless this is the request for the last delta from 0 again (a lost answer, or a
  // block-wise body being fetched). A record at version 0 gave that version itself (a dense
  // pull before the first update): a delta from it is right, and starting over from version
  // 0's model could alternate with dense pulls while the model stands at a version 0 that
  // is not that model (--init-from).
  const bool repeat_from_zero = known && record.last_body && record.last_base == 0;
  const bool record_at_zero = known && record.held_version == 0;
  if (since && *since == 0 && !version_zero_.empty() && !repeat_from_zero && !record_at_zero) {
    record.held = version_zero_;
    record.held_version = 0;
    if (options_.pull.entry_staleness) record.held_since.assign(parameter_count_, 0);
    record.last_body.reset();
    ++counters_.seeded_records;
    known = true;
  }
  if (!known || !since) return dense(record, parameters, version);
  const bool moved_on = version != record.held_version;
  const bool repeat = record.last_body && *since == record.last_base;
  if (*since == record.held_version && (moved_on || !repeat)) {
    // The record is the device's copy whatever the encoding, so a device may switch.
    ReplicaPullOptions pull_options = options_.pull;
    if (!(fp16_increments && pull_options.values == transport::ValueEncoding::kFp16Increment))
      pull_options.values = transport::ValueEncoding::kFp32;
    const transport::ModelDelta delta =
        replica_pull(model_id_, tensor_sizes_, parameters, version, record.held,
                     record.held_version, pull_options, record.held_since);
    auto encoded = transport::encode_model_delta(delta);
    if (!encoded) throw std::logic_error("cannot encode a model delta: " + encoded.error().message);
    // A delta as large as the model (a large fraction, a small model) goes dense: exact.
    if (encoded.value().size() >= transport::dense_model_bytes(tensor_sizes_))
      return dense(record, parameters, version);
    auto body = std::make_shared<const std::vector<std::uint8_t>>(std::move(encoded).value());
    record.last_base = *since;
    record.held_version = version;
    record.last_etag = body_etag(*body);
    record.last_body = body;
    ++counters_.delta_pulls;
    counters_.delta_bytes += body->size();
    counters_.largest_delta_bytes = std::max<std::uint64_t>(counters_.largest_delta_bytes, body->size());
    return {Kind::kDelta, std::move(body), record.last_etag};
  }
  if (repeat) {
    ++counters_.repeated_pulls;
    return {Kind::kRepeat, record.last_body, record.last_etag};
  }
  // A version this device was not given by this record (a restart on either side, an old
  // answer): what it holds is unknown.
  return dense(record, parameters, version);
}

std::span<const std::uint64_t> ReplicaRecords::entry_versions(std::string_view identity,
                                                              std::uint64_t fetched_version) const {
  if (!options_.pull.entry_staleness) return {};
  const auto found = records_.find(identity);
  if (found == records_.end() || found->second.held_version != fetched_version ||
      found->second.held_since.size() != parameter_count_)
    return {};
  return found->second.held_since;
}

void ReplicaRecords::count_update(bool had_entry_versions) {
  if (!options_.pull.entry_staleness) return;
  ++(had_entry_versions ? counters_.entry_sigma_updates : counters_.entry_sigma_fallbacks);
}

std::size_t ReplicaRecords::bytes() const {
  std::size_t total = 0;
  for (const auto& [identity, record] : records_)
    total += record.held.size() * sizeof(float) +
             record.held_since.size() * sizeof(std::uint64_t) +
             (record.last_body ? record.last_body->size() : 0);
  return total;
}

std::string ReplicaRecords::stats_json() const {
  const nlohmann::json j = {{"fraction", options_.pull.fraction},
                            {"min_entries", options_.pull.min_entries},
                            {"max_devices", options_.max_devices},
                            {"records", records_.size()},
                            {"record_bytes", bytes()},
                            {"dense_pulls", counters_.dense_pulls},
                            {"seeded_records", counters_.seeded_records},
                            {"delta_pulls", counters_.delta_pulls},
                            {"repeated_pulls", counters_.repeated_pulls},
                            {"records_evicted", counters_.records_evicted},
                            {"delta_bytes", counters_.delta_bytes},
                            {"largest_delta_bytes", counters_.largest_delta_bytes},
                            {"dense_model_bytes", transport::dense_model_bytes(tensor_sizes_)},
                            {"entry_staleness", options_.pull.entry_staleness},
                            {"entry_sigma_updates", counters_.entry_sigma_updates},
                            {"entry_sigma_fallbacks", counters_.entry_sigma_fallbacks}};
  return j.dump();
}

}  // namespace edgetrain::server
