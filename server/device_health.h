// Per-device health for /status, the stats file and the metrics export (server/README.md,
// "Watching a fleet"): for each identity, when it was last heard from, updates accepted,
// their mean staleness, its recent step rate, and the request and answer payload bytes.
// Identities that only read the monitoring resources (/status) are monitors, reported
// apart from the workers. Refusals by reason stay where they are counted
// (ServerState::device_refusals()); the renderers fold them in per device.
//
// Bounded: at most max_devices identities are tracked; a new one beyond that pushes out the
// one heard from longest ago (a silent one, as soon as any is), so a flood of identities
// cannot grow memory. on_forget tells the owner, which drops what it keeps per identity.
//
// The clocks are injected (tests move time). Not thread-safe: the CoAP thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace edgetrain::server {

struct DeviceHealthOptions {
  double silent_after_seconds = 60;  // a device not heard from for longer is reported silent
  std::size_t max_devices = 10000;   // identities tracked at once (workers and monitors)
  double rate_window_seconds = 60;   // the step rate is updates per second over about this long
  std::function<std::chrono::steady_clock::time_point()> now = [] {
    return std::chrono::steady_clock::now();
  };
  std::function<std::chrono::system_clock::time_point()> wall_now = [] {
    return std::chrono::system_clock::now();
  };
  // Called with an identity that is no longer tracked (pushed out by a new one).
  std::function<void(const std::string& identity)> on_forget;
};

struct DeviceRecord {
  bool worker = false;  // it pulled the model or posted an update (else: a monitor)
  std::chrono::steady_clock::time_point first_seen, last_seen;
  std::chrono::system_clock::time_point last_seen_wall;
  std::uint64_t requests = 0;
  std::uint64_t updates_accepted = 0;
  std::uint64_t staleness_sum = 0;  // of the accepted updates
  std::uint64_t request_payload_bytes = 0, answer_payload_bytes = 0;
  // The step rate: updates accepted in the current window and in the one before it.
  std::chrono::steady_clock::time_point window_started;
  std::uint64_t window_updates = 0, previous_window_updates = 0;
};

// What a renderer shows for one device.
struct DeviceView {
  double last_seen_seconds_ago = 0;
  std::string last_seen_utc;  // "2024-05-01T12:34:56Z"
  bool silent = false;
  double mean_staleness = 0;  // 0 when nothing was accepted
  double step_rate = 0;       // updates accepted per second, recently
};

class DeviceHealth {
 public:
  explicit DeviceHealth(DeviceHealthOptions options = {});

  // A request from `identity` (non-empty): `worker` when it is a training request (model
  // pull, update), false for monitoring. Returns true the first time the identity is seen
  // (since it was last pushed out).
  bool note_request(const std::string& identity, bool worker, std::uint64_t payload_bytes);
  void note_answer(std::string_view identity, std::uint64_t payload_bytes);
  void note_accepted(std::string_view identity, std::uint64_t staleness);

  const std::map<std::string, DeviceRecord, std::less<>>& devices() const { return devices_; }
  const DeviceRecord* find(std::string_view identity) const;
  DeviceView view(const DeviceRecord& record) const;
  std::size_t workers() const;
  std::size_t silent_workers() const;
  // Identities pushed out since start (the table was full).
  std::uint64_t forgotten() const { return forgotten_; }
  const DeviceHealthOptions& options() const { return options_; }

 private:
  void touch(DeviceRecord& record, const std::string& identity,
             std::chrono::steady_clock::time_point now);
  void roll_window(DeviceRecord& record, std::chrono::steady_clock::time_point now) const;
  void make_room();

  DeviceHealthOptions options_;
  std::map<std::string, DeviceRecord, std::less<>> devices_;
  // (last_seen, identity), oldest first: which one to push out.
  std::set<std::pair<std::chrono::steady_clock::time_point, std::string>> by_last_seen_;
  std::uint64_t forgotten_ = 0;
};

}  // namespace edgetrain::server
