// Start-up validation of edgetrain-server: every setting, file and data path is checked
// before the state directory is touched and before the socket is opened, so a mistake ends
// the program with exit status 2 and one clear message, and leaves nothing behind (no
// state directory, no port file). What the checks load (the test set, the parameters of
// --init-from) is handed to the server, so nothing is read twice.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/dataset.h"
#include "server/server_app.h"

namespace edgetrain::server {

// A setting, file or data path that cannot work; main() turns it into exit status 2.
class StartupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
inline constexpr int kStartupErrorExitStatus = 2;

struct StartPlan {
  std::optional<runtime::Dataset> eval_data;  // none: no evaluation
  std::string eval_note;  // why evaluation is off, for the log (empty when on or "none")
  // --init-from for a new state directory: the parameters to start from, and the file's
  // identity (path and checksum) that <state-dir>/init-from.json records.
  std::optional<std::vector<float>> initial_parameters;
  std::string init_from_identity;
  bool init_from_already_applied = false;  // the state directory began from this very file: resume
  bool init_from_unsealed = false;  // --init-from has no edgetrain.crc32: its bytes were not checked
};

// Throws StartupError naming the setting (and file) at fault.
StartPlan check_startup(const ServerSettings& settings);

// <state-dir>/init-from.json, written once a warm-started state directory exists.
inline constexpr const char* kInitFromRecordName = "init-from.json";

}  // namespace edgetrain::server
