// edgetrain-emulate's settings (emulation/emulator_settings.h): the table's defaults and the
// shell assignments the launcher evaluates, a TOML file under a flag, and the checks that
// relate settings.
#include "emulation/emulator_settings.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/temp_dir.h"

namespace {

using namespace edgetrain::emulation;
namespace settings = edgetrain::settings;

std::string assignments(EmulatorSettings& s, std::vector<const char*> argv) {
  settings::Table table("edgetrain-emulate", "test");
  declare_emulator_settings(table, s);
  if (table.parse(static_cast<int>(argv.size()), argv.data()) != std::nullopt) return "refused";
  return shell_assignments(table);
}

std::size_t lines(const std::string& text) {
  std::size_t n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

TEST(EmulatorSettings, OneShellAssignmentPerSettingNamedLikeItsKey) {
  EmulatorSettings s;
  const std::string text = assignments(s, {"edgetrain-emulate"});
  settings::Table table("edgetrain-emulate", "test");
  EmulatorSettings other;
  declare_emulator_settings(table, other);
  EXPECT_EQ(lines(text), table.settings().size());
  for (const char* line :
       {"workers='10'\n", "pull_every='1'\n", "rate='0.01'\n", "error_feedback='0'\n",
        "impaired='all'\n", "label=''\n", "out='emulation-results/run'\n", "cpu_period='100000'\n",
        "max_parameter_magnitude='0'\n", "publish_fraction='0.01'\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line;
  for (const char* line : {"malicious_peers='0'\n", "attack=''\n",
                           "max_neighbour_magnitude='10000'\n", "neighbour_clip='0'\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line;
}

TEST(EmulatorSettings, FlagsQuotedForTheShell) {
  EmulatorSettings s;
  const std::string text = assignments(s, {"edgetrain-emulate", "--label", "it's $HOME", "--fp16",
                                           "--rate", "0.004", "--lr", "1e-3", "--workers", "3"});
  EXPECT_NE(text.find("label='it'\\''s $HOME'\n"), std::string::npos) << text;
  EXPECT_NE(text.find("fp16='1'\n"), std::string::npos);
  EXPECT_NE(text.find("rate='0.004'\n"), std::string::npos);  // not 0.0040000000000000001
  EXPECT_NE(text.find("lr='0.001'\n"), std::string::npos);
  EXPECT_NE(text.find("workers='3'\n"), std::string::npos);
  EmulatorSettings fresh, other;
  EXPECT_EQ(assignments(fresh, {"edgetrain-emulate", "--workers", "0"}), "refused");
  EXPECT_EQ(assignments(other, {"edgetrain-emulate", "--mode", "federated"}), "refused");
}

// Every mode takes any model (issue 35 part 5): a built-in residual model or a spec reaches
// the programs as written, quoted for the shell.
TEST(EmulatorSettings, AnyModelTheProgramsTake) {
  for (const char* mode : {"async", "rounds", "gossip"}) {
    EmulatorSettings builtin, spec;
    EXPECT_NE(assignments(builtin, {"edgetrain-emulate", "--mode", mode, "--model", "resnet-8"})
                  .find("model='resnet-8'\n"),
              std::string::npos)
        << mode;
    EXPECT_NE(assignments(spec, {"edgetrain-emulate", "--mode", mode, "--model",
                                 "input 28x28x1; conv 8 3x3 same relu; name a; conv 8 3x3 same; "
                                 "add a relu; globalavgpool; fc 10"})
                  .find("model='input 28x28x1; conv 8 3x3 same relu; name a; conv 8 3x3 same; "
                        "add a relu; globalavgpool; fc 10'\n"),
              std::string::npos)
        << mode;
  }
}

TEST(EmulatorSettings, AConfigFileUnderTheFlags) {
  edgetrain::testing::TempDir dir("edgetrain-emulator-settings");
  std::filesystem::create_directories(dir.path());
  const std::string file = (dir.path() / "run.toml").string();
  std::ofstream(file) << "pull_every = 10\nworkers = 4\nmode = \"gossip\"\n";
  EmulatorSettings s;
  const std::string text =
      assignments(s, {"edgetrain-emulate", "--config", file.c_str(), "--workers", "6"});
  EXPECT_NE(text.find("pull_every='10'\n"), std::string::npos);
  EXPECT_NE(text.find("mode='gossip'\n"), std::string::npos);
  EXPECT_NE(text.find("workers='6'\n"), std::string::npos);  // the flag beats the file
}

void expect_refused(const std::function<void(EmulatorSettings&)>& change, const char* says) {
  EmulatorSettings s;
  change(s);
  try {
    check_emulator_settings(s);
    ADD_FAILURE() << "accepted; expected '" << says << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(EmulatorSettings, ChecksThatRelateSettings) {
  using S = EmulatorSettings;
  expect_refused([](S& s) { s.fp16 = s.sign_scale = true; }, "exclude each other");
  expect_refused([](S& s) { s.qemu_workers = 11; }, "--qemu-workers");
  expect_refused([](S& s) { s.entry_staleness = true; }, "give --pull-fraction too");
  expect_refused([](S& s) { s.pull_values = "fp16-increment"; }, "give --pull-fraction too");
  expect_refused([](S& s) { s.drop_rates = "0.5", s.dropout_table = "t.json"; }, "give one of");
  expect_refused([](S& s) { s.class_drop_rates = "pi5=0.5"; }, "needs --cpu-classes");
  expect_refused([](S& s) { s.cpu_classes = "pi5=1", s.class_drop_rates = "pi3=0.5"; },
                 "with a class of --cpu-classes");
  expect_refused([](S& s) { s.cpu_classes = "pi5=1", s.class_drop_rates = "pi5=half"; },
                 "rates are numbers");
  expect_refused([](S& s) { s.dropout_table = "t.json"; }, "--step-time-budget");
  expect_refused([](S& s) { s.mode = "gossip", s.workers = 1; }, "at least 2 workers");
  expect_refused([](S& s) { s.mode = "gossip", s.fail = "kill-server@10"; }, "no server to kill");
  expect_refused([](S& s) { s.mode = "gossip", s.drop_rates = "0.5"; }, "whole model");
  expect_refused([](S& s) { s.shards = 2, s.mode = "rounds"; }, "--shards is for --mode async");
  expect_refused([](S& s) { s.shards = 2, s.publish_every = 5; }, "exclude each other");
  expect_refused([](S& s) { s.shards = 2, s.fail = "kill-server@10"; }, "kill one shard");
  expect_refused([](S& s) { s.fail = "kill-shard:0@10"; }, "needs --shards");
  expect_refused([](S& s) { s.mode = "rounds", s.aggregation = "dp-fedavg"; },
                 "needs --round-clip-norm and --dp-noise-multiplier");
  expect_refused([](S& s) { s.mode = "rounds", s.dp_noise_multiplier = 1; },
                 "go with --aggregation dp-fedavg");
  expect_refused([](S& s) { s.aggregation = "median"; }, "settings of --mode rounds");
  expect_refused([](S& s) { s.min_clients = 3; }, "--min-clients is a setting of --mode rounds");
  expect_refused([](S& s) { s.mode = "rounds", s.workers = 4, s.min_clients = 5; },
                 "--min-clients 5 is above --workers 4");
  expect_refused([](S& s) { s.mode = "rounds", s.round_clip_norm = 1, s.dp_noise = "skellam"; },
                 "needs --aggregation dp-fedavg and --secure-aggregation");
  expect_refused([](S& s) { s.impaired = "half"; }, "--impaired must be a number or 'all'");
  expect_refused([](S& s) { s.link = "delay=fast"; }, "--link: delay");
  expect_refused([](S& s) { s.slowdown = "1:"; }, "--slowdown");
  expect_refused([](S& s) { s.cpu_schedule = "10-20:0.5"; }, "needs --cpu-classes");
  expect_refused([](S& s) { s.cpu_priority = true; }, "--cpu-priority needs --cpu-classes");
  // Intermittent links (issue 38 part 1): one link per worker and server only, offline
  // training in async mode only.
  expect_refused([](S& s) { s.reachable = 0.5, s.mode = "gossip"; }, "not built for --mode gossip");
  expect_refused([](S& s) { s.reachable = 0.5, s.shards = 2; }, "or --shards yet");
  expect_refused([](S& s) { s.offline_steps = 100, s.mode = "rounds"; }, "--mode async only");
  EmulatorSettings bad_window;
  bad_window.cpu_classes = "pi5=1";
  bad_window.cpu_schedule = "20-10:0.5";
  EXPECT_THROW(check_emulator_settings(bad_window), std::invalid_argument);
}

// Attackers (--malicious-peers, --attack) and the honest peers' defence (issue 37).
TEST(EmulatorSettings, AttackersAndTheDefence) {
  using S = EmulatorSettings;
  expect_refused([](S& s) { s.malicious_peers = 1; }, "are for --mode gossip");
  expect_refused([](S& s) { s.mode = "rounds", s.attack = "bias:1e30"; }, "are for --mode gossip");
  expect_refused([](S& s) { s.neighbour_clip = 3; }, "the gossip peers'");
  expect_refused([](S& s) { s.max_neighbour_magnitude = 0; }, "the gossip peers'");
  expect_refused([](S& s) { s.mode = "gossip", s.workers = 8, s.malicious_peers = 8; },
                 "--malicious-peers 8 must be below --workers 8");
  expect_refused([](S& s) { s.mode = "gossip", s.attack = "bias:1e30"; },
                 "--attack needs --malicious-peers");
  for (const char* bad : {"bias", "bias:", "bias:x", "bias:1e30x", "scale:inf", "shift:2",
                          "bias:1e39", ":3"})
    expect_refused([bad](S& s) { s.mode = "gossip", s.malicious_peers = 1, s.attack = bad; },
                   "is not bias:V or scale:F");
  expect_refused([](S& s) { s.mode = "gossip", s.workers = 4, s.malicious_peers = 2,
                            s.qemu_workers = 3; },
                 "must not exceed --workers");
  expect_refused([](S& s) { s.mode = "gossip", s.gossip = "ad-psgd", s.neighbour_clip = 1; },
                 "d-psgd's");
  for (const char* good : {"", "bias:1e30", "bias:-1000", "scale:-4", "scale:0.5"}) {
    EmulatorSettings s;
    s.mode = "gossip", s.workers = 8, s.malicious_peers = 1, s.attack = good;
    s.neighbour_clip = 0.3, s.max_neighbour_magnitude = 0;
    EXPECT_NO_THROW(check_emulator_settings(s)) << good;
  }
  EXPECT_NO_THROW(check_gossip_attack("scale:-4"));
  EXPECT_THROW(check_gossip_attack("scale"), std::invalid_argument);
}

TEST(EmulatorSettings, SettingsThatGoTogetherPass) {
  std::vector<EmulatorSettings> good(8);
  good[7].reachable = 0.5, good[7].offline_steps = 1000, good[7].offline_step_credit = 1000;
  good[7].cpu_classes = "equal=0.03", good[7].cpu_priority = true;
  good[1].mode = "gossip", good[1].workers = 2, good[1].fail = "kill-worker:1@10";
  good[2].cpu_classes = "pi5=1,pi3=0.35", good[2].class_drop_rates = "pi3=0:0.5";
  good[3].shards = 3, good[3].fail = "kill-shard:1@20+5";
  good[4].dropout_table = "t.json", good[4].step_time_budget = 40;
  good[6].mode = "rounds", good[6].aggregation = "dp-fedavg", good[6].round_clip_norm = 1;
  good[6].dp_noise_multiplier = 1, good[6].secure_aggregation = true, good[6].dp_noise = "skellam";
  good[6].min_clients = 10;
  good[5].impaired = "3", good[5].link = "delay=20:80,loss=0.01", good[5].slowdown = "0:3";
  good[5].cpu_classes = "a=1,b=0.5", good[5].cpu_schedule = "60-120:0.5@b";
  good[0].pull_fraction = 0.004, good[0].entry_staleness = true;
  good[0].pull_values = "fp16-increment";
  for (std::size_t i = 0; i < good.size(); i++)
    EXPECT_NO_THROW(check_emulator_settings(good[i])) << i;
}

TEST(EmulatorSettings, TheSettingsSubcommand) {
  const char* fine[] = {"settings", "--workers", "3"};
  testing::internal::CaptureStdout();
  EXPECT_EQ(print_emulator_settings(3, fine), 0);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("workers='3'\n"), std::string::npos);
  // The launcher passes min_clients to the server (--min-clients) when it is not 0.
  const char* calibrated[] = {"settings", "--mode", "rounds", "--workers", "20", "--min-clients", "10"};
  testing::internal::CaptureStdout();
  EXPECT_EQ(print_emulator_settings(7, calibrated), 0);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("min_clients='10'\n"), std::string::npos);
  const char* too_many[] = {"settings", "--mode", "rounds", "--workers", "3", "--min-clients", "4"};
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  EXPECT_EQ(print_emulator_settings(7, too_many), 2);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_NE(testing::internal::GetCapturedStderr().find("--min-clients 4 is above --workers 3"), std::string::npos);
  const char* clash[] = {"settings", "--fp16", "--sign-scale"};
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  EXPECT_EQ(print_emulator_settings(3, clash), 2);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");  // nothing for the launcher to run
  EXPECT_NE(testing::internal::GetCapturedStderr().find("edgetrain-emulate: --fp16 and"),
            std::string::npos);
}

}  // namespace
