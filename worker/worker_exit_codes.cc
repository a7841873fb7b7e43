#include "worker/worker_exit_codes.h"

namespace edgetrain::runtime {

std::string worker_exit_codes_help() {
  std::string text = "Exit status:\n";
  for (const WorkerExitDescription& e : kWorkerExits) {
    std::string code = std::to_string(exit_status(e.exit));
    code.insert(0, 4 - code.size(), ' ');
    text += code + "  " + e.meaning +
            (e.permanent ? " [permanent: systemd does not restart]" : "") + "\n";
  }
  return text;
}

}  // namespace edgetrain::runtime
