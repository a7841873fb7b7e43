// The files of an emulated run as edgetrain-emulation-report reads them: CSV tables (the
// plan, timelines, the impairer's links.csv), JSON stats files and text. Shared by every
// part of the report library (edgetrain::emulation_report).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace edgetrain::emulation {

struct CsvTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  // The index of column NAME; throws std::invalid_argument when there is none.
  std::size_t column(const std::string& name) const;
  double number(std::size_t row, const std::string& name) const;
};

std::vector<std::string> split_fields(const std::string& line);
// Missing file: an empty table (a run stopped before the file was written).
CsvTable read_csv(const std::filesystem::path& path);
std::string read_text(const std::filesystem::path& path);
// The programs write their stats files atomically, so a file is whole or absent; absent
// or unparsable throws std::invalid_argument or nlohmann::json::exception.
nlohmann::json read_json(const std::filesystem::path& path);
// logs/worker-I.K.stats.json: worker (or peer) I's K-th incarnation (K = 0, then one per
// restart), in incarnation order.
std::vector<std::filesystem::path> worker_stats_files(const std::filesystem::path& run,
                                                      unsigned worker);
// Writes a file whole: a temporary beside it, then a rename.
void write_file(const std::filesystem::path& path, const std::string& text);
// `value` with `digits` decimals ("%.*f").
std::string fixed(double value, int digits);
// "1.25 GB", "3.40 MB", "12.0 kB".
std::string bytes_text(double bytes);

}  // namespace edgetrain::emulation
