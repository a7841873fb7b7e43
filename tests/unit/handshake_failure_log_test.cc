// The server's log of failed handshakes of known devices (server/handshake_failure_log.h):
// one line per identity per interval, the address escaped, later failures counted.
#include <gtest/gtest.h>

#include "server/handshake_failure_log.h"

namespace {

using edgetrain::server::HandshakeFailureLog;
using edgetrain::transport::HandshakeFailure;
using namespace std::chrono_literals;

class HandshakeFailureLogTest : public ::testing::Test {
 protected:
  HandshakeFailureLog log_{[this](const std::string& line) { lines_.push_back(line); }, 10s};
  std::vector<std::string> lines_;
  HandshakeFailureLog::Clock::time_point t0_ = HandshakeFailureLog::Clock::now();
};

TEST_F(HandshakeFailureLogTest, TheFirstFailureIsLoggedWithIdentityAddressAndReason) {
  log_.record({"pi-kitchen", "198.51.100.7:40000", "wrong key or corrupted handshake"}, t0_);
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("'pi-kitchen'"), std::string::npos) << lines_[0];
  EXPECT_NE(lines_[0].find("198.51.100.7:40000"), std::string::npos) << lines_[0];
  EXPECT_NE(lines_[0].find("wrong key"), std::string::npos) << lines_[0];
}

TEST_F(HandshakeFailureLogTest, RepeatsWithinTheIntervalAreCountedNotLogged) {
  for (int i = 0; i < 50; ++i)
    log_.record({"pi-kitchen", "198.51.100.7:" + std::to_string(40000 + i), "x"}, t0_ + i * 100ms);
  ASSERT_EQ(lines_.size(), 1u);
  log_.record({"pi-garage", "198.51.100.8:1", "x"},
              t0_ + 1s);  // another identity has its own interval
  ASSERT_EQ(lines_.size(), 2u);
  log_.flush(t0_ + 9s);
  EXPECT_EQ(lines_.size(), 2u);
  log_.flush(t0_ + 10s);  // pi-kitchen's interval is over: its 49 held-back failures are reported
  ASSERT_EQ(lines_.size(), 3u);
  EXPECT_NE(lines_[2].find("'pi-kitchen'"), std::string::npos) << lines_[2];
  EXPECT_NE(lines_[2].find("49"), std::string::npos) << lines_[2];
  EXPECT_NE(lines_[2].find("198.51.100.7:40049"), std::string::npos)
      << "the last address: " << lines_[2];
  log_.flush(t0_ + 30s);  // nothing more held back: nothing more said
  EXPECT_EQ(lines_.size(), 3u);
  log_.record({"pi-kitchen", "198.51.100.7:1", "x"}, t0_ + 31s);
  EXPECT_EQ(lines_.size(), 4u);
}

TEST_F(HandshakeFailureLogTest, NetworkTextIsEscapedIntoOneLine) {
  log_.record({"evil\nFAKE LOG LINE", "127.0.0.1:1\x1b[2J", "x"}, t0_);
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_EQ(lines_[0].find('\n'), std::string::npos) << lines_[0];
  EXPECT_EQ(lines_[0].find('\x1b'), std::string::npos) << lines_[0];
  EXPECT_NE(lines_[0].find("evil\\x0aFAKE"), std::string::npos) << lines_[0];
}

}  // namespace
