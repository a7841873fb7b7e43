// MD-GAN's wire formats (transport/gan_codec.h): round trips in fp32 and fp16, and every
// refusal a hostile or mistaken sender can provoke.
#include "transport/gan_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace edgetrain::transport {
namespace {

GanBatches sample_batches() {
  GanBatches b;
  b.run_id = 77;
  b.iteration = 12;
  b.batch = 3;
  b.width = 4;
  b.swap_round = 2;
  b.swap_to = "board-7";
  b.g_labels = {0, 9, 4};
  b.d_labels = {1, 1, 2};
  for (int i = 0; i < 12; i++) {
    b.g_samples.push_back(0.125f * static_cast<float>(i) - 0.5f);
    b.d_samples.push_back(-0.0625f * static_cast<float>(i));
  }
  return b;
}

TEST(GanCodec, BatchesRoundTripInFp32AndFp16) {
  const GanBatches b = sample_batches();
  for (const auto encoding : {ValueEncoding::kFp32, ValueEncoding::kFp16}) {
    auto bytes = encode_gan_batches(b, encoding);
    ASSERT_TRUE(bytes) << bytes.error().message;
    // Header 32, swap fields 6 + name, labels 2·b, values 2·b·d.
    EXPECT_EQ(bytes.value().size(),
              32 + 6 + b.swap_to.size() + 6 + 24 * (encoding == ValueEncoding::kFp16 ? 2u : 4u));
    auto back = decode_gan_batches(bytes.value(), {.run_id = 77, .batch = 3, .width = 4});
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(back.value().iteration, 12u);
    EXPECT_EQ(back.value().swap_round, 2u);
    EXPECT_EQ(back.value().swap_to, "board-7");
    EXPECT_EQ(back.value().g_labels, b.g_labels);
    EXPECT_EQ(back.value().d_labels, b.d_labels);
    EXPECT_EQ(back.value().g_samples, b.g_samples);  // these values are exact in fp16
    EXPECT_EQ(back.value().d_samples, b.d_samples);
  }
}

TEST(GanCodec, FeedbackRoundTripsAndFp16Rounds) {
  GanFeedback f{.run_id = 5,
                .iteration = 3,
                .batch = 2,
                .width = 2,
                .values = {1e-3f, -2.0f, 0.1f, 70000.0f}};
  auto exact = decode_gan_feedback(encode_gan_feedback(f, ValueEncoding::kFp32).value());
  ASSERT_TRUE(exact);
  EXPECT_EQ(exact.value().values, f.values);
  auto half =
      decode_gan_feedback(encode_gan_feedback(f, ValueEncoding::kFp16).value(), {.run_id = 5});
  ASSERT_TRUE(half);
  EXPECT_NEAR(half.value().values[0], 1e-3f, 1e-6f);
  EXPECT_EQ(half.value().values[3], 65504.0f);  // clamped, not infinite
}

TEST(GanCodec, DecoderRefusesWhatItDoesNotExpect) {
  const auto bytes = encode_gan_batches(sample_batches(), ValueEncoding::kFp32).value();
  EXPECT_EQ(decode_gan_batches(bytes, {.run_id = 78}).error().code, CodecErrorCode::kWrongModel);
  EXPECT_EQ(decode_gan_batches(bytes, {.batch = 4}).error().code, CodecErrorCode::kLayoutMismatch);
  EXPECT_EQ(decode_gan_batches(bytes, {.width = 784}).error().code,
            CodecErrorCode::kLayoutMismatch);
  EXPECT_EQ(decode_gan_feedback(bytes).error().code, CodecErrorCode::kBadMagic);
  for (std::size_t cut = 0; cut < bytes.size(); cut++)
    EXPECT_FALSE(decode_gan_batches(std::span(bytes).first(cut))) << "cut at " << cut;
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_EQ(decode_gan_batches(longer).error().code, CodecErrorCode::kTrailingBytes);
}

TEST(GanCodec, DecoderRefusesBadFieldsAndNonFiniteValues) {
  const auto good = encode_gan_batches(sample_batches(), ValueEncoding::kFp32).value();
  auto patched = [&](std::size_t at, std::uint8_t value) {
    auto b = good;
    b[at] = value;
    return decode_gan_batches(b);
  };
  EXPECT_EQ(patched(4, 2).error().code, CodecErrorCode::kUnsupportedVersion);  // format
  EXPECT_EQ(patched(6, 2).error().code,
            CodecErrorCode::kBadEncoding);  // sign + scale is not for samples
  EXPECT_EQ(patched(7, 1).error().code, CodecErrorCode::kBadEncoding);   // reserved
  EXPECT_EQ(patched(24, 0).error().code, CodecErrorCode::kBadCount);     // b = 0 (low byte of 3)
  EXPECT_EQ(patched(27, 0x80).error().code, CodecErrorCode::kBadCount);  // b above the cap
  const std::size_t labels = 32 + 6 + 7;
  EXPECT_EQ(patched(labels, 10).error().code, CodecErrorCode::kBadIndex);
  // A NaN in X_d's last value.
  auto nan = good;
  const std::uint32_t bits = 0x7fc00000u;
  for (int i = 0; i < 4; i++) nan[nan.size() - 4 + i] = static_cast<std::uint8_t>(bits >> (8 * i));
  EXPECT_EQ(decode_gan_batches(nan).error().code, CodecErrorCode::kNonFiniteValue);
  // A swap round without a name.
  auto no_name = sample_batches();
  no_name.swap_to.clear();
  EXPECT_EQ(encode_gan_batches(no_name, ValueEncoding::kFp32).error().code,
            CodecErrorCode::kInvalidInput);
}

TEST(GanCodec, EncoderRefusesWhatItMustNotSend) {
  GanFeedback f{.run_id = 1,
                .iteration = 0,
                .batch = 1,
                .width = 2,
                .values = {0.0f, std::numeric_limits<float>::infinity()}};
  EXPECT_EQ(encode_gan_feedback(f, ValueEncoding::kFp32).error().code,
            CodecErrorCode::kInvalidInput);
  f.values = {0.0f};
  EXPECT_EQ(encode_gan_feedback(f, ValueEncoding::kFp32).error().code,
            CodecErrorCode::kInvalidInput);
  f.values = {0.0f, 1.0f};
  EXPECT_EQ(encode_gan_feedback(f, ValueEncoding::kSignScale).error().code,
            CodecErrorCode::kInvalidInput);
  auto b = sample_batches();
  b.g_labels[0] = 10;
  EXPECT_EQ(encode_gan_batches(b, ValueEncoding::kFp32).error().code,
            CodecErrorCode::kInvalidInput);
}

// Issue 37: a server whose generator went non-finite answered GET /gan/batches with NaN
// samples that every honest worker then refused. The encoder refuses them (the server
// answers 5.00 with the reason), in X_g and X_d, fp32 and fp16 alike; so does the feedback
// encoder (the worker refuses to send).
TEST(GanCodec, EncodersRefuseNonFiniteValues) {
  for (const float v :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    for (const auto encoding : {ValueEncoding::kFp32, ValueEncoding::kFp16}) {
      auto g = sample_batches();
      g.g_samples[5] = v;
      auto r = encode_gan_batches(g, encoding);
      ASSERT_FALSE(r);
      EXPECT_EQ(r.error().code, CodecErrorCode::kInvalidInput);
      EXPECT_NE(r.error().message.find("X_g value 5 is not finite"), std::string::npos)
          << r.error().message;
      auto d = sample_batches();
      d.d_samples.back() = v;
      r = encode_gan_batches(d, encoding);
      ASSERT_FALSE(r);
      EXPECT_NE(r.error().message.find("X_d value 11 is not finite"), std::string::npos)
          << r.error().message;
      GanFeedback f{.run_id = 1, .iteration = 0, .batch = 1, .width = 3, .values = {0, 0, v}};
      auto fr = encode_gan_feedback(f, encoding);
      ASSERT_FALSE(fr);
      EXPECT_EQ(fr.error().code, CodecErrorCode::kInvalidInput);
      EXPECT_NE(fr.error().message.find("value 2 is not finite"), std::string::npos);
    }
  }
  // The largest finite values still travel (fp16 clamps them, as documented).
  auto big = sample_batches();
  big.g_samples[0] = std::numeric_limits<float>::max();
  EXPECT_TRUE(encode_gan_batches(big, ValueEncoding::kFp32));
  EXPECT_TRUE(encode_gan_batches(big, ValueEncoding::kFp16));
}

}  // namespace
}  // namespace edgetrain::transport
