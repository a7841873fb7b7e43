// How edgetrain-worker ends: its exit status, defined here and nowhere else. `--help` prints
// the list (worker_exit_codes_help()), the man page (boards/packaging/edgetrain-worker.1)
// and worker/README.md repeat it (tests/integration/worker_failures.sh checks both against
// --help), and the systemd unit does not restart after the permanent ones
// (RestartPreventExitStatus= in boards/packaging/edgetrain-worker.service.in).
//
// Scripts and service managers read these numbers, never the log's wording.
#pragma once

#include <stdexcept>
#include <string>

namespace edgetrain::runtime {

enum class WorkerExit : int {
  kStopped = 0,  // stopped (--steps, --duration, SIGTERM/SIGINT) after the server accepted updates
  kError = 1,    // any other error: the message says what (unreadable data, a broken server, ...)
  kBadSettings =
      2,  // a setting refused: unknown flag or key, bad value, a key longer than 32 bytes
  kServerUnreachable =
      10,  // the server never answered: no answer from its address, or nothing listens there
  kHandshakeRefused =
      11,  // the DTLS handshake was refused: wrong key, or a certificate not accepted
  kUnknownIdentity = 12,  // the server does not know this identity (or no longer authorizes it)
  kModelMismatch = 13,    // the server trains another model (--model differs)
  kServerGone = 14,       // the server answered, then stopped answering for --give-up-after seconds
  kNothingApplied = 15,   // the run ended before the server accepted any update, for another reason
};

struct WorkerExitDescription {
  WorkerExit exit;
  bool
      permanent;  // retrying (restarting) cannot help until someone changes a setting or the server
  const char* meaning;
};

// Every exit status, in order, with its meaning as --help shows it.
inline constexpr WorkerExitDescription kWorkerExits[] = {
    {WorkerExit::kStopped, false,
     "stopped (--steps, --duration, SIGTERM) after the server accepted updates"},
    {WorkerExit::kError, false, "another error; the message says what"},
    {WorkerExit::kBadSettings, true,
     "a setting refused (flag, --config key or value, a key over 32 bytes)"},
    {WorkerExit::kServerUnreachable, false,
     "the server never answered: no answer from its address (firewall? wrong host?), or nothing "
     "listens on that port"},
    {WorkerExit::kHandshakeRefused, true,
     "the server refused the DTLS handshake: wrong key, or a certificate it does not accept"},
    {WorkerExit::kUnknownIdentity, true,
     "the server does not know (or no longer authorizes) this identity"},
    {WorkerExit::kModelMismatch, true, "the server trains another model than --model"},
    {WorkerExit::kServerGone, false, "the server answered, then not for --give-up-after seconds"},
    {WorkerExit::kNothingApplied, false, "the run ended before the server accepted any update"},
};

inline int exit_status(WorkerExit exit) { return static_cast<int>(exit); }

// The "Exit status" section of --help: one line per status.
std::string worker_exit_codes_help();

// The worker gave up (a permanent failure repeated --max-refusals times, or the server away
// for --give-up-after seconds); what() says why, in words a person acts on.
class WorkerFailure : public std::runtime_error {
 public:
  WorkerFailure(WorkerExit exit, const std::string& why) : std::runtime_error(why), exit_(exit) {}
  WorkerExit exit() const { return exit_; }

 private:
  WorkerExit exit_;
};

}  // namespace edgetrain::runtime
