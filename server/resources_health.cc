// ServerResources' watching-a-fleet side (server/README.md, "Watching a fleet"): the
// per-device section of /status and the stats file, GET /status?device=NAME, Observe
// notifications and collapsed log lines (tick), and the metrics text exposition.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

#include "server/resources.h"
#include "transport/identity.h"
#include "transport/untrusted_text.h"

namespace edgetrain::server {
namespace {

using transport::CoapCode;
using transport::CoapResponse;
using transport::escape_untrusted;

CoapResponse text_answer(int code, const std::string& text) {
  return {code, {text.begin(), text.end()}, {}};
}

double rounded(double value, double step) { return std::round(value / step) * step; }

// The identity a /status?device= query names: a DTLS identity or "unauthenticated:NAME".
bool is_device_name(std::string_view name) {
  const std::string_view prefix = kUnauthenticatedPrefix;
  if (name.substr(0, prefix.size()) == prefix) name.remove_prefix(prefix.size());
  return transport::is_plain_identity(name);
}

// Label values of the text exposition format: backslash, double quote and newline escaped.
std::string label_value(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string metric_number(double value) {
  if (std::isnan(value)) return "NaN";
  char text[40];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

// One metric family: "# HELP", "# TYPE" and its samples.
class Exposition {
 public:
  void family(const std::string& name, const char* type, const std::string& help) {
    text_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, double value, const std::string& labels = {}) {
    text_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + metric_number(value) + "\n";
  }
  std::string text() && { return std::move(text_); }

 private:
  std::string text_;
};

}  // namespace

std::string ServerResources::device_json(const std::string& identity,
                                         const DeviceRecord& record) const {
  const DeviceView view = health_.view(record);
  nlohmann::json device = {
      {"last_seen_seconds_ago", rounded(view.last_seen_seconds_ago, 0.1)},
      {"last_seen", view.last_seen_utc},
      {"silent", view.silent},
      {"requests", record.requests},
      {"updates_accepted", record.updates_accepted},
      {"mean_staleness", rounded(view.mean_staleness, 0.01)},
      {"step_rate_per_second", rounded(view.step_rate, 0.001)},
      {"request_payload_bytes", record.request_payload_bytes},
      {"answer_payload_bytes", record.answer_payload_bytes},
  };
  // Refusals stay counted where they are decided (ServerState), shown here per device.
  nlohmann::json refused = nlohmann::json::object();
  const auto& refusals = state_.device_refusals();
  if (auto it = refusals.find(identity); it != refusals.end()) {
    for (const auto& [reason, count] : it->second.refused) refused[reason] = count;
    device["consecutive_bad"] = it->second.consecutive_bad;
    device["quarantined"] = it->second.quarantined;
  }
  device["refused"] = refused;
  return device.dump();
}

std::string ServerResources::devices_json() const {
  nlohmann::json devices = nlohmann::json::object();
  for (const auto& [identity, record] : health_.devices())
    if (record.worker)
      devices[escape_untrusted(identity)] = nlohmann::json::parse(device_json(identity, record));
  return devices.dump();
}

std::string ServerResources::monitors_json() const {
  nlohmann::json monitors = nlohmann::json::array();
  for (const auto& [identity, record] : health_.devices())
    if (!record.worker) monitors.push_back(escape_untrusted(identity));
  return monitors.dump();
}

CoapResponse ServerResources::get_device_status(std::string_view query) {
  std::optional<std::string_view> name;
  for (std::size_t start = 0; start <= query.size();) {
    std::size_t end = query.find('&', start);
    if (end == std::string_view::npos) end = query.size();
    const std::string_view part = query.substr(start, end - start);
    start = end + 1;
    if (part.substr(0, 3) == "id=") continue;  // the declared identity of plain CoAP requests
    constexpr std::string_view kDevice = "device=";
    if (part.substr(0, kDevice.size()) != kDevice || name)
      return text_answer(CoapCode::kBadRequest, "bad query '" +
                                                    escape_untrusted(part.substr(0, 40)) +
                                                    "': /status takes at most one device=NAME");
    name = part.substr(kDevice.size());
  }
  if (!name) return text_answer(CoapCode::kContent, status_json());  // only id=
  if (!is_device_name(*name))
    return text_answer(CoapCode::kBadRequest,
                       "device= needs a device name (1..64 of [A-Za-z0-9._-], or "
                       "unauthenticated:NAME), got '" +
                           escape_untrusted(name->substr(0, 80)) + "'");
  const std::string identity(*name);
  const DeviceRecord* record = health_.find(identity);
  if (record == nullptr)
    return text_answer(CoapCode::kNotFound,
                       "no device '" + identity + "' has been seen (or it was forgotten)");
  nlohmann::json device = nlohmann::json::parse(device_json(identity, *record));
  device["device"] = identity;
  device["role"] = record->worker ? "worker" : "monitor";
  return text_answer(CoapCode::kContent, device.dump(2) + "\n");
}

std::uint64_t ServerResources::activity() const {
  std::uint64_t refused = 0;
  for (const auto& [reason, count] : refused_) refused += count;
  return applied_.load() + refused + duplicates_ + model_pulls_ + bad_model_queries_ +
         evaluations_.load();
}

void ServerResources::tick(transport::CoapDtlsServer& server, Loop& loop) {
  const auto now = health_.options().now();
  if (now < loop.next_tick) return;
  loop.next_tick = now + std::chrono::seconds(1);
  // The repeat limiter is one for the process: loop 0 writes its summaries.
  if (&loop == &loops_.front())
    for (const std::string& line : repeats_.flush(now)) log_at(logging::Level::kWarn, line);
  if (now < loop.next_notify) return;
  const std::uint64_t activity_now = activity();
  if (activity_now == loop.notified_activity) return;
  // At most one notification per interval, and only when something changed since the last;
  // each loop notifies the observers of its own sessions.
  loop.notified_activity = activity_now;
  loop.next_notify = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(options_.observe_interval_seconds));
  server.notify_observers("status");
}

void ServerResources::flush_collapsed_lines() {
  for (const std::string& line : repeats_.flush_all(health_.options().now()))
    log_at(logging::Level::kWarn, line);
}

std::string ServerResources::metrics_text() const {
  Exposition m;
  m.family("edgetrain_model_version", "gauge",
           "Updates applied to the model since the state directory was created.");
  m.sample("edgetrain_model_version", static_cast<double>(state_.version()));
  m.family("edgetrain_updates_applied_total", "counter",
           "Updates applied since this process started.");
  m.sample("edgetrain_updates_applied_total", static_cast<double>(applied_.load()));
  m.family("edgetrain_updates_duplicate_total", "counter",
           "Retransmitted updates answered again, not applied.");
  m.sample("edgetrain_updates_duplicate_total", static_cast<double>(duplicates_));
  m.family("edgetrain_updates_refused_total", "counter",
           "Updates refused since this process started, by reason.");
  for (const auto& [reason, count] : refused_)
    m.sample("edgetrain_updates_refused_total", static_cast<double>(count),
             "reason=\"" + label_value(reason) + "\"");
  m.family("edgetrain_ingress_payload_bytes_total", "counter",
           "Request payload bytes received (after block-wise reassembly).");
  m.sample("edgetrain_ingress_payload_bytes_total", static_cast<double>(ingress_payload_bytes()));
  m.family("edgetrain_ingress_socket_bytes_total", "counter",
           "UDP payload bytes that reached the server's sockets.");
  m.sample("edgetrain_ingress_socket_bytes_total", static_cast<double>(ingress_socket_bytes()));
  m.family("edgetrain_ingress_socket_datagrams_total", "counter",
           "Datagrams that reached the server's sockets.");
  m.sample("edgetrain_ingress_socket_datagrams_total",
           static_cast<double>(ingress_socket_datagrams()));
  m.family("edgetrain_egress_socket_bytes_total", "counter",
           "UDP payload bytes the server's sockets sent.");
  m.sample("edgetrain_egress_socket_bytes_total", static_cast<double>(egress_socket_bytes()));
  m.family("edgetrain_egress_socket_datagrams_total", "counter",
           "Datagrams the server's sockets sent.");
  m.sample("edgetrain_egress_socket_datagrams_total",
           static_cast<double>(egress_socket_datagrams()));
  m.family("edgetrain_model_pulls_total", "counter",
           "GET /model requests answered, by kind (dense model or model delta).");
  m.sample("edgetrain_model_pulls_total", static_cast<double>(model_pulls_ - model_delta_pulls_),
           "kind=\"dense\"");
  m.sample("edgetrain_model_pulls_total", static_cast<double>(model_delta_pulls_),
           "kind=\"delta\"");
  m.family("edgetrain_model_pull_cpu_seconds_total", "counter",
           "Thread CPU time spent answering GET /model.");
  m.sample("edgetrain_model_pull_cpu_seconds_total", model_pull_cpu_seconds_);
  if (const ReplicaRecords* records = state_.replica_records()) {
    m.family("edgetrain_cheap_pull_records", "gauge",
             "Devices whose copies the cheap pull records (--pull-fraction).");
    m.sample("edgetrain_cheap_pull_records", static_cast<double>(records->records()));
    m.family("edgetrain_cheap_pull_record_bytes", "gauge",
             "Memory the cheap pull's records hold (copies and last deltas).");
    m.sample("edgetrain_cheap_pull_record_bytes", static_cast<double>(records->bytes()));
  }
  {
    std::lock_guard lock(accuracy_mutex_);
    if (last_accuracy_) {
      m.family("edgetrain_last_test_accuracy", "gauge",
               "Test accuracy of the last evaluation (0..1).");
      m.sample("edgetrain_last_test_accuracy", last_accuracy_->second);
      m.family("edgetrain_last_evaluated_version", "gauge",
               "Model version of the last evaluation.");
      m.sample("edgetrain_last_evaluated_version", static_cast<double>(last_accuracy_->first));
    }
  }
  m.family("edgetrain_workers", "gauge",
           "Workers in the per-device table (identities that pulled the model or posted updates).");
  m.sample("edgetrain_workers", static_cast<double>(health_.workers()));
  m.family("edgetrain_workers_silent", "gauge",
           "Workers not heard from for longer than --silent-after.");
  m.sample("edgetrain_workers_silent", static_cast<double>(health_.silent_workers()));

  struct Row {
    std::string labels;
    DeviceView view;
    const DeviceRecord* record;
  };
  std::vector<Row> rows;
  for (const auto& [identity, record] : health_.devices())
    if (record.worker)
      rows.push_back({"device=\"" + label_value(escape_untrusted(identity)) + "\"",
                      health_.view(record), &record});
  auto per_device = [&](const std::string& name, const char* type, const std::string& help,
                        auto value) {
    m.family(name, type, help);
    for (const Row& row : rows) m.sample(name, value(row), row.labels);
  };
  per_device("edgetrain_device_last_seen_seconds", "gauge",
             "Seconds since the device was last heard from.",
             [](const Row& r) { return r.view.last_seen_seconds_ago; });
  per_device(
      "edgetrain_device_last_seen_timestamp_seconds", "gauge",
      "When the device was last heard from (Unix time).", [](const Row& r) {
        return std::chrono::duration<double>(r.record->last_seen_wall.time_since_epoch()).count();
      });
  per_device("edgetrain_device_silent", "gauge",
             "1 when the device was silent for longer than --silent-after.",
             [](const Row& r) { return r.view.silent ? 1.0 : 0.0; });
  per_device("edgetrain_device_updates_accepted_total", "counter",
             "Updates from the device applied since start.",
             [](const Row& r) { return static_cast<double>(r.record->updates_accepted); });
  per_device("edgetrain_device_mean_staleness", "gauge",
             "Mean staleness of the device's applied updates.",
             [](const Row& r) { return r.view.mean_staleness; });
  per_device("edgetrain_device_step_rate", "gauge",
             "Updates per second applied from the device, recently.",
             [](const Row& r) { return r.view.step_rate; });
  per_device("edgetrain_device_request_payload_bytes_total", "counter",
             "Request payload bytes from the device.",
             [](const Row& r) { return static_cast<double>(r.record->request_payload_bytes); });
  per_device("edgetrain_device_answer_payload_bytes_total", "counter",
             "Answer payload bytes to the device.",
             [](const Row& r) { return static_cast<double>(r.record->answer_payload_bytes); });
  m.family("edgetrain_device_updates_refused_total", "counter",
           "Updates from the device refused, by reason.");
  const auto& refusals = state_.device_refusals();
  for (const auto& [identity, record] : health_.devices()) {
    auto it = refusals.find(identity);
    if (!record.worker || it == refusals.end()) continue;
    for (const auto& [reason, count] : it->second.refused)
      m.sample("edgetrain_device_updates_refused_total", static_cast<double>(count),
               "device=\"" + label_value(escape_untrusted(identity)) + "\",reason=\"" +
                   label_value(reason) + "\"");
  }
  return std::move(m).text();
}

}  // namespace edgetrain::server
