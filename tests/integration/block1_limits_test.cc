// Block-wise request bodies are refused as soon as they pass the server's limit (issue 18):
// a body whose Size1 option announces more than Options::max_body_bytes gets 4.13 at its
// first block, one streamed without Size1 at the block that passes the limit, so the
// server never holds more than the limit for it; a body within the limit still arrives
// whole; and at most Options::max_bodies_in_progress bodies are assembled at once.
// The blocks are sent by hand over plain CoAP (a raw UDP socket), so that the test
// controls Size1 and counts every block; the within-limit body also travels over DTLS-PSK
// with our client.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "transport/coap_dtls.h"

namespace {

using namespace edgetrain::transport;

constexpr std::size_t kLimit = 64 * 1024;  // max_body_bytes of the server under test
constexpr std::size_t kBlock = 1024;       // SZX 6

// One plain CoAP endpoint of the client side: confirmable POSTs with a Block1 option,
// one at a time, encoded by hand (RFC 7252 section 3, RFC 7959).
class RawCoapClient {
 public:
  struct Reply {
    int code = 0;  // class * 100 + detail
    std::optional<std::uint64_t> size1;
    std::string payload;
  };

  explicit RawCoapClient(std::uint16_t port)
      : fd_(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in server{};
    server.sin_family = AF_INET;
    server.sin_port = htons(port);
    server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<const sockaddr*>(&server), sizeof(server)), 0);
  }
  ~RawCoapClient() { ::close(fd_); }
  RawCoapClient(const RawCoapClient&) = delete;
  RawCoapClient& operator=(const RawCoapClient&) = delete;

  // POST /update, block `num` of a body in 1024-byte blocks (`more`: not the last one), with
  // a Block1 option or (block_option 19) a Q-Block1 option (RFC 9177).
  Reply post_block(std::uint32_t num, bool more, std::size_t length,
                   std::optional<std::uint64_t> size1 = {}, int block_option = 27) {
    const std::uint16_t mid = ++mid_;
    std::vector<std::uint8_t> message = {0x41, 0x02, static_cast<std::uint8_t>(mid >> 8),
                                         static_cast<std::uint8_t>(mid),
                                         0x5a};  // CON, TKL 1, POST, token
    int last_option = 0;
    auto option = [&](int number, std::vector<std::uint8_t> value) {
      const int delta = number - last_option;
      last_option = number;
      std::vector<std::uint8_t> extended;
      auto nibble = [&extended](std::size_t v) -> std::uint8_t {
        if (v < 13) return static_cast<std::uint8_t>(v);
        extended.push_back(static_cast<std::uint8_t>(v - 13));  // all ours are < 269
        return 13;
      };
      const std::uint8_t d = nibble(static_cast<std::size_t>(delta));
      const std::uint8_t l = nibble(value.size());
      message.push_back(static_cast<std::uint8_t>(d << 4 | l));
      message.insert(message.end(), extended.begin(), extended.end());
      message.insert(message.end(), value.begin(), value.end());
    };
    option(11, {'u', 'p', 'd', 'a', 't', 'e'});
    option(block_option, uint_bytes(std::uint64_t{num} << 4 | (more ? 8u : 0u) | 6u));
    if (size1) option(60, uint_bytes(*size1));
    message.push_back(0xff);
    for (std::size_t i = 0; i < length; ++i)
      message.push_back(static_cast<std::uint8_t>(num * 31 + i));
    EXPECT_EQ(::send(fd_, message.data(), message.size(), 0), static_cast<ssize_t>(message.size()));
    return receive(mid);
  }

 private:
  static std::vector<std::uint8_t> uint_bytes(std::uint64_t value) {
    std::vector<std::uint8_t> bytes;
    for (; value; value >>= 8) bytes.insert(bytes.begin(), static_cast<std::uint8_t>(value));
    return bytes;
  }

  Reply receive(std::uint16_t mid) {
    std::uint8_t buffer[2048];
    for (;;) {
      pollfd ready{fd_, POLLIN, 0};
      if (::poll(&ready, 1, 5000) != 1) {
        ADD_FAILURE() << "no answer to message " << mid;
        return {};
      }
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n < 4 || (buffer[2] << 8 | buffer[3]) != mid) continue;  // not ours
      Reply reply;
      reply.code = (buffer[1] >> 5) * 100 + (buffer[1] & 0x1f);
      std::size_t at = 4 + (buffer[0] & 0x0f);
      int number = 0;
      while (at < static_cast<std::size_t>(n) && buffer[at] != 0xff) {
        auto extend = [&](int v) {
          if (v == 13) return 13 + buffer[at++];
          if (v == 14) {
            const int x = 269 + (buffer[at] << 8 | buffer[at + 1]);
            at += 2;
            return x;
          }
          return v;
        };
        const int head = buffer[at++];
        number += extend(head >> 4);
        const int length = extend(head & 0x0f);
        if (number == 60) {
          std::uint64_t value = 0;
          for (int i = 0; i < length; ++i) value = value << 8 | buffer[at + i];
          reply.size1 = value;
        }
        at += static_cast<std::size_t>(length);
      }
      if (at < static_cast<std::size_t>(n)) reply.payload.assign(buffer + at + 1, buffer + n);
      return reply;
    }
  }

  int fd_;
  std::uint16_t mid_ = 0x1000;
};

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

class Block1Limits : public ::testing::Test {
 protected:
  void SetUp() override {
    CoapDtlsServer::Options options;
    options.psk_lookup = [](std::string_view id) -> std::optional<std::vector<std::uint8_t>> {
      if (id == "device-1") return bytes_of("key-one-0123456789");
      return std::nullopt;
    };
    options.plaintext_port = 0;
    options.max_body_bytes = kLimit;
    options.max_bodies_in_progress = 2;
    server_ = std::make_unique<CoapDtlsServer>(options);
    server_->add_resource("update", Method::kPost, [this](const CoapRequest& request) {
      ++bodies_handled_;
      last_body_ = std::vector<std::uint8_t>(request.payload.begin(), request.payload.end());
      return CoapResponse{CoapCode::kChanged, bytes_of(std::to_string(request.payload.size()))};
    });
    loop_ = std::thread([this] {
      while (!stop_) server_->run_once(10);
    });
  }
  void TearDown() override { stop_loop(); }
  void stop_loop() {
    if (!loop_.joinable()) return;
    stop_ = true;
    loop_.join();
  }

  std::unique_ptr<CoapDtlsServer> server_;
  std::thread loop_;
  std::atomic<bool> stop_ = false;
  std::atomic<int> bodies_handled_ = 0;
  std::vector<std::uint8_t> last_body_;  // written by the loop thread, read after an answer
};

TEST_F(Block1Limits, StreamedBodyIsRefusedAtTheBlockThatPassesTheLimit) {
  RawCoapClient client(server_->plaintext_port());
  // A 1 MiB body without Size1, block by block until the server stops saying 2.31.
  std::uint32_t blocks_sent = 0;
  RawCoapClient::Reply reply;
  for (std::uint32_t num = 0; num < 1024; ++num) {
    reply = client.post_block(num, true, kBlock);
    ++blocks_sent;
    if (reply.code != 231) break;
  }
  EXPECT_EQ(reply.code, CoapCode::kRequestEntityTooLarge) << reply.payload;
  EXPECT_EQ(blocks_sent, kLimit / kBlock + 1)
      << "the 4.13 came after " << blocks_sent * kBlock << " bytes";
  EXPECT_EQ(reply.size1, kLimit) << "a 4.13 says the limit in Size1";
  EXPECT_NE(reply.payload.find("limit is 65536"), std::string::npos) << reply.payload;
  // Nothing of it is kept: a block within the limit has no body to join any more.
  EXPECT_EQ(client.post_block(1, true, kBlock).code, 408);
  stop_loop();
  EXPECT_EQ(bodies_handled_, 0);
  EXPECT_EQ(server_->bodies_in_progress(), 0u);
  EXPECT_EQ(server_->bodies_refused(), 2u);
}

TEST_F(Block1Limits, AnnouncedSizeAboveTheLimitIsRefusedAtTheFirstBlock) {
  RawCoapClient client(server_->plaintext_port());
  const RawCoapClient::Reply reply = client.post_block(0, true, kBlock, std::uint64_t{256} << 20);
  EXPECT_EQ(reply.code, CoapCode::kRequestEntityTooLarge);
  EXPECT_EQ(reply.size1, kLimit);
  EXPECT_NE(reply.payload.find("268435456 bytes announced"), std::string::npos) << reply.payload;
  // Announcing exactly the limit is fine.
  EXPECT_EQ(client.post_block(0, true, kBlock, kLimit).code, 231);
}

TEST_F(Block1Limits, BodyWithinTheLimitArrivesWholeOverDtls) {
  // With Block1 (RFC 7959) and with Q-Block1 (RFC 9177, bursts of 10 blocks).
  for (const bool q_block : {false, true}) {
    CoapDtlsClient::Options options(
        "127.0.0.1", server_->port(), {"device-1", bytes_of("key-one-0123456789")}, 10000);
    options.timing.q_block = q_block;
    CoapDtlsClient client(options);
    std::vector<std::uint8_t> body(kLimit);
    for (std::size_t i = 0; i < body.size(); ++i) body[i] = static_cast<std::uint8_t>(i * 13 + 5);
    const CoapResponse ok = client.request(Method::kPost, "update", body);
    ASSERT_EQ(ok.code, CoapCode::kChanged) << "q_block " << q_block;
    EXPECT_EQ(last_body_, body) << "q_block " << q_block;
    // One byte more: our client announces the size in Size1, so the first block is already
    // refused: a handful of datagrams (Q-Block1: the first burst at most), not 65 blocks.
    body.push_back(1);
    const std::uint64_t datagrams_before = server_->datagrams_received();
    const CoapResponse refused = client.request(Method::kPost, "update", body);
    EXPECT_EQ(refused.code, CoapCode::kRequestEntityTooLarge) << "q_block " << q_block;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the burst's stragglers
    EXPECT_LE(server_->datagrams_received() - datagrams_before, q_block ? 10u : 3u);
  }
  EXPECT_EQ(bodies_handled_, 2);
}

// libcoap 4.3.1 keeps a record of every block-wise body for 93 s after its last block, and a
// libcoap client tags each body anew (Request-Tag), so each post used to leave one behind,
// all walked on every pass of the event loop; now a body's record goes with its last block.
TEST_F(Block1Limits, FinishedBodiesLeaveNoRecordsBehind) {
  CoapDtlsClient::Options options(
      "127.0.0.1", server_->port(), {"device-1", bytes_of("key-one-0123456789")}, 10000);
  options.timing.q_block = false;  // libcoap's records are of Block1 bodies (Q-Block1 leaves none)
  CoapDtlsClient client(options);
  std::vector<std::uint8_t> body(8 * kBlock + 17);
  constexpr int kBodies = 12;
  for (int n = 0; n < kBodies; ++n) {
    body[0] = static_cast<std::uint8_t>(n);
    ASSERT_EQ(client.request(Method::kPost, "update", body).code, CoapCode::kChanged)
        << "body " << n;
    EXPECT_EQ(last_body_, body) << "body " << n << " arrived whole";
  }
  stop_loop();
  EXPECT_EQ(bodies_handled_, kBodies);
  // Each body's record is freed with its last block.
  EXPECT_EQ(server_->block_records_freed(), static_cast<std::uint64_t>(kBodies));
}

TEST_F(Block1Limits, BodiesInProgressAreBounded) {
  RawCoapClient a(server_->plaintext_port()), b(server_->plaintext_port()),
      c(server_->plaintext_port());
  EXPECT_EQ(a.post_block(0, true, kBlock).code, 231);
  EXPECT_EQ(b.post_block(0, true, kBlock).code, 231);
  const RawCoapClient::Reply third = c.post_block(0, true, kBlock);
  EXPECT_EQ(third.code, 503) << "a third body while two are assembled";
  // a finishes; its body is whole, and c gets the free place.
  const RawCoapClient::Reply done = a.post_block(1, false, 100);
  EXPECT_EQ(done.code, CoapCode::kChanged);
  EXPECT_EQ(done.payload, std::to_string(kBlock + 100));
  EXPECT_EQ(c.post_block(0, true, kBlock).code, 231);
  EXPECT_EQ(a.post_block(0, true, kBlock).code, 503) << "b and c are still in progress";
  // A single-block body needs no place.
  EXPECT_EQ(a.post_block(0, false, 10).code, CoapCode::kChanged);
  stop_loop();
  EXPECT_EQ(server_->bodies_in_progress(), 2u);
}

// Q-Block1 bodies (RFC 9177; the server takes them by default) are held to the same limits:
// Size1 above the limit is refused at the first block, and they count with Block1 bodies
// against max_bodies_in_progress. A block that starts a burst gets no answer of its own
// (here, confirmable: an empty ACK, code 0).
constexpr int kQBlock1 = 19;

TEST_F(Block1Limits, QBlock1BodyAnnouncedAboveTheLimitIsRefusedAtTheFirstBlock) {
  RawCoapClient client(server_->plaintext_port());
  const RawCoapClient::Reply reply =
      client.post_block(0, true, kBlock, std::uint64_t{256} << 20, kQBlock1);
  EXPECT_EQ(reply.code, CoapCode::kRequestEntityTooLarge);
  EXPECT_EQ(reply.size1, kLimit);
  EXPECT_EQ(client.post_block(0, true, kBlock, kLimit, kQBlock1).code, 0);
  // Without Size1 the server cannot size the body: refused.
  EXPECT_EQ(client.post_block(0, true, kBlock, std::nullopt, kQBlock1).code, CoapCode::kBadRequest);
  stop_loop();
  EXPECT_EQ(bodies_handled_, 0);
}

TEST_F(Block1Limits, QBlock1BodiesCountWithBlock1BodiesInProgress) {
  RawCoapClient a(server_->plaintext_port()), b(server_->plaintext_port()),
      c(server_->plaintext_port());
  EXPECT_EQ(a.post_block(0, true, kBlock).code, 231);
  EXPECT_EQ(b.post_block(0, true, kBlock, 3 * kBlock, kQBlock1).code, 0);
  EXPECT_EQ(c.post_block(0, true, kBlock, 3 * kBlock, kQBlock1).code, 503)
      << "a third body while two are assembled";
  // b finishes its body (blocks 1 and 2; the last is the burst's end): handled once, whole.
  EXPECT_EQ(b.post_block(1, true, kBlock, 3 * kBlock, kQBlock1).code, 0);
  const RawCoapClient::Reply done = b.post_block(2, false, kBlock, 3 * kBlock, kQBlock1);
  EXPECT_EQ(done.code, CoapCode::kChanged);
  EXPECT_EQ(done.payload, std::to_string(3 * kBlock));
  EXPECT_EQ(c.post_block(0, true, kBlock, 3 * kBlock, kQBlock1).code, 0) << "b's place is free";
  stop_loop();
  EXPECT_EQ(bodies_handled_, 1);
  EXPECT_EQ(server_->bodies_in_progress(), 2u);
}

}  // namespace
