// --mode rounds on the server: the round coordinator (server/round_coordinator.h) behind the
// ServerMode seam.
#include <cstdio>

#include "server/round_coordinator.h"
#include "server/server_mode.h"

namespace edgetrain::server {
namespace {

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

class RoundsMode : public ServerMode {
 public:
  RoundsMode(ServerState& state, RoundOptions options) : rounds_(state, std::move(options)) {}
  std::string_view name() const override { return "rounds"; }
  void attach(transport::CoapDtlsServer& server,
              std::function<void(const transport::CoapRequest&)> note) override {
    rounds_.attach(server, std::move(note));
  }
  void poll() override { rounds_.poll(); }  // a round's deadline passes without a request
  std::string status_json() const override { return rounds_.status_json(); }
  const RoundCoordinator& rounds() const { return rounds_; }

 private:
  RoundCoordinator rounds_;
};

}  // namespace

std::unique_ptr<ServerMode> make_rounds_mode(const ServerSettings& s, ServerState& state,
                                             ResourceOptions& resources) {
  RoundOptions o;
  o.policy = parse_round_policy(s.round_policy);
  o.aggregation = parse_aggregation(s.aggregation);
  o.deadline_seconds = s.round_deadline;
  o.client_fraction = s.client_fraction;
  o.min_clients = s.min_clients;
  o.local_steps = s.local_steps;
  o.local_epochs = s.local_epochs;
  o.server_lr = static_cast<float>(s.server_lr);
  o.store_learning_rate = static_cast<float>(s.lr);
  o.seed = s.seed;
  o.log = log_line;
  if (s.publish_every > 0)
    log_line("WARNING: --publish-every is ignored with --mode rounds: a round's model is exact");
  auto mode = std::make_unique<RoundsMode>(state, o);
  resources.updates_refused_because = "--mode rounds: post model deltas to /round/update";
  resources.extra_status = [m = mode.get()] { return m->status_json(); };
  log_line("federated rounds: round " + std::to_string(mode->rounds().round()) + ", policy " +
           s.round_policy + ", " + s.aggregation + " aggregation, deadline " +
           number(s.round_deadline) + " s, client fraction " + number(s.client_fraction) + ", " +
           (s.local_epochs > 0 ? std::to_string(s.local_epochs) + " local epochs"
                               : std::to_string(s.local_steps) + " local steps") +
           ", server lr " + number(s.server_lr));
  return mode;
}

}  // namespace edgetrain::server
