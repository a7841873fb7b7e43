// POST /update over plain CoAP (edgetrain-server --insecure): nothing proves who sent it,
// so it is keyed on the declared name behind "unauthenticated:", apart from every DTLS
// identity; replays are still applied once; without a usable declared name it is refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/resources.h"
#include "tests/support/served_resources.h"
#include "transport/coap_dtls.h"

namespace {

using namespace edgetrain;
using namespace edgetrain::transport;
using edgetrain::testing::bytes_of;
using edgetrain::testing::text_of;

class InsecureServer : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server_options =
        edgetrain::testing::psk_server_options({{"device-1", "key-one-0123456789"}});
    server_options.plaintext_port = 0;
    served_ = std::make_unique<edgetrain::testing::ServedResources>(
        "insecure", edgetrain::testing::initialized_model("input 8x8x1; fc 10", "tiny", 3),
        server::ServerStateOptions{}, server_options);
    state_ = &served_->state();
    resources_ = &served_->resources();
    server_ = &served_->server();
  }
  void TearDown() override { served_.reset(); }
  CoapDtlsClient plain(const std::string& declared) {
    CoapDtlsClient::Options options;
    options.port = server_->plaintext_port();
    options.timeout_ms = 5000;
    options.plaintext = true;
    options.psk.identity = declared;
    return CoapDtlsClient(options);
  }
  std::vector<std::uint8_t> update(std::uint64_t sequence) const {
    const auto size = static_cast<std::uint32_t>(state_->model().tensors()[0].size);
    transport::SparseUpdate u{
        state_->model_id(), sequence, state_->version(), {{0, size, {1, 7}, {0.5f, -1.0f}}}};
    return transport::encode_sparse_update(u).value();
  }
  nlohmann::json status() { return nlohmann::json::parse(resources_->status_json()); }

  std::unique_ptr<edgetrain::testing::ServedResources> served_;
  server::ServerState* state_ = nullptr;
  server::ServerResources* resources_ = nullptr;
  transport::CoapDtlsServer* server_ = nullptr;
};

TEST_F(InsecureServer, PlainUpdatesAreKeyedOnTheDeclaredNameApartFromProvenOnes) {
  auto impostor = plain("device-1");
  const auto body = update(1'000'000);  // a high sequence under a proven device's name
  const CoapResponse first = impostor.request(Method::kPost, "update", body);
  ASSERT_EQ(first.code, CoapCode::kChanged) << text_of(first);
  EXPECT_EQ(server::decode_update_reply(first.payload), 1u);
  const CoapResponse replay = impostor.request(Method::kPost, "update", body);
  ASSERT_EQ(replay.code, CoapCode::kChanged);
  EXPECT_EQ(replay.payload, first.payload);  // answered the same, not applied again
  EXPECT_EQ(state_->version(), 1u);
  EXPECT_EQ(status()["duplicates_answered"], 1);

  // The real device-1 over DTLS-PSK has its own sequence space: a low sequence still applies.
  CoapDtlsClient device(
      {"127.0.0.1", server_->port(), {"device-1", bytes_of("key-one-0123456789")}, 5000});
  const CoapResponse proven = device.request(Method::kPost, "update", update(5));
  ASSERT_EQ(proven.code, CoapCode::kChanged) << text_of(proven);
  EXPECT_EQ(server::decode_update_reply(proven.payload), 2u);
  EXPECT_EQ(status()["workers_seen"], nlohmann::json({"device-1", "unauthenticated:device-1"}));
  EXPECT_EQ(state_->sequences().count("unauthenticated:device-1"), 1u);
}

TEST_F(InsecureServer, PlainUpdateWithoutAUsableDeclaredNameIsRefused) {
  for (const std::string& declared :
       std::vector<std::string>{"", "two words", std::string(70, 'x')}) {
    auto anonymous = plain(declared);
    const CoapResponse response = anonymous.request(Method::kPost, "update", update(1));
    EXPECT_EQ(response.code, CoapCode::kUnauthorized) << declared;
    EXPECT_NE(text_of(response).find("?id=NAME"), std::string::npos) << text_of(response);
    // Reading is fine without a name.
    EXPECT_EQ(anonymous.request(Method::kGet, "status").code, CoapCode::kContent);
  }
  EXPECT_EQ(state_->version(), 0u);
  EXPECT_EQ(status()["updates_refused_by_reason"]["no identity"], 3);
}

}  // namespace
