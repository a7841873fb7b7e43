// What the worker loop needs of the parameter server: DESIGN.md's two requests. The worker
// talks to this interface only, so its loop can be tested against a fake server without a
// network (tests/unit/worker_test.cc); CoapServerChannel is the real one, over the CoAP
// client of transport/.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "transport/coap_dtls.h"

namespace edgetrain::runtime {

class ServerChannel {
 public:
  virtual ~ServerChannel() = default;
  // GET `path`: "model" or "model?since=V" (ModelReplica::pull_path()). The server's answer,
  // whatever its code; throws transport::TransportError when none arrived (timeout,
  // handshake refused, server unreachable).
  virtual transport::CoapResponse get_model(const std::string& path) = 0;
  // POST /update with one encoded update; answered and thrown like get_model().
  virtual transport::CoapResponse post_update(std::span<const std::uint8_t> body) = 0;
  // Federated rounds (worker/round_worker.h): GET /round, and POST
  // /round/update?examples=N with one encoded model delta. A channel without rounds
  // answers 4.04.
  virtual transport::CoapResponse get_round() { return {transport::CoapCode::kNotFound, {}, {}}; }
  virtual transport::CoapResponse post_round_update(std::uint64_t /*examples*/,
                                                    std::span<const std::uint8_t> /*body*/) {
    return {transport::CoapCode::kNotFound, {}, {}};
  }
  // Any other resource (MD-GAN's /gan/batches and /gan/feedback: worker/gan_worker.h). A
  // channel without it answers 4.04.
  virtual transport::CoapResponse request(transport::Method /*method*/, const std::string& /*path*/,
                                          std::span<const std::uint8_t> /*body*/ = {}) {
    return {transport::CoapCode::kNotFound, {}, {}};
  }
  // Whether the server answers, with a small request bounded by `timeout_ms` whole
  // (an offline worker's try: WorkerConfig::offline_try_timeout_seconds). Its answer,
  // whatever the code; throws transport::TransportError when none arrived. By default
  // GET /status through request().
  virtual transport::CoapResponse probe(int /*timeout_ms*/) {
    return request(transport::Method::kGet, "status");
  }
  // DTLS sessions (full handshakes) started so far: the byte budget charges each one
  // (worker/link_adaptation.h). A channel that cannot tell says 0.
  virtual std::uint64_t sessions_started() const { return 0; }
};

// The channel over CoAP/DTLS (or plain CoAP): one CoapDtlsClient, one session kept across
// requests (transport/coap_dtls.h).
class CoapServerChannel : public ServerChannel {
 public:
  // Throws what CoapDtlsClient's constructor throws (unusable credentials, unresolvable host).
  explicit CoapServerChannel(transport::CoapDtlsClient::Options options)
      : probe_path_(options.psk.identity.empty() ? "status"
                                                 : "status?device=" + options.psk.identity),
        client_(std::move(options)) {}
  // GET /status?device=IDENTITY (one device's entry, or a 4.04: small either way).
  transport::CoapResponse probe(int timeout_ms) override;
  transport::CoapResponse get_model(const std::string& path) override;
  transport::CoapResponse post_update(std::span<const std::uint8_t> body) override;
  transport::CoapResponse get_round() override;
  transport::CoapResponse post_round_update(std::uint64_t examples,
                                            std::span<const std::uint8_t> body) override;
  transport::CoapResponse request(transport::Method method, const std::string& path,
                                  std::span<const std::uint8_t> body = {}) override;
  std::uint64_t sessions_started() const override { return client_.sessions_started(); }

 private:
  std::string probe_path_;
  transport::CoapDtlsClient client_;
};

}  // namespace edgetrain::runtime
