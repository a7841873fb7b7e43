#include "worker/server_channel.h"

namespace edgetrain::runtime {

transport::CoapResponse CoapServerChannel::get_model(const std::string& path) {
  return client_.request(transport::Method::kGet, path);
}

transport::CoapResponse CoapServerChannel::post_update(std::span<const std::uint8_t> body) {
  return client_.request(transport::Method::kPost, "update", body);
}

transport::CoapResponse CoapServerChannel::probe(int timeout_ms) {
  return client_.request(transport::Method::kGet, probe_path_, {}, timeout_ms);
}

transport::CoapResponse CoapServerChannel::get_round() {
  return client_.request(transport::Method::kGet, "round");
}

transport::CoapResponse CoapServerChannel::post_round_update(std::uint64_t examples,
                                                             std::span<const std::uint8_t> body) {
  return client_.request(transport::Method::kPost,
                         "round/update?examples=" + std::to_string(examples), body);
}

transport::CoapResponse CoapServerChannel::request(transport::Method method,
                                                   const std::string& path,
                                                   std::span<const std::uint8_t> body) {
  return client_.request(method, path, body);
}

}  // namespace edgetrain::runtime
