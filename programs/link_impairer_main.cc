// edgetrain-link-impairer: serves the links of a TOML file (one [[link]] table per worker)
// from one thread until SIGTERM/SIGINT, and writes every link's counters to a CSV file
// every few seconds and at exit. SIGUSR1 emulates a NAT rebinding: every link's upstream
// socket is replaced, so the server sees its worker at a new source port. edgetrain-emulate starts one; see emulation/README.md.
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/settings.h"
#include "emulation/link_impairer.h"

namespace {

using namespace edgetrain::emulation;

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop = true; }
std::atomic<bool> g_rebind{false};
extern "C" void on_rebind_signal(int) { g_rebind = true; }

// "host:port" → (host, port); throws std::invalid_argument.
std::pair<std::string, std::uint16_t> split_endpoint(const std::string& text,
                                                     const std::string& what) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos)
    throw std::invalid_argument(what + " '" + text + "' is not HOST:PORT");
  const std::string port_text = text.substr(colon + 1);
  std::size_t used = 0;
  int port = -1;
  try {
    port = std::stoi(port_text, &used);
  } catch (...) {
  }
  if (port_text.empty() || used != port_text.size() || port < 0 || port > 65535) {
    throw std::invalid_argument(what + " '" + text + "' has a bad port");
  }
  return {text.substr(0, colon), static_cast<std::uint16_t>(port)};
}

std::vector<LinkSpec> read_links(const std::string& path) {
  toml::table file;
  try {
    file = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw std::invalid_argument(path + ":" + std::to_string(e.source().begin.line) + ":" +
                                std::to_string(e.source().begin.column) + ": " +
                                std::string(e.description()));
  }
  const toml::array* tables = file["link"].as_array();
  if (!tables || tables->empty()) throw std::invalid_argument(path + ": no [[link]] tables");
  std::vector<LinkSpec> links;
  for (const auto& node : *tables) {
    const toml::table* t = node.as_table();
    if (!t) throw std::invalid_argument(path + ": 'link' must be an array of tables");
    LinkSpec spec;
    spec.name = (*t)["name"].value_or(std::string("link") + std::to_string(links.size()));
    const std::string where = path + ": link " + spec.name;
    for (const auto& [key, value] : *t) {
      static const std::vector<std::string> known = {
          "name", "listen",         "upstream",      "delay_ms",          "jitter_ms",
          "loss", "bandwidth_kbps", "downlink_kbps", "queue_limit_bytes", "seed",
          "down", "outage_period_s", "outage_s",     "outage_phase_s",    "outage_from_s"};
      const std::string name(key.str());
      if (std::find(known.begin(), known.end(), name) != known.end()) continue;
      const std::string near = edgetrain::settings::closest_match(name, known);
      throw std::invalid_argument(path + ":" + std::to_string(key.source().begin.line) + ": link " +
                                  spec.name + ": unknown key '" + name + "'" +
                                  (near.empty() ? "" : " (did you mean '" + near + "'?)"));
    }
    const auto listen = (*t)["listen"].value<std::string>();
    const auto upstream = (*t)["upstream"].value<std::string>();
    if (!listen || !upstream)
      throw std::invalid_argument(where + ": 'listen' and 'upstream' (HOST:PORT) are required");
    std::tie(spec.listen_host, spec.listen_port) = split_endpoint(*listen, where + ": listen");
    std::tie(spec.upstream_host, spec.upstream_port) =
        split_endpoint(*upstream, where + ": upstream");
    if (spec.upstream_port == 0)
      throw std::invalid_argument(where + ": the upstream port must not be 0");
    spec.profile.delay_ms = (*t)["delay_ms"].value_or(0.0);
    spec.profile.jitter_ms = (*t)["jitter_ms"].value_or(0.0);
    spec.profile.loss = (*t)["loss"].value_or(0.0);
    spec.profile.bandwidth_kbps = (*t)["bandwidth_kbps"].value_or(0.0);
    spec.profile.downlink_kbps = (*t)["downlink_kbps"].value_or(-1.0);
    const std::int64_t queue = (*t)["queue_limit_bytes"].value_or(std::int64_t{256 * 1024});
    if (queue < 1500)
      throw std::invalid_argument(where + ": queue_limit_bytes must be at least 1500");
    spec.profile.queue_limit_bytes = static_cast<std::size_t>(queue);
    spec.seed = static_cast<std::uint64_t>((*t)["seed"].value_or(std::int64_t{1}));
    DownSchedule& down = spec.profile.down;
    down.windows = parse_down_windows((*t)["down"].value_or(std::string()), where + ": down");
    down.period_s = (*t)["outage_period_s"].value_or(0.0);
    down.down_s = (*t)["outage_s"].value_or(0.0);
    down.phase_s = (*t)["outage_phase_s"].value_or(0.0);
    down.from_s = (*t)["outage_from_s"].value_or(0.0);
    down.check(where);
    links.push_back(spec);
  }
  return links;
}

void write_stats(const LinkImpairer& impairer, const std::string& path) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    out << "link,listen,delay_ms,jitter_ms,loss,bandwidth_kbps";
    for (const char* d : {"to_server", "to_worker"}) {
      for (const char* c : {"datagrams_in", "bytes_in", "datagrams_out", "bytes_out",
                            "dropped_loss", "dropped_queue_full", "dropped_down"}) {
        out << ',' << d << '_' << c;
      }
    }
    out << ",down_s\n";
    for (std::size_t i = 0; i < impairer.size(); i++) {
      const LinkSpec& s = impairer.spec(i);
      const LinkCounters c = impairer.counters(i);
      out << s.name << ',' << s.listen_host << ':' << impairer.listen_port(i) << ','
          << s.profile.delay_ms << ',' << s.profile.jitter_ms << ',' << s.profile.loss << ','
          << s.profile.bandwidth_kbps;
      for (const DirectionCounters& d : {c.to_server, c.to_worker}) {
        out << ',' << d.datagrams_in << ',' << d.bytes_in << ',' << d.datagrams_out << ','
            << d.bytes_out << ',' << d.dropped_loss << ',' << d.dropped_queue_full << ','
            << d.dropped_down;
      }
      out << ',' << impairer.down_seconds(i) << '\n';
    }
  }
  std::filesystem::rename(temporary, path);
}

// {"links": {"NAME": "HOST:PORT", ...}}: where each link listens (its bound port when the
// file asked for port 0).
std::string listen_endpoints_json(const LinkImpairer& impairer) {
  nlohmann::json links = nlohmann::json::object();
  for (std::size_t i = 0; i < impairer.size(); i++)
    links[impairer.spec(i).name] =
        impairer.spec(i).listen_host + ":" + std::to_string(impairer.listen_port(i));
  return nlohmann::json{{"links", links}}.dump(2) + "\n";
}

struct ImpairerSettings {
  std::string links, stats, port_file;
  double stats_interval = 2;
};

int run(const ImpairerSettings& s) {
  try {
    const std::vector<LinkSpec> links = read_links(s.links);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    std::signal(SIGUSR1, on_rebind_signal);
    LinkImpairer impairer(links);
    for (std::size_t i = 0; i < impairer.size(); i++) {
      std::printf("link %s listening on %s:%u\n", links[i].name.c_str(),
                  links[i].listen_host.c_str(), impairer.listen_port(i));
    }
    if (!s.port_file.empty())
      edgetrain::common::write_file_atomically(s.port_file, listen_endpoints_json(impairer));
    std::printf("relaying %zu links\n", impairer.size());
    std::fflush(stdout);
    auto next_write = std::chrono::steady_clock::now();
    const auto started = next_write;
    std::vector<bool> was_down(impairer.size(), false);
    while (!g_stop) {
      for (std::size_t i = 0; i < impairer.size(); i++) {
        if (impairer.down_now(i) == was_down[i]) continue;
        was_down[i] = !was_down[i];
        std::printf("link %s %s at %.1f s\n", links[i].name.c_str(), was_down[i] ? "down" : "up",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
                        .count());
        std::fflush(stdout);
      }
      if (g_rebind) {
        g_rebind = false;
        impairer.rebind_upstreams();
        std::printf("rebinding every link's upstream socket (SIGUSR1): the server sees new source ports\n");
        std::fflush(stdout);
      }
      if (!s.stats.empty() && std::chrono::steady_clock::now() >= next_write) {
        write_stats(impairer, s.stats);
        next_write += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(s.stats_interval));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!s.stats.empty()) write_stats(impairer, s.stats);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgetrain-link-impairer: %s\n", e.what());
    return 1;
  }
}

constexpr const char* kDescription =
    "edgetrain-link-impairer: relays UDP between workers and a server with per-link delay, jitter, "
    "loss and a\n"
    "bandwidth cap (a user-space netem), all links served by one thread.\n\n"
    "The --links file holds one table per link:\n"
    "  [[link]]\n"
    "  name = \"w0\"                      # used in messages and the stats CSV\n"
    "  listen = \"10.77.0.1:5684\"        # where the worker sends (port 0: any free port)\n"
    "  upstream = \"127.0.0.1:5684\"      # the server\n"
    "  delay_ms = 50                    # one-way delay, each direction\n"
    "  jitter_ms = 10                   # plus a uniform draw in [0, jitter_ms]; order is kept\n"
    "  loss = 0.01                      # drop probability per datagram, each direction\n"
    "  bandwidth_kbps = 1000            # serialization rate per direction (0: unlimited)\n"
    "  downlink_kbps = 10000            # toward the worker only (default: bandwidth_kbps)\n"
    "  queue_limit_bytes = 262144       # tail drop beyond this backlog\n"
    "  seed = 1                         # loss and jitter draws\n"
    "  down = \"30+60,200+60\"            # down windows START+LEN (s from the start): every\n"
    "                                   # datagram dropped, both ways\n"
    "  outage_period_s = 120            # and/or periodic: down outage_s of every period,\n"
    "  outage_s = 60                    # starting at outage_phase_s (mod the period),\n"
    "  outage_phase_s = 30              # from outage_from_s on (86400: a diurnal pattern)\n"
    "  outage_from_s = 30\n"
    "Prints 'link NAME listening on HOST:PORT' for every link, then 'relaying N links', then\n"
    "'link NAME down at T s' / 'link NAME up at T s' as its down schedule turns.\n"
    "SIGUSR1 emulates a NAT rebinding: every link's upstream socket is replaced by one with a "
    "new source port.";

}  // namespace

int main(int argc, char** argv) {
  ImpairerSettings settings;
  edgetrain::settings::Table table("edgetrain-link-impairer", kDescription);
  table.add("links", settings.links, "TOML file of [[link]] tables (required)");
  table.add("stats", settings.stats,
            "CSV file of per-link counters, rewritten every --stats-interval and at exit");
  table.add("stats-interval", settings.stats_interval, "time between stats writes")
      .range(0.1, 3600)
      .unit("seconds");
  table.add("port-file", settings.port_file,
            "once every link listens: write {\"links\": {\"NAME\": \"HOST:PORT\", "
            "...}} (JSON) here, atomically");
  if (auto exit_status = table.parse(argc, argv)) return *exit_status;
  if (settings.links.empty()) {
    std::fprintf(stderr, "edgetrain-link-impairer: --links is required\n");
    return 2;
  }
  return run(settings);
}
