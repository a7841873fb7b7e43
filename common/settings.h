// One table of settings per program, driving its command line, its TOML file and the
// checks of both. A program declares each setting once, bound to a field of its own
// configuration struct:
//
//   struct Config { std::string server = "coaps://127.0.0.1:5684"; int batch = 10;
//                   double timeout = 60; bool quiet = false; std::string compressor = "adacomp"; };
//
//   int main(int argc, char** argv) {
//     Config config;
//     edgetrain::settings::Table table("edgetrain-worker", "trains on this device's shard");
//     table.group("Server");
//     table.add("server", config.server, "coaps://HOST[:PORT] of the edgetrain-server");
//     table.add("request-timeout", config.timeout, "time one request may take").range(0.5,
//     3600).unit("seconds"); table.group("Training"); table.add("batch", config.batch, "minibatch
//     size").range(1, 4096); table.add("compressor", config.compressor, "what to
//     send").choices({"adacomp", "none"}); table.add("quiet", config.quiet, "no progress line"); if
//     (auto exit_status = table.parse(argc, argv)) return *exit_status;  // --help, --version, or
//     an error
//     ... config holds defaults, overridden by the --config file, overridden by flags ...
//   }
//
// What that gives the program:
//   - flags --server, --request-timeout, --batch, --compressor, --quiet (a bool is a flag;
//     `--quiet=false` also works), plus --config FILE, --version and --help; the help lists
//     the settings by group with each one's default, unit and range or choices;
//   - a TOML file (--config) whose keys are the flag names with '-' turned into '_'
//     (`request_timeout = 30`); a flag on the command line beats the file, the file beats
//     the default;
//   - checks, after flags and file are merged, with messages that say where a value came
//     from: a TOML syntax error as FILE:LINE:COLUMN; an unknown key with its line and a
//     "did you mean 'x'?" when a known key is close; a wrong type (`batch = "10"`) with the
//     key, the line and the expected type; a value outside its range or choices, for flags
//     and file alike.
// Checks that relate two settings (say, two options that exclude each other) stay in the
// program, after parse().
//
// Supported field types: bool, int, std::uint16_t, std::uint32_t, std::int64_t,
// std::uint64_t (also std::size_t), float, double, std::string. TOML integers fill integer
// and floating-point fields; TOML floats only floating-point ones; negative numbers are
// refused for unsigned fields.
//
// Not thread-safe; a Table lives in main() for the duration of parse() (and the fields it
// binds must outlive it).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace edgetrain::settings {

// The project's version (CMake's project(VERSION)), which every program's --version prints.
std::string_view project_version();

// A setting's bound field.
using Field = std::variant<bool*, int*, std::uint16_t*, std::uint32_t*, std::int64_t*,
                           std::uint64_t*, float*, double*, std::string*>;

// One row of the table. add() returns it so that range, choices and unit read as part of
// the declaration.
class Setting {
 public:
  Setting(std::string flag, Field field, std::string help, std::string group);

  // Inclusive bounds for a number.
  Setting& range(double minimum, double maximum);
  // The values a string may take.
  Setting& choices(std::initializer_list<std::string_view> allowed);
  // Shown in --help as the flag's value ("seconds": --request-timeout SECONDS=60).
  Setting& unit(std::string unit);
  // Must be given (as a flag or in the file); parse() refuses to go on without it.
  Setting& required();

  const std::string& flag() const { return flag_; }  // without the dashes: "request-timeout"
  const std::string& key() const { return key_; }    // TOML key: "request_timeout"
  const std::string& group() const { return group_; }
  const std::string& help() const { return help_; }
  const std::string& default_text() const { return default_text_; }  // the field's value at add()
  const std::string& unit_text() const { return unit_; }
  const Field& field() const { return field_; }
  std::optional<std::pair<double, double>> bounds() const { return range_; }
  const std::vector<std::string>& allowed() const { return choices_; }
  // Where the value came from, for messages: "--batch", "worker.toml:3 (batch)" or "the default".
  const std::string& origin() const { return origin_; }

  // The field's current value as text (strings quoted).
  std::string value_text() const;
  // Empty when the value is inside range and choices, otherwise what is wrong.
  std::string check_value() const;

 private:
  friend class Table;
  std::string flag_, key_, help_, group_, unit_, default_text_, origin_ = "the default";
  Field field_;
  std::optional<std::pair<double, double>> range_;
  bool required_ = false;
  std::vector<std::string> choices_;
};

// Thrown by Table::parse() (caught there and printed) and by load_file(); the message is
// complete ("worker.toml:3: unknown key 'identiy' (did you mean 'identity'?)").
class SettingsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Table {
 public:
  // `program` names the executable in messages and --version; `description` heads --help.
  Table(std::string program, std::string description);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  // Settings added from now on are listed under this heading in --help.
  void group(std::string heading);
  // Declares a setting: flag name without dashes ("request-timeout"), the field it fills
  // (its current value is the default) and one line of help. Flags must be unique.
  template <class T>
  Setting& add(std::string flag, T& field, std::string help) {
    return add_field(std::move(flag), Field(&field), std::move(help));
  }

  // A subcommand (`edgetrain-server add-device NAME --keystore F`) with its own table of
  // settings. Its settings are flags only (the --config file fills the main table), with
  // the same help, defaults and checks, checked only when the subcommand was given.
  Table& subcommand(std::string name, std::string description);
  // Whether this table is the main one or a subcommand given on the command line (after parse()).
  bool parsed() const;

  // What is not a setting (not in the --config file), on this table (a subcommand's: its
  // own). A positional argument that must be given (`add-device NAME`):
  void positional(std::string name, std::string& field, std::string help);
  // Positional arguments, any number of them (`edgetrain-fleet-eval A.safetensors B...`):
  void positional(std::string name, std::vector<std::string>& field, std::string help);
  // A flag that takes several integers (`--delta-after 3 10`); its current value is the default.
  void int_list_flag(std::string flag, std::vector<int>& field, std::string help);
  // Text printed after --help's list of settings.
  void footer(std::string text);
  // One of the subcommands must be given.
  void require_subcommand();

  // The underlying CLI11 app, for what the calls above do not cover. Including
  // <CLI/CLI.hpp> costs a source file about 13 s of compile time (35 s under the
  // sanitizers), so programs use the calls above where they can.
  CLI::App& cli();

  // Parses the command line, then the --config file for every setting no flag gave, then
  // checks every value. Returns std::nullopt when the program should go on, otherwise the
  // exit status after --help / --version (0) or an error (2; the message is on stderr,
  // prefixed with the program's name).
  std::optional<int> parse(int argc, const char* const* argv);

  // What every program's main() does: parse(), then `run` (the program), and an exception
  // that escapes it printed as "PROGRAM: message" with exit status 1. Returns the exit status.
  int run_program(int argc, const char* const* argv, const std::function<int()>& run);

  // The same steps without the command line, for tests and programs that read a file
  // alone: fills every setting from `path` (TOML) unless `given_on_command_line(key)`,
  // then checks all values. Throws SettingsError.
  void load_file(const std::string& path);
  void check_all() const;

  // Whether the setting with this flag name was given as a flag (after parse()).
  bool given_on_command_line(std::string_view flag) const;
  // Whether the setting came from the flag or the file, not its default.
  bool was_set(std::string_view flag) const;
  const std::vector<std::unique_ptr<Setting>>& settings() const { return settings_; }
  const std::string& config_path() const { return config_path_; }

 private:
  Table(std::string program, CLI::App* subcommand);
  Setting& add_field(std::string flag, Field field, std::string help);
  Setting* find_by_key(std::string_view key) const;
  void make_options();
  void note_flags_given();

  std::string program_;
  std::string current_group_ = "Settings";
  std::unique_ptr<CLI::App> owned_app_;  // the main table's; a subcommand's belongs to it
  CLI::App* app_;
  std::vector<std::unique_ptr<Table>> subcommands_;
  std::vector<std::unique_ptr<Setting>> settings_;
  std::vector<CLI::Option*> options_;  // settings_[i]'s option, made by parse()
  std::string config_path_;
};

// The closest of `candidates` to `word` when it is close enough to be a likely typo
// (edit distance at most 2, or a third of the word's length for longer words); empty
// otherwise. Used for unknown keys; available to other file readers.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace edgetrain::settings
