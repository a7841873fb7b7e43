// Text from the network reaches the server's log lines, its answers and /status only
// escaped (transport::escape_untrusted): a PSK identity or a query carrying a newline and an
// ESC sequence gives one log line with both visible as \xNN, never a forged second line or
// a terminal control code. ServerResources' handlers are called directly, as the event
// loop would with the identity Mbed TLS reports for the session.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "server/resources.h"
#include "server/server_state.h"
#include "tests/support/served_resources.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace edgetrain;

const std::string kForgedIdentity = "pi\n2026-11-23T00:00:00.000Z version 999\x1b[2J";
const std::string kShownIdentity = "pi\\x0a2026-11-23T00:00:00.000Z version 999\\x1b[2J";

bool raw_control_bytes_in(const std::string& text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  return false;
}

TEST(UntrustedTextInTheServer, IdentityWithNewlineAndEscIsOneEscapedLogLineAndEscapedInStatus) {
  edgetrain::testing::TempDir dir("untrusted-text");
  server::ServerStateOptions options;
  options.state_dir = dir.path();
  runtime::Model model =
      edgetrain::testing::initialized_model("input 4x4x1; fc 8 relu; fc 10", "tiny", 1);
  server::ServerState state(model, options);
  std::vector<std::string> log;
  server::ResourceOptions resource_options;
  resource_options.log = [&](const std::string& line) { log.push_back(line); };
  server::ServerResources resources(state, resource_options);

  std::mt19937 rng(7);
  const std::vector<std::uint8_t> body =
      edgetrain::testing::random_sparse_update(rng, state.model(), 1, 0);
  transport::CoapRequest post;
  post.method = transport::Method::kPost;
  post.authentication = transport::PeerAuthentication::kPsk;
  post.identity = kForgedIdentity;
  post.payload = body;
  ASSERT_EQ(resources.post_update(post).code, transport::CoapCode::kChanged);
  ASSERT_EQ(resources.post_update(post).code,
            transport::CoapCode::kChanged);  // a duplicate: logged too

  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0], "first request from '" + kShownIdentity + "'");
  EXPECT_NE(log[1].find("duplicate update from '" + kShownIdentity + "'"), std::string::npos)
      << log[1];
  for (const std::string& line : log) EXPECT_FALSE(raw_control_bytes_in(line)) << line;

  const nlohmann::json status = nlohmann::json::parse(resources.status_json());
  ASSERT_EQ(status["workers_seen"].size(), 1u);
  EXPECT_EQ(status["workers_seen"][0], kShownIdentity);

  // A query is echoed back in the 4.00 diagnostic: escaped as well.
  transport::CoapRequest get;
  get.authentication = transport::PeerAuthentication::kPsk;
  get.identity = "pi-01";
  get.query = "since=1\n\x1b[31m";
  const transport::CoapResponse refused = resources.get_model(get);
  EXPECT_EQ(refused.code, transport::CoapCode::kBadRequest);
  const std::string diagnostic(refused.payload.begin(), refused.payload.end());
  EXPECT_NE(diagnostic.find("got '1\\x0a\\x1b[31m'"), std::string::npos) << diagnostic;
  EXPECT_FALSE(raw_control_bytes_in(diagnostic)) << diagnostic;
  get.query = "x\r\n=1";
  const transport::CoapResponse unknown = resources.get_model(get);
  const std::string unknown_text(unknown.payload.begin(), unknown.payload.end());
  EXPECT_NE(unknown_text.find("unknown query parameter 'x\\x0d\\x0a=1'"), std::string::npos)
      << unknown_text;
}

}  // namespace
