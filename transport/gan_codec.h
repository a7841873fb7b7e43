// The wire formats of MD-GAN's mode (issue 16; server/README.md "MD-GAN"): the two batches of
// generated samples the server sends a worker each iteration, and the error feedback the
// worker sends back. Pure functions over byte spans, hostile input as in codec.h: every
// count is checked against caps and the caller's expectations before anything is
// allocated, values must be finite, trailing bytes are an error. Layout (little-endian):
//
//   batches   "EGNB", u16 format 1, u8 value encoding (0 fp32, 1 fp16), u8 reserved 0,
//             u64 run id, u64 iteration, u32 b, u32 d, u32 swap round (0: none),
//             u16 swap-to length, the swap-to name (the peer this worker sends its
//             discriminator to in that round), then X_g's b labels (u8 each, < 10),
//             X_d's b labels, X_g's b·d values, X_d's b·d values
//   feedback  "EGNF", u16 format 1, u8 value encoding, u8 reserved 0, u64 run id,
//             u64 iteration, u32 b, u32 d, then b·d values: F = ∂loss/∂x for X_g's samples
//
// The run id ties both to one generator run (a server restarted on other settings, or a
// worker of another run, is refused rather than mixed in).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/codec.h"

namespace edgetrain::transport {

// Caps on what a decoder accepts before allocating anything.
inline constexpr std::uint32_t kGanMaxBatch = 4096;
inline constexpr std::uint32_t kGanMaxWidth = 1u << 20;
inline constexpr std::size_t kGanMaxSwapName = 255;

struct GanBatches {
  std::uint64_t run_id = 0;
  std::uint64_t iteration = 0;
  std::uint32_t batch = 0;       // b
  std::uint32_t width = 0;       // d: values per sample
  std::uint32_t swap_round = 0;  // > 0: this iteration begins discriminator swap round `swap_round`
  std::string swap_to;           // with swap_round > 0: the peer to send this worker's D to
  std::vector<std::uint8_t> g_labels,
      d_labels;                             // b each: the classes the samples were conditioned on
  std::vector<float> g_samples, d_samples;  // b·d each
};

struct GanFeedback {
  std::uint64_t run_id = 0;
  std::uint64_t iteration = 0;
  std::uint32_t batch = 0;
  std::uint32_t width = 0;
  std::vector<float> values;  // b·d
};

// kFp32 or kFp16 (rounded to nearest even; magnitudes above 65504 clamp). Fails with
// kInvalidInput for sizes that disagree, another encoding, a name that is too long, or a
// non-finite value (NaN or ±Inf: what the decoder refuses is never sent).
CodecResult<std::vector<std::uint8_t>> encode_gan_batches(const GanBatches& batches,
                                                          ValueEncoding encoding);
CodecResult<std::vector<std::uint8_t>> encode_gan_feedback(const GanFeedback& feedback,
                                                           ValueEncoding encoding);

// What the decoder insists on; 0 accepts any (still within the caps).
struct GanExpectation {
  std::uint64_t run_id = 0;
  std::uint32_t batch = 0;
  std::uint32_t width = 0;
};
CodecResult<GanBatches> decode_gan_batches(std::span<const std::uint8_t> bytes,
                                           const GanExpectation& expected = {});
CodecResult<GanFeedback> decode_gan_feedback(std::span<const std::uint8_t> bytes,
                                             const GanExpectation& expected = {});

}  // namespace edgetrain::transport
