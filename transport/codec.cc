#include "transport/codec.h"

#include "transport/byte_io.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

namespace edgetrain::transport {

namespace {

constexpr std::uint8_t kSparseMagic[4] = {'E', 'T', 'S', 'U'};
constexpr std::uint8_t kDenseMagic[4] = {'E', 'T', 'D', 'M'};
constexpr std::size_t kSparseHeaderBytes = 36;
constexpr std::size_t kTensorHeaderBytes = 14;
constexpr std::size_t kDenseHeaderBytes = 28;
constexpr std::uint8_t kDeltaMagic[4] = {'E', 'T', 'M', 'D'};
constexpr std::size_t kDeltaHeaderBytes = kModelDeltaHeaderBytes;
constexpr std::uint16_t kLargestFiniteHalf = 0x7bff;

CodecError fail(CodecErrorCode code, std::string message) {
  return CodecError{code, std::move(message)};
}
std::string str(std::uint64_t v) { return std::to_string(v); }
std::string num(float v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", static_cast<double>(v));
  return text;
}

using byte_io::Reader;
using byte_io::Writer;

// The three message formats share their first 8 bytes (CODEC.md): magic, format version,
// a u16 that is reserved (must be 0) in models and deltas and carries a sparse update's
// local steps. What differs is named here.
struct MessageFormat {
  const char* name;           // "update", "model", "model delta": the size messages
  const char* kind;           // "a sparse update": the bad-magic message
  const std::uint8_t* magic;  // 4 bytes
  std::size_t header_bytes;   // the fixed header, before any tensor
  // The wrong-model message: before[0] + the message's model id + before[1] + the expected one.
  const char* wrong_model[2];
};
constexpr MessageFormat kSparseFormat{"update",
                                      "a sparse update",
                                      kSparseMagic,
                                      kSparseHeaderBytes,
                                      {"update is for model ", ", this is model "}};
constexpr MessageFormat kDenseFormat{"model",
                                     "a dense model",
                                     kDenseMagic,
                                     kDenseHeaderBytes,
                                     {"model ", " received, expected model "}};
constexpr MessageFormat kDeltaFormat{"model delta",
                                     "a model delta",
                                     kDeltaMagic,
                                     kDeltaHeaderBytes,
                                     {"model delta for model ", ", expected model "}};

void write_message_header(Writer& w, const MessageFormat& format, std::uint16_t field6 = 0) {
  w.bytes(format.magic, 4);
  w.u16(kCodecFormatVersion);
  w.u16(field6);
}

// The size cap, the fixed header's length, magic, format version, reserved field and the
// model id every format carries next (into `model_id`, checked against the expected one);
// on success `r` stands after those 16 bytes with the rest of the fixed header left.
std::optional<CodecError> read_message_header(Reader& r, std::span<const std::uint8_t> bytes,
                                              const MessageFormat& format,
                                              const DecodeLimits& limits,
                                              std::uint64_t expected_model_id,
                                              std::uint64_t& model_id,
                                              std::uint16_t* local_steps = nullptr) {
  using E = CodecErrorCode;
  if (bytes.size() > limits.max_message_bytes)
    return fail(E::kTooLarge, std::string(format.name) + " of " + str(bytes.size()) +
                                  " bytes exceeds the cap of " + str(limits.max_message_bytes));
  if (bytes.size() < format.header_bytes)
    return fail(E::kTruncated, std::string(format.name) + " of " + str(bytes.size()) +
                                   " bytes is shorter than its " + str(format.header_bytes) +
                                   "-byte header");
  std::span<const std::uint8_t> magic;
  r.span(4, magic);
  if (std::memcmp(magic.data(), format.magic, 4) != 0)
    return fail(E::kBadMagic, std::string("not ") + format.kind + " (magic is not " +
                                  std::string(reinterpret_cast<const char*>(format.magic), 4) +
                                  ")");
  std::uint16_t version = 0, reserved = 0;
  r.u16(version);
  r.u16(reserved);
  if (version != kCodecFormatVersion)
    return fail(E::kUnsupportedVersion, "format version " + str(version) +
                                            "; this build reads version " +
                                            str(kCodecFormatVersion));
  if (local_steps != nullptr)
    *local_steps = reserved;  // a sparse update's: any value is well formed
  else if (reserved != 0)
    return fail(E::kBadEncoding, "reserved header field is " + str(reserved) + ", must be 0");
  r.u64(model_id);
  if (model_id != expected_model_id)
    return fail(E::kWrongModel, format.wrong_model[0] + str(model_id) + format.wrong_model[1] +
                                    str(expected_model_id));
  return std::nullopt;
}

bool finite(float v) { return std::isfinite(v); }

std::size_t varint_length(std::uint32_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Shared by the encoder (on what it is asked to send) and, through the decoder's own
// checks, the rules in CODEC.md.
std::optional<CodecError> check_tensor(const SparseTensor& t) {
  const std::string where = "tensor " + str(t.tensor) + ": ";
  if (t.size == 0) return fail(CodecErrorCode::kInvalidInput, where + "size is zero");
  if (t.indices.size() != t.values.size())
    return fail(CodecErrorCode::kInvalidInput,
                where + str(t.indices.size()) + " indices but " + str(t.values.size()) + " values");
  if (t.indices.size() > t.size)
    return fail(CodecErrorCode::kInvalidInput, where + "more entries than its size");
  for (std::size_t j = 0; j < t.indices.size(); ++j) {
    if (t.indices[j] >= t.size)
      return fail(CodecErrorCode::kInvalidInput,
                  where + "index " + str(t.indices[j]) + " ≥ size " + str(t.size));
    if (j > 0 && t.indices[j] <= t.indices[j - 1])
      return fail(CodecErrorCode::kInvalidInput, where + "indices not strictly increasing");
    if (!finite(t.values[j]))
      return fail(CodecErrorCode::kInvalidInput,
                  where + "non-finite value at index " + str(t.indices[j]));
  }
  return std::nullopt;
}

// Sign + scale carries every value as ±s: only a tensor that already holds nothing else can
// be sent exactly, and an encoder that rounded here would hide a compressor bug.
std::optional<CodecError> check_sign_scale(const SparseTensor& t) {
  if (t.values.empty()) return std::nullopt;
  const float scale = std::fabs(t.values[0]);
  const std::string where = "tensor " + str(t.tensor) + ": ";
  if (!(scale > 0.0f))
    return fail(
        CodecErrorCode::kInvalidInput,
        where + "sign-scale values cannot carry a zero value (index " + str(t.indices[0]) + ")");
  for (std::size_t j = 1; j < t.values.size(); ++j)
    if (std::fabs(t.values[j]) != scale)
      return fail(CodecErrorCode::kInvalidInput, where + "sign-scale values must all be ±" +
                                                     num(scale) + ", index " + str(t.indices[j]) +
                                                     " holds " + num(t.values[j]));
  return std::nullopt;
}

// What an encoder checks of the tensor records it is asked to send (sparse updates and
// model deltas alike): each one valid for `values`, each tensor at most once.
std::optional<CodecError> check_tensor_records(const std::vector<SparseTensor>& tensors,
                                               ValueEncoding values) {
  if (tensors.size() > UINT32_MAX) return fail(CodecErrorCode::kInvalidInput, "too many tensors");
  std::vector<std::uint32_t> seen;
  for (const SparseTensor& t : tensors) {
    if (auto error = check_tensor(t)) return *error;
    if (values == ValueEncoding::kSignScale)
      if (auto error = check_sign_scale(t)) return *error;
    for (std::uint32_t s : seen)
      if (s == t.tensor)
        return fail(CodecErrorCode::kInvalidInput, "tensor " + str(t.tensor) + " appears twice");
    seen.push_back(t.tensor);
  }
  return std::nullopt;
}

// One tensor record (CODEC.md), shared by sparse updates and model deltas. `t` has passed
// check_tensor() (and check_sign_scale() for kSignScale).
void write_tensor_record(Writer& w, const SparseTensor& t, ValueEncoding values) {
  const std::size_t varint_bytes = delta_varint_bytes(t.indices);
  const IndexEncoding index_encoding = t.indices.size() == t.size ? IndexEncoding::kAll
                                       : bitmap_bytes(t.size) < varint_bytes
                                           ? IndexEncoding::kBitmap
                                           : IndexEncoding::kDeltaVarint;
  w.u32(t.tensor);
  w.u32(t.size);
  w.u32(static_cast<std::uint32_t>(t.indices.size()));
  w.u8(static_cast<std::uint8_t>(values));
  w.u8(static_cast<std::uint8_t>(index_encoding));
  if (index_encoding == IndexEncoding::kAll) {
    // check_tensor() guarantees strictly increasing indices < n, so k == n means 0..n-1.
  } else if (index_encoding == IndexEncoding::kBitmap) {
    const std::size_t start = w.buffer().size();
    w.buffer().resize(start + bitmap_bytes(t.size), 0);
    for (std::uint32_t i : t.indices)
      w.buffer()[start + i / 8] |= static_cast<std::uint8_t>(1u << (i % 8));
  } else {
    for (std::size_t j = 0; j < t.indices.size(); ++j)
      w.varint(j == 0 ? t.indices[0] : t.indices[j] - t.indices[j - 1] - 1);
  }
  if (values == ValueEncoding::kSignScale) {
    if (t.values.empty()) return;  // no entries, no scale
    w.f32(std::fabs(t.values[0]));
    const std::size_t start = w.buffer().size();
    w.buffer().resize(
        start + value_section_bytes(values, static_cast<std::uint32_t>(t.values.size())) - 4, 0);
    for (std::size_t j = 0; j < t.values.size(); ++j)
      if (std::signbit(t.values[j]))
        w.buffer()[start + j / 8] |= static_cast<std::uint8_t>(1u << (j % 8));
    return;
  }
  for (float v : t.values) {
    if (values == ValueEncoding::kFp16 || values == ValueEncoding::kFp16Increment)
      w.u16(float_to_half(v));
    else
      w.f32(v);
  }
}

// Which value encodings a message's tensor records may use, one bit per encoding byte:
// sparse updates any of fp32, fp16 and sign + scale; model deltas, which carry the server's
// values bit for bit, fp32 and what the reader asked for (fp16 values, fp16 increments), one
// encoding in every record of a delta.
using RecordValues = unsigned;
constexpr RecordValues encoding_bit(ValueEncoding e) { return 1u << static_cast<unsigned>(e); }
constexpr RecordValues kSparseUpdateValues = encoding_bit(ValueEncoding::kFp32) |
                                             encoding_bit(ValueEncoding::kFp16) |
                                             encoding_bit(ValueEncoding::kSignScale);
const char* value_encoding_name(std::uint8_t encoding) {
  switch (encoding) {
    case 0: return "fp32";
    case 1: return "fp16";
    case 2: return "sign-scale";
    case 3: return "fp16-increment";
  }
  return "unknown";
}

// The T tensor records of a sparse update or a model delta (CODEC.md), checked against the
// layout and caps before anything sized by the message is allocated; nothing may follow
// them. For a model delta, `delta_values` (may be null) gets the records' value encoding.
std::optional<CodecError> read_tensor_records(Reader& r, std::uint32_t tensor_count,
                                              const ModelLayout& expected,
                                              const DecodeLimits& limits, RecordValues allowed,
                                              std::vector<SparseTensor>& tensors,
                                              ValueEncoding* delta_values = nullptr) {
  using E = CodecErrorCode;
  if (tensor_count > limits.max_tensors)
    return fail(E::kTooLarge,
                str(tensor_count) + " tensors exceed the cap of " + str(limits.max_tensors));
  if (tensor_count > expected.tensor_sizes.size())
    return fail(E::kLayoutMismatch,
                str(tensor_count) + " tensors, the model has " + str(expected.tensor_sizes.size()));
  if (r.remaining() < tensor_count * kTensorHeaderBytes)
    return fail(E::kTruncated, "message too short for " + str(tensor_count) + " tensor headers");

  std::vector<bool> seen(expected.tensor_sizes.size(), false);
  std::uint64_t total_entries = 0;
  tensors.resize(tensor_count);
  for (SparseTensor& t : tensors) {
    std::uint32_t count = 0;
    std::uint8_t value_encoding = 0, index_encoding = 0;
    if (!(r.u32(t.tensor) && r.u32(t.size) && r.u32(count) && r.u8(value_encoding) &&
          r.u8(index_encoding)))
      return fail(E::kTruncated, "message ends inside a tensor header");
    const std::string where = "tensor " + str(t.tensor) + ": ";
    if (t.tensor >= expected.tensor_sizes.size())
      return fail(E::kLayoutMismatch,
                  where + "the model has " + str(expected.tensor_sizes.size()) + " tensors");
    if (seen[t.tensor]) return fail(E::kDuplicateTensor, where + "appears twice");
    seen[t.tensor] = true;
    if (t.size != expected.tensor_sizes[t.tensor])
      return fail(E::kLayoutMismatch, where + "size " + str(t.size) + ", the model's is " +
                                          str(expected.tensor_sizes[t.tensor]));
    if (count > t.size)
      return fail(E::kBadCount, where + str(count) + " entries > size " + str(t.size));
    total_entries += count;
    if (total_entries > limits.max_total_entries)
      return fail(E::kTooLarge, "more than " + str(limits.max_total_entries) + " entries in total");
    if (value_encoding > 3 || (value_encoding == 3 && allowed == kSparseUpdateValues))
      return fail(E::kBadEncoding, where + "unknown value encoding " + str(value_encoding) +
                                       (value_encoding == 3 ? " (fp16 increments are for model deltas)" : ""));
    if (!(allowed & (1u << value_encoding)))
      return fail(E::kBadEncoding, where + value_encoding_name(value_encoding) +
                                       " values in a model delta this reader did not ask for "
                                       "(it takes exact fp32 values" +
                                       (allowed & encoding_bit(ValueEncoding::kFp16) ? ", fp16 values" : "") +
                                       (allowed & encoding_bit(ValueEncoding::kFp16Increment)
                                            ? ", fp16 increments" : "") + ")");
    if (delta_values) {
      const auto encoding = static_cast<ValueEncoding>(value_encoding);
      if (&t == tensors.data()) {
        *delta_values = encoding;
      } else if (*delta_values != encoding) {
        return fail(E::kBadEncoding, where + value_encoding_name(value_encoding) + " values after " +
                                         value_encoding_name(static_cast<std::uint8_t>(*delta_values)) +
                                         " ones: a model delta uses one value encoding");
      }
    }
    const auto values_as = static_cast<ValueEncoding>(value_encoding);
    if (index_encoding > 2)
      return fail(E::kBadEncoding, where + "unknown index encoding " + str(index_encoding));
    if (index_encoding == 2 && count != t.size)
      return fail(E::kBadCount,
                  where + "index encoding 'all' with " + str(count) + " entries of " + str(t.size));
    const std::size_t value_bytes = value_section_bytes(values_as, count);
    // Every entry costs at least one index byte (varint) or one bit (sign) plus its value:
    // checking that before allocating keeps allocations proportional to the message.
    const std::size_t index_minimum = index_encoding == 1   ? bitmap_bytes(t.size)
                                      : index_encoding == 2 ? 0
                                                            : count;
    if (r.remaining() < index_minimum + value_bytes)
      return fail(E::kTruncated, where + "message too short for " + str(count) + " entries");

    t.indices.resize(count);
    if (index_encoding == 2) {
      for (std::uint32_t j = 0; j < count; ++j) t.indices[j] = j;
    } else if (index_encoding == 1) {
      std::span<const std::uint8_t> bitmap;
      r.span(bitmap_bytes(t.size), bitmap);
      std::size_t found = 0;
      for (std::size_t b = 0; b < bitmap.size(); ++b) {
        std::uint8_t byte = bitmap[b];
        if (b == bitmap.size() - 1 && t.size % 8 != 0 && (byte >> (t.size % 8)) != 0)
          return fail(E::kBadIndex, where + "bitmap has bits set beyond size " + str(t.size));
        while (byte != 0) {
          const int bit = std::countr_zero(byte);
          byte = static_cast<std::uint8_t>(byte & (byte - 1));
          if (found == count)
            return fail(E::kBadCount, where + "bitmap has more than " + str(count) + " bits set");
          t.indices[found++] = static_cast<std::uint32_t>(b * 8 + static_cast<std::size_t>(bit));
        }
      }
      if (found != count)
        return fail(E::kBadCount,
                    where + "bitmap has " + str(found) + " bits set, count is " + str(count));
    } else {
      std::uint64_t next = 0;  // smallest index the next entry may take
      for (std::uint32_t j = 0; j < count; ++j) {
        std::uint32_t gap = 0;
        const char* problem = r.varint(gap);
        if (*problem) return fail(E::kBadIndex, where + problem);
        const std::uint64_t index = next + gap;
        if (index >= t.size)
          return fail(E::kBadIndex, where + "index " + str(index) + " ≥ size " + str(t.size));
        t.indices[j] = static_cast<std::uint32_t>(index);
        next = index + 1;
      }
    }
    if (r.remaining() < value_bytes)
      return fail(E::kTruncated, where + "message ends inside the values");
    t.values.resize(count);
    if (values_as == ValueEncoding::kSignScale) {
      if (count == 0) continue;
      std::uint32_t word = 0;
      r.u32(word);
      const float scale = std::bit_cast<float>(word);
      if (!finite(scale)) return fail(E::kNonFiniteValue, where + "sign-scale scale is not finite");
      // Zero would decode to k zeros the encoder cannot have meant (it sends k = 0 instead);
      // a negative scale would give the sign two encodings.
      if (!(scale > 0.0f))
        return fail(E::kBadEncoding, where + "sign-scale scale " + num(scale) + " is not > 0");
      std::span<const std::uint8_t> signs;
      r.span(value_bytes - 4, signs);
      if (count % 8 != 0 && (signs.back() >> (count % 8)) != 0)
        return fail(E::kBadEncoding, where + "sign bits set beyond entry " + str(count - 1));
      for (std::uint32_t j = 0; j < count; ++j)
        t.values[j] = (signs[j / 8] >> (j % 8)) & 1 ? -scale : scale;
      continue;
    }
    for (std::uint32_t j = 0; j < count; ++j) {
      float v;
      if (value_encoding == 1 || value_encoding == 3) {
        std::uint16_t half = 0;
        r.u16(half);
        v = half_to_float(half);
      } else {
        std::uint32_t word = 0;
        r.u32(word);
        v = std::bit_cast<float>(word);
      }
      if (!finite(v))
        return fail(E::kNonFiniteValue,
                    where + "value at index " + str(t.indices[j]) + " is not finite");
      t.values[j] = v;
    }
  }
  if (r.remaining() != 0)
    return fail(E::kTrailingBytes, str(r.remaining()) + " bytes after the last tensor");
  return std::nullopt;
}

}  // namespace

const char* codec_error_name(CodecErrorCode code) {
  switch (code) {
    case CodecErrorCode::kTooLarge:
      return "too large";
    case CodecErrorCode::kTruncated:
      return "truncated";
    case CodecErrorCode::kBadMagic:
      return "bad magic";
    case CodecErrorCode::kUnsupportedVersion:
      return "unsupported version";
    case CodecErrorCode::kWrongModel:
      return "wrong model";
    case CodecErrorCode::kLayoutMismatch:
      return "layout mismatch";
    case CodecErrorCode::kDuplicateTensor:
      return "duplicate tensor";
    case CodecErrorCode::kBadCount:
      return "bad count";
    case CodecErrorCode::kBadIndex:
      return "bad index";
    case CodecErrorCode::kBadEncoding:
      return "bad encoding";
    case CodecErrorCode::kNonFiniteValue:
      return "non-finite value";
    case CodecErrorCode::kTrailingBytes:
      return "trailing bytes";
    case CodecErrorCode::kInvalidInput:
      return "invalid input";
  }
  return "unknown";
}

std::uint16_t float_to_half(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000);
  const std::uint32_t magnitude = bits & 0x7fffffff;
  if (magnitude > 0x7f800000) return sign | 0x7e00;  // NaN
  if (magnitude >= 0x477ff000)
    return sign | kLargestFiniteHalf;       // ≥ 65520 (or Inf) would round to Inf
  if (magnitude < 0x33000000) return sign;  // ≤ 2^-25 rounds to zero
  std::uint32_t result, remainder, halfway;
  if (magnitude < 0x38800000) {  // below 2^-14: a subnormal half, in units of 2^-24
    const std::uint32_t mantissa = (magnitude & 0x7fffff) | 0x800000;
    const std::uint32_t shift = 126 - (magnitude >> 23);  // 14..24
    result = mantissa >> shift;
    remainder = mantissa & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
  } else {  // re-bias the exponent from 127 to 15 and drop 13 mantissa bits
    const std::uint32_t rebased = magnitude - 0x38000000;
    result = rebased >> 13;
    remainder = rebased & 0x1fff;
    halfway = 0x1000;
  }
  if (remainder > halfway || (remainder == halfway && (result & 1)))
    ++result;  // carries into the exponent correctly
  return static_cast<std::uint16_t>(sign | result);
}

float half_to_float(std::uint16_t half) {
  const std::uint32_t sign = std::uint32_t{half & 0x8000u} << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1f;
  const std::uint32_t mantissa = half & 0x3ff;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000 | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

std::size_t value_section_bytes(ValueEncoding encoding, std::uint32_t count) {
  switch (encoding) {
    case ValueEncoding::kFp32:
      return 4 * std::size_t{count};
    case ValueEncoding::kFp16:
    case ValueEncoding::kFp16Increment:
      return 2 * std::size_t{count};
    case ValueEncoding::kSignScale:
      return count == 0 ? 0 : 4 + (std::size_t{count} + 7) / 8;
  }
  return 4 * std::size_t{count};
}

std::size_t delta_varint_bytes(std::span<const std::uint32_t> indices) {
  std::size_t total = 0;
  for (std::size_t j = 0; j < indices.size(); ++j)
    total += varint_length(j == 0 ? indices[0] : indices[j] - indices[j - 1] - 1);
  return total;
}

CodecResult<std::vector<std::uint8_t>> encode_sparse_update(const SparseUpdate& update,
                                                            const EncodeOptions& options) {
  if (options.values != ValueEncoding::kFp32 && options.values != ValueEncoding::kFp16 &&
      options.values != ValueEncoding::kSignScale)
    return fail(CodecErrorCode::kInvalidInput, "unknown value encoding");
  if (auto error = check_tensor_records(update.tensors, options.values)) return *error;
  Writer w;
  write_message_header(w, kSparseFormat, update.local_steps);
  w.u64(update.model_id);
  w.u64(update.sequence);
  w.u64(update.fetched_version);
  w.u32(static_cast<std::uint32_t>(update.tensors.size()));
  for (const SparseTensor& t : update.tensors) write_tensor_record(w, t, options.values);
  return w.take();
}

CodecResult<SparseUpdate> decode_sparse_update(std::span<const std::uint8_t> bytes,
                                               const ModelLayout& expected,
                                               const DecodeLimits& limits) {
  Reader r(bytes);
  SparseUpdate update;
  if (auto error =
          read_message_header(r, bytes, kSparseFormat, limits, expected.model_id, update.model_id,
                              &update.local_steps))
    return *error;
  std::uint32_t tensor_count = 0;
  r.u64(update.sequence);
  r.u64(update.fetched_version);
  r.u32(tensor_count);
  if (auto error = read_tensor_records(r, tensor_count, expected, limits, kSparseUpdateValues,
                                       update.tensors))
    return *error;
  return update;
}

CodecResult<std::vector<std::uint8_t>> encode_dense_model(
    std::uint64_t model_id, std::uint64_t version, std::span<const std::uint32_t> tensor_sizes,
    std::span<const float> values) {
  std::uint64_t total = 0;
  for (std::uint32_t n : tensor_sizes) total += n;
  if (total != values.size())
    return fail(CodecErrorCode::kInvalidInput, "tensor sizes add up to " + str(total) + ", " +
                                                   str(values.size()) + " values given");
  if (tensor_sizes.size() > UINT32_MAX)
    return fail(CodecErrorCode::kInvalidInput, "too many tensors");
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!finite(values[i]))
      return fail(CodecErrorCode::kInvalidInput, "non-finite parameter at flat index " + str(i));
  Writer w;
  w.reserve(kDenseHeaderBytes + 4 * tensor_sizes.size() + 4 * values.size());
  write_message_header(w, kDenseFormat);
  w.u64(model_id);
  w.u64(version);
  w.u32(static_cast<std::uint32_t>(tensor_sizes.size()));
  for (std::uint32_t n : tensor_sizes) w.u32(n);
  for (float v : values) w.f32(v);
  return w.take();
}

CodecResult<DenseModel> decode_dense_model(std::span<const std::uint8_t> bytes,
                                           const ModelLayout& expected,
                                           const DecodeLimits& limits, std::vector<float>* reuse) {
  using E = CodecErrorCode;
  Reader r(bytes);
  DenseModel model;
  if (auto error =
          read_message_header(r, bytes, kDenseFormat, limits, expected.model_id, model.model_id))
    return *error;
  std::uint32_t tensor_count = 0;
  r.u64(model.version);
  r.u32(tensor_count);
  if (tensor_count > limits.max_tensors)
    return fail(E::kTooLarge,
                str(tensor_count) + " tensors exceed the cap of " + str(limits.max_tensors));
  if (tensor_count != expected.tensor_sizes.size())
    return fail(E::kLayoutMismatch,
                str(tensor_count) + " tensors, expected " + str(expected.tensor_sizes.size()));
  if (r.remaining() < std::size_t{tensor_count} * 4)
    return fail(E::kTruncated, "message ends inside the tensor sizes");
  std::uint64_t total = 0;
  model.tensor_sizes.resize(tensor_count);
  for (std::uint32_t i = 0; i < tensor_count; ++i) {
    r.u32(model.tensor_sizes[i]);
    if (model.tensor_sizes[i] != expected.tensor_sizes[i])
      return fail(E::kLayoutMismatch, "tensor " + str(i) + ": size " + str(model.tensor_sizes[i]) +
                                          ", expected " + str(expected.tensor_sizes[i]));
    total += model.tensor_sizes[i];
  }
  if (total > limits.max_total_entries)
    return fail(E::kTooLarge,
                str(total) + " parameters exceed the cap of " + str(limits.max_total_entries));
  if (r.remaining() < total * 4)
    return fail(E::kTruncated, "message too short for " + str(total) + " parameters");
  if (r.remaining() > total * 4)
    return fail(E::kTrailingBytes, str(r.remaining() - total * 4) + " bytes after the parameters");
  // Every value is checked before any is stored, so that `reuse` is taken only for a good
  // message.
  Reader check = r;
  for (std::size_t i = 0; i < total; ++i) {
    std::uint32_t word = 0;
    check.u32(word);
    if (!finite(std::bit_cast<float>(word)))
      return fail(E::kNonFiniteValue, "parameter at flat index " + str(i) + " is not finite");
  }
  if (reuse) model.values = std::move(*reuse);
  model.values.resize(total);
  for (std::size_t i = 0; i < total; ++i) {
    std::uint32_t word = 0;
    r.u32(word);
    model.values[i] = std::bit_cast<float>(word);
  }
  return model;
}

std::size_t dense_model_bytes(std::span<const std::uint32_t> tensor_sizes) {
  std::size_t total = kDenseHeaderBytes + 4 * tensor_sizes.size();
  for (std::uint32_t n : tensor_sizes) total += 4 * std::size_t{n};
  return total;
}

ModelMessageKind model_message_kind(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < 4) return ModelMessageKind::kUnknown;
  if (std::memcmp(bytes.data(), kDenseMagic, 4) == 0) return ModelMessageKind::kDense;
  if (std::memcmp(bytes.data(), kDeltaMagic, 4) == 0) return ModelMessageKind::kDelta;
  return ModelMessageKind::kUnknown;
}

std::uint64_t parameter_digest(std::span<const float> parameters) {
  // FNV-1a over 32-bit words in four interleaved lanes (word i goes to lane i mod 4), so the
  // multiplications of neighbouring words do not wait on each other; the lanes and the
  // count are then folded in with the same step. ~4x faster than byte-wise FNV-1a on 1.7 MB.
  constexpr std::uint64_t kOffset = 0xcbf29ce484222325ULL, kPrime = 0x100000001b3ULL;
  std::uint64_t lane[4] = {kOffset, kOffset ^ 1, kOffset ^ 2, kOffset ^ 3};
  const std::size_t n = parameters.size();
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l)
      lane[l] = (lane[l] ^ std::bit_cast<std::uint32_t>(parameters[i + l])) * kPrime;
  for (; i < n; ++i)
    lane[i % 4] = (lane[i % 4] ^ std::bit_cast<std::uint32_t>(parameters[i])) * kPrime;
  std::uint64_t digest = kOffset;
  for (std::uint64_t v : lane) digest = (digest ^ v) * kPrime;
  return (digest ^ static_cast<std::uint64_t>(n)) * kPrime;
}

CodecResult<std::vector<std::uint8_t>> encode_model_delta(const ModelDelta& delta) {
  if (delta.version < delta.base_version)
    return fail(CodecErrorCode::kInvalidInput, "version below the base version");
  if (delta.values != ValueEncoding::kFp32 && delta.values != ValueEncoding::kFp16 &&
      delta.values != ValueEncoding::kFp16Increment)
    return fail(CodecErrorCode::kInvalidInput,
                "a model delta's values are fp32, fp16 or fp16 increments (not sign + scale)");
  if (auto error = check_tensor_records(delta.tensors, delta.values)) return *error;
  if (delta.values == ValueEncoding::kFp16 || delta.values == ValueEncoding::kFp16Increment)
    for (const SparseTensor& t : delta.tensors)
      for (std::size_t j = 0; j < t.values.size(); ++j)
        if (std::bit_cast<std::uint32_t>(round_to_fp16(t.values[j])) !=
            std::bit_cast<std::uint32_t>(t.values[j]))
          return fail(CodecErrorCode::kInvalidInput,
                      "tensor " + str(t.tensor) + ": value " + num(t.values[j]) + " at index " +
                          str(t.indices[j]) +
                          " is not an fp16 value (round it before it is recorded as sent)");
  std::size_t entries = 0;
  for (const SparseTensor& t : delta.tensors) entries += t.indices.size();
  Writer w;
  w.reserve(kDeltaHeaderBytes + delta.tensors.size() * kTensorHeaderBytes + entries * 6);
  write_message_header(w, kDeltaFormat);
  w.u64(delta.model_id);
  w.u64(delta.base_version);
  w.u64(delta.version);
  w.u64(delta.digest);
  w.u32(static_cast<std::uint32_t>(delta.tensors.size()));
  for (const SparseTensor& t : delta.tensors) write_tensor_record(w, t, delta.values);
  return w.take();
}

CodecResult<ModelDelta> decode_model_delta(std::span<const std::uint8_t> bytes,
                                           const ModelLayout& expected,
                                           const DecodeLimits& limits) {
  using E = CodecErrorCode;
  Reader r(bytes);
  ModelDelta delta;
  if (auto error =
          read_message_header(r, bytes, kDeltaFormat, limits, expected.model_id, delta.model_id))
    return *error;
  std::uint32_t tensor_count = 0;
  r.u64(delta.base_version);
  r.u64(delta.version);
  r.u64(delta.digest);
  r.u32(tensor_count);
  if (delta.version < delta.base_version)
    return fail(E::kBadEncoding, "version " + str(delta.version) + " is below the base version " +
                                     str(delta.base_version));
  RecordValues allowed = encoding_bit(ValueEncoding::kFp32);
  if (limits.accept_fp16_delta_values) allowed |= encoding_bit(ValueEncoding::kFp16);
  if (limits.accept_fp16_increment_delta_values)
    allowed |= encoding_bit(ValueEncoding::kFp16Increment);
  if (auto error = read_tensor_records(r, tensor_count, expected, limits, allowed, delta.tensors,
                                       &delta.values))
    return *error;
  return delta;
}

std::size_t model_delta_record_min_bytes(std::uint32_t size, std::size_t count) {
  const std::size_t index_bytes = count == size ? 0 : std::min(bitmap_bytes(size), count);
  return kTensorHeaderBytes +
         value_section_bytes(ValueEncoding::kFp32, static_cast<std::uint32_t>(count)) + index_bytes;
}

std::vector<std::uint8_t> encode_update_reply(std::uint64_t version) {
  Writer w;
  w.u64(version);
  return w.take();
}

std::optional<std::uint64_t> decode_update_reply(std::span<const std::uint8_t> payload) {
  if (payload.size() != 8) return std::nullopt;
  Reader r(payload);
  std::uint64_t version = 0;
  r.u64(version);
  return version;
}

bool apply_model_delta(const ModelDelta& delta, std::span<const std::uint32_t> tensor_sizes,
                       std::span<float> parameters) {
  std::vector<std::size_t> offsets(tensor_sizes.size());
  std::size_t total = 0;
  for (std::size_t i = 0; i < tensor_sizes.size(); ++i) {
    offsets[i] = total;
    total += tensor_sizes[i];
  }
  if (total != parameters.size()) return false;
  for (const SparseTensor& t : delta.tensors) {
    if (t.tensor >= tensor_sizes.size() || t.size != tensor_sizes[t.tensor] ||
        t.indices.size() != t.values.size())
      return false;
    for (std::uint32_t i : t.indices)
      if (i >= t.size) return false;
  }
  if (delta.values == ValueEncoding::kFp16Increment) {
    // The sender's record took the same float additions (server/replica_pull.cc), so the
    // sums are its values bit for bit. A sum that is not finite (fp16 increments cannot
    // overflow a float: only a copy that was already wrong) is refused before anything changes.
    for (const SparseTensor& t : delta.tensors) {
      const float* tensor = parameters.data() + offsets[t.tensor];
      for (std::size_t j = 0; j < t.indices.size(); ++j)
        if (!finite(tensor[t.indices[j]] + t.values[j])) return false;
    }
    for (const SparseTensor& t : delta.tensors) {
      float* tensor = parameters.data() + offsets[t.tensor];
      for (std::size_t j = 0; j < t.indices.size(); ++j) tensor[t.indices[j]] += t.values[j];
    }
    return true;
  }
  for (const SparseTensor& t : delta.tensors) {
    float* tensor = parameters.data() + offsets[t.tensor];
    for (std::size_t j = 0; j < t.indices.size(); ++j) tensor[t.indices[j]] = t.values[j];
  }
  return true;
}

}  // namespace edgetrain::transport
