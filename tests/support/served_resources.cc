#include "tests/support/served_resources.h"

#include <algorithm>

#include <string>
#include <utility>

namespace edgetrain::testing {

runtime::Model initialized_model(std::string_view spec, std::string_view name, std::uint64_t seed) {
  runtime::Model model(runtime::parse_model_spec(spec, std::string(name)));
  model.initialize(seed);
  return model;
}

transport::CoapDtlsServer::Options psk_server_options(std::map<std::string, std::string> keys) {
  transport::CoapDtlsServer::Options options;
  options.psk_lookup =
      [keys = std::move(keys)](std::string_view id) -> std::optional<std::vector<std::uint8_t>> {
    const auto found = keys.find(std::string(id));
    if (found == keys.end()) return std::nullopt;
    return bytes_of(found->second);
  };
  return options;
}

std::vector<std::uint8_t> bytes_of(std::string_view text) { return {text.begin(), text.end()}; }

std::string text_of(const transport::CoapResponse& response) {
  return {response.payload.begin(), response.payload.end()};
}

std::vector<std::uint32_t> tensor_sizes(const runtime::Model& model) {
  std::vector<std::uint32_t> sizes;
  for (const auto& t : model.tensors()) sizes.push_back(static_cast<std::uint32_t>(t.size));
  return sizes;
}

std::vector<std::uint8_t> random_sparse_update(std::mt19937& rng, const runtime::Model& model,
                                               std::uint64_t sequence,
                                               std::uint64_t fetched_version) {
  transport::SparseUpdate u{model.layout_id(), sequence, fetched_version, {}};
  const auto sizes = tensor_sizes(model);
  for (std::uint32_t t = 0; t < sizes.size(); ++t) {
    transport::SparseTensor tensor{t, sizes[t], {}, {}};
    for (std::uint32_t i = 0; i < sizes[t]; ++i)
      if (rng() % 4 == 0) {
        tensor.indices.push_back(i);
        tensor.values.push_back(std::uniform_real_distribution<float>(-1, 1)(rng));
      }
    if (!tensor.indices.empty()) u.tensors.push_back(std::move(tensor));
  }
  return transport::encode_sparse_update(u).value();
}

ServedResources::ServedResources(std::string_view name, runtime::Model model,
                                 server::ServerStateOptions state_options,
                                 transport::CoapDtlsServer::Options server_options,
                                 std::size_t loops, int idle_timeout_ms)
    : dir_("edgetrain-" + std::string(name)) {
  state_options.state_dir = dir_.path();
  state_ = std::make_unique<server::ServerState>(std::move(model), std::move(state_options));
  resources_ = std::make_unique<server::ServerResources>(*state_);
  server_options.reuse_port = loops > 1;
  for (std::size_t n = 0; n < std::max<std::size_t>(loops, 1); ++n) {
    servers_.push_back(std::make_unique<transport::CoapDtlsServer>(server_options));
    server_options.port = servers_[0]->port();
    resources_->attach(*servers_.back());
  }
  // The same loops as edgetrain-server's: group-committed updates are answered after each
  // pass; once all have stopped, one thread answers what is still staged.
  for (std::size_t n = 0; n < servers_.size(); ++n)
    loops_.emplace_back([this, n, idle_timeout_ms] {
      while (!stop_) resources_->serve_once(*servers_[n], idle_timeout_ms);
    });
}

void ServedResources::stop() {
  stop_ = true;
  resources_->wake_loops();  // a loop waiting out a long idle timeout
  bool joined = false;
  for (std::thread& loop : loops_)
    if (loop.joinable()) {
      loop.join();
      joined = true;
    }
  if (joined) resources_->answer_durable_updates(true);
}

ServedResources::~ServedResources() {
  stop();
  servers_.clear();
  resources_.reset();
  state_.reset();
}

}  // namespace edgetrain::testing
