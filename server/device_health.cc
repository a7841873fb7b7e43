#include "server/device_health.h"

#include <algorithm>
#include <ctime>

namespace edgetrain::server {
namespace {

double seconds_between(std::chrono::steady_clock::time_point from,
                       std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string utc_text(std::chrono::system_clock::time_point when) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(when);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace

DeviceHealth::DeviceHealth(DeviceHealthOptions options) : options_(std::move(options)) {
  options_.max_devices = std::max<std::size_t>(options_.max_devices, 1);
  if (!(options_.rate_window_seconds > 0)) options_.rate_window_seconds = 60;
}

void DeviceHealth::make_room() {
  while (devices_.size() >= options_.max_devices && !by_last_seen_.empty()) {
    const std::string oldest = by_last_seen_.begin()->second;  // heard from longest ago
    by_last_seen_.erase(by_last_seen_.begin());
    devices_.erase(oldest);
    ++forgotten_;
    if (options_.on_forget) options_.on_forget(oldest);
  }
}

void DeviceHealth::touch(DeviceRecord& record, const std::string& identity,
                         std::chrono::steady_clock::time_point now) {
  by_last_seen_.erase({record.last_seen, identity});
  record.last_seen = now;
  record.last_seen_wall = options_.wall_now();
  by_last_seen_.insert({now, identity});
}

bool DeviceHealth::note_request(const std::string& identity, bool worker,
                                std::uint64_t payload_bytes) {
  const auto now = options_.now();
  auto it = devices_.find(identity);
  const bool first = it == devices_.end();
  if (first) {
    make_room();
    DeviceRecord record;
    record.first_seen = record.last_seen = record.window_started = now;
    it = devices_.emplace(identity, record).first;
    by_last_seen_.insert({now, identity});
  }
  DeviceRecord& record = it->second;
  touch(record, identity, now);
  record.worker = record.worker || worker;
  ++record.requests;
  record.request_payload_bytes += payload_bytes;
  return first;
}

void DeviceHealth::note_answer(std::string_view identity, std::uint64_t payload_bytes) {
  auto it = devices_.find(identity);
  if (it != devices_.end()) it->second.answer_payload_bytes += payload_bytes;
}

void DeviceHealth::roll_window(DeviceRecord& record,
                               std::chrono::steady_clock::time_point now) const {
  const double window = options_.rate_window_seconds;
  const double elapsed = seconds_between(record.window_started, now);
  if (elapsed < window) return;
  const auto windows = static_cast<long long>(elapsed / window);
  record.previous_window_updates = windows == 1 ? record.window_updates : 0;
  record.window_updates = 0;
  record.window_started += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(static_cast<double>(windows) * window));
}

void DeviceHealth::note_accepted(std::string_view identity, std::uint64_t staleness) {
  auto it = devices_.find(identity);
  if (it == devices_.end()) return;
  DeviceRecord& record = it->second;
  roll_window(record, options_.now());
  ++record.updates_accepted;
  ++record.window_updates;
  record.staleness_sum += staleness;
}

const DeviceRecord* DeviceHealth::find(std::string_view identity) const {
  auto it = devices_.find(identity);
  return it == devices_.end() ? nullptr : &it->second;
}

DeviceView DeviceHealth::view(const DeviceRecord& stored) const {
  const auto now = options_.now();
  DeviceRecord record = stored;
  roll_window(record, now);
  DeviceView v;
  v.last_seen_seconds_ago = std::max(0.0, seconds_between(record.last_seen, now));
  v.last_seen_utc = utc_text(record.last_seen_wall);
  v.silent = v.last_seen_seconds_ago > options_.silent_after_seconds;
  if (record.updates_accepted > 0)
    v.mean_staleness =
        static_cast<double>(record.staleness_sum) / static_cast<double>(record.updates_accepted);
  // Sliding estimate over one window: the current window's updates plus the share of the
  // previous window's that still lies within the last rate_window_seconds. A device younger
  // than a window is rated over its own age (at least a second).
  const double window = options_.rate_window_seconds;
  const double into_window = seconds_between(record.window_started, now);
  const double age = seconds_between(record.first_seen, now);
  const double recent = static_cast<double>(record.window_updates) +
                        static_cast<double>(record.previous_window_updates) *
                            std::max(0.0, 1.0 - into_window / window);
  v.step_rate = recent / (age < window ? std::max(age, 1.0) : window);
  return v;
}

std::size_t DeviceHealth::workers() const {
  return static_cast<std::size_t>(std::count_if(devices_.begin(), devices_.end(),
                                                [](const auto& d) { return d.second.worker; }));
}

std::size_t DeviceHealth::silent_workers() const {
  std::size_t silent = 0;
  for (const auto& [identity, record] : devices_)
    if (record.worker && view(record).silent) ++silent;
  return silent;
}

}  // namespace edgetrain::server
