// The wire rules that live in transport/ once: the identity rule (transport/identity.h),
// which the DTLS server (certificate CNs), the server's resources (declared plain CoAP
// names) and the keystore (device names) all call, and the POST /update acknowledgement
// and the model delta's size bounds (transport/codec.h); the one escaping of network text
// for logs and /status (transport/untrusted_text.h).
#include <gtest/gtest.h>

#include <string>

#include "transport/codec.h"
#include "transport/identity.h"
#include "transport/untrusted_text.h"

namespace {

using namespace edgetrain::transport;

TEST(UntrustedText, PrintableTextStaysAsItIs) {
  EXPECT_EQ(escape_untrusted("pi-kitchen since=42&id=x/y (ok)"), "pi-kitchen since=42&id=x/y (ok)");
  EXPECT_EQ(escape_untrusted(""), "");
}

TEST(UntrustedText, ControlBytesQuotesAndBackslashesBecomeHexEscapes) {
  // A forged log line and a terminal colour sequence become one visible token.
  EXPECT_EQ(escape_untrusted("evil\n2026-01-01 fake line\x1b[31mred"),
            "evil\\x0a2026-01-01 fake line\\x1b[31mred");
  EXPECT_EQ(escape_untrusted(std::string("a\0b\r\t\x7f\xff", 7)), "a\\x00b\\x0d\\x09\\x7f\\xff");
  EXPECT_EQ(escape_untrusted("say \"hi\" it's \\x41"), "say \\x22hi\\x22 it\\x27s \\x5cx41");
  for (int c = 0; c < 256; ++c) {
    const std::string escaped = escape_untrusted(std::string(1, static_cast<char>(c)));
    for (char e : escaped) EXPECT_TRUE(e >= 0x20 && e <= 0x7e) << c;
    EXPECT_EQ(escaped.find_first_of("\"'"), std::string::npos)
        << c;  // cannot end the quotes it is shown in
  }
}

TEST(UntrustedText, LongTextIsCutAndSaysHowMuchWasLeftOut) {
  const std::string escaped = escape_untrusted(std::string(kMaxShownUntrustedBytes + 10, 'x'));
  EXPECT_EQ(escaped, std::string(kMaxShownUntrustedBytes, 'x') + "...(10 more bytes)");
}

TEST(IdentityRule, AcceptsPlainNamesOfOneTo64Characters) {
  EXPECT_TRUE(is_plain_identity("pi-kitchen"));
  EXPECT_TRUE(is_plain_identity("device_01.lab"));
  EXPECT_TRUE(is_plain_identity("A"));
  EXPECT_TRUE(is_plain_identity("0123456789abcdefghijklmnopqrstuvwxyz"));
  EXPECT_TRUE(is_plain_identity("ABCDEFGHIJKLMNOPQRSTUVWXYZ._-"));
  EXPECT_TRUE(is_plain_identity(std::string(64, 'x')));
}

TEST(IdentityRule, RefusesEmptyLongAndEveryOtherCharacter) {
  EXPECT_FALSE(is_plain_identity(""));
  EXPECT_FALSE(is_plain_identity(std::string(65, 'x')));
  for (int c = 0; c < 256; ++c) {
    const char ch = static_cast<char>(c);
    const bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                       (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    EXPECT_EQ(is_plain_identity(std::string("ok") + ch), plain) << "character " << c;
  }
  EXPECT_FALSE(is_plain_identity("unauthenticated:pi"));  // the server's own prefix is not a name
  EXPECT_FALSE(is_plain_identity(std::string("pi\0x", 4)));
  EXPECT_FALSE(is_plain_identity("pi kitchen"));
  EXPECT_FALSE(is_plain_identity("pi/../x"));
  EXPECT_FALSE(is_plain_identity("p\xc3\xa9"));  // UTF-8 letters are not plain
}

TEST(UpdateReply, EncodesTheVersionAsEightBytesLittleEndianAndBack) {
  const std::vector<std::uint8_t> bytes = encode_update_reply(0x0102030405060708ULL);
  EXPECT_EQ(bytes, (std::vector<std::uint8_t>{8, 7, 6, 5, 4, 3, 2, 1}));
  EXPECT_EQ(decode_update_reply(bytes), 0x0102030405060708ULL);
  for (std::uint64_t version :
       {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{255}, ~std::uint64_t{0}})
    EXPECT_EQ(decode_update_reply(encode_update_reply(version)), version);
}

TEST(UpdateReply, AnyOtherLengthIsNoVersion) {
  EXPECT_EQ(decode_update_reply({}), std::nullopt);
  const std::vector<std::uint8_t> seven(7, 1), nine(9, 1);
  EXPECT_EQ(decode_update_reply(seven), std::nullopt);
  EXPECT_EQ(decode_update_reply(nine), std::nullopt);
  const std::string text = "too stale";  // a refusal's diagnostic is not a version either
  EXPECT_EQ(decode_update_reply({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}),
            std::nullopt);
}

// The bound the server stops building a delta at must never exceed what the encoder
// really writes, or the server would send the dense model where a delta was smaller.
TEST(ModelDeltaSize, LowerBoundsNeverExceedTheEncodedSize) {
  const std::uint32_t size = 200;
  for (std::uint32_t count : {1u, 2u, 20u, 25u, 26u, 100u, 199u, 200u}) {
    ModelDelta delta{7, 1, 2, 0, {}};
    SparseTensor tensor{0, size, {}, {}};
    for (std::uint32_t j = 0; j < count; ++j) {
      tensor.indices.push_back(j * (size / count));
      tensor.values.push_back(0.5f);
    }
    delta.tensors.push_back(tensor);
    const auto encoded = encode_model_delta(delta);
    ASSERT_TRUE(encoded) << encoded.error().message;
    const std::size_t bound = kModelDeltaHeaderBytes + model_delta_record_min_bytes(size, count);
    EXPECT_LE(bound, encoded.value().size()) << count << " entries";
    if (count == size) {
      EXPECT_EQ(bound, encoded.value().size()) << "all entries: no index bytes";
    }
  }
  ModelDelta empty{7, 1, 2, 0, {}};
  EXPECT_EQ(encode_model_delta(empty).value().size(), kModelDeltaHeaderBytes);
}

}  // namespace
