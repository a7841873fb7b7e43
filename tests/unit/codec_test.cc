// Wire codec: random updates and models survive a round trip in every encoding, the encoder
// picks the smaller index encoding, and malformed bytes of every kind are refused with the
// right error code (never a crash: this file also runs under ASan/UBSan).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "transport/codec.h"

using namespace edgetrain::transport;

namespace {

constexpr std::uint64_t kModel = 0x5eed'0000'cafe'0001ULL;

SparseTensor random_tensor(std::mt19937& rng, std::uint32_t tensor, std::uint32_t size,
                           std::uint32_t count) {
  std::vector<std::uint32_t> all(size);
  for (std::uint32_t i = 0; i < size; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  SparseTensor t{tensor, size, {all.begin(), all.begin() + count}, {}};
  std::sort(t.indices.begin(), t.indices.end());
  std::normal_distribution<float> value(0.0f, 1.0f);
  for (std::uint32_t j = 0; j < count; ++j) t.values.push_back(value(rng));
  return t;
}

struct Fixture {
  std::vector<std::uint32_t> sizes;
  SparseUpdate update;
  ModelLayout layout() const { return {kModel, sizes}; }
};

Fixture random_update(std::mt19937& rng) {
  Fixture f;
  const std::uint32_t tensors = 1 + rng() % 6;
  for (std::uint32_t i = 0; i < tensors; ++i)
    f.sizes.push_back(1 + rng() % (rng() % 2 ? 40 : 3000));
  f.update = {kModel, rng(), rng() % 1000, {}};
  for (std::uint32_t i = 0; i < tensors; ++i) {
    if (rng() % 4 == 0) continue;  // a tensor may be absent
    const std::uint32_t n = f.sizes[i];
    const std::uint32_t mode = rng() % 4;
    const std::uint32_t k = mode == 0   ? 0
                            : mode == 1 ? n
                                        : static_cast<std::uint32_t>(rng() % (n + 1));
    f.update.tensors.push_back(random_tensor(rng, i, n, k));
  }
  std::shuffle(f.update.tensors.begin(), f.update.tensors.end(), rng);
  f.update.local_steps = rng() % 2 ? static_cast<std::uint16_t>(rng()) : 0;  // offline updates
  return f;
}

void expect_same(const SparseUpdate& a, const SparseUpdate& b, bool fp16) {
  EXPECT_EQ(a.model_id, b.model_id);
  EXPECT_EQ(a.sequence, b.sequence);
  EXPECT_EQ(a.fetched_version, b.fetched_version);
  EXPECT_EQ(a.local_steps, b.local_steps);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].tensor, b.tensors[i].tensor);
    EXPECT_EQ(a.tensors[i].size, b.tensors[i].size);
    EXPECT_EQ(a.tensors[i].indices, b.tensors[i].indices);
    ASSERT_EQ(a.tensors[i].values.size(), b.tensors[i].values.size());
    for (std::size_t j = 0; j < a.tensors[i].values.size(); ++j) {
      const float expected = fp16 ? round_to_fp16(a.tensors[i].values[j]) : a.tensors[i].values[j];
      EXPECT_EQ(std::bit_cast<std::uint32_t>(expected),
                std::bit_cast<std::uint32_t>(b.tensors[i].values[j]));
    }
  }
}

TEST(SparseCodec, RandomUpdatesRoundTripInBothValueEncodings) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 300; ++trial) {
    Fixture f = random_update(rng);
    for (ValueEncoding values : {ValueEncoding::kFp32, ValueEncoding::kFp16}) {
      auto bytes = encode_sparse_update(f.update, {values});
      ASSERT_TRUE(bytes.ok()) << bytes.error().message;
      auto decoded = decode_sparse_update(bytes.value(), f.layout());
      ASSERT_TRUE(decoded.ok()) << decoded.error().message;
      expect_same(f.update, decoded.value(), values == ValueEncoding::kFp16);
    }
  }
}

// Byte offset of the first tensor's index-encoding byte (header 36 + tensor, size, count, value
// enc).
constexpr std::size_t kFirstIndexEncoding = 36 + 13;

TEST(SparseCodec, PicksTheSmallerIndexEncoding) {
  std::mt19937 rng(2);
  std::vector<std::uint32_t> sizes = {1000};
  for (std::uint32_t k : {0u, 1u, 10u, 100u, 125u, 300u, 1000u}) {
    SparseUpdate u{kModel, 0, 0, {random_tensor(rng, 0, 1000, k)}};
    auto bytes = encode_sparse_update(u).value();
    const std::size_t varint = delta_varint_bytes(u.tensors[0].indices);
    const std::size_t bitmap = bitmap_bytes(1000);
    const bool all = k == 1000;  // a full tensor needs no index bytes at all
    const std::size_t index_section = all ? 0 : std::min(varint, bitmap);
    EXPECT_EQ(bytes.size(), 36 + 14 + index_section + 4 * k) << "k=" << k;
    EXPECT_EQ(bytes[kFirstIndexEncoding], all ? 2 : bitmap < varint ? 1 : 0) << "k=" << k;
    auto back = decode_sparse_update(bytes, {kModel, sizes});
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back.value().tensors[0].indices, u.tensors[0].indices);
  }
}

TEST(SparseCodec, IndexEncodingAllNeedsEveryEntry) {
  std::vector<std::uint32_t> sizes = {4};
  SparseUpdate full{kModel, 0, 0, {{0, 4, {0, 1, 2, 3}, {1, 2, 3, 4}}}};
  auto bytes = encode_sparse_update(full).value();
  ASSERT_EQ(bytes[kFirstIndexEncoding], 2);
  ASSERT_EQ(bytes.size(), 36u + 14u + 16u);
  auto back = decode_sparse_update(bytes, {kModel, sizes});
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value().tensors[0].indices, (std::vector<std::uint32_t>{0, 1, 2, 3}));
  // 'all' with a count below n is a lie about the indices: refused.
  auto lying = bytes;
  lying[36 + 8] = 3;  // count k = 3
  lying.resize(lying.size() - 4);
  auto r = decode_sparse_update(lying, {kModel, sizes});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, CodecErrorCode::kBadCount);
  auto unknown = bytes;
  unknown[kFirstIndexEncoding] = 3;
  EXPECT_EQ(decode_sparse_update(unknown, {kModel, sizes}).error().code,
            CodecErrorCode::kBadEncoding);
}

TEST(SparseCodec, EdgeCasesSizeOneAndFullAndEmpty) {
  std::vector<std::uint32_t> sizes = {1, 8, 9};
  SparseUpdate u{kModel, 7, 3, {}};
  u.tensors.push_back({0, 1, {0}, {-2.5f}});
  u.tensors.push_back({1, 8, {0, 1, 2, 3, 4, 5, 6, 7}, {1, 2, 3, 4, 5, 6, 7, 8}});
  u.tensors.push_back({2, 9, {}, {}});
  auto bytes = encode_sparse_update(u).value();
  auto back = decode_sparse_update(bytes, {kModel, sizes});
  ASSERT_TRUE(back.ok()) << back.error().message;
  expect_same(u, back.value(), false);
  // An update with no tensors at all is well-formed.
  SparseUpdate empty{kModel, 1, 0, {}};
  auto empty_back = decode_sparse_update(encode_sparse_update(empty).value(), {kModel, sizes});
  ASSERT_TRUE(empty_back.ok());
  EXPECT_TRUE(empty_back.value().tensors.empty());
  // The largest index a varint must carry.
  std::vector<std::uint32_t> huge = {std::numeric_limits<std::uint32_t>::max()};
  SparseUpdate far{kModel, 0, 0, {{0, huge[0], {huge[0] - 1}, {1.0f}}}};
  auto far_back = decode_sparse_update(encode_sparse_update(far).value(), {kModel, huge});
  ASSERT_TRUE(far_back.ok()) << far_back.error().message;
  EXPECT_EQ(far_back.value().tensors[0].indices[0], huge[0] - 1);
}

TEST(SparseCodec, MatchesTheExampleInCodecMd) {
  SparseUpdate u{1, 2, 3, {{0, 300, {3, 200}, {0.5f, -1.0f}}}};
  const std::vector<std::uint8_t> documented = {
      0x45, 0x54, 0x53, 0x55, 0x01, 0x00, 0x00, 0x00, 0x01, 0,    0,    0,    0,    0, 0, 0,
      0x02, 0,    0,    0,    0,    0,    0,    0,    0x03, 0,    0,    0,    0,    0, 0, 0,
      0x01, 0,    0,    0,    0x00, 0,    0,    0,    0x2c, 0x01, 0,    0,    0x02, 0, 0, 0,
      0x00, 0x00, 0x03, 0xc4, 0x01, 0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x80, 0xbf};
  EXPECT_EQ(encode_sparse_update(u).value(), documented);
}

TEST(Fp16, ConversionMatchesIeeeBinary16) {
  // Every half converts to a float and back to the same bits (NaNs aside).
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    EXPECT_EQ(float_to_half(half_to_float(static_cast<std::uint16_t>(h))), h) << std::hex << h;
  }
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  // Halfway between 1 and the next half (1 + 2^-10) rounds to even (1); a hair above rounds up.
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_half(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  // Out of range clamps instead of producing Inf.
  EXPECT_EQ(float_to_half(1e9f), 0x7bff);
  EXPECT_EQ(float_to_half(-70000.0f), 0xfbff);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -26)), 0x0000);
  // Rounding error is within half a unit in the last place for random normal values.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float v = dist(rng);
    if (std::fabs(v) < 1e-3f) continue;
    const float r = round_to_fp16(v);
    EXPECT_LE(std::fabs(r - v), std::ldexp(std::fabs(v), -11)) << v;
  }
}

TEST(SparseCodec, EncoderRefusesWhatItMustNotSend) {
  auto refused = [](SparseUpdate u) {
    auto r = encode_sparse_update(u);
    EXPECT_FALSE(r.ok());
    if (!r.ok()) {
      EXPECT_EQ(r.error().code, CodecErrorCode::kInvalidInput);
    }
  };
  refused({kModel, 0, 0, {{0, 4, {1, 1}, {1, 2}}}});  // not strictly increasing
  refused({kModel, 0, 0, {{0, 4, {4}, {1}}}});        // index ≥ size
  refused({kModel, 0, 0, {{0, 4, {1}, {}}}});         // length mismatch
  refused({kModel, 0, 0, {{0, 4, {1}, {std::numeric_limits<float>::quiet_NaN()}}}});  // NaN
  refused({kModel, 0, 0, {{0, 4, {1}, {std::numeric_limits<float>::infinity()}}}});   // Inf
  refused({kModel, 0, 0, {{0, 4, {1}, {1}}, {0, 4, {2}, {1}}}});  // duplicate tensor
  refused({kModel, 0, 0, {{0, 0, {}, {}}}});                      // empty tensor
}

// A valid message to corrupt: two tensors, the first delta-varint, the second bitmap.
struct Sample {
  std::vector<std::uint32_t> sizes = {300, 20};
  SparseUpdate update{
      kModel,
      9,
      4,
      {{0, 300, {3, 200, 299}, {0.5f, -1.0f, 2.0f}},
       {1, 20, {0, 2, 4, 6, 8, 10, 12, 14, 16, 18}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}}};
  std::vector<std::uint8_t> bytes = encode_sparse_update(update).value();
  ModelLayout layout() const { return {kModel, sizes}; }
  // Offsets inside `bytes`: first tensor header at 36, its 3 varints (3, 196, 98 → 1+2+1 bytes)
  // at 50, values at 54; second tensor header at 66, bitmap (3 bytes) at 80, values at 83.
};

void expect_decode_error(std::span<const std::uint8_t> bytes, const ModelLayout& layout,
                         CodecErrorCode code, const DecodeLimits& limits = {}) {
  auto r = decode_sparse_update(bytes, layout, limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, code) << codec_error_name(r.error().code) << ": " << r.error().message;
  EXPECT_FALSE(r.error().message.empty());
}

TEST(SparseCodec, SampleLayoutIsWhatTheTestsAssume) {
  Sample s;
  ASSERT_EQ(s.bytes.size(), 83u + 40u);
  EXPECT_EQ(s.bytes[kFirstIndexEncoding], 0);  // delta-varint
  EXPECT_EQ(s.bytes[66 + 13], 1);              // bitmap
  EXPECT_EQ(s.bytes[80], 0x55);                // indices 0, 2, 4, 6
  ASSERT_TRUE(decode_sparse_update(s.bytes, s.layout()).ok());
}

TEST(SparseCodec, RefusesBadHeaders) {
  Sample s;
  auto with = [&](std::size_t offset, std::uint8_t value) {
    auto b = s.bytes;
    b[offset] = value;
    return b;
  };
  expect_decode_error(with(0, 'X'), s.layout(), CodecErrorCode::kBadMagic);
  expect_decode_error(with(4, 2), s.layout(), CodecErrorCode::kUnsupportedVersion);
  // Offset 6 is the update's local steps (little-endian u16, any value), no longer reserved.
  auto steps = with(6, 0x34);
  steps[7] = 0x12;
  auto claimed = decode_sparse_update(steps, s.layout());
  ASSERT_TRUE(claimed.ok()) << claimed.error().message;
  EXPECT_EQ(claimed.value().local_steps, 0x1234);
  EXPECT_EQ(decode_sparse_update(s.bytes, s.layout()).value().local_steps, 0);
  expect_decode_error(with(8, 0), s.layout(), CodecErrorCode::kWrongModel);
  expect_decode_error(with(32, 3), s.layout(),
                      CodecErrorCode::kLayoutMismatch);  // 3 tensors, model has 2
  expect_decode_error(with(32, 0xff), s.layout(), CodecErrorCode::kLayoutMismatch);
  DecodeLimits few;
  few.max_tensors = 1;
  expect_decode_error(s.bytes, s.layout(), CodecErrorCode::kTooLarge, few);
  DecodeLimits small;
  small.max_message_bytes = 100;
  expect_decode_error(s.bytes, s.layout(), CodecErrorCode::kTooLarge, small);
  DecodeLimits few_entries;
  few_entries.max_total_entries = 12;
  expect_decode_error(s.bytes, s.layout(), CodecErrorCode::kTooLarge, few_entries);
}

TEST(SparseCodec, RefusesBadTensors) {
  Sample s;
  auto with = [&](std::size_t offset, std::uint8_t value) {
    auto b = s.bytes;
    b[offset] = value;
    return b;
  };
  expect_decode_error(with(36, 5), s.layout(),
                      CodecErrorCode::kLayoutMismatch);  // tensor number beyond model
  expect_decode_error(with(40, 45), s.layout(),
                      CodecErrorCode::kLayoutMismatch);  // size differs from model
  expect_decode_error(with(66, 0), s.layout(),
                      CodecErrorCode::kDuplicateTensor);  // second tensor says 0 again
  expect_decode_error(with(48, 9), s.layout(), CodecErrorCode::kBadEncoding);    // value encoding
  expect_decode_error(with(49, 9), s.layout(), CodecErrorCode::kBadEncoding);    // index encoding
  expect_decode_error(with(70 + 4, 21), s.layout(), CodecErrorCode::kBadCount);  // k > n
  expect_decode_error(with(70 + 4, 9), s.layout(),
                      CodecErrorCode::kBadCount);  // bitmap has 10 bits, k says 9
  expect_decode_error(with(82, 0x15), s.layout(),
                      CodecErrorCode::kBadIndex);  // bit 20 of a 20-entry tensor
  expect_decode_error(with(52, 0x7f), s.layout(),
                      CodecErrorCode::kBadIndex);  // gap pushes an index past 299
  expect_decode_error(with(50, 0x80), s.layout(),
                      CodecErrorCode::kBadIndex);  // first varint becomes 80 c4 01 = 25088
}

TEST(SparseCodec, RefusesNonCanonicalAndOverlongVarints) {
  std::vector<std::uint32_t> sizes = {100};
  SparseUpdate u{kModel, 0, 0, {{0, 100, {5}, {1.0f}}}};
  auto good = encode_sparse_update(u).value();
  ASSERT_EQ(good[50], 5);
  // 5 as two bytes (0x85 0x00): same value, longer encoding.
  std::vector<std::uint8_t> padded(good.begin(), good.begin() + 50);
  padded.insert(padded.end(), {0x85, 0x00});
  padded.insert(padded.end(), good.begin() + 51, good.end());
  expect_decode_error(padded, {kModel, sizes}, CodecErrorCode::kBadIndex);
  std::vector<std::uint32_t> huge = {std::numeric_limits<std::uint32_t>::max()};
  std::vector<std::uint8_t> too_wide(good.begin(), good.begin() + 50);
  too_wide[40] = too_wide[41] = too_wide[42] = too_wide[43] = 0xff;  // size = 2^32 − 1
  too_wide.insert(too_wide.end(), {0xff, 0xff, 0xff, 0xff, 0x1f});   // 5th byte > 0x0f
  too_wide.insert(too_wide.end(), good.begin() + 51, good.end());
  expect_decode_error(too_wide, {kModel, huge}, CodecErrorCode::kBadIndex);
}

TEST(SparseCodec, RefusesNonFiniteValues) {
  Sample s;
  for (std::uint32_t bits : {0x7fc00000u, 0x7f800000u, 0xff800000u}) {
    auto b = s.bytes;
    for (int i = 0; i < 4; ++i) b[54 + 4 + i] = static_cast<std::uint8_t>(bits >> (8 * i));
    expect_decode_error(b, s.layout(), CodecErrorCode::kNonFiniteValue);
  }
  SparseUpdate half{kModel, 0, 0, {{0, 300, {1}, {1.0f}}}};
  auto b = encode_sparse_update(half, {ValueEncoding::kFp16}).value();
  b[b.size() - 2] = 0x00;
  b[b.size() - 1] = 0x7c;  // half +Inf
  expect_decode_error(b, s.layout(), CodecErrorCode::kNonFiniteValue);
}

TEST(SparseCodec, RefusesEveryTruncationAndTrailingBytes) {
  Sample s;
  for (std::size_t length = 0; length < s.bytes.size(); ++length) {
    auto r = decode_sparse_update(std::span(s.bytes).first(length), s.layout());
    ASSERT_FALSE(r.ok()) << "prefix of " << length << " bytes accepted";
    EXPECT_EQ(r.error().code, CodecErrorCode::kTruncated) << length << ": " << r.error().message;
  }
  auto longer = s.bytes;
  longer.push_back(0);
  expect_decode_error(longer, s.layout(), CodecErrorCode::kTrailingBytes);
}

TEST(SparseCodec, RandomCorruptionNeverCrashes) {
  // Whatever the decoder accepts must satisfy the documented invariants.
  std::mt19937 rng(4);
  for (int trial = 0; trial < 3000; ++trial) {
    Fixture f = random_update(rng);
    auto bytes = encode_sparse_update(f.update).value();
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i)
      bytes[rng() % bytes.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    auto r = decode_sparse_update(bytes, f.layout());
    if (!r.ok()) continue;
    for (const auto& t : r.value().tensors) {
      ASSERT_LT(t.tensor, f.sizes.size());
      ASSERT_EQ(t.size, f.sizes[t.tensor]);
      ASSERT_EQ(t.indices.size(), t.values.size());
      for (std::size_t j = 0; j < t.indices.size(); ++j) {
        ASSERT_LT(t.indices[j], t.size);
        if (j) {
          ASSERT_LT(t.indices[j - 1], t.indices[j]);
        }
        ASSERT_TRUE(std::isfinite(t.values[j]));
      }
    }
  }
}

// Sign + scale (ValueEncoding::kSignScale): one f32 scale per tensor record and one sign
// bit per entry. The encoder only takes values that are all ±s, so the round trip is exact.
void make_sign_scale(SparseUpdate& u, std::mt19937& rng) {
  std::uniform_real_distribution<float> scale(1e-6f, 10.0f);
  for (auto& t : u.tensors) {
    const float s = scale(rng);
    for (auto& v : t.values) v = rng() % 2 ? -s : s;
  }
}

TEST(SignScaleCodec, RandomUpdatesRoundTripBitForBit) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    Fixture f = random_update(rng);
    make_sign_scale(f.update, rng);
    auto bytes = encode_sparse_update(f.update, {ValueEncoding::kSignScale});
    ASSERT_TRUE(bytes.ok()) << bytes.error().message;
    auto decoded = decode_sparse_update(bytes.value(), f.layout());
    ASSERT_TRUE(decoded.ok()) << decoded.error().message;
    expect_same(f.update, decoded.value(), false);
    // ±s is an fp32 value: re-encoding as fp32 keeps it, and a sign-scale re-encoding of the
    // decoded update is the same message.
    auto as_fp32 = decode_sparse_update(encode_sparse_update(decoded.value()).value(), f.layout());
    ASSERT_TRUE(as_fp32.ok());
    expect_same(f.update, as_fp32.value(), false);
    EXPECT_EQ(encode_sparse_update(decoded.value(), {ValueEncoding::kSignScale}).value(),
              bytes.value());
  }
}

TEST(SignScaleCodec, CostsAScaleAndOneBitPerEntry) {
  std::mt19937 rng(12);
  const std::vector<std::uint32_t> sizes = {1000};
  for (std::uint32_t k : {0u, 1u, 7u, 8u, 9u, 100u, 125u, 1000u}) {
    SparseUpdate u{kModel, 0, 0, {random_tensor(rng, 0, 1000, k)}};
    make_sign_scale(u, rng);
    const std::size_t value_bytes = k == 0 ? 0 : 4 + (k + 7) / 8;
    EXPECT_EQ(value_section_bytes(ValueEncoding::kSignScale, k), value_bytes);
    const auto fp32 = encode_sparse_update(u).value();
    const auto signs = encode_sparse_update(u, {ValueEncoding::kSignScale}).value();
    EXPECT_EQ(signs.size(), fp32.size() - 4 * k + value_bytes) << "k=" << k;
    EXPECT_EQ(signs[kFirstIndexEncoding - 1], 2) << "k=" << k;  // the record's value-encoding byte
  }
  EXPECT_EQ(value_section_bytes(ValueEncoding::kFp32, 10), 40u);
  EXPECT_EQ(value_section_bytes(ValueEncoding::kFp16, 10), 20u);
}

TEST(SignScaleCodec, MatchesTheExampleInCodecMd) {
  // The f32 example of CODEC.md with values {3: 0.75, 200: −0.75}.
  SparseUpdate u{1, 2, 3, {{0, 300, {3, 200}, {0.75f, -0.75f}}}};
  const std::vector<std::uint8_t> documented = {
      0x45, 0x54, 0x53, 0x55, 0x01, 0x00, 0x00, 0x00, 0x01, 0,    0,    0,    0,   0, 0,
      0,    0x02, 0,    0,    0,    0,    0,    0,    0,    0x03, 0,    0,    0,   0, 0,
      0,    0,    0x01, 0,    0,    0,    0x00, 0,    0,    0,    0x2c, 0x01, 0,   0, 0x02,
      0,    0,    0,    0x02, 0x00, 0x03, 0xc4, 0x01, 0x00, 0x00, 0x40, 0x3f, 0x02};
  EXPECT_EQ(encode_sparse_update(u, {ValueEncoding::kSignScale}).value(), documented);
}

TEST(SignScaleCodec, EncoderRefusesValuesThatAreNotAllPlusOrMinusOneScale) {
  auto refused = [](SparseUpdate u) {
    auto r = encode_sparse_update(u, {ValueEncoding::kSignScale});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, CodecErrorCode::kInvalidInput);
    EXPECT_FALSE(r.error().message.empty());
  };
  refused({kModel, 0, 0, {{0, 4, {1, 2}, {1.0f, -2.0f}}}});                       // two magnitudes
  refused({kModel, 0, 0, {{0, 4, {1, 2}, {1.0f, std::nextafter(1.0f, 2.0f)}}}});  // one ulp apart
  refused({kModel, 0, 0, {{0, 4, {1, 2}, {0.0f, 0.0f}}}});                        // zero scale
  refused({kModel, 0, 0, {{0, 4, {1}, {-0.0f}}}});
  refused({kModel, 0, 0, {{0, 4, {1, 2}, {1.0f, 0.0f}}}});
  refused({kModel, 0, 0, {{0, 4, {1}, {std::numeric_limits<float>::infinity()}}}});
  refused({kModel, 0, 0, {{0, 4, {1}, {std::numeric_limits<float>::quiet_NaN()}}}});
  // The check is per tensor: each may have its own scale, and an empty one needs none.
  SparseUpdate fine{
      kModel, 0, 0, {{0, 4, {0, 3}, {-2.0f, 2.0f}}, {1, 4, {}, {}}, {2, 4, {1}, {0.125f}}}};
  EXPECT_TRUE(encode_sparse_update(fine, {ValueEncoding::kSignScale}).ok());
}

TEST(SignScaleCodec, DecoderRefusesBadScalesPaddingAndTruncation) {
  // One tensor (n = 300) with 10 entries at 0, 20, ..., 180: delta-varint indices at 50..59
  // (one byte each), scale at 60, signs at 64..65 (bits 8 and 9 in the second byte).
  const std::vector<std::uint32_t> sizes = {300};
  const ModelLayout layout{kModel, sizes};
  SparseTensor t{0, 300, {}, {}};
  for (std::uint32_t j = 0; j < 10; ++j) {
    t.indices.push_back(20 * j);
    t.values.push_back(j % 3 ? 1.5f : -1.5f);
  }
  SparseUpdate u{kModel, 0, 0, {t}};
  const auto good = encode_sparse_update(u, {ValueEncoding::kSignScale}).value();
  ASSERT_EQ(good.size(), 36u + 14 + 10 + 4 + 2);
  ASSERT_EQ(good[64], 0x49);  // entries 0, 3, 6 negative
  ASSERT_EQ(good[65], 0x02);  // entry 9 negative
  ASSERT_TRUE(decode_sparse_update(good, layout).ok());
  auto with_scale = [&](float scale) {
    auto b = good;
    const auto bits = std::bit_cast<std::uint32_t>(scale);
    for (int i = 0; i < 4; ++i) b[60 + i] = static_cast<std::uint8_t>(bits >> (8 * i));
    return b;
  };
  expect_decode_error(with_scale(std::numeric_limits<float>::quiet_NaN()), layout,
                      CodecErrorCode::kNonFiniteValue);
  expect_decode_error(with_scale(std::numeric_limits<float>::infinity()), layout,
                      CodecErrorCode::kNonFiniteValue);
  expect_decode_error(with_scale(-std::numeric_limits<float>::infinity()), layout,
                      CodecErrorCode::kNonFiniteValue);
  expect_decode_error(with_scale(-1.5f), layout, CodecErrorCode::kBadEncoding);
  expect_decode_error(with_scale(0.0f), layout, CodecErrorCode::kBadEncoding);
  expect_decode_error(with_scale(-0.0f), layout, CodecErrorCode::kBadEncoding);
  auto tiny = decode_sparse_update(with_scale(std::numeric_limits<float>::denorm_min()), layout);
  ASSERT_TRUE(tiny.ok()) << tiny.error().message;  // a subnormal scale is still > 0
  EXPECT_EQ(tiny.value().tensors[0].values[0], -std::numeric_limits<float>::denorm_min());
  // Padding: the six unused high bits of the last sign byte must be zero.
  for (int bit = 2; bit < 8; ++bit) {
    auto b = good;
    b[65] |= static_cast<std::uint8_t>(1u << bit);
    expect_decode_error(b, layout, CodecErrorCode::kBadEncoding);
  }
  for (std::size_t length = 0; length < good.size(); ++length)
    expect_decode_error(std::span(good).first(length), layout, CodecErrorCode::kTruncated);
  auto longer = good;
  longer.push_back(0);
  expect_decode_error(longer, layout, CodecErrorCode::kTrailingBytes);
  auto unknown = good;
  unknown[48] = 3;
  expect_decode_error(unknown, layout, CodecErrorCode::kBadEncoding);
  // A count the sign bytes cannot hold is refused before anything is allocated.
  auto more = good;
  more[44] = 200;
  expect_decode_error(more, layout, CodecErrorCode::kTruncated);
  // No entries: no scale and no sign bytes.
  SparseUpdate empty{kModel, 0, 0, {{0, 300, {}, {}}}};
  const auto empty_bytes = encode_sparse_update(empty, {ValueEncoding::kSignScale}).value();
  EXPECT_EQ(empty_bytes.size(), 36u + 14);
  ASSERT_TRUE(decode_sparse_update(empty_bytes, layout).ok());
}

TEST(SignScaleCodec, ModelDeltasRefuseIt) {
  std::vector<std::uint32_t> sizes = {300, 20};
  ModelDelta delta{kModel, 2, 9, 1234, {{0, 300, {3, 200}, {0.5f, -0.5f}}}};
  auto b = encode_model_delta(delta).value();
  b[56] = 2;  // value encoding of the first record (header 44 + 12)
  auto r = decode_model_delta(b, {kModel, sizes});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, CodecErrorCode::kBadEncoding);
}

TEST(SignScaleCodec, RandomCorruptionNeverCrashes) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 3000; ++trial) {
    Fixture f = random_update(rng);
    make_sign_scale(f.update, rng);
    auto bytes = encode_sparse_update(f.update, {ValueEncoding::kSignScale}).value();
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i)
      bytes[rng() % bytes.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    auto r = decode_sparse_update(bytes, f.layout());
    if (!r.ok()) continue;
    for (const auto& t : r.value().tensors) {
      ASSERT_LT(t.tensor, f.sizes.size());
      ASSERT_EQ(t.indices.size(), t.values.size());
      for (std::size_t j = 0; j < t.indices.size(); ++j) {
        ASSERT_LT(t.indices[j], t.size);
        ASSERT_TRUE(std::isfinite(t.values[j]));
      }
    }
  }
}

TEST(DenseCodec, RoundTripsAndChecksLayout) {
  std::mt19937 rng(5);
  std::vector<std::uint32_t> sizes = {288, 32, 1, 7};
  std::vector<float> values(328);
  std::normal_distribution<float> dist;
  for (auto& v : values) v = dist(rng);
  auto bytes = encode_dense_model(kModel, 1234, sizes, values);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes.value().size(), 28 + 4 * sizes.size() + 4 * values.size());
  auto model = decode_dense_model(bytes.value(), {kModel, sizes});
  ASSERT_TRUE(model.ok()) << model.error().message;
  EXPECT_EQ(model.value().version, 1234u);
  EXPECT_EQ(model.value().tensor_sizes, sizes);
  EXPECT_EQ(model.value().values, values);

  auto error_of = [&](std::vector<std::uint8_t> b,
                      std::vector<std::uint32_t> layout_sizes = {288, 32, 1, 7},
                      std::uint64_t id = kModel) {
    auto r = decode_dense_model(b, {id, layout_sizes});
    EXPECT_FALSE(r.ok());
    return r.ok() ? CodecErrorCode::kInvalidInput : r.error().code;
  };
  const auto& good = bytes.value();
  EXPECT_EQ(error_of(good, {288, 32, 1}), CodecErrorCode::kLayoutMismatch);
  EXPECT_EQ(error_of(good, {288, 32, 1, 8}), CodecErrorCode::kLayoutMismatch);
  EXPECT_EQ(error_of(good, sizes, kModel + 1), CodecErrorCode::kWrongModel);
  EXPECT_EQ(error_of({good.begin(), good.end() - 1}), CodecErrorCode::kTruncated);
  EXPECT_EQ(error_of({good.begin(), good.begin() + 27}), CodecErrorCode::kTruncated);
  auto longer = good;
  longer.push_back(1);
  EXPECT_EQ(error_of(longer), CodecErrorCode::kTrailingBytes);
  auto nan = good;
  nan[nan.size() - 1] = 0x7f;
  nan[nan.size() - 2] = 0xc0;
  EXPECT_EQ(error_of(nan), CodecErrorCode::kNonFiniteValue);
  auto magic = good;
  magic[3] = 'U';
  EXPECT_EQ(error_of(magic), CodecErrorCode::kBadMagic);

  // `reuse`: the values take over its allocation, and only for a good message.
  std::vector<float> old(328, 7.0f);
  const float* allocation = old.data();
  auto refused = decode_dense_model(nan, {kModel, sizes}, {}, &old);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(old, std::vector<float>(328, 7.0f));  // left as it was
  auto reused = decode_dense_model(good, {kModel, sizes}, {}, &old);
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(reused.value().values, values);
  EXPECT_EQ(reused.value().values.data(), allocation);

  EXPECT_FALSE(encode_dense_model(kModel, 0, sizes, std::span(values).first(10)).ok());
  values[5] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(encode_dense_model(kModel, 0, sizes, values).ok());
}

// Issue 37: no encoder that sends floats lets a NaN or an infinity out, in any value
// encoding (fp16 would otherwise round them to a half NaN or clamp nothing; sign + scale
// would send an infinite scale). Each refusal is kInvalidInput with a reason.
TEST(CodecEncoders, RefuseNonFiniteValuesInEveryValueEncoding) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  auto refused = [](const auto& result) {
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().code, CodecErrorCode::kInvalidInput);
    EXPECT_NE(result.error().message.find("non-finite"), std::string::npos)
        << result.error().message;
  };
  const std::vector<std::uint32_t> sizes = {4, 3};
  for (const float v : bad) {
    for (const auto encoding :
         {ValueEncoding::kFp32, ValueEncoding::kFp16, ValueEncoding::kSignScale})
      refused(encode_sparse_update({kModel, 1, 0, {{0, 4, {1, 2}, {v, v}}}}, {encoding}));
    std::vector<float> dense(7, 0.5f);
    dense[6] = v;
    refused(encode_dense_model(kModel, 3, sizes, dense));
    refused(encode_model_delta({kModel, 1, 2, 0, {{1, 3, {0, 2}, {1.0f, v}}}}));
  }
}

// ---- Model delta (GET /model?since=V) ----

std::size_t total_of(const std::vector<std::uint32_t>& sizes) {
  std::size_t total = 0;
  for (auto n : sizes) total += n;
  return total;
}

// Parameters at a base version, parameters at a later version that differ in some entries,
// and the delta between them as the server builds it.
struct DeltaSample {
  std::vector<std::uint32_t> sizes = {288, 32, 1, 7};
  std::vector<float> before, after;
  ModelDelta delta;
  std::vector<std::uint8_t> bytes;
  ModelLayout layout() const { return {kModel, sizes}; }

  explicit DeltaSample(std::uint32_t seed, int change_one_in = 5) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist;
    before.resize(total_of(sizes));
    for (auto& v : before) v = dist(rng);
    after = before;
    delta = {kModel, 17, 23, 0, {}};
    std::size_t offset = 0;
    for (std::uint32_t t = 0; t < sizes.size(); ++t) {
      SparseTensor changed{t, sizes[t], {}, {}};
      for (std::uint32_t i = 0; i < sizes[t]; ++i)
        if (rng() % change_one_in == 0) {
          after[offset + i] = dist(rng);
          changed.indices.push_back(i);
          changed.values.push_back(after[offset + i]);
        }
      if (!changed.indices.empty()) delta.tensors.push_back(changed);
      offset += sizes[t];
    }
    delta.digest = parameter_digest(after);
    bytes = encode_model_delta(delta).value();
  }
};

TEST(DeltaCodec, AppliedToTheBaseItReproducesTheNewParametersBitForBit) {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    DeltaSample s(seed, 1 + seed % 7);  // seed % 7 == 0: every entry ("all" encoding)
    ASSERT_EQ(model_message_kind(s.bytes), ModelMessageKind::kDelta);
    auto decoded = decode_model_delta(s.bytes, s.layout());
    ASSERT_TRUE(decoded.ok()) << decoded.error().message;
    EXPECT_EQ(decoded.value().base_version, 17u);
    EXPECT_EQ(decoded.value().version, 23u);
    std::vector<float> copy = s.before;
    ASSERT_TRUE(apply_model_delta(decoded.value(), s.sizes, copy));
    ASSERT_EQ(std::memcmp(copy.data(), s.after.data(), copy.size() * sizeof(float)), 0) << seed;
    EXPECT_EQ(parameter_digest(copy), decoded.value().digest);
  }
}

TEST(DeltaCodec, SignedZeroAndTinyValuesTravelExactly) {
  std::vector<std::uint32_t> sizes = {4};
  const float values[] = {-0.0f, std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::max(), 1.0f};
  ModelDelta delta{kModel, 0, 1, 0, {{0, 4, {0, 1, 2, 3}, {values, values + 4}}}};
  auto decoded = decode_model_delta(encode_model_delta(delta).value(), {kModel, sizes});
  ASSERT_TRUE(decoded.ok()) << decoded.error().message;
  std::vector<float> copy(4, 7.0f);
  ASSERT_TRUE(apply_model_delta(decoded.value(), sizes, copy));
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(copy[i]), std::bit_cast<std::uint32_t>(values[i]));
}

TEST(DeltaCodec, EmptyDeltaIsTheHeaderAlone) {
  std::vector<std::uint32_t> sizes = {3};
  ModelDelta delta{kModel, 5, 5, 99, {}};
  auto bytes = encode_model_delta(delta).value();
  EXPECT_EQ(bytes.size(), 44u);
  auto decoded = decode_model_delta(bytes, {kModel, sizes});
  ASSERT_TRUE(decoded.ok()) << decoded.error().message;
  EXPECT_TRUE(decoded.value().tensors.empty());
  EXPECT_EQ(decoded.value().digest, 99u);
}

TEST(DeltaCodec, DigestSeesEveryBitAndTheLength) {
  std::vector<float> values(1001, 0.5f);
  const std::uint64_t digest = parameter_digest(values);
  for (std::size_t i : {0, 1, 2, 3, 500, 1000}) {
    for (int bit : {0, 13, 31}) {
      auto changed = values;
      changed[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(changed[i]) ^ (1u << bit));
      EXPECT_NE(parameter_digest(changed), digest) << i << " " << bit;
    }
  }
  EXPECT_NE(parameter_digest(std::span(values).first(1000)), digest);
  auto swapped = values;
  swapped[0] = 1.0f;
  auto swapped_other = values;
  swapped_other[4] = 1.0f;  // same lane, other position
  EXPECT_NE(parameter_digest(swapped), parameter_digest(swapped_other));
}

TEST(DeltaCodec, RefusesEveryTruncationAndTrailingBytes) {
  DeltaSample s(3);
  for (std::size_t length = 0; length < s.bytes.size(); ++length) {
    auto r = decode_model_delta(std::span(s.bytes).first(length), s.layout());
    ASSERT_FALSE(r.ok()) << "prefix of " << length << " bytes accepted";
    EXPECT_EQ(r.error().code, CodecErrorCode::kTruncated) << length << ": " << r.error().message;
  }
  auto longer = s.bytes;
  longer.push_back(0);
  auto r = decode_model_delta(longer, s.layout());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, CodecErrorCode::kTrailingBytes);
}

TEST(DeltaCodec, RefusesBadHeadersOutOfRangeIndicesNanAndFp16) {
  std::vector<std::uint32_t> sizes = {300, 20};
  const ModelLayout layout{kModel, sizes};
  auto error_of = [&](const std::vector<std::uint8_t>& b, const ModelLayout& l) {
    auto r = decode_model_delta(b, l);
    EXPECT_FALSE(r.ok());
    return r.ok() ? CodecErrorCode::kInvalidInput : r.error().code;
  };
  // One tensor (0, n = 300) with entries {3: 0.5, 200: -1.0}, delta-varint: header 44
  // bytes, tensor header at 44, indices at 58 (03 c4 01), values at 61.
  ModelDelta delta{kModel, 2, 9, 1234, {{0, 300, {3, 200}, {0.5f, -1.0f}}}};
  const auto good = encode_model_delta(delta).value();
  ASSERT_EQ(good.size(), 44u + 14 + 3 + 8);
  ASSERT_TRUE(decode_model_delta(good, layout).ok());

  auto b = good;
  b[3] = 'M';  // ETMM
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kBadMagic);
  EXPECT_EQ(
      error_of(encode_dense_model(kModel, 1, sizes, std::vector<float>(320, 0.0f)).value(), layout),
      CodecErrorCode::kBadMagic);
  b = good;
  b[4] = 2;
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kUnsupportedVersion);
  b = good;
  b[6] = 1;
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kBadEncoding);
  EXPECT_EQ(error_of(good, {kModel + 1, sizes}), CodecErrorCode::kWrongModel);
  EXPECT_EQ(error_of(good, {kModel, std::vector<std::uint32_t>{301, 20}}),
            CodecErrorCode::kLayoutMismatch);
  b = good;
  b[16] = 10;  // base version 10 > version 9
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kBadEncoding);
  b = good;
  b[44] = 2;  // tensor 2 of a 2-tensor model
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kLayoutMismatch);
  b = good;
  b[60] = 0x02;  // second gap 0xc4 0x02 = 324: index 328 ≥ 300
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kBadIndex);
  b = good;
  b[52] = 3;  // count 3 > the 2 entries the bytes hold
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kTruncated);
  b = good;
  b[52] = 0xff, b[53] = 0xff;  // count above n
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kBadCount);
  b = good;
  b[56] = 1;  // fp16 values: a delta must be exact
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kBadEncoding);
  b = good;
  b[57] = 3;  // unknown index encoding
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kBadEncoding);
  for (std::uint32_t bits : {0x7fc00000u, 0x7f800000u, 0xff800000u}) {
    b = good;
    for (int i = 0; i < 4; ++i) b[65 + i] = static_cast<std::uint8_t>(bits >> (8 * i));
    EXPECT_EQ(error_of(b, layout), CodecErrorCode::kNonFiniteValue);
  }
  DecodeLimits small;
  small.max_message_bytes = good.size() - 1;
  auto r = decode_model_delta(good, layout, small);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, CodecErrorCode::kTooLarge);
  // Twice the same tensor: records at 44 and 44 + 14 + 1 + 4 = 63, the second renamed to 0.
  ModelDelta twice{kModel, 2, 9, 0, {{0, 300, {1}, {1.0f}}, {1, 300, {2}, {1.0f}}}};
  b = encode_model_delta(twice).value();
  ASSERT_EQ(b[63], 1);
  b[63] = 0;
  EXPECT_EQ(error_of(b, layout), CodecErrorCode::kDuplicateTensor);
}

TEST(DeltaCodec, EncoderAndApplyRefuseWhatDoesNotFit) {
  std::vector<std::uint32_t> sizes = {4, 2};
  EXPECT_FALSE(encode_model_delta({kModel, 5, 4, 0, {}}).ok());  // version below base
  EXPECT_FALSE(encode_model_delta({kModel, 0, 1, 0, {{0, 4, {2, 1}, {1.0f, 2.0f}}}}).ok());
  EXPECT_FALSE(encode_model_delta({kModel, 0, 1, 0, {{0, 4, {1}, {std::nanf("")}}}}).ok());
  EXPECT_FALSE(
      encode_model_delta({kModel, 0, 1, 0, {{0, 4, {1}, {1.0f}}, {0, 4, {2}, {1.0f}}}}).ok());
  std::vector<float> copy(6, 3.0f);
  const std::vector<float> unchanged = copy;
  EXPECT_FALSE(
      apply_model_delta({kModel, 0, 1, 0, {{0, 4, {1}, {1.0f}}}}, sizes, std::span(copy).first(5)));
  EXPECT_FALSE(apply_model_delta({kModel, 0, 1, 0, {{0, 4, {1}, {1.0f}}, {2, 4, {1}, {1.0f}}}},
                                 sizes, copy));
  EXPECT_FALSE(apply_model_delta({kModel, 0, 1, 0, {{0, 4, {1}, {1.0f}}, {1, 2, {2}, {1.0f}}}},
                                 sizes, copy));
  EXPECT_EQ(copy, unchanged);  // nothing written by a refused delta
}

// CODEC.md's model delta example, byte for byte: the exact (fp32) pull is what it was before
// fp16 deltas existed, and the fp16 one differs only in its value encoding byte and values.
TEST(DeltaCodec, TheDocumentedExampleByteForByteInFp32AndFp16) {
  ModelDelta delta{1, 2, 9, 1234, {{0, 300, {3, 200}, {0.5f, -1.0f}}}};
  const std::vector<std::uint8_t> header = {
      0x45, 0x54, 0x4d, 0x44, 0x01, 0x00, 0x00, 0x00,  // ETMD, version 1, reserved
      0x01, 0, 0, 0, 0, 0, 0, 0,                        // model id 1
      0x02, 0, 0, 0, 0, 0, 0, 0,                        // base version 2
      0x09, 0, 0, 0, 0, 0, 0, 0,                        // version 9
      0xd2, 0x04, 0, 0, 0, 0, 0, 0,                     // digest 1234
      0x01, 0, 0, 0,                                    // 1 tensor
      0x00, 0, 0, 0, 0x2c, 0x01, 0, 0, 0x02, 0, 0, 0};  // tensor 0, n = 300, k = 2
  std::vector<std::uint8_t> fp32 = header;
  for (std::uint8_t b : {0x00, 0x00, 0x03, 0xc4, 0x01, 0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x80, 0xbf})
    fp32.push_back(b);
  EXPECT_EQ(encode_model_delta(delta).value(), fp32);
  delta.values = ValueEncoding::kFp16;
  std::vector<std::uint8_t> fp16 = header;
  for (std::uint8_t b : {0x01, 0x00, 0x03, 0xc4, 0x01, 0x00, 0x38, 0x00, 0xbc}) fp16.push_back(b);
  EXPECT_EQ(encode_model_delta(delta).value(), fp16);
  delta.values = ValueEncoding::kFp16Increment;  // the same bytes but the encoding byte
  std::vector<std::uint8_t> increments = fp16;
  increments[56] = 0x03;
  EXPECT_EQ(encode_model_delta(delta).value(), increments);
}

// fp16 values in a model delta (the cheap pull's option, server/replica_pull.h): half the
// value bytes, values that are already fp16 values travel bit for bit, and only a reader
// that asked for them takes them.
TEST(Fp16DeltaCodec, OnlyAReaderThatAskedTakesItAndItsValuesComeBackBitForBit) {
  std::vector<std::uint32_t> sizes = {300, 20};
  const float values[] = {0.5f, -1.0f, 3.140625f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24),
                          -0.0f, 65504.0f};
  ModelDelta delta{kModel, 2, 9, 1234, {{0, 300, {3, 200, 201, 202, 203, 204, 299}, {values, values + 7}}}};
  delta.values = ValueEncoding::kFp16;
  const auto bytes = encode_model_delta(delta).value();
  // Header, tensor header, 7 varint indices (3, 196 in two bytes, 0, 0, 0, 0, 94), 2 bytes a value.
  EXPECT_EQ(bytes.size(), 44u + 14 + 8 + 2 * 7);
  EXPECT_EQ(bytes[56], 1);  // value encoding fp16
  auto refused = decode_model_delta(bytes, {kModel, sizes});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, CodecErrorCode::kBadEncoding);
  DecodeLimits fp16_reader;
  fp16_reader.accept_fp16_delta_values = true;
  auto taken = decode_model_delta(bytes, {kModel, sizes}, fp16_reader);
  ASSERT_TRUE(taken.ok()) << taken.error().message;
  EXPECT_EQ(taken.value().values, ValueEncoding::kFp16);
  ASSERT_EQ(taken.value().tensors.size(), 1u);
  EXPECT_EQ(taken.value().tensors[0].indices, delta.tensors[0].indices);
  for (int j = 0; j < 7; ++j)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(taken.value().tensors[0].values[j]),
              std::bit_cast<std::uint32_t>(values[j]))
        << j;
  // Re-encoded as decoded: the same bytes. An fp32 delta is read as before by either reader.
  EXPECT_EQ(encode_model_delta(taken.value()).value(), bytes);
  delta.values = ValueEncoding::kFp32;
  const auto exact = encode_model_delta(delta).value();
  EXPECT_EQ(exact.size(), 44u + 14 + 8 + 4 * 7);
  auto exact_taken = decode_model_delta(exact, {kModel, sizes}, fp16_reader);
  ASSERT_TRUE(exact_taken.ok());
  EXPECT_EQ(exact_taken.value().values, ValueEncoding::kFp32);
}

TEST(Fp16DeltaCodec, TheEncoderRoundsNothingAndOneDeltaHasOneValueEncoding) {
  std::vector<std::uint32_t> sizes = {300, 20};
  auto encoded = [](float v, ValueEncoding encoding) {
    ModelDelta d{kModel, 0, 1, 0, {{0, 300, {5}, {v}}}};
    d.values = encoding;
    return encode_model_delta(d);
  };
  // 0.1 and 65505 are not fp16 values: the server must record what the worker will hold,
  // so the encoder refuses rather than round.
  for (const float v : {0.1f, 65505.0f, 1e-9f}) {
    auto r = encoded(v, ValueEncoding::kFp16);
    ASSERT_FALSE(r.ok()) << v;
    EXPECT_EQ(r.error().code, CodecErrorCode::kInvalidInput);
    EXPECT_TRUE(encoded(v, ValueEncoding::kFp32).ok());
  }
  EXPECT_TRUE(encoded(round_to_fp16(0.1f), ValueEncoding::kFp16).ok());
  EXPECT_FALSE(encoded(0.5f, ValueEncoding::kSignScale).ok());
  // An fp32 record (no entries, so no value bytes) before an fp16 one: refused.
  ModelDelta two{kModel, 0, 1, 0, {{0, 300, {}, {}}, {1, 20, {4}, {0.25f}}}};
  two.values = ValueEncoding::kFp16;
  auto bytes = encode_model_delta(two).value();
  DecodeLimits fp16_reader;
  fp16_reader.accept_fp16_delta_values = true;
  ASSERT_TRUE(decode_model_delta(bytes, {kModel, sizes}, fp16_reader).ok());
  ASSERT_EQ(bytes[56], 1);
  bytes[56] = 0;
  auto mixed = decode_model_delta(bytes, {kModel, sizes}, fp16_reader);
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.error().code, CodecErrorCode::kBadEncoding);
  bytes[56] = 2;  // sign + scale: never in a delta
  mixed = decode_model_delta(bytes, {kModel, sizes}, fp16_reader);
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.error().code, CodecErrorCode::kBadEncoding);
}

TEST(DeltaCodec, RandomCorruptionNeverCrashes) {
  std::mt19937 rng(6);
  for (int trial = 0; trial < 2000; ++trial) {
    DeltaSample s(trial % 10 + 1, 2 + trial % 9);
    auto bytes = s.bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i)
      bytes[rng() % bytes.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    auto r = decode_model_delta(bytes, s.layout());
    if (!r.ok()) continue;
    std::vector<float> copy = s.before;
    ASSERT_TRUE(apply_model_delta(r.value(), s.sizes, copy));
    for (float v : copy) ASSERT_TRUE(std::isfinite(v));
  }
}

// fp16 increments in a model delta (ValueEncoding::kFp16Increment, the cheap pull's
// error-feedback option, server/replica_pull.h): value encoding 3, 2 bytes a value, taken only
// by a reader that asked for them, and added to the copy rather than written over it.
TEST(Fp16IncrementDeltaCodec, OnlyAReaderThatAskedTakesItAndApplyAddsTheIncrements) {
  std::vector<std::uint32_t> sizes = {300, 20};
  ModelDelta delta{kModel, 2, 9, 1234, {{0, 300, {3, 200}, {0.5f, -1.0f}}, {1, 20, {7}, {round_to_fp16(0.1f)}}}};
  delta.values = ValueEncoding::kFp16Increment;
  const auto bytes = encode_model_delta(delta).value();
  EXPECT_EQ(bytes.size(), 44u + 14 + 3 + 2 * 2 + 14 + 1 + 2);
  EXPECT_EQ(bytes[56], 3);  // value encoding fp16 increments
  // Refused by a reader that did not ask for them, also by one that takes fp16 values.
  DecodeLimits fp16_reader;
  fp16_reader.accept_fp16_delta_values = true;
  for (const DecodeLimits& reader : {DecodeLimits{}, fp16_reader}) {
    auto refused = decode_model_delta(bytes, {kModel, sizes}, reader);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, CodecErrorCode::kBadEncoding);
    EXPECT_NE(refused.error().message.find("fp16-increment"), std::string::npos) << refused.error().message;
  }
  DecodeLimits increment_reader;
  increment_reader.accept_fp16_increment_delta_values = true;
  auto taken = decode_model_delta(bytes, {kModel, sizes}, increment_reader);
  ASSERT_TRUE(taken.ok()) << taken.error().message;
  EXPECT_EQ(taken.value().values, ValueEncoding::kFp16Increment);
  EXPECT_EQ(encode_model_delta(taken.value()).value(), bytes);  // the same bytes again
  // An fp16-value delta is not taken by an increment reader (the worker would add values).
  ModelDelta as_values = delta;
  as_values.values = ValueEncoding::kFp16;
  EXPECT_FALSE(decode_model_delta(encode_model_delta(as_values).value(), {kModel, sizes}, increment_reader).ok());

  std::vector<float> copy(320, 0.25f);
  ASSERT_TRUE(apply_model_delta(taken.value(), sizes, copy));
  EXPECT_EQ(copy[3], 0.25f + 0.5f);
  EXPECT_EQ(copy[200], 0.25f - 1.0f);
  EXPECT_EQ(copy[300 + 7], 0.25f + round_to_fp16(0.1f));
  EXPECT_EQ(copy[4], 0.25f);
  // An entry that would not be finite after the addition (fp16 increments cannot overflow a
  // float, so only a copy that was not the server's): refused, nothing changed.
  std::vector<float> huge(320, 0.0f);
  huge[200] = -std::numeric_limits<float>::infinity();
  const std::vector<float> before = huge;
  EXPECT_FALSE(apply_model_delta(taken.value(), sizes, huge));
  EXPECT_EQ(huge, before);
}

TEST(Fp16IncrementDeltaCodec, RefusedInUpdatesCorruptValuesAndMixedRecords) {
  std::vector<std::uint32_t> sizes = {300, 20};
  DecodeLimits reader;
  reader.accept_fp16_increment_delta_values = true;
  ModelDelta delta{kModel, 0, 1, 0, {{0, 300, {5}, {0.5f}}, {1, 20, {4}, {0.25f}}}};
  delta.values = ValueEncoding::kFp16Increment;
  // The encoder rounds nothing: 0.1 is not an fp16 value.
  ModelDelta unrounded = delta;
  unrounded.tensors[0].values[0] = 0.1f;
  EXPECT_EQ(encode_model_delta(unrounded).error().code, CodecErrorCode::kInvalidInput);
  auto bytes = encode_model_delta(delta).value();
  ASSERT_TRUE(decode_model_delta(bytes, {kModel, sizes}, reader).ok());
  // The first record's value (offset 44 + 14 + 1 varint byte): an f16 infinity, then a NaN.
  const std::size_t value_at = 44 + 14 + 1;
  ASSERT_EQ(bytes[value_at] | bytes[value_at + 1] << 8, float_to_half(0.5f));
  for (const std::uint16_t bad : {std::uint16_t{0x7c00}, std::uint16_t{0xfc00}, std::uint16_t{0x7e00}}) {
    auto corrupt = bytes;
    corrupt[value_at] = static_cast<std::uint8_t>(bad & 0xff);
    corrupt[value_at + 1] = static_cast<std::uint8_t>(bad >> 8);
    auto r = decode_model_delta(corrupt, {kModel, sizes}, reader);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, CodecErrorCode::kNonFiniteValue);
  }
  // The second record in fp32 or fp16 values after an fp16-increment one: refused (read before
  // its values, so the byte alone decides).
  const std::size_t second_encoding = value_at + 2 + 12;
  ASSERT_EQ(bytes[second_encoding], 3);
  for (const std::uint8_t other : {std::uint8_t{0}, std::uint8_t{1}}) {
    auto mixed = bytes;
    mixed[second_encoding] = other;
    DecodeLimits both = reader;
    both.accept_fp16_delta_values = true;
    auto r = decode_model_delta(mixed, {kModel, sizes}, both);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, CodecErrorCode::kBadEncoding) << r.error().message;
  }
  // A sparse update with value encoding 3: unknown there (an update's values are increments
  // already; 3 is for model deltas).
  SparseUpdate update{kModel, 1, 0, {{0, 300, {5}, {0.5f}}}};
  auto update_bytes = encode_sparse_update(update, {ValueEncoding::kFp16}).value();
  ASSERT_EQ(update_bytes[36 + 12], 1);
  update_bytes[36 + 12] = 3;
  auto r = decode_sparse_update(update_bytes, {kModel, sizes});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, CodecErrorCode::kBadEncoding);
  EXPECT_FALSE(encode_sparse_update(update, {ValueEncoding::kFp16Increment}).ok());
}

}  // namespace
