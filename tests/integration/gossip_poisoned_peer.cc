// A hostile gossip peer for e2e_gossip_bad_neighbour (issue 37 part 4): it serves, over
// plain CoAP (the --insecure peers' transport) on 127.0.0.1:PORT, a dense model of MODEL
// (initialised with seed 1, as the fleet's) whose output layer's bias is all BIAS (a finite
// float, e.g. 1e30), at GET /gossip/model whatever the query, under a version ahead of any
// honest peer's iteration; and answers POST /gossip/average with the same model (AD-PSGD).
// Exits 0 after SECONDS; prints how many models it served.
//
// usage: gossip_poisoned_peer PORT MODEL SECONDS BIAS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/model.h"
#include "transport/codec.h"
#include "transport/coap_dtls.h"

int main(int argc, char** argv) {
  using namespace edgetrain;
  if (argc != 5) {
    std::fprintf(stderr, "usage: gossip_poisoned_peer PORT MODEL SECONDS BIAS\n");
    return 2;
  }
  try {
    const auto port = static_cast<std::uint16_t>(std::stoul(argv[1]));
    runtime::Model model(runtime::model_spec_from_argument(argv[2]));
    const double seconds = std::strtod(argv[3], nullptr);
    const float bias = std::strtof(argv[4], nullptr);
    model.initialize(1);
    const runtime::ResolvedLayer& last = model.layers().back();
    if (last.bias_tensor < 0) throw std::runtime_error("the model's last layer has no bias");
    for (float& v : model.tensor(last.bias_tensor)) v = bias;
    const std::vector<std::uint32_t> sizes = model.tensor_sizes();
    std::uint64_t version = 1000000000;  // ahead of every honest peer: nobody waits for it
    long served = 0;
    auto answer = [&](int code) {
      auto body =
          transport::encode_dense_model(model.layout_id(), ++version, sizes, model.parameters());
      if (!body) throw std::runtime_error("cannot encode: " + body.error().message);
      ++served;
      return transport::CoapResponse{code, std::move(body).value(), version};
    };
    transport::CoapDtlsServer::Options o;
    o.bind_address = "127.0.0.1";
    o.port = 0;
    o.plaintext_port = port;
    o.max_body_bytes = std::size_t{16} << 20;
    transport::CoapDtlsServer server(o);
    server.add_resource(
        "gossip/model", transport::Method::kGet,
        [&](const transport::CoapRequest&) { return answer(transport::CoapCode::kContent); });
    server.add_resource(
        "gossip/average", transport::Method::kPost,
        [&](const transport::CoapRequest&) { return answer(transport::CoapCode::kChanged); });
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) server.run_once(100);
    std::printf("gossip_poisoned_peer: served %ld poisoned models (bias %g)\n", served,
                static_cast<double>(bias));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossip_poisoned_peer: %s\n", e.what());
    return 1;
  }
}
