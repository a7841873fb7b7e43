// A worker-like MD-GAN client for e2e_gan_bad_feedback (issue 37): with a valid identity
// from the keystore it asks a real edgetrain-server --mode gan for its batches over
// CoAP/DTLS with PSK, checks that every sample is finite, and posts a feedback whose values
// are all ±V (alternating signs; "nan" writes NaN bits the encoder would refuse), one
// iteration per value given, checking the answer's code. Exits 0 when every answer was the
// expected one and every batch finite; prints one line per exchange.
//
// usage: gan_feedback_client PORT KEYSTORE IDENTITY BATCH EXPECTED_CODE [VALUE...]
//   EXPECTED_CODE as CoAP's class*100 + detail (422 for 4.22). No VALUE: only the batches
//   are fetched and checked.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "server/keystore.h"
#include "transport/coap_dtls.h"
#include "transport/gan_codec.h"

namespace {

using namespace edgetrain;
using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kWidth = 784;

// The batches of the iteration after `after` (any iteration when `after` is negative): asks
// again after 5.03 and while the server still serves `after`. Exits on anything else.
transport::GanBatches next_batches(transport::CoapDtlsClient& client, std::uint32_t batch,
                                   long long after) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    const auto answer = client.request(transport::Method::kGet, "gan/batches");
    if (answer.code == 503) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (answer.code != transport::CoapCode::kContent) {
      std::printf("FAIL: GET /gan/batches answered %s %s\n",
                  transport::coap_code_string(answer.code).c_str(),
                  std::string(answer.payload.begin(), answer.payload.end()).c_str());
      std::exit(1);
    }
    auto decoded = transport::decode_gan_batches(answer.payload, {.batch = batch, .width = kWidth});
    if (!decoded) {  // among others: a non-finite sample (the decoder refuses them)
      std::printf("FAIL: GET /gan/batches: %s\n", decoded.error().message.c_str());
      std::exit(1);
    }
    if (after >= 0 && decoded.value().iteration <= static_cast<std::uint64_t>(after)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    for (const auto* samples : {&decoded.value().g_samples, &decoded.value().d_samples})
      for (const float v : *samples)
        if (!std::isfinite(v)) {
          std::printf("FAIL: a non-finite sample in iteration %llu\n",
                      static_cast<unsigned long long>(decoded.value().iteration));
          std::exit(1);
        }
    return std::move(decoded).value();
  }
  std::printf("FAIL: no new batches within 60 s\n");
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr,
                 "usage: %s PORT KEYSTORE IDENTITY BATCH EXPECTED_CODE [VALUE...] (VALUE: a "
                 "number or nan)\n",
                 argv[0]);
    return 2;
  }
  try {
    const auto port = static_cast<std::uint16_t>(std::atoi(argv[1]));
    const auto keystore = server::Keystore::load(argv[2]);
    const std::string identity = argv[3];
    const auto batch = static_cast<std::uint32_t>(std::atoi(argv[4]));
    const int expected = std::atoi(argv[5]);
    const auto key = keystore.key_for(identity);
    if (!key) {
      std::printf("FAIL: %s is not in the keystore\n", identity.c_str());
      return 1;
    }
    transport::CoapDtlsClient client({"127.0.0.1", port, {identity, *key}, 20000});
    auto batches = next_batches(client, batch, -1);
    std::printf("iteration %llu: batches finite\n",
                static_cast<unsigned long long>(batches.iteration));
    int wrong = 0;
    for (int a = 6; a < argc; a++) {
      const std::string text = argv[a];
      const bool nan = text == "nan";
      const float v = nan ? 1.0f : std::strtof(text.c_str(), nullptr);
      transport::GanFeedback f{.run_id = batches.run_id,
                               .iteration = batches.iteration,
                               .batch = batch,
                               .width = kWidth,
                               .values = {}};
      for (std::uint32_t i = 0; i < batch * kWidth; i++) f.values.push_back(i % 2 ? -v : v);
      auto body = transport::encode_gan_feedback(f, transport::ValueEncoding::kFp32);
      if (!body) {
        std::printf("FAIL: %s\n", body.error().message.c_str());
        return 1;
      }
      if (nan) {  // the last value's bits: a quiet NaN
        const std::uint32_t bits = 0x7fc00000u;
        std::memcpy(body.value().data() + body.value().size() - 4, &bits, 4);
      }
      const auto answer = client.request(transport::Method::kPost, "gan/feedback", body.value());
      std::printf("iteration %llu: feedback of ±%s answered %s %s\n",
                  static_cast<unsigned long long>(batches.iteration), text.c_str(),
                  transport::coap_code_string(answer.code).c_str(),
                  std::string(answer.payload.begin(), answer.payload.end()).c_str());
      if (answer.code != expected) ++wrong;
      // The next iteration's batches: the server goes on (at the deadline, without this
      // client's refused feedback) and its samples are still finite.
      batches = next_batches(client, batch, static_cast<long long>(batches.iteration));
      std::printf("iteration %llu: batches finite\n",
                  static_cast<unsigned long long>(batches.iteration));
    }
    if (wrong > 0) {
      std::printf("FAIL: %d answers were not %d\n", wrong, expected);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
