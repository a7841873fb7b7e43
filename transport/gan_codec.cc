#include "transport/gan_codec.h"

#include <bit>
#include <cmath>

#include "transport/byte_io.h"

namespace edgetrain::transport {
namespace {

using byte_io::Reader;
using byte_io::Writer;

constexpr std::uint8_t kBatchesMagic[4] = {'E', 'G', 'N', 'B'};
constexpr std::uint8_t kFeedbackMagic[4] = {'E', 'G', 'N', 'F'};
constexpr std::uint16_t kGanFormat = 1;

CodecError fail(CodecErrorCode code, std::string message) {
  return CodecError{code, std::move(message)};
}
std::string str(std::uint64_t v) { return std::to_string(v); }

std::size_t value_bytes(ValueEncoding encoding) { return encoding == ValueEncoding::kFp16 ? 2 : 4; }

void write_values(Writer& w, const std::vector<float>& values, ValueEncoding encoding) {
  for (const float v : values) {
    if (encoding == ValueEncoding::kFp16) {
      w.u16(float_to_half(v));
    } else {
      w.f32(v);
    }
  }
}

// The fields both messages start with: magic, format, encoding, reserved, run id, iteration, b, d.
struct Header {
  ValueEncoding encoding = ValueEncoding::kFp32;
  std::uint64_t run_id = 0, iteration = 0;
  std::uint32_t batch = 0, width = 0;
};

void write_header(Writer& w, const std::uint8_t* magic, const Header& h) {
  w.bytes(magic, 4);
  w.u16(kGanFormat);
  w.u8(static_cast<std::uint8_t>(h.encoding));
  w.u8(0);
  w.u64(h.run_id);
  w.u64(h.iteration);
  w.u32(h.batch);
  w.u32(h.width);
}

std::optional<CodecError> check_encoding(ValueEncoding encoding) {
  if (encoding != ValueEncoding::kFp32 && encoding != ValueEncoding::kFp16)
    return fail(CodecErrorCode::kInvalidInput,
                "GAN samples and feedback travel as fp32 or fp16 values");
  return std::nullopt;
}

std::optional<CodecError> check_sizes(std::uint32_t batch, std::uint32_t width) {
  if (batch == 0 || batch > kGanMaxBatch)
    return fail(CodecErrorCode::kBadCount,
                "batch of " + str(batch) + " samples (1 to " + str(kGanMaxBatch) + ")");
  if (width == 0 || width > kGanMaxWidth)
    return fail(CodecErrorCode::kBadCount,
                "sample width " + str(width) + " (1 to " + str(kGanMaxWidth) + ")");
  return std::nullopt;
}

std::optional<CodecError> read_header(Reader& r, const std::uint8_t* magic, const char* kind,
                                      const GanExpectation& expected, Header& h) {
  std::span<const std::uint8_t> got;
  if (!r.span(4, got))
    return fail(CodecErrorCode::kTruncated, std::string(kind) + ": message ends inside its header");
  if (!std::equal(got.begin(), got.end(), magic))
    return fail(CodecErrorCode::kBadMagic, std::string("not ") + kind + " (wrong magic bytes)");
  std::uint16_t format = 0;
  std::uint8_t encoding = 0, reserved = 0;
  if (!r.u16(format) || !r.u8(encoding) || !r.u8(reserved) || !r.u64(h.run_id) ||
      !r.u64(h.iteration) || !r.u32(h.batch) || !r.u32(h.width))
    return fail(CodecErrorCode::kTruncated, std::string(kind) + ": message ends inside its header");
  if (format != kGanFormat)
    return fail(CodecErrorCode::kUnsupportedVersion, std::string(kind) + " format " + str(format) +
                                                         ", this side reads " + str(kGanFormat));
  if (reserved != 0)
    return fail(CodecErrorCode::kBadEncoding, std::string(kind) + ": reserved byte is not 0");
  if (encoding != static_cast<std::uint8_t>(ValueEncoding::kFp32) &&
      encoding != static_cast<std::uint8_t>(ValueEncoding::kFp16))
    return fail(CodecErrorCode::kBadEncoding,
                std::string(kind) + ": value encoding " + str(encoding) + " (0 fp32, 1 fp16)");
  h.encoding = static_cast<ValueEncoding>(encoding);
  if (expected.run_id != 0 && h.run_id != expected.run_id)
    return fail(CodecErrorCode::kWrongModel, std::string(kind) + " of run " + str(h.run_id) +
                                                 ", this is run " + str(expected.run_id));
  if (auto e = check_sizes(h.batch, h.width)) return e;
  if (expected.batch != 0 && h.batch != expected.batch)
    return fail(CodecErrorCode::kLayoutMismatch, std::string(kind) + " of " + str(h.batch) +
                                                     " samples, expected " + str(expected.batch));
  if (expected.width != 0 && h.width != expected.width)
    return fail(CodecErrorCode::kLayoutMismatch, std::string(kind) + ": samples of " +
                                                     str(h.width) + " values, expected " +
                                                     str(expected.width));
  return std::nullopt;
}

std::optional<CodecError> read_values(Reader& r, ValueEncoding encoding, std::size_t count,
                                      const char* what, std::vector<float>& out) {
  if (r.remaining() / value_bytes(encoding) < count)
    return fail(CodecErrorCode::kTruncated, std::string(what) + ": message ends inside the values");
  out.resize(count);
  for (std::size_t i = 0; i < count; i++) {
    float v = 0;
    if (encoding == ValueEncoding::kFp16) {
      std::uint16_t half = 0;
      r.u16(half);
      v = half_to_float(half);
    } else {
      std::uint32_t bits = 0;
      r.u32(bits);
      v = std::bit_cast<float>(bits);
    }
    if (!std::isfinite(v))
      return fail(CodecErrorCode::kNonFiniteValue,
                  std::string(what) + ": value " + str(i) + " is not finite");
    out[i] = v;
  }
  return std::nullopt;
}

}  // namespace

CodecResult<std::vector<std::uint8_t>> encode_gan_batches(const GanBatches& b,
                                                          ValueEncoding encoding) {
  if (auto e = check_encoding(encoding)) return *e;
  if (auto e = check_sizes(b.batch, b.width))
    return CodecError{CodecErrorCode::kInvalidInput, e->message};
  const std::size_t n = std::size_t{b.batch} * b.width;
  if (b.g_labels.size() != b.batch || b.d_labels.size() != b.batch || b.g_samples.size() != n ||
      b.d_samples.size() != n)
    return fail(CodecErrorCode::kInvalidInput,
                "GAN batches: labels or samples disagree with b and d");
  if (b.swap_to.size() > kGanMaxSwapName)
    return fail(CodecErrorCode::kInvalidInput, "swap-to name longer than 255 bytes");
  if ((b.swap_round == 0) != b.swap_to.empty())
    return fail(CodecErrorCode::kInvalidInput,
                "a swap round needs a swap-to name and the name a round");
  for (const auto labels : {&b.g_labels, &b.d_labels})
    for (const auto label : *labels)
      if (label >= 10)
        return fail(CodecErrorCode::kInvalidInput, "class label " + str(label) + " (0 to 9)");
  // The decoder refuses non-finite samples; a sender that had them must not send them.
  for (const auto& [samples, what] :
       {std::pair{&b.g_samples, "X_g"}, std::pair{&b.d_samples, "X_d"}})
    for (std::size_t i = 0; i < samples->size(); i++)
      if (!std::isfinite((*samples)[i]))
        return fail(CodecErrorCode::kInvalidInput,
                    std::string("GAN batches: ") + what + " value " + str(i) + " is not finite");
  Writer w;
  w.reserve(48 + b.swap_to.size() + 2 * b.batch + 2 * n * value_bytes(encoding));
  write_header(w, kBatchesMagic, {encoding, b.run_id, b.iteration, b.batch, b.width});
  w.u32(b.swap_round);
  w.u16(static_cast<std::uint16_t>(b.swap_to.size()));
  w.bytes(reinterpret_cast<const std::uint8_t*>(b.swap_to.data()), b.swap_to.size());
  w.bytes(b.g_labels.data(), b.batch);
  w.bytes(b.d_labels.data(), b.batch);
  write_values(w, b.g_samples, encoding);
  write_values(w, b.d_samples, encoding);
  return w.take();
}

CodecResult<std::vector<std::uint8_t>> encode_gan_feedback(const GanFeedback& f,
                                                           ValueEncoding encoding) {
  if (auto e = check_encoding(encoding)) return *e;
  if (auto e = check_sizes(f.batch, f.width))
    return CodecError{CodecErrorCode::kInvalidInput, e->message};
  if (f.values.size() != std::size_t{f.batch} * f.width)
    return fail(CodecErrorCode::kInvalidInput, "GAN feedback: values disagree with b and d");
  for (std::size_t i = 0; i < f.values.size(); i++)
    if (!std::isfinite(f.values[i]))
      return fail(CodecErrorCode::kInvalidInput,
                  "GAN feedback: value " + str(i) + " is not finite");
  Writer w;
  w.reserve(32 + f.values.size() * value_bytes(encoding));
  write_header(w, kFeedbackMagic, {encoding, f.run_id, f.iteration, f.batch, f.width});
  write_values(w, f.values, encoding);
  return w.take();
}

CodecResult<GanBatches> decode_gan_batches(std::span<const std::uint8_t> bytes,
                                           const GanExpectation& expected) {
  Reader r(bytes);
  Header h;
  if (auto e = read_header(r, kBatchesMagic, "GAN batches", expected, h)) return *e;
  GanBatches b;
  b.run_id = h.run_id;
  b.iteration = h.iteration;
  b.batch = h.batch;
  b.width = h.width;
  std::uint16_t name_length = 0;
  std::span<const std::uint8_t> name;
  if (!r.u32(b.swap_round) || !r.u16(name_length) || !r.span(name_length, name))
    return fail(CodecErrorCode::kTruncated, "GAN batches: message ends inside the swap fields");
  if (name_length > kGanMaxSwapName)
    return fail(CodecErrorCode::kTooLarge, "swap-to name longer than 255 bytes");
  if ((b.swap_round == 0) != (name_length == 0))
    return fail(CodecErrorCode::kBadEncoding,
                "GAN batches: a swap round without a peer, or a peer without a round");
  b.swap_to.assign(name.begin(), name.end());
  for (auto* labels : {&b.g_labels, &b.d_labels}) {
    std::span<const std::uint8_t> got;
    if (!r.span(b.batch, got))
      return fail(CodecErrorCode::kTruncated, "GAN batches: message ends inside the labels");
    for (const auto label : got)
      if (label >= 10)
        return fail(CodecErrorCode::kBadIndex,
                    "GAN batches: class label " + str(label) + " (0 to 9)");
    labels->assign(got.begin(), got.end());
  }
  const std::size_t n = std::size_t{b.batch} * b.width;
  if (auto e = read_values(r, h.encoding, n, "GAN batches (X_g)", b.g_samples)) return *e;
  if (auto e = read_values(r, h.encoding, n, "GAN batches (X_d)", b.d_samples)) return *e;
  if (r.remaining() != 0)
    return fail(CodecErrorCode::kTrailingBytes,
                str(r.remaining()) + " bytes after the GAN batches");
  return b;
}

CodecResult<GanFeedback> decode_gan_feedback(std::span<const std::uint8_t> bytes,
                                             const GanExpectation& expected) {
  Reader r(bytes);
  Header h;
  if (auto e = read_header(r, kFeedbackMagic, "GAN feedback", expected, h)) return *e;
  GanFeedback f;
  f.run_id = h.run_id;
  f.iteration = h.iteration;
  f.batch = h.batch;
  f.width = h.width;
  if (auto e = read_values(r, h.encoding, std::size_t{f.batch} * f.width, "GAN feedback", f.values))
    return *e;
  if (r.remaining() != 0)
    return fail(CodecErrorCode::kTrailingBytes,
                str(r.remaining()) + " bytes after the GAN feedback");
  return f;
}

}  // namespace edgetrain::transport
