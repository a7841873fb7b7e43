// The settings table (common/settings.h): a flag beats the file, the file beats the
// default; unknown keys, wrong types, values out of range or choices and TOML syntax
// errors are refused with the key, the file and the line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>

#include "common/number_text.h"
#include "common/settings.h"

namespace {

using edgetrain::settings::closest_match;
using edgetrain::settings::SettingsError;
using edgetrain::settings::Table;

struct Config {
  std::string server = "coaps://127.0.0.1:5684";
  std::string identity;
  std::uint32_t workers = 1;
  int batch = 10;
  double request_timeout = 60;
  std::uint64_t seed = 1;
  bool label_skew = false;
  std::string compressor = "adacomp";
  float lr = 0.1f;
  double rate = 0.0002;
};

class SettingsTable : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("edgetrain-settings-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    table_.group("Connection");
    table_.add("server", config_.server, "server URI");
    table_.add("identity", config_.identity, "PSK identity");
    table_.add("request-timeout", config_.request_timeout, "seconds per request")
        .range(0.5, 3600)
        .unit("seconds");
    table_.group("Training");
    table_.add("workers", config_.workers, "shards").range(1, 10000);
    table_.add("batch", config_.batch, "minibatch").range(1, 4096);
    table_.add("seed", config_.seed, "seed");
    table_.add("label-skew", config_.label_skew, "skewed shards");
    table_.add("compressor", config_.compressor, "what to send").choices({"adacomp", "none"});
    table_.add("lr", config_.lr, "learning rate");
    table_.add("rate", config_.rate, "compression rate").range(1e-6, 1);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string file(const std::string& text) {
    const auto path = dir_ / "settings.toml";
    std::ofstream(path) << text;
    return path.string();
  }
  // parse() with these arguments; its exit status, or -1 when the program would go on.
  int parse(std::vector<std::string> args) {
    args.insert(args.begin(), "program");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    const auto status = table_.parse(static_cast<int>(argv.size()), argv.data());
    return status ? *status : -1;
  }
  // The message of the SettingsError that load_file() throws for this file text.
  std::string refusal(const std::string& text) {
    try {
      table_.load_file(file(text));
      table_.check_all();
    } catch (const SettingsError& e) {
      return e.what();
    }
    return "accepted";
  }

  std::filesystem::path dir_;
  Config config_;
  Table table_{"program", "a test program"};
};

TEST_F(SettingsTable, DefaultsStayWithoutFlagsOrFile) {
  EXPECT_EQ(parse({}), -1);
  EXPECT_EQ(config_.batch, 10);
  EXPECT_EQ(config_.server, "coaps://127.0.0.1:5684");
  EXPECT_FALSE(table_.was_set("batch"));
}

TEST_F(SettingsTable, FlagBeatsFileAndFileBeatsDefault) {
  const std::string path = file(
      "batch = 32\n"
      "workers = 4\n"
      "request_timeout = 5\n"  // an integer fills a double
      "label_skew = true\n"
      "identity = \"pi-01\"\n");
  EXPECT_EQ(parse({"--config", path, "--batch", "64", "--request-timeout", "2.5"}), -1);
  EXPECT_EQ(config_.batch, 64);  // flag over file
  EXPECT_DOUBLE_EQ(config_.request_timeout, 2.5);
  EXPECT_EQ(config_.workers, 4u);  // file over default
  EXPECT_TRUE(config_.label_skew);
  EXPECT_EQ(config_.identity, "pi-01");
  EXPECT_EQ(config_.seed, 1u);  // default
  EXPECT_TRUE(table_.given_on_command_line("batch"));
  EXPECT_FALSE(table_.given_on_command_line("workers"));
  EXPECT_TRUE(table_.was_set("workers"));
}

TEST_F(SettingsTable, BoolFlagCanBeTurnedOffOverTheFile) {
  EXPECT_EQ(parse({"--config", file("label_skew = true\n"), "--label-skew=false"}), -1);
  EXPECT_FALSE(config_.label_skew);
}

TEST_F(SettingsTable, UnknownKeyIsRefusedWithItsLineAndASuggestion) {
  const std::string message = refusal("batch = 10\n\nidentiy = \"pi-01\"\n");
  EXPECT_NE(message.find("settings.toml:3: unknown key 'identiy' (did you mean 'identity'?)"),
            std::string::npos)
      << message;
  EXPECT_EQ(refusal("colour = 1\n").find("did you mean"), std::string::npos)
      << "nothing is close to 'colour'";
}

TEST_F(SettingsTable, WrongTypeIsRefusedWithKeyLineAndExpectedType) {
  const std::string message = refusal("seed = 3\nworkers = \"4\"\n");
  EXPECT_NE(message.find("settings.toml:2: 'workers' must be a non-negative integer, not a string"),
            std::string::npos)
      << message;
  EXPECT_NE(
      refusal("batch = 2.5\n").find("'batch' must be an integer, not a floating-point number"),
      std::string::npos);
  EXPECT_NE(refusal("label_skew = 1\n").find("'label_skew' must be a boolean"), std::string::npos);
  EXPECT_NE(refusal("workers = -1\n").find("'workers' must be a non-negative integer"),
            std::string::npos);
}

TEST_F(SettingsTable, OutOfRangeIsRefusedFromFileAndFlagAlike) {
  const std::string from_file = refusal("batch = 0\n");
  EXPECT_NE(from_file.find("settings.toml:1 (batch): batch must be in 1..4096, not 0"),
            std::string::npos)
      << from_file;
  testing::internal::CaptureStderr();
  EXPECT_EQ(parse({"--request-timeout", "0.1"}), 2);
  const std::string from_flag = testing::internal::GetCapturedStderr();
  EXPECT_NE(
      from_flag.find("program: --request-timeout: request-timeout must be in 0.5..3600, not 0.1"),
      std::string::npos)
      << from_flag;
}

TEST_F(SettingsTable, ChoicesAreChecked) {
  const std::string message = refusal("compressor = \"adacom\"\n");
  EXPECT_NE(message.find("must be one of adacomp, none, not 'adacom' (did you mean 'adacomp'?)"),
            std::string::npos)
      << message;
}

TEST_F(SettingsTable, SyntaxErrorNamesFileLineAndColumn) {
  const std::string message = refusal("batch = 10\nserver = \"unterminated\n");
  EXPECT_NE(message.find("settings.toml:2:"), std::string::npos) << message;
}

TEST_F(SettingsTable, MissingFileIsAnError) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(parse({"--config", (dir_ / "absent.toml").string()}), 2);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("absent.toml"), std::string::npos);
}

TEST_F(SettingsTable, VersionAndHelpExitWithZero) {
  testing::internal::CaptureStdout();
  EXPECT_EQ(parse({"--version"}), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(),
            "program " + std::string(edgetrain::settings::project_version()) + "\n");
  testing::internal::CaptureStdout();
  EXPECT_EQ(parse({"--help"}), 0);
  const std::string help = testing::internal::GetCapturedStdout();
  // Grouped, with defaults, units and ranges.
  EXPECT_NE(help.find("Connection"), std::string::npos) << help;
  EXPECT_NE(help.find("Training"), std::string::npos) << help;
  EXPECT_NE(help.find("--request-timeout SECONDS=60"), std::string::npos) << help;
  EXPECT_NE(help.find("--batch INT=10"), std::string::npos) << help;
  EXPECT_NE(help.find("(1..4096)"), std::string::npos) << help;
  EXPECT_NE(help.find("(adacomp|none)"), std::string::npos) << help;
  // Defaults in their shortest exact form: a float's 0.1f is 0.1, not 0.1000000015.
  EXPECT_NE(help.find("--lr FLOAT=0.1 "), std::string::npos) << help;
  EXPECT_NE(help.find("--rate FLOAT=0.0002 "), std::string::npos) << help;
  EXPECT_NE(help.find("(1e-06..1)"), std::string::npos) << help;
}

TEST(SettingsSubcommand, HasItsOwnFlagsChecksAndRequiredSettings) {
  Table table("program", "with a subcommand");
  int port = 0;
  std::string keystore, name;
  double seconds = 30;
  Table& add = table.subcommand("add", "add something");
  add.cli().add_option("name", name)->required();
  add.add("keystore", keystore, "file").required();
  add.add("seconds", seconds, "time").range(0, 60).unit("seconds");
  table.add("port", port, "port").range(0, 65535);
  auto parse = [&](std::vector<const char*> argv) {
    argv.insert(argv.begin(), "program");
    const auto status = table.parse(static_cast<int>(argv.size()), argv.data());
    return status ? *status : -1;
  };
  EXPECT_EQ(parse({"--port", "80"}), -1);  // the subcommand's required settings do not apply
  EXPECT_FALSE(add.parsed());
  EXPECT_TRUE(table.parsed());
  testing::internal::CaptureStderr();
  EXPECT_EQ(parse({"add", "pi-01"}), 2);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("program add: --keystore is required"),
            std::string::npos);
  testing::internal::CaptureStderr();
  EXPECT_EQ(parse({"add", "pi-01", "--keystore", "k.toml", "--seconds", "61"}), 2);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("seconds must be in 0..60, not 61"),
            std::string::npos);
  EXPECT_EQ(parse({"add", "pi-02", "--keystore", "k.toml", "--seconds", "5"}), -1);
  EXPECT_TRUE(add.parsed());
  EXPECT_EQ(name, "pi-02");
  EXPECT_EQ(keystore, "k.toml");
  EXPECT_DOUBLE_EQ(seconds, 5);
}

TEST(ClosestMatch, SuggestsOnlyNearWords) {
  EXPECT_EQ(closest_match("identiy", {"identity", "server"}), "identity");
  EXPECT_EQ(closest_match("max_stalenes", {"max_staleness", "seed"}), "max_staleness");
  EXPECT_EQ(closest_match("colour", {"identity", "server"}), "");
  // Keys renamed by a suffix: the old name points at the new one.
  EXPECT_EQ(closest_match("eval_interval_seconds", {"eval_interval", "eval_data"}),
            "eval_interval");
  EXPECT_EQ(closest_match("cert_file", {"cert", "cert_key", "ca"}), "cert");
  EXPECT_EQ(closest_match("cert_key_file", {"cert", "cert_key", "ca"}), "cert_key");
  EXPECT_EQ(closest_match("ca_file", {"cert", "cert_key", "ca"}), "ca");
  EXPECT_EQ(closest_match("key", {"key_hex", "key_file", "identity"}), "key_hex");
}

// What a stats file shows of a float setting: its shortest text, not the widened double's.
TEST(NumberText, AFloatIsWrittenAsItsShortestDecimal) {
  EXPECT_EQ(edgetrain::common::float_as_written(0.05f), 0.05);
  EXPECT_EQ(edgetrain::common::float_as_written(0.05f * 0.5f), 0.025);
  EXPECT_EQ(edgetrain::common::float_as_written(1e-6f), 1e-6);
  EXPECT_NE(static_cast<double>(0.05f), 0.05);  // what a plain widening would write
  EXPECT_EQ(static_cast<float>(edgetrain::common::float_as_written(0.1f / 3)), 0.1f / 3);
}

}  // namespace
