// The one registry of edgetrain-server's modes (server/server_mode.h).
#include <stdexcept>

#include "server/server_mode.h"

namespace edgetrain::server {

// The modes (server/server_mode_*.cc).
void declare_rounds_settings(settings::Table&, ServerSettings&);
std::unique_ptr<ServerMode> make_rounds_mode(const ServerSettings&, ServerState&, ResourceOptions&);
void declare_gan_settings(settings::Table&, ServerSettings&);
std::unique_ptr<ServerMode> make_gan_mode(const ServerSettings&, ServerState&, ResourceOptions&);

const std::vector<ServerModeEntry>& server_modes() {
  static const std::vector<ServerModeEntry> modes = {
      {"async", nullptr, nullptr},
      {"rounds", declare_rounds_settings, make_rounds_mode},
      {"gan", declare_gan_settings, make_gan_mode}};
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
