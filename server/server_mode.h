// What a training mode adds to edgetrain-server beside the asynchronous core (POST /update,
// GET /model, GET /status of server/resources.h): its own resources, what the serving loop
// drives (deadlines that pass without a request), its keys in /status and the stats file,
// and what it does at shutdown. ServerApp (server_app.cc) holds at most one, made by
// make_server_mode() from the one registry of server modes; `async` has none.
//
// A mode's server side lives in its own files: server/server_mode_rounds.cc (federated
// rounds over server/round_coordinator.h), server/server_mode_gan.cc (MD-GAN over
// server/gan_coordinator.h, with the generator's evaluations). A new mode is new files plus
// one line in server_modes().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/settings.h"
#include "server/resources.h"
#include "server/run_end.h"
#include "server/server_app.h"
#include "server/server_state.h"
#include "transport/coap_dtls.h"

namespace edgetrain::server {

class ServerMode {
 public:
  virtual ~ServerMode() = default;
  // The --mode, and the key of the mode's object in the stats file ("rounds", "gan").
  virtual std::string_view name() const = 0;
  // Registers the mode's handlers on the serving loop's server; `note` sees each request
  // first (the server's ingress and device counters).
  virtual void attach(transport::CoapDtlsServer& server,
                      std::function<void(const transport::CoapRequest&)> note) = 0;
  // From the serving loop after every pass: deadlines pass without requests.
  virtual void poll() = 0;
  // The mode's keys (a JSON object) for /status and the stats file.
  virtual std::string status_json() const = 0;
  // What the run's stop conditions count (--stop-after-updates), if not the model version.
  virtual std::optional<std::uint64_t> progress() const { return std::nullopt; }
  // Whether the server's evaluator scores the classifier on --eval-data (MD-GAN uses the
  // test images for its generator's judge instead).
  virtual bool evaluates_classifier() const { return true; }
  // Why the run must end now, if it must (rounds: the privacy budget is spent): the
  // serving loop checks it beside the --stop-* conditions.
  virtual std::optional<StopReason> stop_reason() const { return std::nullopt; }
  // At shutdown, after the parameters' checkpoint: the mode's own durable state.
  virtual void shutdown() {}
};

// Makes the mode's server side over `state` once the settings passed their checks; sets
// what POST /update answers in this mode and the /status hook in `resources`. Throws
// StartupError (server/startup_checks.h) for state or settings it cannot use.
using MakeServerMode = std::unique_ptr<ServerMode> (*)(const ServerSettings& settings,
                                                       ServerState& state,
                                                       ResourceOptions& resources);

struct ServerModeEntry {
  std::string_view name;
  // The mode's own rows of the settings table (null: none).
  void (*declare)(settings::Table& table, ServerSettings& settings);
  MakeServerMode make;  // null: the asynchronous core alone
};

// Every --mode of the server: async, rounds, gan.
const std::vector<ServerModeEntry>& server_modes();
// The mode's server side, or null for async. Throws std::invalid_argument for an unknown mode.
std::unique_ptr<ServerMode> make_server_mode(const ServerSettings& settings, ServerState& state,
                                             ResourceOptions& resources);

}  // namespace edgetrain::server
