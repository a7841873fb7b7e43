// POST /update over plain CoAP (edgetrain-server --insecure): nothing proves who sent it,
// so it is keyed on the declared name behind "unauthenticated:", apart from every DTLS
// identity; replays are still applied once; without a usable declared name it is refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/resources.h"
#include "transport/coap_dtls.h"

namespace {

using namespace edgetrain;
using transport::CoapCode;
using transport::CoapDtlsClient;
using transport::CoapResponse;
using transport::Method;

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const CoapResponse& r) { return {r.payload.begin(), r.payload.end()}; }

class InsecureServer : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = std::filesystem::temp_directory_path() / ("edgetrain-insecure-" + std::to_string(::getpid()));
    std::filesystem::remove_all(state_dir_);
    runtime::Model model(runtime::parse_model_spec("input 8x8x1; fc 10", "tiny"));
    model.initialize(3);
    server::ServerStateOptions options;
    options.state_dir = state_dir_;
    state_ = std::make_unique<server::ServerState>(std::move(model), options);
    resources_ = std::make_unique<server::ServerResources>(*state_);
    transport::CoapDtlsServer::Options server_options;
    server_options.psk_lookup = [](std::string_view id) -> std::optional<std::vector<std::uint8_t>> {
      if (id == "device-1") return bytes_of("key-one-0123456789");
      return std::nullopt;
    };
    server_options.plaintext_port = 0;
    server_ = std::make_unique<transport::CoapDtlsServer>(server_options);
    resources_->attach(*server_);
    // The same loop as edgetrain-server's: group-committed updates are answered after each pass.
    thread_ = std::thread([this] {
      while (!stop_) {
        resources_->serve_once(*server_, 10);
      }
      resources_->answer_durable_updates(true);
    });
  }
  void TearDown() override {
    stop_ = true;
    thread_.join();
    server_.reset();
    resources_.reset();
    state_.reset();
    std::filesystem::remove_all(state_dir_);
  }
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
    transport::SparseUpdate u{state_->model_id(), sequence, state_->version(), {{0, size, {1, 7}, {0.5f, -1.0f}}}};
    return transport::encode_sparse_update(u).value();
  }
  nlohmann::json status() { return nlohmann::json::parse(resources_->status_json()); }

  std::filesystem::path state_dir_;
  std::unique_ptr<server::ServerState> state_;
  std::unique_ptr<server::ServerResources> resources_;
  std::unique_ptr<transport::CoapDtlsServer> server_;
  std::thread thread_;
  std::atomic<bool> stop_ = false;
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
  CoapDtlsClient device({"127.0.0.1", server_->port(), {"device-1", bytes_of("key-one-0123456789")}, 5000});
  const CoapResponse proven = device.request(Method::kPost, "update", update(5));
  ASSERT_EQ(proven.code, CoapCode::kChanged) << text_of(proven);
  EXPECT_EQ(server::decode_update_reply(proven.payload), 2u);
  EXPECT_EQ(status()["workers_seen"], nlohmann::json({"device-1", "unauthenticated:device-1"}));
  EXPECT_EQ(state_->sequences().count("unauthenticated:device-1"), 1u);
}

TEST_F(InsecureServer, PlainUpdateWithoutAUsableDeclaredNameIsRefused) {
  for (const std::string& declared : std::vector<std::string>{"", "two words", std::string(70, 'x')}) {
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
