#include "kernels/training_xnn.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "kernels/xnnpack_setup.h"

namespace edgetrain::kernels {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

void check(xnn_status status, const char* what) {
  if (status != xnn_status_success) {
    throw std::runtime_error(std::string(what) + " failed with XNNPACK status " +
                             std::to_string(status));
  }
}

// dbias[OC] += column sums of dout [rows][OC].
void bias_backward_accumulate(float* __restrict dbias, const float* __restrict dout,
                              std::size_t rows, std::size_t OC) {
  for (std::size_t r = 0; r < rows; r++) {
    const float* d = dout + r * OC;
    for (std::size_t o = 0; o < OC; o++) dbias[o] += d[o];
  }
}

float output_min(Activation activation) {
  return activation == Activation::relu ? 0.0f : -kInfinity;
}

// Calls body(begin, end) on consecutive blocks of [0, n), `block` items each (the last may
// be shorter), spread over the pool's threads; one call over all of [0, n) without a pool.
// Bodies compute each item on its own, so the result does not depend on the thread count.
// No allocation: the context lives on this stack frame.
template <class Body>
void parallel_for_blocks(pthreadpool_t pool, std::size_t n, std::size_t block, const Body& body) {
  if (n == 0) return;
  if (!pool || n <= block) {
    body(std::size_t{0}, n);
    return;
  }
  struct Context {
    const Body* body;
    std::size_t n, block;
  } context{&body, n, block};
  pthreadpool_parallelize_1d(
      pool,
      [](void* raw, std::size_t i) {
        const auto* c = static_cast<const Context*>(raw);
        const std::size_t begin = i * c->block;
        (*c->body)(begin, std::min(c->n, begin + c->block));
      },
      &context, (n + block - 1) / block, 0);
}

// Elements per task of our element-wise loops: below ~16k floats (64 kB) a task costs more
// to hand to another thread than it saves (kernel_bench --per-layer, 2 threads).
constexpr std::size_t kElementsPerTask = 16384;

// out[rows][N] = inp[rows][K] · W + bias, where W is `kernel` as [N][K] (kernel_is_k_by_n
// false) or [K][N] (true). The operator packs `kernel`, so it is rebuilt on every call.
void run_fully_connected(XnnOperator& op, float* out, const float* inp, std::size_t rows,
                         std::size_t K, std::size_t N, const float* kernel, bool kernel_is_k_by_n,
                         const float* bias, float min, pthreadpool_t pool) {
  check(xnn_create_fully_connected_nc_f32(K, N, K, N, kernel, bias, min, kInfinity,
                                          kernel_is_k_by_n ? XNN_FLAG_TRANSPOSE_WEIGHTS : 0,
                                          op.out_param()),
        "xnn_create_fully_connected_nc_f32");
  check(xnn_setup_fully_connected_nc_f32(op.get(), rows, inp, out, pool),
        "xnn_setup_fully_connected_nc_f32");
  check(xnn_run_operator(op.get(), pool), "xnn_run_operator (fully connected)");
}

// Returns dout, or dout times the ReLU mask (out > 0) written to `masked`; dout as it is
// when `out` is null (already masked by the caller).
const float* apply_relu_mask(Activation activation, float* masked, const float* dout,
                             const float* out, std::size_t n, pthreadpool_t pool) {
  if (activation == Activation::none || !out) return dout;
  parallel_for_blocks(pool, n, kElementsPerTask, [&](std::size_t begin, std::size_t end) {
    relu_backward(masked + begin, dout + begin, out + begin, end - begin);
  });
  return masked;
}

// bias_backward over blocks of 16 columns on the pool: each column summed over the rows in
// the same order as on one thread.
void bias_backward_parallel(float* dbias, const float* dout, std::size_t rows, std::size_t OC,
                            pthreadpool_t pool) {
  if (!dbias) return;
  constexpr std::size_t kColumns = 16;
  if (!pool || OC <= kColumns || rows * OC < kElementsPerTask) {
    bias_backward(dbias, dout, rows, OC);
    return;
  }
  parallel_for_blocks(pool, OC, kColumns, [&](std::size_t begin, std::size_t end) {
    float* __restrict sum = dbias + begin;
    for (std::size_t o = 0; o < end - begin; o++) sum[o] = 0.0f;
    for (std::size_t r = 0; r < rows; r++) {
      const float* __restrict d = dout + r * OC + begin;
      for (std::size_t o = 0; o < end - begin; o++) sum[o] += d[o];
    }
  });
}

// patches [M][K]: row m holds the KH x KW x C input patch under output pixel m (zeros in the
// padding).
void im2col(float* patches, const float* inp, const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW();
  const std::size_t K = static_cast<std::size_t>(s.KH) * s.KW * s.C;
  float* row = patches;
  for (int b = 0; b < s.B; b++) {
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++, row += K) {
        for (int kh = 0; kh < s.KH; kh++) {
          const int ih = oh * s.stride - s.pad + kh;
          for (int kw = 0; kw < s.KW; kw++) {
            const int iw = ow * s.stride - s.pad + kw;
            float* dst = row + (kh * s.KW + kw) * s.C;
            if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) {
              std::memset(dst, 0, sizeof(float) * s.C);
            } else {
              std::memcpy(dst, inp + ((static_cast<std::size_t>(b) * s.H + ih) * s.W + iw) * s.C,
                          sizeof(float) * s.C);
            }
          }
        }
      }
    }
  }
}

// patches_transposed [K][M]: im2col written transposed directly, which saves a pass over
// the largest buffer of the step when the weight gradient packs dout instead of patches.
// Each image is first transposed to channel planes [C][H*W] (`planes`, H*W*C floats), so
// that every (tap, channel) block of the [K][M] patches, OH x OW, is written contiguously.
// Writing [K][M] straight from NHWC pixels stored each value C*M floats from the last one,
// a scalar store to another cache line every time: 28 % of resnet-8's step
// (model/README.md). At stride 1 with `same` padding (OW == W: resnet-8's 3x3 convs) an
// input row continues in the next one as an output row does, so a block is one copy of
// the plane shifted by the tap, its border rows and columns then zeroed; otherwise row by
// row. Rows are short (7 to 28 floats): plain loops, not a libc call per row (those cost
// 10 % of the step).
void im2col_transposed(float* __restrict patches_transposed, float* __restrict planes,
                       const float* inp, const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW();
  const std::size_t pixels = static_cast<std::size_t>(OH) * OW;
  const std::size_t M = static_cast<std::size_t>(s.B) * pixels;
  const std::size_t plane = static_cast<std::size_t>(s.H) * s.W;
  const bool shifted_copy = s.stride == 1 && OW == s.W;
  for (int b = 0; b < s.B; b++) {
    transpose(planes, inp + static_cast<std::size_t>(b) * plane * s.C, plane, s.C);
    for (int kw = 0; kw < s.KW; kw++) {
      // Output columns whose tap falls inside the image (iw = ow*stride - pad + kw).
      int ow_begin = 0, ow_end = OW;
      while (ow_begin < OW && ow_begin * s.stride - s.pad + kw < 0) ow_begin++;
      while (ow_end > ow_begin && (ow_end - 1) * s.stride - s.pad + kw >= s.W) ow_end--;
      for (int kh = 0; kh < s.KH; kh++) {
        // Output rows whose tap falls inside the image (ih = oh*stride - pad + kh).
        int oh_begin = 0, oh_end = OH;
        while (oh_begin < OH && oh_begin * s.stride - s.pad + kh < 0) oh_begin++;
        while (oh_end > oh_begin && (oh_end - 1) * s.stride - s.pad + kh >= s.H) oh_end--;
        const std::size_t tap = static_cast<std::size_t>(kh) * s.KW + kw;
        for (int c = 0; c < s.C; c++) {
          float* __restrict dst = patches_transposed + (tap * s.C + c) * M + b * pixels;
          const float* __restrict src = planes + c * plane;
          for (std::size_t i = 0; i < static_cast<std::size_t>(oh_begin) * OW; i++) dst[i] = 0.0f;
          for (std::size_t i = static_cast<std::size_t>(oh_end) * OW; i < pixels; i++) dst[i] = 0.0f;
          if (shifted_copy) {
            // dst[oh*OW + ow] = src[oh*W + ow + shift] for the inside rows; the entries that
            // fall outside the plane are border columns, zeroed below.
            const std::ptrdiff_t shift =
                static_cast<std::ptrdiff_t>(kh - s.pad) * s.W + (kw - s.pad);
            std::ptrdiff_t first = static_cast<std::ptrdiff_t>(oh_begin) * OW;
            std::ptrdiff_t last = static_cast<std::ptrdiff_t>(oh_end) * OW;
            first = std::max(first, -shift);
            last = std::min(last, static_cast<std::ptrdiff_t>(plane) - shift);
            for (std::ptrdiff_t i = first; i < last; i++) dst[i] = src[i + shift];
            for (int oh = oh_begin; oh < oh_end; oh++) {
              float* row = dst + static_cast<std::size_t>(oh) * OW;
              for (int ow = 0; ow < ow_begin; ow++) row[ow] = 0.0f;
              for (int ow = ow_end; ow < OW; ow++) row[ow] = 0.0f;
            }
            continue;
          }
          for (int oh = oh_begin; oh < oh_end; oh++) {
            float* __restrict row = dst + static_cast<std::size_t>(oh) * OW;
            const float* __restrict src_row =
                src + static_cast<std::size_t>(oh * s.stride - s.pad + kh) * s.W;
            for (int ow = 0; ow < ow_begin; ow++) row[ow] = 0.0f;
            for (int ow = ow_begin; ow < ow_end; ow++) row[ow] = src_row[ow * s.stride - s.pad + kw];
            for (int ow = ow_end; ow < OW; ow++) row[ow] = 0.0f;
          }
        }
      }
    }
  }
}

// dinp [B][C] = d [B][OC] · weight [OC][C] for a batch smaller than OC. XNNPACK would have
// to pack the whole weight matrix (it changes every step) for a GEMM of only B rows:
// for the paper's FC1 (128 x 3136) at batch 10 the packing cost four times the product.
// Streaming the weights once instead, four rows at a time, against a 128-column tile of
// dinp that stays in L1, needs no packing.
// Tiles go to the pool's threads in pairs (each tile's output is its own, so the result does
// not depend on the thread count).
void fully_connected_input_gradient(float* dinp, const float* d, const float* weight, std::size_t B,
                                    std::size_t C, std::size_t OC, pthreadpool_t pool) {
  constexpr std::size_t kTile = 128;  // measured: 128 to 512 are within 10%; 128 is best on x86-64
  parallel_for_blocks(pool, C, 2 * kTile, [&](std::size_t c_begin, std::size_t c_end) {
    for (std::size_t c0 = c_begin; c0 < c_end; c0 += kTile) {
      const std::size_t n = std::min(kTile, c_end - c0);
      for (std::size_t b = 0; b < B; b++) std::memset(dinp + b * C + c0, 0, sizeof(float) * n);
      std::size_t o = 0;
      for (; o + 4 <= OC;
           o += 4) {  // four weight rows per pass over the tile: a quarter of the dinp traffic
        const float* __restrict w0 = weight + o * C + c0;
        const float* __restrict w1 = w0 + C;
        const float* __restrict w2 = w1 + C;
        const float* __restrict w3 = w2 + C;
        // Two rows of dinp per pass share the weight loads (each value's sum as before).
        std::size_t b = 0;
        for (; b + 2 <= B; b += 2) {
          const float* s = d + b * OC + o;
          const float s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];
          const float t0 = s[OC], t1 = s[OC + 1], t2 = s[OC + 2], t3 = s[OC + 3];
          float* __restrict out = dinp + b * C + c0;
          float* __restrict out_next = out + C;
          for (std::size_t j = 0; j < n; j++) {
            const float x0 = w0[j], x1 = w1[j], x2 = w2[j], x3 = w3[j];
            out[j] += s0 * x0 + s1 * x1 + s2 * x2 + s3 * x3;
            out_next[j] += t0 * x0 + t1 * x1 + t2 * x2 + t3 * x3;
          }
        }
        for (; b < B; b++) {
          const float* s = d + b * OC + o;
          const float s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];
          float* __restrict out = dinp + b * C + c0;
          for (std::size_t j = 0; j < n; j++)
            out[j] += s0 * w0[j] + s1 * w1[j] + s2 * w2[j] + s3 * w3[j];
        }
      }
      for (; o < OC; o++) {
        const float* __restrict w0 = weight + o * C + c0;
        for (std::size_t b = 0; b < B; b++) {
          const float s0 = d[b * OC + o];
          float* __restrict out = dinp + b * C + c0;
          for (std::size_t j = 0; j < n; j++) out[j] += s0 * w0[j];
        }
      }
    }
  });
}

// acc[oc] += x[ow * stride] * d[ow][oc] for ow in [ow_begin, ow_end), oc < OC: one tap of
// the one-channel weight gradient over an output row. 16 channels at a time in four vector
// registers held across the row (GCC kept storing the accumulators on every pixel: 1.0 ms
// of a 11.5 ms batch-32 step); each sum still runs over ow in order, as the plain loop's.
inline void accumulate_tap(float* __restrict acc, const float* __restrict d,
                           const float* __restrict x, int ow_begin, int ow_end, int stride,
                           std::size_t OC) {
  using Vec4 = float __attribute__((vector_size(16)));
  std::size_t oc = 0;
  for (; oc + 16 <= OC; oc += 16) {
    Vec4 a0, a1, a2, a3;
    std::memcpy(&a0, acc + oc, sizeof a0);
    std::memcpy(&a1, acc + oc + 4, sizeof a1);
    std::memcpy(&a2, acc + oc + 8, sizeof a2);
    std::memcpy(&a3, acc + oc + 12, sizeof a3);
    for (int ow = ow_begin; ow < ow_end; ow++) {
      const float v = x[ow * stride];
      const float* dm = d + static_cast<std::size_t>(ow) * OC + oc;
      Vec4 d0, d1, d2, d3;
      std::memcpy(&d0, dm, sizeof d0);
      std::memcpy(&d1, dm + 4, sizeof d1);
      std::memcpy(&d2, dm + 8, sizeof d2);
      std::memcpy(&d3, dm + 12, sizeof d3);
      a0 += v * d0;
      a1 += v * d1;
      a2 += v * d2;
      a3 += v * d3;
    }
    std::memcpy(acc + oc, &a0, sizeof a0);
    std::memcpy(acc + oc + 4, &a1, sizeof a1);
    std::memcpy(acc + oc + 8, &a2, sizeof a2);
    std::memcpy(acc + oc + 12, &a3, sizeof a3);
  }
  for (; oc < OC; oc++) {
    float a = acc[oc];
    for (int ow = ow_begin; ow < ow_end; ow++)
      a += x[ow * stride] * d[static_cast<std::size_t>(ow) * OC + oc];
    acc[oc] = a;
  }
}

// Weight and bias gradients of a convolution with ONE input channel (grey images: the
// first layer), in one pass over dout with the ReLU mask (out, nullable) folded in.
// XNNPACK's GEMM is a poor fit here: one operand (M x KH*KW patches or M x OC dout) must
// be packed for an output of only OC x KH*KW values, with N = 9 wasting most of a
// microkernel tile. Image by image (the images spread over the pool's threads): per output
// row, mask it into the image's `masked_rows` row [OW][OC] (stays in L1), add it to the
// image's bias sum, then for each tap accumulate x * d over the row into the image's
// tap-major sums, so the innermost loops run over contiguous OC. `image_sums` holds
// [B][KH*KW + 1][OC] (the taps, then the bias); the images' sums are then added in image
// order, so the result is the same for every thread count.
void conv2d_weight_gradient_single_channel(float* dweight, float* dbias, float* image_sums,
                                           float* masked_rows, const float* dout, const float* out,
                                           const float* inp, const Conv2dShape& s,
                                           pthreadpool_t pool) {
  const std::size_t OC = s.OC, taps = static_cast<std::size_t>(s.KH) * s.KW;
  const std::size_t sums_size = (taps + 1) * OC;
  const int OH = s.OH(), OW = s.OW();
  const std::size_t row_size = static_cast<std::size_t>(OW) * OC;
  parallel_for_blocks(
      pool, static_cast<std::size_t>(s.B), 1, [&](std::size_t b_begin, std::size_t b_end) {
        for (std::size_t b = b_begin; b < b_end; b++) {
          float* __restrict sums = image_sums + b * sums_size;
          float* __restrict bias_sum = sums + taps * OC;
          float* masked_row = masked_rows ? masked_rows + b * row_size : nullptr;
          std::memset(sums, 0, sizeof(float) * sums_size);
          const float* image = inp + b * s.H * s.W;
          for (int oh = 0; oh < OH; oh++) {
            const std::size_t row_offset = (b * OH + oh) * row_size;
            const float* d = dout + row_offset;
            if (out) {
              relu_backward(masked_row, d, out + row_offset, row_size);
              d = masked_row;
            }
            bias_backward_accumulate(bias_sum, d, OW, OC);
            for (int kh = 0; kh < s.KH; kh++) {
              const int ih = oh * s.stride - s.pad + kh;
              if (ih < 0 || ih >= s.H) continue;
              const float* image_row = image + static_cast<std::size_t>(ih) * s.W;
              for (int kw = 0; kw < s.KW; kw++) {
                float* __restrict acc = sums + static_cast<std::size_t>(kh * s.KW + kw) * OC;
                // Output columns whose tap falls inside the image (iw = ow*stride - pad + kw).
                int ow_begin = 0, ow_end = OW;
                while (ow_begin < OW && ow_begin * s.stride - s.pad + kw < 0) ow_begin++;
                while (ow_end > ow_begin && (ow_end - 1) * s.stride - s.pad + kw >= s.W) ow_end--;
                accumulate_tap(acc, d, image_row + kw - s.pad, ow_begin, ow_end, s.stride, OC);
              }
            }
          }
        }
      });
  // The images' sums, added in image order into the first image's.
  float* __restrict total = image_sums;
  for (int b = 1; b < s.B; b++) {
    const float* __restrict sums = image_sums + static_cast<std::size_t>(b) * sums_size;
    for (std::size_t i = 0; i < sums_size; i++) total[i] += sums[i];
  }
  transpose(dweight, total, taps, OC);
  if (dbias) std::memcpy(dbias, total + taps * OC, sizeof(float) * OC);
}

// out[j][i] = inp[i][j] for a 4x4 block (row strides in floats): four vector loads, eight
// shuffles, four vector stores. GCC and Clang vector extensions (SSE on x86-64, NEON on
// aarch64); GCC does not vectorize the scalar loop itself.
inline void transpose_4x4(float* out, std::size_t out_stride, const float* inp,
                          std::size_t inp_stride) {
  using Vec4 = float __attribute__((vector_size(16)));
  Vec4 r0, r1, r2, r3;
  std::memcpy(&r0, inp, sizeof r0);
  std::memcpy(&r1, inp + inp_stride, sizeof r1);
  std::memcpy(&r2, inp + 2 * inp_stride, sizeof r2);
  std::memcpy(&r3, inp + 3 * inp_stride, sizeof r3);
  const Vec4 t0 = __builtin_shufflevector(r0, r1, 0, 4, 1, 5);  // a0 b0 a1 b1
  const Vec4 t1 = __builtin_shufflevector(r0, r1, 2, 6, 3, 7);  // a2 b2 a3 b3
  const Vec4 t2 = __builtin_shufflevector(r2, r3, 0, 4, 1, 5);  // c0 d0 c1 d1
  const Vec4 t3 = __builtin_shufflevector(r2, r3, 2, 6, 3, 7);  // c2 d2 c3 d3
  const Vec4 o0 = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
  const Vec4 o1 = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
  const Vec4 o2 = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
  const Vec4 o3 = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
  std::memcpy(out, &o0, sizeof o0);
  std::memcpy(out + out_stride, &o1, sizeof o1);
  std::memcpy(out + 2 * out_stride, &o2, sizeof o2);
  std::memcpy(out + 3 * out_stride, &o3, sizeof o3);
}

}  // namespace

void XnnOperator::reset() {
  if (op_) xnn_delete_operator(op_);
  op_ = nullptr;
}

void bias_backward(float* dbias, const float* dout, std::size_t rows, std::size_t OC) {
  if (!dbias) return;
  std::memset(dbias, 0, sizeof(float) * OC);
  bias_backward_accumulate(dbias, dout, rows, OC);
}

void transpose(float* out, const float* inp, std::size_t rows, std::size_t cols) {
  // 32x32 tiles keep both the reads and the strided writes in L1.
  constexpr std::size_t kTile = 32;
  for (std::size_t r0 = 0; r0 < rows; r0 += kTile) {
    const std::size_t r1 = std::min(rows, r0 + kTile);
    for (std::size_t c0 = 0; c0 < cols; c0 += kTile) {
      const std::size_t c1 = std::min(cols, c0 + kTile);
      std::size_t r = r0;
      for (; r + 4 <= r1; r += 4) {
        // 4x4 blocks in vector registers (a scalar store per value was a third of
        // Conv2dXnn's own time in resnet-8's step).
        std::size_t c = c0;
        for (; c + 4 <= c1; c += 4) transpose_4x4(out + c * rows + r, rows, inp + r * cols + c, cols);
        for (; c < c1; c++)
          for (std::size_t i = 0; i < 4; i++) out[c * rows + r + i] = inp[(r + i) * cols + c];
      }
      for (; r < r1; r++)
        for (std::size_t c = c0; c < c1; c++) out[c * rows + r] = inp[r * cols + c];
    }
  }
}

// ---------------------------------------------------------------------------------------
FullyConnectedTrainXnn::FullyConnectedTrainXnn(std::size_t B, std::size_t C, std::size_t OC,
                                               Activation activation, pthreadpool_t pool)
    : B_(B),
      C_(C),
      OC_(OC),
      activation_(activation),
      pool_(pool),
      out_transposed_(B < OC ? B * OC : 0),
      dout_masked_(activation == Activation::relu ? B * OC : 0),
      dout_transposed_(B * OC) {
  ensure_xnnpack_initialized();
}

void FullyConnectedTrainXnn::forward(float* out, const float* inp, const float* weight,
                                     const float* bias) {
  if (B_ < OC_) {
    // Pack the activations (B*C values) rather than the weights (OC*C): out^T = weight · inp^T.
    run_fully_connected(forward_op_, out_transposed_.data(), weight, OC_, C_, B_, inp, false,
                        nullptr, -kInfinity, pool_);
    const bool relu = activation_ == Activation::relu;
    for (std::size_t b = 0; b < B_; b++) {
      for (std::size_t o = 0; o < OC_; o++) {
        const float v = out_transposed_[o * B_ + b] + (bias ? bias[o] : 0.0f);
        out[b * OC_ + o] = relu && v < 0.0f ? 0.0f : v;
      }
    }
  } else {
    run_fully_connected(forward_op_, out, inp, B_, C_, OC_, weight, false, bias,
                        output_min(activation_), pool_);
  }
}

void FullyConnectedTrainXnn::backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                      const float* out, const float* inp, const float* weight) {
  const float* d = apply_relu_mask(activation_, dout_masked_.data(), dout, out, B_ * OC_, pool_);
  bias_backward(dbias, d, B_, OC_);
  // dinp [B][C] = d [B][OC] · weight [OC][C]: weight is already the K x N operand, but
  // packing it only pays off for a batch of at least OC rows.
  if (dinp && B_ < OC_) {
    fully_connected_input_gradient(dinp, d, weight, B_, C_, OC_, pool_);
  } else if (dinp) {
    run_fully_connected(dinp_op_, dinp, d, B_, OC_, C_, weight, true, nullptr, -kInfinity, pool_);
  }
  // dweight [OC][C] = d^T [OC][B] · inp [B][C]: packs the activations (B*C), the smaller
  // operand for a batch smaller than OC, and writes dweight in place.
  if (!dweight) return;  // an input gradient alone
  transpose(dout_transposed_.data(), d, B_, OC_);
  run_fully_connected(dweight_op_, dweight, dout_transposed_.data(), OC_, B_, C_, inp, true,
                      nullptr, -kInfinity, pool_);
}

// ---------------------------------------------------------------------------------------
Conv2dXnn::Conv2dXnn(const Conv2dShape& shape, Activation activation, pthreadpool_t pool)
    : s_(shape),
      activation_(activation),
      pool_(pool),
      M_(static_cast<std::size_t>(shape.B) * shape.OH() * shape.OW()),
      K_(static_cast<std::size_t>(shape.KH) * shape.KW * shape.C),
      single_channel_(shape.C == 1),
      pack_patches_(K_ <= static_cast<std::size_t>(shape.OC)),
      weight_swapped_(K_ * shape.OC),
      // A single-channel layer without an input gradient (the usual first layer) masks one
      // output row of each image at a time; a whole copy is made on the first call that
      // needs it.
      dout_masked_(activation == Activation::relu && single_channel_
                       ? static_cast<std::size_t>(shape.B) * shape.OW() * shape.OC
                       : 0),
      // Packing dout, the weight gradient goes image by image: one image's patches.
      patches_(single_channel_ ? 0 : (pack_patches_ ? M_ : M_ / shape.B) * K_),
      dout_transposed_(!single_channel_ && pack_patches_ ? M_ * shape.OC : 0),
      dweight_transposed_(!single_channel_ && !pack_patches_ ? K_ * shape.OC : 0),
      dweight_image_(!single_channel_ && !pack_patches_ && shape.B > 1 ? K_ * shape.OC : 0),
      input_planes_(!single_channel_ && !pack_patches_
                        ? static_cast<std::size_t>(shape.H) * shape.W * shape.C
                        : 0),
      image_sums_(single_channel_ ? static_cast<std::size_t>(shape.B) * (K_ + 1) * shape.OC : 0) {
  ensure_xnnpack_initialized();
  if (s_.OH() <= 0 || s_.OW() <= 0) throw std::invalid_argument("Conv2dXnn: empty output");
  // Packing dout on a pool: the images' weight-gradient products go to the threads (each
  // slot with its own scratch, operator and product), added in image order as on one
  // thread (kernels/README.md).
  const std::size_t threads = pool ? pthreadpool_get_threads_count(pool) : 1;
  if (!single_channel_ && !pack_patches_ && threads > 1 && s_.B > 1) {
    slots_ = std::min<std::size_t>(threads, static_cast<std::size_t>(s_.B));
    slot_ops_ = std::make_unique<XnnOperator[]>(slots_);
    slot_errors_ = std::make_unique<std::exception_ptr[]>(slots_);
    patches_.resize(slots_ * patches_.size());
    input_planes_.resize(slots_ * input_planes_.size());
    dweight_image_.assign(slots_ * K_ * s_.OC, 0.0f);
  }
}

void Conv2dXnn::forward(float* out, const float* inp, const float* weight, const float* bias) {
  const auto p = static_cast<std::uint32_t>(s_.pad);
  check(xnn_create_convolution2d_nhwc_f32(
            p, p, p, p, s_.KH, s_.KW, s_.stride, s_.stride, 1, 1, /*groups=*/1, s_.C, s_.OC, s_.C,
            s_.OC, weight, bias, output_min(activation_), kInfinity, 0, forward_op_.out_param()),
        "xnn_create_convolution2d_nhwc_f32");
  check(xnn_setup_convolution2d_nhwc_f32(forward_op_.get(), s_.B, s_.H, s_.W, inp, out, pool_),
        "xnn_setup_convolution2d_nhwc_f32");
  check(xnn_run_operator(forward_op_.get(), pool_), "xnn_run_operator (convolution)");
}

void Conv2dXnn::backward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* out, const float* inp, const float* weight) {
  const bool masks_a_copy = activation_ == Activation::relu && out && !(single_channel_ && !dinp);
  if (masks_a_copy && dout_masked_.size() < M_ * static_cast<std::size_t>(s_.OC))
    dout_masked_.resize(M_ * static_cast<std::size_t>(s_.OC));  // the first call that needs it
  backward_into(dinp, dweight, dbias, dout, dout_masked_.data(), out, inp, weight);
}

void Conv2dXnn::backward_overwriting_dout(float* dinp, float* dweight, float* dbias, float* dout,
                                          const float* out, const float* inp,
                                          const float* weight) {
  backward_into(dinp, dweight, dbias, dout, dout, out, inp, weight);
}

void Conv2dXnn::backward_into(float* dinp, float* dweight, float* dbias, const float* dout,
                              float* masked, const float* out, const float* inp,
                              const float* weight) {
  const std::size_t OC = s_.OC;
  if (single_channel_ &&
      !dinp) {  // the usual first layer: mask folded into the one pass, one row of scratch
    conv2d_weight_gradient_single_channel(dweight, dbias, image_sums_.data(), dout_masked_.data(),
                                          dout, activation_ == Activation::relu ? out : nullptr,
                                          inp, s_, pool_);
    return;
  }
  // In place (masked == dout) each entry is read before it is written.
  const float* d = apply_relu_mask(activation_, masked, dout, out, M_ * OC, pool_);
  if (!single_channel_) bias_backward_parallel(dbias, d, M_, OC, pool_);

  if (dinp) {
    // The input gradient is the transposed convolution of d with the same taps; XNNPACK's
    // deconvolution maps OC -> C, so its kernel is the weight with O and I swapped.
    // weight [OC][taps][C] -> [C][taps][OC]; a small tensor, so a plain loop.
    const std::size_t taps = static_cast<std::size_t>(s_.KH) * s_.KW, C = s_.C;
    for (std::size_t oc = 0; oc < OC; oc++)
      for (std::size_t t = 0; t < taps; t++)
        for (std::size_t c = 0; c < C; c++)
          weight_swapped_[(c * taps + t) * OC + oc] = weight[(oc * taps + t) * C + c];
    const auto p = static_cast<std::uint32_t>(s_.pad);
    const std::uint32_t adjust_h = s_.H - ((s_.OH() - 1) * s_.stride + s_.KH - 2 * s_.pad);
    const std::uint32_t adjust_w = s_.W - ((s_.OW() - 1) * s_.stride + s_.KW - 2 * s_.pad);
    check(xnn_create_deconvolution2d_nhwc_f32(p, p, p, p, s_.KH, s_.KW, s_.stride, s_.stride, 1, 1,
                                              /*groups=*/1, s_.OC, s_.C, s_.OC, s_.C,
                                              weight_swapped_.data(), nullptr, -kInfinity,
                                              kInfinity, 0, dinp_op_.out_param()),
          "xnn_create_deconvolution2d_nhwc_f32");
    check(xnn_setup_deconvolution2d_nhwc_f32(dinp_op_.get(), s_.B, s_.OH(), s_.OW(), adjust_h,
                                             adjust_w, d, dinp, pool_),
          "xnn_setup_deconvolution2d_nhwc_f32");
    check(xnn_run_operator(dinp_op_.get(), pool_), "xnn_run_operator (deconvolution)");
  }

  if (!dweight) {  // an input gradient alone (kernel_bench --per-layer times it so)
    if (single_channel_) bias_backward_parallel(dbias, d, M_, OC, pool_);
    return;
  }
  if (single_channel_) {
    conv2d_weight_gradient_single_channel(dweight, dbias, image_sums_.data(), nullptr, d, nullptr,
                                          inp, s_, pool_);
    return;
  }
  // dweight [OC][K] = d^T [OC][M] · patches [M][K], packing whichever of patches (M*K)
  // and d (M*OC) is smaller.
  if (pack_patches_) {
    im2col(patches_.data(), inp, s_);
    transpose(dout_transposed_.data(), d, M_, OC);
    run_fully_connected(dweight_op_, dweight, dout_transposed_.data(), OC, M_, K_, patches_.data(),
                        true, nullptr, -kInfinity, pool_);
  } else {
    // Image by image, the products added up: the patches of one image, [K][OH*OW], rather
    // than the batch's (2.3 MB for the paper CNN's second conv at batch 10), and one image's
    // dout packed at a time. The sum runs in another order than one product over the batch
    // would; the reference loops are the definition either way.
    Conv2dShape image = s_;
    image.B = 1;
    const std::size_t pixels = M_ / static_cast<std::size_t>(s_.B);
    const std::size_t image_size = static_cast<std::size_t>(s_.H) * s_.W * s_.C;
    if (slots_ > 1) {
      weight_gradient_on_slots(d, inp);
      transpose(dweight, dweight_transposed_.data(), K_, OC);
      return;
    }
    for (int b = 0; b < s_.B; b++) {
      im2col_transposed(patches_.data(), input_planes_.data(),
                        inp + static_cast<std::size_t>(b) * image_size, image);
      float* product = b == 0 ? dweight_transposed_.data() : dweight_image_.data();
      run_fully_connected(dweight_op_, product, patches_.data(), K_, pixels, OC,
                          d + static_cast<std::size_t>(b) * pixels * OC, true, nullptr, -kInfinity,
                          pool_);
      if (b > 0)
        for (std::size_t i = 0; i < K_ * OC; i++) dweight_transposed_[i] += product[i];
    }
    transpose(dweight, dweight_transposed_.data(), K_, OC);
  }
}

void Conv2dXnn::weight_gradient_on_slots(const float* d, const float* inp) {
  const std::size_t OC = s_.OC, B = s_.B;
  const std::size_t pixels = M_ / B, product_size = K_ * OC;
  const std::size_t image_size = static_cast<std::size_t>(s_.H) * s_.W * s_.C;
  const std::size_t patches_size = patches_.size() / slots_,
                    planes_size = input_planes_.size() / slots_;
  Conv2dShape image = s_;
  image.B = 1;
  next_image_.store(0, std::memory_order_relaxed);
  slot_failed_.store(false, std::memory_order_relaxed);
  // One task per slot; with as many tasks as threads (slots_ <= threads), pthreadpool gives
  // each thread one, so every slot runs at once and waiting for another cannot deadlock.
  // Slot `slot` takes images slot, slot + slots, ... : each image's im2col and GEMM on its own
  // (its own operator, no pool inside: the GEMM's tiles and sums are the same), then, once
  // the image before it has been added, adds its product into dweight_transposed_ (image 0
  // writes it): the sum runs in image order, as on one thread, and each slot needs one
  // product buffer. The adds take ~1/10 of a GEMM, so the slots rarely wait.
  parallel_for_blocks(pool_, slots_, 1, [&](std::size_t slot_begin, std::size_t slot_end) {
    for (std::size_t slot = slot_begin; slot < slot_end; slot++) {
      float* patches = patches_.data() + slot * patches_size;
      float* planes = input_planes_.data() + slot * planes_size;
      float* product = dweight_image_.data() + slot * product_size;
      try {
        for (std::size_t b = slot; b < B; b += slots_) {
          im2col_transposed(patches, planes, inp + b * image_size, image);
          float* target = b == 0 ? dweight_transposed_.data() : product;
          run_fully_connected(slot_ops_[slot], target, patches, K_, pixels, OC, d + b * pixels * OC,
                              true, nullptr, -kInfinity, nullptr);
          while (next_image_.load(std::memory_order_acquire) != b) {
            if (slot_failed_.load(std::memory_order_relaxed)) return;
            std::this_thread::yield();
          }
          if (b > 0) {
            float* __restrict sum = dweight_transposed_.data();
            const float* __restrict add = product;
            for (std::size_t i = 0; i < product_size; i++) sum[i] += add[i];
          }
          next_image_.store(b + 1, std::memory_order_release);
        }
      } catch (...) {
        slot_errors_[slot] = std::current_exception();
        slot_failed_.store(true, std::memory_order_relaxed);
      }
    }
  });
  for (std::size_t slot = 0; slot < slots_; slot++)
    if (slot_errors_[slot]) std::rethrow_exception(std::exchange(slot_errors_[slot], nullptr));
}

// ---------------------------------------------------------------------------------------
MaxPool2x2Xnn::MaxPool2x2Xnn(int B, int H, int W, int C, pthreadpool_t pool)
    : B_(B),
      H_(H),
      W_(W),
      C_(C),
      pool_(pool),
      unpooled_((H % 2 || W % 2) ? static_cast<std::size_t>(B) * (H / 2 * 2) * (W / 2 * 2) * C
                                 : 0) {
  ensure_xnnpack_initialized();
  if (H < 2 || W < 2) throw std::invalid_argument("MaxPool2x2Xnn: input smaller than the window");
  check(xnn_create_argmax_pooling2d_nhwc_f32(0, 0, 0, 0, 2, 2, C, C, C, 0, pool_op_.out_param()),
        "xnn_create_argmax_pooling2d_nhwc_f32");
  check(xnn_create_unpooling2d_nhwc_x32(0, 0, 0, 0, 2, 2, C, C, C, 0, unpool_op_.out_param()),
        "xnn_create_unpooling2d_nhwc_x32");
}

void MaxPool2x2Xnn::forward(float* out, std::uint32_t* window_index, const float* inp) {
  check(xnn_setup_argmax_pooling2d_nhwc_f32(pool_op_.get(), B_, H_, W_, inp, out, window_index,
                                            pool_),
        "xnn_setup_argmax_pooling2d_nhwc_f32");
  check(xnn_run_operator(pool_op_.get(), pool_), "xnn_run_operator (argmax pooling)");
}

void MaxPool2x2Xnn::backward(float* dinp, const float* dout, const std::uint32_t* window_index) {
  const int OH = H_ / 2, OW = W_ / 2;
  float* target = unpooled_.empty() ? dinp : unpooled_.data();
  check(xnn_setup_unpooling2d_nhwc_x32(unpool_op_.get(), B_, OH, OW, dout, window_index, target,
                                       pool_),
        "xnn_setup_unpooling2d_nhwc_x32");
  check(xnn_run_operator(unpool_op_.get(), pool_), "xnn_run_operator (unpooling)");
  if (unpooled_.empty()) return;
  // Odd H or W: the last row/column never wins, so its gradient is zero.
  const std::size_t row_in = static_cast<std::size_t>(2 * OW) * C_,
                    row_out = static_cast<std::size_t>(W_) * C_;
  for (int b = 0; b < B_; b++) {
    for (int h = 0; h < H_; h++) {
      float* dst = dinp + (static_cast<std::size_t>(b) * H_ + h) * row_out;
      if (h < 2 * OH) {
        std::memcpy(dst, unpooled_.data() + (static_cast<std::size_t>(b) * 2 * OH + h) * row_in,
                    sizeof(float) * row_in);
        std::memset(dst + row_in, 0, sizeof(float) * (row_out - row_in));
      } else {
        std::memset(dst, 0, sizeof(float) * row_out);
      }
    }
  }
}

std::uint32_t MaxPool2x2Xnn::window_index_to_flat(std::size_t i, std::uint32_t window_index) const {
  const std::size_t OW = W_ / 2, OH = H_ / 2;
  const std::size_t c = i % C_, ow = (i / C_) % OW, oh = (i / C_ / OW) % OH, b = i / C_ / OW / OH;
  const std::size_t dy = window_index % 2,
                    dx = window_index / 2;  // XNNPACK scans windows column by column
  return static_cast<std::uint32_t>(((b * H_ + 2 * oh + dy) * W_ + 2 * ow + dx) * C_ + c);
}

// ---------------------------------------------------------------------------------------
DepthwiseConv2dXnn::DepthwiseConv2dXnn(const Conv2dShape& shape, Activation activation,
                                       pthreadpool_t pool)
    : s_(shape),
      activation_(activation),
      pool_(pool),
      dweight_by_tap_(static_cast<std::size_t>(shape.KH) * shape.KW * shape.C),
      weight_by_tap_(dweight_by_tap_.size()) {
  ensure_xnnpack_initialized();
  if (s_.OC != s_.C) throw std::invalid_argument("DepthwiseConv2dXnn: OC must equal C");
  if (s_.OH() <= 0 || s_.OW() <= 0) throw std::invalid_argument("DepthwiseConv2dXnn: empty output");
}

void DepthwiseConv2dXnn::forward(float* out, const float* inp, const float* weight,
                                 const float* bias) {
  const auto p = static_cast<std::uint32_t>(s_.pad);
  // groups = C, one input and one output channel per group: the kernel layout is
  // [C][KH][KW][1], ours. (XNN_FLAG_DEPTHWISE_CONVOLUTION would want [1][KH][KW][C].)
  check(xnn_create_convolution2d_nhwc_f32(p, p, p, p, s_.KH, s_.KW, s_.stride, s_.stride, 1, 1,
                                          /*groups=*/s_.C, 1, 1, s_.C, s_.C, weight, bias,
                                          output_min(activation_), kInfinity, 0,
                                          forward_op_.out_param()),
        "xnn_create_convolution2d_nhwc_f32 (depthwise)");
  check(xnn_setup_convolution2d_nhwc_f32(forward_op_.get(), s_.B, s_.H, s_.W, inp, out, pool_),
        "xnn_setup_convolution2d_nhwc_f32 (depthwise)");
  check(xnn_run_operator(forward_op_.get(), pool_), "xnn_run_operator (depthwise convolution)");
}

void DepthwiseConv2dXnn::backward_overwriting_dout(float* dinp, float* dweight, float* dbias,
                                                   float* dout, const float* out, const float* inp,
                                                   const float* weight) {
  const int OH = s_.OH(), OW = s_.OW();
  const std::size_t C = s_.C, M = static_cast<std::size_t>(s_.B) * OH * OW;
  const float* d = apply_relu_mask(activation_, dout, dout, out, M * C, pool_);
  bias_backward_parallel(dbias, d, M, C, pool_);
  // One pass over the output pixels and taps, the innermost loops over contiguous channels:
  // dweight[c][tap] = sum of d * the input under that tap, accumulated tap-major and
  // transposed at the end; and, when asked, dinp = the transposed depthwise convolution of
  // d, each output pixel's gradient spread over its taps. XNNPACK's deconvolution with
  // groups = C gave the input gradient 3-6x slower for the whole op (one-channel groups
  // waste its GEMM tiles): 14x14x32 at batch 10, forward + backward 0.80 -> 0.26 ms,
  // stride 2 0.40 -> 0.07 ms (kernel_bench --op, x86-64, 1 thread, interleaved runs).
  const std::size_t taps = static_cast<std::size_t>(s_.KH) * s_.KW;
  float* __restrict acc_all = dweight_by_tap_.data();
  std::memset(acc_all, 0, sizeof(float) * taps * C);
  if (dinp) {
    transpose(weight_by_tap_.data(), weight, C, taps);
    std::memset(dinp, 0, sizeof(float) * s_.B * s_.H * s_.W * C);
  }
  for (int b = 0; b < s_.B; b++) {
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        const float* __restrict dm = d + ((static_cast<std::size_t>(b) * OH + oh) * OW + ow) * C;
        for (int kh = 0; kh < s_.KH; kh++) {
          const int ih = oh * s_.stride - s_.pad + kh;
          if (ih < 0 || ih >= s_.H) continue;
          for (int kw = 0; kw < s_.KW; kw++) {
            const int iw = ow * s_.stride - s_.pad + kw;
            if (iw < 0 || iw >= s_.W) continue;
            const std::size_t at = ((static_cast<std::size_t>(b) * s_.H + ih) * s_.W + iw) * C;
            const std::size_t tap = static_cast<std::size_t>(kh * s_.KW + kw) * C;
            const float* __restrict x = inp + at;
            float* __restrict acc = acc_all + tap;
            for (std::size_t c = 0; c < C; c++) acc[c] += dm[c] * x[c];
            if (dinp) {
              float* __restrict dx = dinp + at;
              const float* __restrict w = weight_by_tap_.data() + tap;
              for (std::size_t c = 0; c < C; c++) dx[c] += dm[c] * w[c];
            }
          }
        }
      }
    }
  }
  transpose(dweight, acc_all, taps, C);
}

// ---------------------------------------------------------------------------------------
AvgPoolXnn::AvgPoolXnn(int B, int H, int W, int C, int K, pthreadpool_t pool)
    : B_(B), H_(H), W_(W), C_(C), K_(K), pool_(pool) {
  ensure_xnnpack_initialized();
  if (K < 2 || H < K || W < K)
    throw std::invalid_argument("AvgPoolXnn: window below 2 or larger than the input");
  const auto k = static_cast<std::uint32_t>(K);
  check(xnn_create_average_pooling2d_nhwc_f32(0, 0, 0, 0, k, k, k, k, C, C, C, -kInfinity,
                                              kInfinity, 0, op_.out_param()),
        "xnn_create_average_pooling2d_nhwc_f32");
}

void AvgPoolXnn::forward(float* out, const float* inp) {
  check(xnn_setup_average_pooling2d_nhwc_f32(op_.get(), B_, H_, W_, inp, out, pool_),
        "xnn_setup_average_pooling2d_nhwc_f32");
  check(xnn_run_operator(op_.get(), pool_), "xnn_run_operator (average pooling)");
}

void AvgPoolXnn::backward(float* dinp, const float* dout) {
  const int OH = H_ / K_, OW = W_ / K_;
  const std::size_t C = C_;
  const float scale = 1.0f / static_cast<float>(K_ * K_);
  for (int b = 0; b < B_; b++) {
    for (int h = 0; h < H_; h++) {
      float* __restrict row = dinp + (static_cast<std::size_t>(b) * H_ + h) * W_ * C;
      if (h >= OH * K_) {  // a leftover row is in no window
        std::memset(row, 0, sizeof(float) * W_ * C);
        continue;
      }
      const float* d_row = dout + (static_cast<std::size_t>(b) * OH + h / K_) * OW * C;
      for (int w = 0; w < OW * K_; w++) {
        const float* __restrict d = d_row + static_cast<std::size_t>(w / K_) * C;
        float* __restrict x = row + static_cast<std::size_t>(w) * C;
        for (std::size_t c = 0; c < C; c++) x[c] = d[c] * scale;
      }
      std::memset(row + static_cast<std::size_t>(OW) * K_ * C, 0,
                  sizeof(float) * (W_ - OW * K_) * C);
    }
  }
}

// ---------------------------------------------------------------------------------------
GlobalAvgPoolXnn::GlobalAvgPoolXnn(int B, int HW, int C, pthreadpool_t pool)
    : B_(B), HW_(HW), C_(C), pool_(pool) {
  ensure_xnnpack_initialized();
  check(
      xnn_create_global_average_pooling_nwc_f32(C, C, C, -kInfinity, kInfinity, 0, op_.out_param()),
      "xnn_create_global_average_pooling_nwc_f32");
}

void GlobalAvgPoolXnn::forward(float* out, const float* inp) {
  check(xnn_setup_global_average_pooling_nwc_f32(op_.get(), B_, HW_, inp, out, pool_),
        "xnn_setup_global_average_pooling_nwc_f32");
  check(xnn_run_operator(op_.get(), pool_), "xnn_run_operator (global average pooling)");
}

void GlobalAvgPoolXnn::backward(float* dinp, const float* dout) {
  const std::size_t C = C_;
  const float scale = 1.0f / static_cast<float>(HW_);
  for (int b = 0; b < B_; b++) {
    const float* __restrict d = dout + static_cast<std::size_t>(b) * C;
    for (int p = 0; p < HW_; p++) {
      float* __restrict x = dinp + (static_cast<std::size_t>(b) * HW_ + p) * C;
      for (std::size_t c = 0; c < C; c++) x[c] = d[c] * scale;
    }
  }
}

}  // namespace edgetrain::kernels
