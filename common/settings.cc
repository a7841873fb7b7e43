#include "common/settings.h"

#include <CLI/CLI.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#ifndef EDGETRAIN_VERSION
#error "EDGETRAIN_VERSION is set by common/CMakeLists.txt from the project version"
#endif

namespace edgetrain::settings {

std::string_view project_version() { return EDGETRAIN_VERSION; }

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// The shortest text that reads back as the same value: a float field's 0.1f is "0.1", not
// the "0.1000000015" its conversion to double prints.
template <typename Number>
std::string number_text(Number value) {
  char text[64];
  const auto [end, error] =
      std::to_chars(text, text + sizeof text, value, std::chars_format::general);
  return error == std::errc() ? std::string(text, end) : std::to_string(value);
}

std::string text_of(const Field& field) {
  return std::visit(
      Overloaded{[](bool* v) { return std::string(*v ? "true" : "false"); },
                 [](std::string* v) { return *v; }, [](float* v) { return number_text(*v); },
                 [](double* v) { return number_text(*v); },
                 [](auto* v) { return std::to_string(*v); }},
      field);
}

const char* type_name(const Field& field) {
  return std::visit(
      Overloaded{[](bool*) { return "a boolean (true or false)"; },
                 [](std::string*) { return "a string"; }, [](float*) { return "a number"; },
                 [](double*) { return "a number"; },
                 [](std::uint16_t*) { return "an integer (0..65535)"; },
                 [](std::uint32_t*) { return "a non-negative integer"; },
                 [](std::uint64_t*) { return "a non-negative integer"; },
                 [](auto*) { return "an integer"; }},
      field);
}

const char* toml_type_name(toml::node_type type) {
  switch (type) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    default:
      return "a date or time";
  }
}

template <class Integer>
bool assign_integer(std::int64_t value, Integer* target) {
  if (value < static_cast<std::int64_t>(std::numeric_limits<Integer>::min())) return false;
  if constexpr (sizeof(Integer) < sizeof(std::int64_t) || std::is_signed_v<Integer>) {
    if (value > static_cast<std::int64_t>(std::numeric_limits<Integer>::max())) return false;
  }
  *target = static_cast<Integer>(value);
  return true;
}

// Stores a TOML value in the field; false when its type does not fit.
bool assign(const toml::node& node, const Field& field) {
  return std::visit(Overloaded{[&](bool* v) {
                                 if (auto b = node.value_exact<bool>()) return *v = *b, true;
                                 return false;
                               },
                               [&](std::string* v) {
                                 if (auto s = node.value_exact<std::string>()) return *v = *s, true;
                                 return false;
                               },
                               [&](auto* v) {
                                 using T = std::remove_pointer_t<decltype(v)>;
                                 if constexpr (std::is_floating_point_v<T>) {
                                   if (node.is_integer() || node.is_floating_point())
                                     return *v = static_cast<T>(*node.value<double>()), true;
                                   return false;
                                 } else {
                                   if (auto i = node.value_exact<std::int64_t>())
                                     return assign_integer(*i, v);
                                   return false;
                                 }
                               }},
                    field);
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); j++) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); i++) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); j++) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string where(const std::string& path, const toml::source_region& source) {
  return path + ":" + std::to_string(source.begin.line);
}

}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  // A typo (a few edits), or a key renamed by dropping or adding a '_' suffix
  // (eval_interval_seconds -> eval_interval, cert_file -> cert).
  auto extends = [](std::string_view longer, std::string_view shorter) {
    return longer.size() > shorter.size() && longer.substr(0, shorter.size()) == shorter &&
           longer[shorter.size()] == '_';
  };
  const std::size_t allowed = std::max<std::size_t>(2, word.size() / 3);
  std::string best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const auto& candidate : candidates) {
    const std::size_t d = edit_distance(word, candidate);
    if (d > allowed && !extends(word, candidate) && !extends(candidate, word)) continue;
    if (d < best_distance) best_distance = d, best = candidate;
  }
  return best;
}

Setting::Setting(std::string flag, Field field, std::string help, std::string group)
    : flag_(std::move(flag)), help_(std::move(help)), group_(std::move(group)), field_(field) {
  key_ = flag_;
  std::replace(key_.begin(), key_.end(), '-', '_');
  default_text_ = text_of(field_);
}

Setting& Setting::range(double minimum, double maximum) {
  range_ = {minimum, maximum};
  return *this;
}

Setting& Setting::choices(std::initializer_list<std::string_view> allowed) {
  choices_.assign(allowed.begin(), allowed.end());
  return *this;
}

Setting& Setting::required() {
  required_ = true;
  return *this;
}

Setting& Setting::unit(std::string unit) {
  unit_ = std::move(unit);
  return *this;
}

std::string Setting::value_text() const {
  const std::string text = text_of(field_);
  return std::holds_alternative<std::string*>(field_) ? "'" + text + "'" : text;
}

std::string Setting::check_value() const {
  if (!choices_.empty()) {
    const std::string value = text_of(field_);
    if (std::find(choices_.begin(), choices_.end(), value) != choices_.end()) return {};
    std::string list;
    for (const auto& c : choices_) list += (list.empty() ? "" : ", ") + c;
    std::string message = "must be one of " + list + ", not " + value_text();
    if (auto near = closest_match(value, choices_); !near.empty())
      message += " (did you mean '" + near + "'?)";
    return message;
  }
  if (range_) {
    const double value =
        std::visit(Overloaded{[](bool*) { return 0.0; }, [](std::string*) { return 0.0; },
                              [](auto* v) { return static_cast<double>(*v); }},
                   field_);
    if (!(value >= range_->first && value <= range_->second))  // also catches NaN
      return "must be in " + number_text(range_->first) + ".." + number_text(range_->second) +
             ", not " + value_text();
  }
  return {};
}

Table::Table(std::string program, std::string description)
    : program_(std::move(program)),
      owned_app_(std::make_unique<CLI::App>(std::move(description), program_)),
      app_(owned_app_.get()) {
  app_->set_version_flag("--version", program_ + " " + std::string(project_version()),
                         "print the version and exit");
  app_->add_option(
          "--config", config_path_,
          "TOML file with any of the settings below, each under its flag's name with '_' for '-' "
          "(request_timeout = 30); a flag given here beats the file")
      ->type_name("FILE");
  app_->get_formatter()->column_width(34);
}

Table::Table(std::string program, CLI::App* subcommand)
    : program_(std::move(program)), app_(subcommand) {
  app_->get_formatter()->column_width(34);
}

Table::~Table() = default;

CLI::App& Table::cli() { return *app_; }

void Table::positional(std::string name, std::string& field, std::string help) {
  app_->add_option(std::move(name), field, std::move(help))->required();
}

void Table::positional(std::string name, std::vector<std::string>& field, std::string help) {
  app_->add_option(std::move(name), field, std::move(help));
}

void Table::int_list_flag(std::string flag, std::vector<int>& field, std::string help) {
  app_->add_option("--" + flag, field, std::move(help))->capture_default_str();
}

void Table::footer(std::string text) { app_->footer(std::move(text)); }

void Table::require_subcommand() { app_->require_subcommand(1); }

Table& Table::subcommand(std::string name, std::string description) {
  CLI::App* sub = app_->add_subcommand(name, std::move(description));
  subcommands_.push_back(std::unique_ptr<Table>(new Table(program_ + " " + name, sub)));
  return *subcommands_.back();
}

bool Table::parsed() const { return !app_->get_parent() || app_->parsed(); }

void Table::group(std::string heading) { current_group_ = std::move(heading); }

Setting& Table::add_field(std::string flag, Field field, std::string help) {
  for (const auto& s : settings_)
    if (s->flag() == flag)
      throw std::logic_error(program_ + ": setting --" + flag + " declared twice");
  auto setting = std::make_unique<Setting>(std::move(flag), field, std::move(help), current_group_);
  settings_.push_back(std::move(setting));
  options_.push_back(nullptr);  // made in parse(), once range, choices and unit are known
  return *settings_.back();
}

Setting* Table::find_by_key(std::string_view key) const {
  for (const auto& s : settings_)
    if (s->key() == key) return s.get();
  return nullptr;
}

bool Table::given_on_command_line(std::string_view flag) const {
  for (std::size_t i = 0; i < settings_.size(); i++)
    if (settings_[i]->flag() == flag) return options_[i] && options_[i]->count() > 0;
  return false;
}

bool Table::was_set(std::string_view flag) const {
  for (const auto& s : settings_)
    if (s->flag() == flag) return s->origin() != "the default";
  return false;
}

void Table::load_file(const std::string& path) {
  if (FILE* readable = std::fopen(path.c_str(), "r"))
    std::fclose(readable);
  else
    throw SettingsError("cannot read the settings file " + path);
  toml::table file;
  try {
    file = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    throw SettingsError(path + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) +
                        ": " + std::string(e.description()));
  }
  std::vector<std::string> keys;
  for (const auto& s : settings_) keys.push_back(s->key());
  for (const auto& [name, node] : file) {
    const std::string key(name.str());
    Setting* setting = find_by_key(key);
    if (!setting) {
      std::string message = where(path, name.source()) + ": unknown key '" + key + "'";
      if (auto near = closest_match(key, keys); !near.empty())
        message += " (did you mean '" + near + "'?)";
      throw SettingsError(message);
    }
    if (given_on_command_line(setting->flag())) continue;
    if (!assign(node, setting->field_))
      throw SettingsError(where(path, node.source()) + ": '" + key + "' must be " +
                          type_name(setting->field_) + ", not " + toml_type_name(node.type()));
    setting->origin_ = where(path, node.source()) + " (" + key + ")";
  }
}

void Table::check_all() const {
  for (const auto& s : settings_)
    if (s->required_ && s->origin() == "the default")
      throw SettingsError(
          "--" + s->flag_ + " is required" +
          (app_->get_parent() ? std::string() : " (or " + s->key_ + " in --config)"));
  for (const auto& s : settings_)
    if (auto problem = s->check_value(); !problem.empty())
      throw SettingsError(s->origin() + ": " + s->flag_ + " " + problem);
}

void Table::make_options() {
  for (std::size_t i = 0; i < settings_.size(); i++) {
    if (options_[i]) continue;  // a second parse() (tests) reuses the options
    Setting& s = *settings_[i];
    std::string help = s.help();
    if (!s.allowed().empty()) {
      help += " (";
      for (std::size_t c = 0; c < s.allowed().size(); c++) help += (c ? "|" : "") + s.allowed()[c];
      help += ")";
    } else if (s.bounds()) {
      help += " (" + number_text(s.bounds()->first) + ".." + number_text(s.bounds()->second) + ")";
    }
    CLI::Option* option = std::visit(
        Overloaded{[&](bool* v) { return app_->add_flag("--" + s.flag(), *v, help); },
                   [&](auto* v) {
                     CLI::Option* o = app_->add_option("--" + s.flag(), *v, help);
                     if (!s.unit_text().empty()) {  // "--request-timeout SECONDS=60"
                       std::string unit = s.unit_text();
                       for (char& c : unit)
                         c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
                       o->type_name(unit);
                     }
                     return o;
                   }},
        s.field());
    option->group(s.group());
    if (!std::holds_alternative<bool*>(s.field()))
      option->default_str(s.default_text().empty() ? "\"\"" : s.default_text());
    options_[i] = option;
  }
  for (auto& sub : subcommands_) sub->make_options();
}

void Table::note_flags_given() {
  for (std::size_t i = 0; i < settings_.size(); i++)
    if (options_[i]->count() > 0) settings_[i]->origin_ = "--" + settings_[i]->flag();
}

std::optional<int> Table::parse(int argc, const char* const* argv) {
  make_options();
  try {
    app_->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app_->exit(e);
  }
  try {
    note_flags_given();
    if (!config_path_.empty()) load_file(config_path_);
    check_all();
  } catch (const SettingsError& e) {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(), e.what());
    return 2;
  }
  for (auto& sub : subcommands_) {
    if (!sub->parsed()) continue;
    try {
      sub->note_flags_given();
      sub->check_all();
    } catch (const SettingsError& e) {
      std::fprintf(stderr, "%s: %s\n", sub->program_.c_str(), e.what());
      return 2;
    }
  }
  return std::nullopt;
}

int Table::run_program(int argc, const char* const* argv, const std::function<int()>& run) {
  if (auto exit_status = parse(argc, argv)) return *exit_status;
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(), e.what());
    return 1;
  }
}

}  // namespace edgetrain::settings
