// The one registry of edgetrain-server's modes (server/server_mode.h).
#include <stdexcept>

#include "server/server_mode.h"

namespace edgetrain::server {

std::unique_ptr<ServerMode> make_rounds_mode(const ServerSettings&, ServerState&, ResourceOptions&);
std::unique_ptr<ServerMode> make_gan_mode(const ServerSettings&, ServerState&, ResourceOptions&);

const std::vector<ServerModeEntry>& server_modes() {
  static const std::vector<ServerModeEntry> modes = {
      {"async", nullptr}, {"rounds", make_rounds_mode}, {"gan", make_gan_mode}};
  return modes;
}

std::unique_ptr<ServerMode> make_server_mode(const ServerSettings& settings, ServerState& state,
                                             ResourceOptions& resources) {
  for (const ServerModeEntry& entry : server_modes())
    if (entry.name == settings.mode)
      return entry.make ? entry.make(settings, state, resources) : nullptr;
  throw std::invalid_argument("unknown --mode " + settings.mode);
}

}  // namespace edgetrain::server
