// libFuzzer target for the wire decoders (transport/codec.cc, transport/gan_codec.cc): sparse
// updates, dense models, model deltas, and MD-GAN's batches and feedback. The first input byte
// picks the expected layout so that both small tensors (bitmaps, k = n) and the paper CNN's sizes
// are reached; the rest is the message. Whatever a decoder accepts must satisfy the documented
// invariants and re-encode to something that decodes to the same value.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "transport/codec.h"
#include "transport/gan_codec.h"

using namespace edgetrain::transport;

namespace {

const std::vector<std::uint32_t> kLayouts[] = {
    {1},
    {300, 20},
    {8, 9, 1, 64},
    {288, 32, 18432, 64, 401408, 128, 1280, 10},
};
constexpr std::uint64_t kModel = 1;

void require(bool condition) {
  if (!condition) std::abort();
}

// The invariants every decoder documents for what it accepts: each tensor of the layout at
// most once and with its size, indices strictly increasing and < n, one finite value each.
void require_documented_tensors(const std::vector<SparseTensor>& tensors,
                                const std::vector<std::uint32_t>& sizes) {
  std::vector<bool> seen(sizes.size(), false);
  for (const auto& t : tensors) {
    require(t.tensor < sizes.size() && !seen[t.tensor] && t.size == sizes[t.tensor]);
    seen[t.tensor] = true;
    require(t.indices.size() == t.values.size() && t.indices.size() <= t.size);
    for (std::size_t j = 0; j < t.indices.size(); ++j) {
      require(t.indices[j] < t.size && (j == 0 || t.indices[j - 1] < t.indices[j]));
      require(std::isfinite(t.values[j]));
    }
  }
}

// Bit for bit, so -0 differs from +0. memcmp must not see the null data() of an empty
// vector (a tensor with no entries).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (b.empty() || std::memcmp(a.data(), b.data(), b.size() * sizeof(float)) == 0);
}

// What the sign + scale encoder accepts: in every tensor, all values ±s for one s > 0.
bool all_plus_minus_one_scale(const SparseUpdate& u) {
  for (const auto& t : u.tensors)
    for (float v : t.values)
      if (!(std::fabs(v) > 0.0f) || std::fabs(v) != std::fabs(t.values[0])) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto& sizes = kLayouts[data[0] % 4];
  const ModelLayout layout{kModel, sizes};
  DecodeLimits limits;
  limits.max_message_bytes = 1 << 20;
  std::span<const std::uint8_t> message(data + 1, size - 1);

  auto update = decode_sparse_update(message, layout, limits);
  if (update.ok()) {
    const SparseUpdate& u = update.value();
    require_documented_tensors(u.tensors, sizes);
    // fp32 re-encoding is lossless for any decoded value (fp16 values widen exactly, and
    // sign + scale values are ±an f32 scale).
    auto again = encode_sparse_update(u);
    require(again.ok());
    auto back = decode_sparse_update(again.value(), layout, limits);
    require(back.ok());
    require(back.value().tensors.size() == u.tensors.size());
    for (std::size_t i = 0; i < u.tensors.size(); ++i) {
      require(back.value().tensors[i].indices == u.tensors[i].indices);
      require(back.value().tensors[i].values == u.tensors[i].values);
    }
    // Sign + scale takes exactly the updates whose tensors are each ±s (every update decoded
    // from that encoding among them) and gives them back bit for bit.
    auto signs = encode_sparse_update(u, {ValueEncoding::kSignScale});
    require(signs.ok() == all_plus_minus_one_scale(u));
    if (signs.ok()) {
      auto signs_back = decode_sparse_update(signs.value(), layout, limits);
      require(signs_back.ok() && signs_back.value().tensors.size() == u.tensors.size());
      for (std::size_t i = 0; i < u.tensors.size(); ++i) {
        require(signs_back.value().tensors[i].indices == u.tensors[i].indices);
        require(same_bits(signs_back.value().tensors[i].values, u.tensors[i].values));
      }
    }
  }

  // A reader that takes fp16 deltas (values and increments) takes whatever one that does not
  // takes, and the same.
  DecodeLimits fp16_limits = limits;
  fp16_limits.accept_fp16_delta_values = true;
  fp16_limits.accept_fp16_increment_delta_values = true;
  auto delta = decode_model_delta(message, layout, fp16_limits);
  auto fp32_only = decode_model_delta(message, layout, limits);
  require(fp32_only.ok() == (delta.ok() && delta.value().values == ValueEncoding::kFp32));
  if (delta.ok()) {
    const ModelDelta& d = delta.value();
    require(d.version >= d.base_version);
    require(d.values == ValueEncoding::kFp32 || d.values == ValueEncoding::kFp16 ||
            d.values == ValueEncoding::kFp16Increment);
    require_documented_tensors(d.tensors, sizes);
    // Deltas carry exact values (fp32, or values or increments fp16 holds): re-encoding gives back the same
    // entries bit for bit.
    auto again = encode_model_delta(d);
    require(again.ok());
    auto back = decode_model_delta(again.value(), layout, fp16_limits);
    require(back.ok() && back.value().digest == d.digest &&
            back.value().tensors.size() == d.tensors.size());
    for (std::size_t i = 0; i < d.tensors.size(); ++i) {
      require(back.value().tensors[i].indices == d.tensors[i].indices);
      require(same_bits(back.value().tensors[i].values, d.tensors[i].values));
    }
    std::size_t total = 0;
    for (auto n : sizes) total += n;
    std::vector<float> parameters(total, 0.0f);
    require(apply_model_delta(d, sizes, parameters));
  }

  // MD-GAN: whatever decodes has b·d finite values per batch and labels < 10, and
  // re-encodes (fp32) to a message that decodes to the same bits.
  auto batches = decode_gan_batches(message);
  if (batches.ok()) {
    const GanBatches& b = batches.value();
    const std::size_t n = std::size_t{b.batch} * b.width;
    require(b.g_samples.size() == n && b.d_samples.size() == n && b.g_labels.size() == b.batch &&
            b.d_labels.size() == b.batch && (b.swap_round == 0) == b.swap_to.empty());
    for (const auto* labels : {&b.g_labels, &b.d_labels})
      for (auto label : *labels) require(label < 10);
    auto again = encode_gan_batches(b, ValueEncoding::kFp32);
    require(again.ok());
    auto back = decode_gan_batches(again.value());
    require(back.ok() && same_bits(back.value().g_samples, b.g_samples) &&
            same_bits(back.value().d_samples, b.d_samples) && back.value().swap_to == b.swap_to &&
            back.value().g_labels == b.g_labels);
  }
  auto feedback = decode_gan_feedback(message);
  if (feedback.ok()) {
    const GanFeedback& f = feedback.value();
    require(f.values.size() == std::size_t{f.batch} * f.width);
    for (float v : f.values) require(std::isfinite(v));
    auto again = encode_gan_feedback(f, ValueEncoding::kFp32);
    require(again.ok());
    auto back = decode_gan_feedback(again.value());
    require(back.ok() && same_bits(back.value().values, f.values) &&
            back.value().iteration == f.iteration);
  }

  auto model = decode_dense_model(message, layout, limits);
  if (model.ok()) {
    auto again = encode_dense_model(model.value().model_id, model.value().version,
                                    model.value().tensor_sizes, model.value().values);
    require(again.ok());
    require(again.value().size() == message.size());
  }
  return 0;
}
