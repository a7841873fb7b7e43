// edgetrain-server's settings table (common/settings.h): the rows every mode shares, then
// each mode's own (server/server_mode.h's registry declares them), then the output and the
// run's end (server/operator_commands.h). programs/server_main.cc only builds it.
#pragma once

#include "common/settings.h"
#include "server/server_app.h"

namespace edgetrain::server {

void declare_server_settings(settings::Table& table, ServerSettings& settings);

}  // namespace edgetrain::server
