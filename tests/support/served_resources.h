// Test fixtures for the server (host trees only: server/ is not built for aarch64).
//
// ServedResources is what edgetrain-server runs, on loopback and in-process: a
// ServerState in a fresh state directory, its ServerResources attached to a
// CoapDtlsServer (DTLS-PSK on 127.0.0.1, any free port), and the server's event loop on
// its own thread, answering group-committed updates after every pass. Tests then talk to
// it with transport::CoapDtlsClient and look at state() directly.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "model/model.h"
#include "server/resources.h"
#include "server/server_state.h"
#include "tests/support/temp_dir.h"
#include "transport/coap_dtls.h"

namespace edgetrain::testing {

// A model parsed from `spec` and initialised from `seed` (the server tests' small nets).
runtime::Model initialized_model(std::string_view spec, std::string_view name, std::uint64_t seed);

// A server's DTLS-PSK settings that know exactly `keys` (identity → key; the key's bytes
// are the string's), everything else as the server's defaults.
transport::CoapDtlsServer::Options psk_server_options(std::map<std::string, std::string> keys);

std::vector<std::uint8_t> bytes_of(std::string_view text);
std::string text_of(const transport::CoapResponse& response);  // the payload as text

// The element count of every tensor of `model`, in order (the codec's layout check).
std::vector<std::uint32_t> tensor_sizes(const runtime::Model& model);

// An encoded sparse update of `model` in which every parameter is sent with probability
// 1/4, values uniform in [-1, 1): for a model of a few hundred parameters an update spans
// several 1,024-byte Block1 blocks.
std::vector<std::uint8_t> random_sparse_update(std::mt19937& rng, const runtime::Model& model,
                                               std::uint64_t sequence,
                                               std::uint64_t fetched_version);

class ServedResources {
 public:
  // `state_options.state_dir` is replaced by a fresh directory named after `name`, removed
  // again with the fixture. Starts serving before it returns. `loops` > 1: that many event
  // loops, each a server on the one port (SO_REUSEPORT) driven by its own thread, as
  // edgetrain-server --loop-threads runs them. `idle_timeout_ms`: each serve_once()'s wait
  // when nothing is due (the server's is 200 ms).
  ServedResources(std::string_view name, runtime::Model model,
                  server::ServerStateOptions state_options,
                  transport::CoapDtlsServer::Options server_options, std::size_t loops = 1,
                  int idle_timeout_ms = 10);
  // stop(), then the server, the resources, the state and the directory, in that order.
  ~ServedResources();
  ServedResources(const ServedResources&) = delete;
  ServedResources& operator=(const ServedResources&) = delete;

  // Ends the loop as edgetrain-server does: the updates still waiting for their WAL sync
  // are answered first. Idempotent; state() stays readable afterwards.
  void stop();

  server::ServerState& state() { return *state_; }
  server::ServerResources& resources() { return *resources_; }
  transport::CoapDtlsServer& server() { return *servers_[0]; }  // the port all loops serve
  const std::filesystem::path& state_dir() const { return dir_.path(); }

 private:
  TempDir dir_;
  std::unique_ptr<server::ServerState> state_;
  std::unique_ptr<server::ServerResources> resources_;
  std::vector<std::unique_ptr<transport::CoapDtlsServer>> servers_;
  std::atomic<bool> stop_ = false;
  std::vector<std::thread> loops_;
};

}  // namespace edgetrain::testing
