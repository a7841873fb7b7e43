#include "model/dropout_table.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace edgetrain::runtime {
namespace {

constexpr const char* kFormatName = "edgetrain-dropout-table";

std::string hex64(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

void write_dropout_table(const std::string& path, const DropoutTable& table) {
  nlohmann::json points = nlohmann::json::array();
  for (const DropoutTablePoint& p : table.points) {
    points.push_back({{"drop_rates", p.drop_rates},
                      {"relative_time", p.relative_time},
                      {"relative_flops", p.relative_flops},
                      {"accuracy", p.accuracy}});
  }
  const nlohmann::json doc = {
      {"format", kFormatName},
      {"format_version", table.format_version},
      {"model", {{"name", table.model_name}, {"layout_id", hex64(table.layout_id)}}},
      {"dropout_rescale", dropout_rescale_name(table.rescale)},
      {"points", points}};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << doc.dump(2) << '\n';
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

DropoutTable read_dropout_table(const std::string& path, const Model& model) {
  auto fail = [&](const std::string& what) {
    return std::invalid_argument("dropout table " + path + ": " + what);
  };
  std::ifstream in(path);
  if (!in) throw fail("cannot open it");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("not valid JSON (") + e.what() + ")");
  }
  DropoutTable table;
  try {
    if (doc.at("format").get<std::string>() != kFormatName)
      throw fail("not an edgetrain dropout table");
    table.format_version = doc.at("format_version").get<int>();
    if (table.format_version != kDropoutTableFormatVersion) {
      throw fail("format version " + std::to_string(table.format_version) +
                 ", this program reads " + std::to_string(kDropoutTableFormatVersion));
    }
    table.model_name = doc.at("model").at("name").get<std::string>();
    const std::string layout = doc.at("model").at("layout_id").get<std::string>();
    if (layout != hex64(model.layout_id())) {
      throw fail("made for model '" + table.model_name + "' (layout " + layout +
                 "), not for model '" + model.spec().name + "' (layout " +
                 hex64(model.layout_id()) + ")");
    }
    table.layout_id = model.layout_id();
    table.rescale = parse_dropout_rescale(doc.at("dropout_rescale").get<std::string>());
    for (const auto& p : doc.at("points")) {
      DropoutTablePoint point;
      point.drop_rates = p.at("drop_rates").get<std::vector<float>>();
      point.relative_time = p.at("relative_time").get<double>();
      point.relative_flops = p.at("relative_flops").get<double>();
      point.accuracy = p.at("accuracy").get<double>();
      const std::string which = "point " + std::to_string(table.points.size() + 1);
      try {
        validate_drop_rates(model, point.drop_rates);
      } catch (const std::invalid_argument& e) {
        throw fail(which + ": " + e.what());
      }
      if (!(point.relative_time > 0 && std::isfinite(point.relative_time)) ||
          !(point.relative_flops > 0 && std::isfinite(point.relative_flops))) {
        throw fail(which + ": relative time and FLOPs must be finite and positive");
      }
      if (!(point.accuracy >= 0 && point.accuracy <= 1))
        throw fail(which + ": accuracy outside [0, 1]");
      table.points.push_back(std::move(point));
    }
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("missing or mistyped field (") + e.what() + ")");
  }
  if (table.points.empty()) throw fail("no points");
  return table;
}

std::vector<DropoutChoice> dropout_choices(const DropoutTable& table) {
  std::vector<DropoutChoice> choices;
  for (const DropoutTablePoint& p : table.points)
    choices.push_back({p.drop_rates, p.relative_time, p.accuracy});
  return choices;
}

}  // namespace edgetrain::runtime
