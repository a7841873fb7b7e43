// edgetrain-server: the parameter server executable.
//
//   edgetrain-server --state-dir DIR --keystore KEYS [--config server.toml] [flags]
//   edgetrain-server --state-dir DIR --cert C --cert-key K --ca CA [--keystore KEYS] [flags]
//   edgetrain-server add-device NAME --keystore KEYS [--server-uri coaps://host:5684]
//   edgetrain-server repair-wal --state-dir DIR [--skip-damaged | --cut-at-damage]
//   edgetrain-server list-devices | remove-device NAME | rotate-key NAME  --keystore KEYS
//   edgetrain-server evaluate CHECKPOINT --data NAME [--model M] [--json]
//
// One table of settings (common/settings.h, server/server_settings.h): flags override the
// TOML config file, which overrides the defaults. The program itself is
// server/server_app.h; the subcommands are server/operator_commands.h.
#include <string>

#include "common/logging.h"
#include "common/settings.h"
#include "server/operator_commands.h"
#include "server/server_app.h"
#include "server/server_settings.h"
#include "server/startup_checks.h"

int main(int argc, char** argv) {
  using namespace edgetrain;
  server::ServerSettings settings;
  settings::Table table(
      "edgetrain-server",
      "edgetrain-server: the parameter server (CoAP over DTLS with PSK or X.509, WAL, checkpoints, "
      "evaluator)");
  server::declare_server_settings(table, settings);
  server::OperatorCommands operator_commands(table);
  if (auto exit_status = table.parse(argc, argv)) return *exit_status;
  try {
    if (auto exit_status = operator_commands.run()) return *exit_status;
    // The cheap pull's bounds and σ per entry mean nothing without it; given alone they
    // would be ignored, and the operator would believe pulls are cut.
    if (settings.pull_fraction == 0)
      for (const char* flag : {"pull-min-entries", "pull-max-devices", "entry-staleness"})
        if (table.was_set(flag))
          throw server::StartupError(std::string("--") + flag +
                                     " is a setting of the cheap pull: give --pull-fraction "
                                     "too (0, the default, means exact pulls)");
    return server::run_server(settings);
  } catch (const server::StartupError& e) {
    server::log_line(std::string("error: ") + e.what() + " (nothing was created; exit status 2)");
    return server::kStartupErrorExitStatus;
  } catch (const std::exception& e) {
    logging::write(logging::Level::kError, std::string("error: ") + e.what());
    return 1;
  }
}
