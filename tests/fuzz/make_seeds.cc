// Writes valid messages for codec_fuzz's layouts into a directory, as its seed corpus:
// starting from well-formed updates (every index encoding; fp32, fp16 and sign + scale
// values), models, model deltas and MD-GAN's batches and feedback gets the fuzzer past the
// header checks at once.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "transport/codec.h"
#include "transport/gan_codec.h"

using namespace edgetrain::transport;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::vector<std::vector<std::uint32_t>> layouts = {{1}, {300, 20}, {8, 9, 1, 64}};
  std::mt19937 rng(1);
  int written = 0;
  auto write = [&](std::uint8_t selector, const std::vector<std::uint8_t>& message) {
    const std::string path = std::string(argv[1]) + "/seed-" + std::to_string(written++);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    std::fputc(selector, f);
    std::fwrite(message.data(), 1, message.size(), f);
    return std::fclose(f) == 0;
  };
  for (std::uint8_t selector = 0; selector < layouts.size(); ++selector) {
    const auto& sizes = layouts[selector];
    for (int variant = 0; variant < 4; ++variant) {
      SparseUpdate u{1, static_cast<std::uint64_t>(variant), 0, {}};
      for (std::uint32_t t = 0; t < sizes.size(); ++t) {
        SparseTensor tensor{t, sizes[t], {}, {}};
        for (std::uint32_t i = 0; i < sizes[t]; ++i)
          if (variant == 3 || rng() % (variant + 2) == 0) {
            tensor.indices.push_back(i);
            tensor.values.push_back(static_cast<float>(rng() % 200) / 7.0f - 14.0f);
          }
        u.tensors.push_back(tensor);
      }
      auto bytes =
          encode_sparse_update(u, {variant % 2 ? ValueEncoding::kFp16 : ValueEncoding::kFp32});
      if (!bytes.ok() || !write(selector, bytes.value())) return 1;
      // The same entries as sign + scale: each tensor's values become ±(a scale of its own),
      // and the first entry of every byte of signs negative so the sign bits vary.
      for (auto& tensor : u.tensors) {
        const float scale = static_cast<float>(1 + rng() % 400) / 64.0f;
        for (std::size_t j = 0; j < tensor.values.size(); ++j)
          tensor.values[j] = j % 8 == 0 || rng() % 2 ? -scale : scale;
      }
      bytes = encode_sparse_update(u, {ValueEncoding::kSignScale});
      if (!bytes.ok() || !write(selector, bytes.value())) return 1;
    }
    std::uint64_t total = 0;
    for (auto n : sizes) total += n;
    std::vector<float> values(total, 0.25f);
    auto model = encode_dense_model(1, 5, sizes, values);
    if (!model.ok() || !write(selector, model.value())) return 1;
    // Model deltas: a few entries (delta-varint, in fp32, fp16 and fp16 increments), most (bitmap), every entry
    // (all), none.
    for (int variant = 0; variant < 4; ++variant) {
      ModelDelta delta{1, 5, 9, parameter_digest(values), {}};
      for (std::uint32_t t = 0; t < sizes.size(); ++t) {
        SparseTensor tensor{t, sizes[t], {}, {}};
        for (std::uint32_t i = 0; i < sizes[t] && variant != 3; ++i)
          if (variant == 2 || rng() % (variant == 0 ? 20 : 2) == 0) {
            tensor.indices.push_back(i);
            tensor.values.push_back(static_cast<float>(rng() % 200) / 7.0f - 14.0f);
          }
        if (!tensor.indices.empty()) delta.tensors.push_back(tensor);
      }
      auto bytes = encode_model_delta(delta);
      if (!bytes.ok() || !write(selector, bytes.value())) return 1;
      if (variant == 0) {  // the same entries in fp16 (the cheap pull's option)
        for (SparseTensor& tensor : delta.tensors)
          for (float& v : tensor.values) v = round_to_fp16(v);
        delta.values = ValueEncoding::kFp16;
        auto half = encode_model_delta(delta);
        if (!half.ok() || !write(selector, half.value())) return 1;
        delta.values = ValueEncoding::kFp16Increment;  // ... and as fp16 increments
        auto increments = encode_model_delta(delta);
        if (!increments.ok() || !write(selector, increments.value())) return 1;
      }
    }
  }
  // MD-GAN's batches (with and without a swap instruction) and feedback, fp32 and fp16.
  for (const auto encoding : {ValueEncoding::kFp32, ValueEncoding::kFp16}) {
    GanBatches b{.run_id = 3,
                 .iteration = 7,
                 .batch = 2,
                 .width = 5,
                 .swap_round = 0,
                 .swap_to = {},
                 .g_labels = {1, 9},
                 .d_labels = {0, 4},
                 .g_samples = std::vector<float>(10, 0.5f),
                 .d_samples = std::vector<float>(10, -0.25f)};
    auto plain = encode_gan_batches(b, encoding);
    b.swap_round = 2;
    b.swap_to = "gan-1";
    auto swap = encode_gan_batches(b, encoding);
    GanFeedback f{.run_id = 3,
                  .iteration = 7,
                  .batch = 2,
                  .width = 5,
                  .values = std::vector<float>(10, 1e-3f)};
    auto feedback = encode_gan_feedback(f, encoding);
    if (!plain.ok() || !swap.ok() || !feedback.ok() || !write(0, plain.value()) ||
        !write(0, swap.value()) || !write(0, feedback.value()))
      return 1;
  }
  std::printf("%d seeds\n", written);
  return 0;
}
