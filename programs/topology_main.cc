// edgetrain-topology: writes the topology file of a gossip fleet (worker/gossip.h,
// worker/README.md "Gossip"): N peers, their names and addresses, and the edges.
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

#include "common/atomic_file.h"
#include "common/settings.h"
#include "worker/gossip.h"

namespace {

struct TopologySettings {
  std::string kind = "ring", prefix = "peer-", addresses, out;
  std::uint32_t peers = 8, degree = 4;
  std::uint64_t seed = 1;
  std::uint32_t base_port = 5684;
};

// "10.0.{i}.2:5684" or "127.0.0.1:{port}": {i} is the peer's index, {port} base_port + index.
std::string address_of(const std::string& pattern, std::uint32_t index, std::uint32_t base_port) {
  std::string out = pattern;
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"{i}", std::to_string(index)},
        {"{port}", std::to_string(base_port + index)}}) {
    for (auto at = out.find(key); at != std::string::npos; at = out.find(key, at + value.size()))
      out.replace(at, key.size(), value);
  }
  return out;
}

int run(const TopologySettings& s) {
  using namespace edgetrain::runtime;
  GossipTopology topology;
  try {
    topology = make_topology(parse_topology_kind(s.kind), s.peers, s.degree, s.seed, s.prefix);
    if (!s.addresses.empty()) {
      if (s.base_port + s.peers - 1 > 65535 && s.addresses.find("{port}") != std::string::npos)
        throw std::invalid_argument("--base-port + peers passes port 65535");
      for (std::uint32_t i = 0; i < topology.size(); ++i)
        topology.peers[i].address = address_of(s.addresses, i, s.base_port);
    }
    parse_topology_json(
        topology_json(topology));  // names from --name-prefix are checked like a file's
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "edgetrain-topology: %s\n", e.what());
    return 2;
  }
  const std::string text = topology_json(topology);
  if (s.out.empty() || s.out == "-")
    std::cout << text;
  else
    edgetrain::common::write_file_atomically(s.out, text);
  std::fprintf(stderr, "edgetrain-topology: %s of %zu peers, %zu edges%s%s\n",
               topology_kind_name(topology.kind), topology.size(), topology.edges().size(),
               s.out.empty() || s.out == "-" ? "" : " -> ",
               s.out.empty() || s.out == "-" ? "" : s.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  TopologySettings s;
  edgetrain::settings::Table t(
      "edgetrain-topology",
      "edgetrain-topology: writes the topology file of a gossip fleet (edgetrain-worker --mode "
      "gossip --topology FILE):\nits peers' names and addresses and the edges between them.");
  t.add("kind", s.kind,
        "ring (each peer's neighbours are the next and the previous), random-regular (every peer "
        "has "
        "--degree neighbours, a seeded draw, connected) or full")
      .choices({"ring", "random-regular", "full"});
  t.add("peers", s.peers, "number of peers").range(2, 100000);
  t.add("degree", s.degree, "random-regular: neighbours per peer").range(1, 100000);
  t.add("seed", s.seed, "random-regular: the draw");
  t.add("name-prefix", s.prefix, "peers are named PREFIX0 .. PREFIX(N-1): their certificates' CNs");
  t.add("addresses", s.addresses,
        "each peer's HOST:PORT, with {i} for its index and {port} for --base-port + index, "
        "e.g. 10.0.{i}.2:5684 or 127.0.0.1:{port} (empty: no addresses)");
  t.add("base-port", s.base_port, "the port of peer 0 for {port}").range(1, 65535);
  t.add("out", s.out, "the file to write (default: standard output)");
  return t.run_program(argc, argv, [&] { return run(s); });
}
