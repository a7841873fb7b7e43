// A device-like federated-rounds client for e2e_rounds_bad_delta (issue 37): with a valid
// identity from the keystore it asks a real edgetrain-server --mode rounds for the current
// round over CoAP/DTLS with PSK and posts a delta whose every entry is V (one post per value
// given), checking each answer's code. Exits 0 when every answer was the expected one;
// prints one line per post.
//
// usage: round_delta_client PORT KEYSTORE IDENTITY MODEL EXPECTED_CODE VALUE...
//   EXPECTED_CODE as CoAP's class*100 + detail (422 for 4.22).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/model.h"
#include "server/keystore.h"
#include "transport/codec.h"
#include "transport/coap_dtls.h"

int main(int argc, char** argv) {
  using namespace edgetrain;
  if (argc < 7) {
    std::fprintf(stderr,
                 "usage: round_delta_client PORT KEYSTORE IDENTITY MODEL EXPECTED_CODE VALUE...\n");
    return 2;
  }
  try {
    const auto port = static_cast<std::uint16_t>(std::stoul(argv[1]));
    const std::string identity = argv[3];
    const auto keystore = server::Keystore::load(argv[2]);
    const auto key = keystore.key_for(identity);
    if (!key) throw std::runtime_error(identity + " is not in " + argv[2]);
    const runtime::Model model(runtime::model_spec_from_argument(argv[4]));
    const int expected = std::atoi(argv[5]);
    transport::CoapDtlsClient client({"127.0.0.1", port, {identity, *key}, 20000});
    int failures = 0;
    for (int a = 6; a < argc; ++a) {
      const auto round_answer = client.request(transport::Method::kGet, "round");
      if (round_answer.code != 205)
        throw std::runtime_error("GET /round answered " + std::to_string(round_answer.code));
      const auto round = nlohmann::json::parse(
                             std::string(round_answer.payload.begin(), round_answer.payload.end()))
                             .at("round")
                             .get<std::uint64_t>();
      transport::SparseUpdate delta;
      delta.model_id = model.layout_id();
      delta.sequence = static_cast<std::uint64_t>(a);
      delta.fetched_version = round;
      const std::vector<std::uint32_t> sizes = model.tensor_sizes();
      const float value = std::strtof(argv[a], nullptr);
      for (std::uint32_t t = 0; t < sizes.size(); ++t) {
        transport::SparseTensor tensor{t, sizes[t], {}, {}};
        for (std::uint32_t i = 0; i < sizes[t]; ++i) {
          tensor.indices.push_back(i);
          tensor.values.push_back(i % 2 ? -value : value);
        }
        delta.tensors.push_back(std::move(tensor));
      }
      const auto body = transport::encode_sparse_update(delta);
      if (!body) throw std::runtime_error("cannot encode: " + body.error().message);
      const auto answer =
          client.request(transport::Method::kPost, "round/update?examples=10", body.value());
      const std::string text(answer.payload.begin(), answer.payload.end());
      std::printf("round %llu, delta of ±%s: %d %s\n", static_cast<unsigned long long>(round),
                  argv[a], answer.code, text.c_str());
      if (answer.code != expected) ++failures;
    }
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "round_delta_client: %s\n", e.what());
    return 1;
  }
}
