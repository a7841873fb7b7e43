// The wire formats of edgetrain: a sparse gradient update (worker → server), a dense model
// and a model delta (the parameters changed since a version; server → worker). Pure functions over
// byte spans: no I/O, no libcoap, no allocation beyond the returned objects. The byte-by-byte
// layout is in CODEC.md.
//
// Decoding treats its input as hostile. Every count, length and index is checked against
// caps and against the model layout the caller expects before anything is allocated or
// written, values must be finite, and bytes after the message are an error. Failure is a
// value (CodecResult holding a CodecError), never an exception or undefined behaviour, so
// a server can answer 4.00 and carry on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace edgetrain::transport {

// One tensor's share of an update: `values[j]` belongs at flat index `indices[j]` of tensor
// number `tensor`, whose size is `size`.
struct SparseTensor {
  std::uint32_t tensor = 0;
  std::uint32_t size = 0;
  std::vector<std::uint32_t> indices;  // strictly increasing, each < size
  std::vector<float> values;           // same length as indices, finite
};

struct SparseUpdate {
  std::uint64_t model_id = 0;
  std::uint64_t sequence = 0;         // per worker, for replay detection
  std::uint64_t fetched_version = 0;  // t_fetch: the model version the gradient was computed on
  std::vector<SparseTensor> tensors;  // each tensor at most once
  // How many local steps the update carries: 0 or 1 for one step (an online update); more
  // for a worker's accumulated offline steps (worker/offline_training.h), saturating at
  // 65535. A claim only: the server decides what credit it gives (server/parameter_store.h).
  // Last, so that brace initializers of the fields above keep their meaning.
  std::uint16_t local_steps = 0;
};

struct DenseModel {
  std::uint64_t model_id = 0;
  std::uint64_t version = 0;  // t: updates applied
  std::vector<std::uint32_t> tensor_sizes;
  std::vector<float> values;  // all tensors back to back, in tensor order
};

// kSignScale (sparse updates only): one f32 scale s per tensor record and one sign bit per
// entry; every value is +s or −s (sign + scale, "ternary" with the unsent entries as 0).
// kFp16Increment (model deltas only): f16 values that the reader adds to the entries it
// holds instead of overwriting them (the cheap pull's error-feedback option, ours).
enum class ValueEncoding : std::uint8_t { kFp32 = 0, kFp16 = 1, kSignScale = 2, kFp16Increment = 3 };

// The parameters that changed after `base_version`, with their values at `version`: a
// worker holding the model at `base_version` that overwrites these entries holds the model
// at `version`, bit for bit. `digest` is parameter_digest() of the whole model at `version`,
// so the worker can check that it does.
struct ModelDelta {
  std::uint64_t model_id = 0;
  std::uint64_t base_version = 0;
  std::uint64_t version = 0;  // ≥ base_version
  std::uint64_t digest = 0;
  std::vector<SparseTensor>
      tensors;  // new values (not differences); each tensor at most once
  // How the values travel, every record alike: kFp32 (the default, exact), or kFp16 for a
  // pull that sends 16-bit values (the cheap pull's option, server/replica_pull.h). With
  // kFp16 every value must already be a binary16 value (round_to_fp16(v) == v, bit for bit),
  // so that what the worker decodes is what the server recorded and the digest holds: the
  // encoder refuses anything else rather than round it. kFp16Increment: every value is an
  // increment (again a binary16 value, bit for bit) that the worker adds to its entry, in
  // float arithmetic; the sender updates its record of the worker's copy by the very same
  // additions, so the digest still holds (server/replica_pull.h). Never kSignScale.
  ValueEncoding values = ValueEncoding::kFp32;
};

// kAll: k == n, every entry in index order, no index bytes (a dense update must not pay
// for indices it does not need, or the ASGD baseline would look worse than it is).
enum class IndexEncoding : std::uint8_t { kDeltaVarint = 0, kBitmap = 1, kAll = 2 };

enum class CodecErrorCode {
  kTooLarge,   // message or a count above a cap
  kTruncated,  // the message ends inside a field
  kBadMagic,
  kUnsupportedVersion,
  kWrongModel,      // model id differs from the expected one
  kLayoutMismatch,  // tensor number or size does not match the expected layout
  kDuplicateTensor,
  kBadCount,        // k > n, or a bitmap's population differs from k
  kBadIndex,        // index ≥ size, not strictly increasing, or a malformed varint
  kBadEncoding,     // unknown encoding byte, nonzero reserved field
  kNonFiniteValue,  // NaN or ±Inf
  kTrailingBytes,
  kInvalidInput,  // the encoder was handed something it must not send
};
const char* codec_error_name(CodecErrorCode code);

struct CodecError {
  CodecErrorCode code;
  std::string message;  // one line a person can act on, e.g. "tensor 3: index 7 ≥ size 5"
};

// A value or the reason there is none.
template <class T>
class CodecResult {
 public:
  CodecResult(T value) : state_(std::move(value)) {}
  CodecResult(CodecError error) : state_(std::move(error)) {}
  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }
  // Only when ok().
  const T& value() const& { return std::get<0>(state_); }
  T& value() & { return std::get<0>(state_); }
  T&& value() && { return std::get<0>(std::move(state_)); }
  // Only when !ok().
  const CodecError& error() const { return std::get<1>(state_); }

 private:
  std::variant<T, CodecError> state_;
};

// What the receiver expects: updates and models for another model are refused, and every
// tensor must have the size the receiver's model gives it.
struct ModelLayout {
  std::uint64_t model_id = 0;
  std::span<const std::uint32_t> tensor_sizes;
};

struct DecodeLimits {
  std::size_t max_message_bytes = std::size_t{16} << 20;
  std::uint32_t max_tensors = 4096;
  std::uint64_t max_total_entries = std::uint64_t{1} << 26;  // sum of k (sparse) or n (dense)
  // Model deltas with fp16 values (ModelDelta::values) are taken only by a reader that asked
  // for them; any other reader refuses them as kBadEncoding, as before they existed.
  bool accept_fp16_delta_values = false;
  // The same for model deltas whose values are fp16 increments (ValueEncoding::kFp16Increment).
  bool accept_fp16_increment_delta_values = false;
};

struct EncodeOptions {
  // kFp16 halves the value bytes. Values are rounded to nearest-even; magnitudes beyond the
  // largest finite half (65504) are clamped to it rather than becoming infinities the
  // decoder would refuse.
  //
  // kSignScale sends one f32 scale s per tensor and one sign bit per entry, so the encoder
  // only accepts tensors whose values are all exactly +s or −s for one finite s > 0 (the
  // compressor's kSignScale value encoding produces them); anything else is kInvalidInput rather
  // than a silent rounding. A tensor with no entries carries no scale.
  ValueEncoding values = ValueEncoding::kFp32;
};

inline constexpr std::uint16_t kCodecFormatVersion = 1;

// Checks `update` the way the decoder would (without a layout) and encodes it; each tensor
// gets whichever index encoding is smaller (delta-varint on a tie).
CodecResult<std::vector<std::uint8_t>> encode_sparse_update(const SparseUpdate& update,
                                                            const EncodeOptions& options = {});
CodecResult<SparseUpdate> decode_sparse_update(std::span<const std::uint8_t> bytes,
                                               const ModelLayout& expected,
                                               const DecodeLimits& limits = {});

// `values` holds all tensors back to back; its length must be the sum of `tensor_sizes`.
CodecResult<std::vector<std::uint8_t>> encode_dense_model(
    std::uint64_t model_id, std::uint64_t version, std::span<const std::uint32_t> tensor_sizes,
    std::span<const float> values);
// `reuse` (may be null): a vector whose allocation the values take over, e.g. the old copy
// a worker replaces, so that a dense pull does not hold two models at once. It is taken only
// once the whole message is known good, and left as it was otherwise.
CodecResult<DenseModel> decode_dense_model(std::span<const std::uint8_t> bytes,
                                           const ModelLayout& expected,
                                           const DecodeLimits& limits = {},
                                           std::vector<float>* reuse = nullptr);

// Model delta (CODEC.md). The encoder picks each tensor's index encoding like
// encode_sparse_update() and sends the values in delta.values: fp32, or fp16 (values or
// increments) when every value is a binary16 value (else kInvalidInput). The decoder refuses
// a version below the base version, sign + scale values, fp16 values unless
// limits.accept_fp16_delta_values, fp16 increments unless
// limits.accept_fp16_increment_delta_values, and a delta whose records mix encodings; it sets
// ModelDelta::values.
CodecResult<std::vector<std::uint8_t>> encode_model_delta(const ModelDelta& delta);
CodecResult<ModelDelta> decode_model_delta(std::span<const std::uint8_t> bytes,
                                           const ModelLayout& expected,
                                           const DecodeLimits& limits = {});
// Overwrites the delta's entries in `parameters` (all tensors back to back, laid out as
// `tensor_sizes`, which the delta was decoded against), or with kFp16Increment adds the
// increments to them. Returns false, changing nothing, when `parameters` has another length,
// a tensor does not fit, or an increment would make an entry non-finite.
bool apply_model_delta(const ModelDelta& delta, std::span<const std::uint32_t> tensor_sizes,
                       std::span<float> parameters);
// A 64-bit fingerprint of a parameter vector (CODEC.md): detects a worker copy that is not
// the server's (a bug, or a server whose state was replaced); not cryptographic.
std::uint64_t parameter_digest(std::span<const float> parameters);

// The least bytes one tensor record of a model delta with `count` of a tensor's `size`
// entries takes (CODEC.md): its header, fp32 values, and the smallest index encoding the
// encoder could pick (none for all entries, else at most the bitmap, at least one varint
// byte per entry). With kModelDeltaHeaderBytes, what a server can add up to stop building
// a delta that cannot beat the dense model.
inline constexpr std::size_t kModelDeltaHeaderBytes = 44;
std::size_t model_delta_record_min_bytes(std::uint32_t size, std::size_t count);

// The payload of POST /update's 2.04: the version the update produced, 8 bytes
// little-endian (CODEC.md, "Update acknowledgement"). decode_update_reply() gives nullopt
// for any other length.
std::vector<std::uint8_t> encode_update_reply(std::uint64_t version);
std::optional<std::uint64_t> decode_update_reply(std::span<const std::uint8_t> payload);

// What a GET /model body holds, from its magic: a dense model, a model delta, or neither.
enum class ModelMessageKind { kDense, kDelta, kUnknown };
ModelMessageKind model_message_kind(std::span<const std::uint8_t> bytes);
// Size of encode_dense_model()'s message for this layout.
std::size_t dense_model_bytes(std::span<const std::uint32_t> tensor_sizes);

// IEEE 754 binary16 conversions used by the fp16 value encoding (exposed so a compressor
// can account for the rounding in its residuals).
std::uint16_t float_to_half(float value);  // round to nearest even; clamps to ±65504, NaN stays NaN
float half_to_float(std::uint16_t half);
inline float round_to_fp16(float value) { return half_to_float(float_to_half(value)); }

// Bytes the value section of a tensor record with `count` entries takes (CODEC.md): 4k, 2k,
// or for kSignScale 4 + ⌈k/8⌉ (0 when k = 0).
std::size_t value_section_bytes(ValueEncoding encoding, std::uint32_t count);

// Bytes the index section of one tensor takes in each encoding (CODEC.md).
std::size_t delta_varint_bytes(std::span<const std::uint32_t> indices);
inline std::size_t bitmap_bytes(std::uint32_t size) { return (std::size_t{size} + 7) / 8; }

}  // namespace edgetrain::transport
