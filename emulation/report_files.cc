#include "emulation/report_files.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <regex>
#include <utility>
#include <sstream>
#include <stdexcept>

namespace edgetrain::emulation {

std::size_t CsvTable::column(const std::string& name) const {
  const auto it = std::find(header.begin(), header.end(), name);
  if (it == header.end()) throw std::invalid_argument("no column '" + name + "'");
  return static_cast<std::size_t>(it - header.begin());
}

double CsvTable::number(std::size_t row, const std::string& name) const {
  return std::stod(rows.at(row).at(column(name)));
}

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> fields;
  std::istringstream in(line);
  for (std::string field; std::getline(in, field, ',');) fields.push_back(field);
  return fields;
}

CsvTable read_csv(const std::filesystem::path& path) {
  CsvTable table;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return table;
  table.header = split_fields(line);
  while (std::getline(in, line)) {
    if (!line.empty()) table.rows.push_back(split_fields(line));
  }
  return table;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read " + path.string());
  return nlohmann::json::parse(in);
}

std::vector<std::filesystem::path> worker_stats_files(const std::filesystem::path& run,
                                                      unsigned worker) {
  std::vector<std::pair<int, std::filesystem::path>> found;
  const std::regex name("worker-" + std::to_string(worker) + R"(\.([0-9]+)\.stats\.json)");
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(run / "logs", error)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, name)) found.emplace_back(std::stoi(m[1].str()), entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::filesystem::path> files;
  for (auto& f : found) files.push_back(f.second);
  return files;
}

std::string bytes_text(double b) {
  char text[32];
  if (b >= 1e9)
    std::snprintf(text, sizeof text, "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(text, sizeof text, "%.2f MB", b / 1e6);
  else
    std::snprintf(text, sizeof text, "%.1f kB", b / 1e3);
  return text;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary);
    out << text;
    if (!out.flush()) throw std::runtime_error("cannot write " + temporary.string());
  }
  std::filesystem::rename(temporary, path);
}

std::string fixed(double value, int digits) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

}  // namespace edgetrain::emulation
