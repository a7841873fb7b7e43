// edgetrain-server's operator commands beside the server itself (server/README.md,
// "Operating a fleet"): add-device, list-devices, remove-device and rotate-key work on the
// keystore of a running server (server/keystore.h: locked, atomic); repair-wal lists and
// repairs damage in the middle of a state directory's logs (server/wal_repair.h); evaluate
// measures a checkpoint on a test set. Also the settings rows for start-up and the end of a
// run.
#pragma once

#include <optional>
#include <string>

#include "common/settings.h"
#include "server/server_app.h"

namespace edgetrain::server {

// The "Start-up and end of the run" group of the server's settings table.
void declare_run_settings(settings::Table& t, ServerSettings& s);

class OperatorCommands {
 public:
  // Declares the subcommands on `table` (before its parse()).
  explicit OperatorCommands(settings::Table& table);
  // After parse(): runs the subcommand given, returning its exit status, or nullopt when
  // none of these was given. Throws std::exception for an error (exit status 1).
  std::optional<int> run() const;

 private:
  struct Device {
    std::string name, keystore, server_uri;
    bool show_keys = false, json = false;
  };
  struct Evaluate {
    std::string checkpoint, data, model;
    bool json = false;
  };
  struct RepairWal {
    std::string state_dir;
    bool skip_damaged = false, cut_at_damage = false;
  };
  int add_device() const;
  int repair_wal() const;
  int list_devices() const;
  int remove_device() const;
  int rotate_key() const;
  int evaluate() const;

  Device add_, list_, remove_, rotate_;
  RepairWal repair_;
  Evaluate evaluate_;
  settings::Table* add_table_ = nullptr;
  settings::Table* repair_table_ = nullptr;
  settings::Table* list_table_ = nullptr;
  settings::Table* remove_table_ = nullptr;
  settings::Table* rotate_table_ = nullptr;
  settings::Table* evaluate_table_ = nullptr;
};

}  // namespace edgetrain::server
