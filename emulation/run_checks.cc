#include "emulation/run_checks.h"

#include <algorithm>
#include <string>

#include "emulation/report_files.h"

namespace edgetrain::emulation {

namespace fs = std::filesystem;
using nlohmann::json;

std::uint64_t highest_acknowledged(const fs::path& run, unsigned workers,
                                   std::optional<unsigned> shard) {
  std::uint64_t highest = 0;
  for (unsigned i = 0; i < workers; i++) {
    for (const fs::path& file : worker_stats_files(run, i)) {
      const json stats = read_json(file);
      if (!shard) {
        if (const auto it = stats.find("acknowledged_highest"); it != stats.end())
          highest = std::max(highest, it->get<std::uint64_t>());
        else  // a worker of an earlier release: the whole list
          for (const auto& version : stats.at("acknowledged_versions"))
            highest = std::max(highest, version.get<std::uint64_t>());
      } else if (const auto it = stats.find("shard_versions");
                 it != stats.end() && it->is_array() && *shard < it->size()) {
        highest = std::max(highest, it->at(*shard).get<std::uint64_t>());
      }
    }
  }
  return highest;
}

std::uint64_t highest_acknowledged_in_run(const fs::path& run, std::optional<unsigned> shard) {
  const CsvTable plan = read_csv(run / "plan.csv");
  return highest_acknowledged(run, static_cast<unsigned>(plan.rows.size()), shard);
}

WorkerTotals worker_totals(const fs::path& run, unsigned worker) {
  WorkerTotals t;
  std::optional<std::uint64_t> previous;
  for (const fs::path& file : worker_stats_files(run, worker)) {
    const json stats = read_json(file);
    t.incarnations++;
    t.steps += stats.at("steps").get<std::uint64_t>();
    t.bytes_sent += stats.at("bytes_sent").get<std::uint64_t>();
    t.retries += stats.at("retries").get<std::uint64_t>();
    t.offline_seconds += stats.value("offline_seconds", 0.0);
    t.offline_steps += stats.value("offline_steps", std::uint64_t{0});
    t.offline_updates_accepted += stats.value("offline_updates_accepted", std::uint64_t{0});
    t.offline_updates_refused += stats.value("offline_updates_refused", std::uint64_t{0});
    t.offline_steps_refused += stats.value("offline_steps_refused", std::uint64_t{0});
    t.buffered_steps = stats.value("buffered_steps", std::uint64_t{0});  // the last incarnation's
    if (stats.value("mode", "async") == "rounds") {
      // A round worker's deltas accepted (2.04) and refused (4.09: its round had closed);
      // its acknowledged versions are the rounds acknowledged (round r is version r).
      t.accepted += stats.at("rounds_trained").get<std::uint64_t>();
      t.refused += stats.at("deltas_refused").get<std::uint64_t>();
    } else {
      t.accepted += stats.at("updates_accepted").get<std::uint64_t>();
      t.refused += stats.at("updates_refused").get<std::uint64_t>();
    }
    if (const auto it = stats.find("acknowledged_increasing"); it != stats.end()) {
      // The worker's bounded summary (worker_program.h AcknowledgedVersions): increasing
      // within this incarnation, and its first above the previous incarnation's last.
      if (stats.at("acknowledged_count").get<std::uint64_t>() > 0) {
        if (!it->get<bool>()) t.versions_increase = false;
        const auto first = stats.at("acknowledged_first").get<std::uint64_t>();
        if (previous && first <= *previous) t.versions_increase = false;
        previous = stats.at("acknowledged_highest").get<std::uint64_t>();
      }
    } else {
      for (const auto& v : stats.at("acknowledged_versions")) {  // an earlier release's list
        const auto version = v.get<std::uint64_t>();
        if (previous && version <= *previous) t.versions_increase = false;
        previous = version;
      }
    }
  }
  return t;
}

json restart_checks(const fs::path& run) {
  const CsvTable restarts = read_csv(run / "restarts.csv");
  json checks = json::array();
  for (std::size_t r = 0; r < restarts.rows.size(); r++) {
    const auto acknowledged =
        static_cast<std::uint64_t>(restarts.number(r, "highest_acknowledged"));
    const std::string recovered_text = restarts.rows[r].at(restarts.column("recovered_version"));
    json check = {{"elapsed_s", restarts.number(r, "elapsed_s")},
                  {"highest_acknowledged", acknowledged}};
    check["recovered_version"] =
        recovered_text.empty() ? json(nullptr) : json(std::stoull(recovered_text));
    check["lost"] = recovered_text.empty() || std::stoull(recovered_text) < acknowledged;
    checks.push_back(check);
  }
  return checks;
}

}  // namespace edgetrain::emulation
