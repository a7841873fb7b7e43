#include "emulation/shard_report.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <regex>
#include <stdexcept>

#include "emulation/report_files.h"

namespace edgetrain::emulation {

namespace fs = std::filesystem;
using nlohmann::json;

std::pair<double, double> shard_ingress(const fs::path& run) {
  double payload = 0, socket = 0;
  const std::regex name(R"(shard-[0-9]+-[0-9]+\.stats\.json)");
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(run / "logs", error)) {
    if (!std::regex_match(entry.path().filename().string(), name)) continue;
    const json stats = read_json(entry.path());
    payload += stats.value("ingress_payload_bytes", 0.0);
    socket += stats.value("ingress_socket_bytes", 0.0);
  }
  return {payload, socket};
}

std::string append_shard_row(const fs::path& run, double elapsed, const fs::path& eval_path) {
  const json eval = read_json(eval_path);
  const json& versions = eval.at("shard_versions");
  if (!versions.is_array() || versions.empty())
    throw std::invalid_argument(eval_path.string() + ": no shard_versions");
  double version_sum = 0;
  for (const json& v : versions) version_sum += v.get<double>();
  const auto [payload, socket] = shard_ingress(run);
  const fs::path timeline = run / "timeline.csv";
  if (!fs::exists(timeline))
    write_file(timeline,
               "elapsed_s,version,test_accuracy,ingress_payload_bytes,ingress_socket_bytes\n");
  const std::string row = fixed(elapsed, 0) + "," +
                          fixed(version_sum / static_cast<double>(versions.size()), 0) + "," +
                          fixed(eval.at("accuracy").get<double>(), 4) + "," + fixed(payload, 0) +
                          "," + fixed(socket, 0);
  std::ofstream(timeline, std::ios::app) << row << '\n';
  return row;
}

}  // namespace edgetrain::emulation
