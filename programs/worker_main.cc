// edgetrain-worker: trains on this device's shard in one of the modes of
// worker/worker_program.h (async AdaComp updates to an edgetrain-server over CoAP/DTLS by
// default; federated rounds, gossip between peers, MD-GAN). Its settings are one table
// (common/settings.h): flags, or the same names in a TOML file (--config); see
// worker/README.md.
#include "common/settings.h"
#include "worker/worker_exit_codes.h"
#include "worker/worker_program.h"

int main(int argc, char** argv) {
  using namespace edgetrain;
  runtime::WorkerSettings settings;
  settings::Table table(
      "edgetrain-worker",
      "edgetrain-worker: trains a model on this device's data shard and sends AdaComp-compressed "
      "gradients to an\n"
      "edgetrain-server over CoAP/DTLS (PSK, or X.509 with --cert/--cert-key/--ca).");
  runtime::declare_worker_settings(table, settings);
  table.footer(runtime::worker_exit_codes_help());
  return table.run_program(argc, argv, [&] {
    // --shards replaces --server: both as flags, or both in the file, is a mistake; a
    // --shards flag wins over a server in the file (add-device's configuration has one).
    settings.server_given = table.given_on_command_line("server") ||
                            (table.was_set("server") && !table.given_on_command_line("shards"));
    return runtime::run_worker_program(settings);
  });
}
