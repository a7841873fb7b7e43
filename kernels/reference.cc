#include "kernels/reference.h"

#include <cmath>
#include <cstring>

namespace edgetrain::kernels {

void conv2d_forward_reference(float* out, const float* inp, const float* weight, const float* bias,
                              const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW();
  for (int b = 0; b < s.B; b++) {
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        float* o = out + ((static_cast<std::size_t>(b) * OH + oh) * OW + ow) * s.OC;
        for (int oc = 0; oc < s.OC; oc++) {
          float sum = bias ? bias[oc] : 0.0f;
          for (int kh = 0; kh < s.KH; kh++) {
            const int ih = oh * s.stride - s.pad + kh;
            if (ih < 0 || ih >= s.H) continue;
            for (int kw = 0; kw < s.KW; kw++) {
              const int iw = ow * s.stride - s.pad + kw;
              if (iw < 0 || iw >= s.W) continue;
              const float* x = inp + ((static_cast<std::size_t>(b) * s.H + ih) * s.W + iw) * s.C;
              const float* w =
                  weight + ((static_cast<std::size_t>(oc) * s.KH + kh) * s.KW + kw) * s.C;
              for (int c = 0; c < s.C; c++) sum += x[c] * w[c];
            }
          }
          o[oc] = sum;
        }
      }
    }
  }
}

void conv2d_backward_reference(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW();
  if (dinp) std::memset(dinp, 0, sizeof(float) * s.B * s.H * s.W * s.C);
  std::memset(dweight, 0, sizeof(float) * s.OC * s.KH * s.KW * s.C);
  if (dbias) std::memset(dbias, 0, sizeof(float) * s.OC);
  for (int b = 0; b < s.B; b++) {
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        const float* d = dout + ((static_cast<std::size_t>(b) * OH + oh) * OW + ow) * s.OC;
        for (int oc = 0; oc < s.OC; oc++) {
          if (dbias) dbias[oc] += d[oc];
          for (int kh = 0; kh < s.KH; kh++) {
            const int ih = oh * s.stride - s.pad + kh;
            if (ih < 0 || ih >= s.H) continue;
            for (int kw = 0; kw < s.KW; kw++) {
              const int iw = ow * s.stride - s.pad + kw;
              if (iw < 0 || iw >= s.W) continue;
              const std::size_t x_at = ((static_cast<std::size_t>(b) * s.H + ih) * s.W + iw) * s.C;
              const std::size_t w_at =
                  ((static_cast<std::size_t>(oc) * s.KH + kh) * s.KW + kw) * s.C;
              for (int c = 0; c < s.C; c++) {
                dweight[w_at + c] += d[oc] * inp[x_at + c];
                if (dinp) dinp[x_at + c] += d[oc] * weight[w_at + c];
              }
            }
          }
        }
      }
    }
  }
}

void maxpool2x2_forward_reference(float* out, std::uint32_t* argmax, const float* inp, int B, int H,
                                  int W, int C) {
  const int OH = H / 2, OW = W / 2;
  for (int b = 0; b < B; b++) {
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        for (int c = 0; c < C; c++) {
          std::uint32_t best = 0;
          float best_value = 0.0f;
          bool first = true;
          for (int dy = 0; dy < 2; dy++) {
            for (int dx = 0; dx < 2; dx++) {
              const std::uint32_t at =
                  static_cast<std::uint32_t>(((b * H + 2 * oh + dy) * W + 2 * ow + dx) * C + c);
              if (first || inp[at] > best_value) {
                best = at;
                best_value = inp[at];
                first = false;
              }
            }
          }
          const std::size_t o = ((static_cast<std::size_t>(b) * OH + oh) * OW + ow) * C + c;
          out[o] = best_value;
          argmax[o] = best;
        }
      }
    }
  }
}

void maxpool2x2_backward_reference(float* dinp, const float* dout, const std::uint32_t* argmax,
                                   int B, int H, int W, int C) {
  std::memset(dinp, 0, sizeof(float) * B * H * W * C);
  const std::size_t n_out = static_cast<std::size_t>(B) * (H / 2) * (W / 2) * C;
  for (std::size_t i = 0; i < n_out; i++) dinp[argmax[i]] += dout[i];
}

void depthwise_conv2d_forward_reference(float* out, const float* inp, const float* weight,
                                        const float* bias, const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW();
  for (int b = 0; b < s.B; b++) {
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        float* o = out + ((static_cast<std::size_t>(b) * OH + oh) * OW + ow) * s.C;
        for (int c = 0; c < s.C; c++) {
          float sum = bias ? bias[c] : 0.0f;
          for (int kh = 0; kh < s.KH; kh++) {
            const int ih = oh * s.stride - s.pad + kh;
            if (ih < 0 || ih >= s.H) continue;
            for (int kw = 0; kw < s.KW; kw++) {
              const int iw = ow * s.stride - s.pad + kw;
              if (iw < 0 || iw >= s.W) continue;
              sum += inp[((static_cast<std::size_t>(b) * s.H + ih) * s.W + iw) * s.C + c] *
                     weight[(static_cast<std::size_t>(c) * s.KH + kh) * s.KW + kw];
            }
          }
          o[c] = sum;
        }
      }
    }
  }
}

void depthwise_conv2d_backward_reference(float* dinp, float* dweight, float* dbias,
                                         const float* dout, const float* inp, const float* weight,
                                         const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW();
  if (dinp) std::memset(dinp, 0, sizeof(float) * s.B * s.H * s.W * s.C);
  std::memset(dweight, 0, sizeof(float) * s.C * s.KH * s.KW);
  if (dbias) std::memset(dbias, 0, sizeof(float) * s.C);
  for (int b = 0; b < s.B; b++) {
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        const float* d = dout + ((static_cast<std::size_t>(b) * OH + oh) * OW + ow) * s.C;
        for (int c = 0; c < s.C; c++) {
          if (dbias) dbias[c] += d[c];
          for (int kh = 0; kh < s.KH; kh++) {
            const int ih = oh * s.stride - s.pad + kh;
            if (ih < 0 || ih >= s.H) continue;
            for (int kw = 0; kw < s.KW; kw++) {
              const int iw = ow * s.stride - s.pad + kw;
              if (iw < 0 || iw >= s.W) continue;
              const std::size_t x_at =
                  ((static_cast<std::size_t>(b) * s.H + ih) * s.W + iw) * s.C + c;
              const std::size_t w_at = (static_cast<std::size_t>(c) * s.KH + kh) * s.KW + kw;
              dweight[w_at] += d[c] * inp[x_at];
              if (dinp) dinp[x_at] += d[c] * weight[w_at];
            }
          }
        }
      }
    }
  }
}

void avgpool_forward_reference(float* out, const float* inp, int B, int H, int W, int C, int K) {
  const int OH = H / K, OW = W / K;
  const float scale = 1.0f / static_cast<float>(K * K);
  for (int b = 0; b < B; b++) {
    for (int oh = 0; oh < OH; oh++) {
      for (int ow = 0; ow < OW; ow++) {
        for (int c = 0; c < C; c++) {
          float sum = 0.0f;
          for (int dy = 0; dy < K; dy++)
            for (int dx = 0; dx < K; dx++)
              sum +=
                  inp[((static_cast<std::size_t>(b) * H + oh * K + dy) * W + ow * K + dx) * C + c];
          out[((static_cast<std::size_t>(b) * OH + oh) * OW + ow) * C + c] = sum * scale;
        }
      }
    }
  }
}

void avgpool_backward_reference(float* dinp, const float* dout, int B, int H, int W, int C, int K) {
  std::memset(dinp, 0, sizeof(float) * B * H * W * C);
  const int OH = H / K, OW = W / K;
  const float scale = 1.0f / static_cast<float>(K * K);
  for (int b = 0; b < B; b++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++)
        for (int c = 0; c < C; c++) {
          const float d = dout[((static_cast<std::size_t>(b) * OH + oh) * OW + ow) * C + c] * scale;
          for (int dy = 0; dy < K; dy++)
            for (int dx = 0; dx < K; dx++)
              dinp[((static_cast<std::size_t>(b) * H + oh * K + dy) * W + ow * K + dx) * C + c] = d;
        }
}

void global_avgpool_forward_reference(float* out, const float* inp, int B, int HW, int C) {
  for (int b = 0; b < B; b++) {
    for (int c = 0; c < C; c++) {
      float sum = 0.0f;
      for (int p = 0; p < HW; p++) sum += inp[(static_cast<std::size_t>(b) * HW + p) * C + c];
      out[static_cast<std::size_t>(b) * C + c] = sum / static_cast<float>(HW);
    }
  }
}

void global_avgpool_backward_reference(float* dinp, const float* dout, int B, int HW, int C) {
  for (int b = 0; b < B; b++)
    for (int p = 0; p < HW; p++)
      for (int c = 0; c < C; c++)
        dinp[(static_cast<std::size_t>(b) * HW + p) * C + c] =
            dout[static_cast<std::size_t>(b) * C + c] / static_cast<float>(HW);
}

namespace {
// splitmix64's output function on seed + (i + 1) * golden gamma: element i's draw, as the
// (i + 1)-th output of a splitmix64 stream started at `seed` (common/splitmix64.h's
// SplitMix64{seed}), computed without walking the stream.
inline float dropout_draw(std::uint64_t seed, std::size_t i) {
  std::uint64_t z = seed + (static_cast<std::uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}
}  // namespace

bool dropout_keeps(std::uint64_t seed, std::size_t i, float rate) {
  return dropout_draw(seed, i) >= rate;
}

void dropout_forward(float* out, const float* inp, std::size_t n, float rate, std::uint64_t seed) {
  const float scale = 1.0f / (1.0f - rate);
  for (std::size_t i = 0; i < n; i++)
    out[i] = dropout_draw(seed, i) >= rate ? inp[i] * scale : 0.0f;
}

void dropout_backward(float* dinp, const float* dout, std::size_t n, float rate,
                      std::uint64_t seed) {
  const float scale = 1.0f / (1.0f - rate);
  for (std::size_t i = 0; i < n; i++)
    dinp[i] = dropout_draw(seed, i) >= rate ? dout[i] * scale : 0.0f;
}

void add_forward(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void accumulate(float* sum, const float* addend, std::size_t n) {
  for (std::size_t i = 0; i < n; i++) sum[i] += addend[i];
}

void relu_forward(float* out, const float* inp, std::size_t n) {
  for (std::size_t i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void relu_backward(float* dinp, const float* dout, const float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; i++) {
    // Loading dout unconditionally lets the compiler turn the select into vector blends.
    const float d = dout[i];
    dinp[i] = out[i] > 0.0f ? d : 0.0f;
  }
}

void fully_connected_forward_reference(float* out, const float* inp, const float* weight,
                                       const float* bias, std::size_t B, std::size_t C,
                                       std::size_t OC) {
  for (std::size_t b = 0; b < B; b++) {
    const float* x = inp + b * C;
    for (std::size_t o = 0; o < OC; o++) {
      const float* w = weight + o * C;
      float sum = bias ? bias[o] : 0.0f;
      for (std::size_t c = 0; c < C; c++) sum += x[c] * w[c];
      out[b * OC + o] = sum;
    }
  }
}

void fully_connected_backward_reference(float* dinp, float* dweight, float* dbias,
                                        const float* dout, const float* inp, const float* weight,
                                        std::size_t B, std::size_t C, std::size_t OC) {
  if (dinp) std::memset(dinp, 0, sizeof(float) * B * C);
  if (dweight) std::memset(dweight, 0, sizeof(float) * OC * C);
  if (dbias) std::memset(dbias, 0, sizeof(float) * OC);
  for (std::size_t b = 0; b < B; b++) {
    for (std::size_t o = 0; o < OC; o++) {
      const float d = dout[b * OC + o];
      if (dbias) dbias[o] += d;
      for (std::size_t c = 0; c < C; c++) {
        if (dweight) dweight[o * C + c] += d * inp[b * C + c];
        if (dinp) dinp[b * C + c] += d * weight[o * C + c];
      }
    }
  }
}

float softmax_cross_entropy_forward(float* probs, const float* logits, const std::int32_t* labels,
                                    int B, int NC, int* correct) {
  double loss = 0.0;
  int n_correct = 0;
  for (int b = 0; b < B; b++) {
    const float* z = logits + static_cast<std::size_t>(b) * NC;
    float* p = probs + static_cast<std::size_t>(b) * NC;
    // Subtracting the max keeps exp() finite; the first max is the prediction.
    int best = 0;
    for (int k = 1; k < NC; k++)
      if (z[k] > z[best]) best = k;
    double sum = 0.0;
    for (int k = 0; k < NC; k++) sum += std::exp(static_cast<double>(z[k]) - z[best]);
    for (int k = 0; k < NC; k++)
      p[k] = static_cast<float>(std::exp(static_cast<double>(z[k]) - z[best]) / sum);
    loss += std::log(sum) - (static_cast<double>(z[labels[b]]) - z[best]);
    if (best == labels[b]) n_correct++;
  }
  if (correct) *correct = n_correct;
  return static_cast<float>(loss / B);
}

void softmax_cross_entropy_backward(float* dlogits, const float* probs, const std::int32_t* labels,
                                    int B, int NC) {
  const float scale = 1.0f / static_cast<float>(B);
  for (int b = 0; b < B; b++) {
    for (int k = 0; k < NC; k++) {
      const std::size_t i = static_cast<std::size_t>(b) * NC + k;
      dlogits[i] = (probs[i] - (k == labels[b] ? 1.0f : 0.0f)) * scale;
    }
  }
}

void standardize_per_image(float* out, const float* inp, int B, int N) {
  for (int b = 0; b < B; b++) {
    const float* x = inp + static_cast<std::size_t>(b) * N;
    float* y = out + static_cast<std::size_t>(b) * N;
    double sum = 0.0, sum_sq = 0.0;
    for (int i = 0; i < N; i++) sum += x[i];
    const double mean = sum / N;
    for (int i = 0; i < N; i++) sum_sq += (x[i] - mean) * (x[i] - mean);
    const double stddev = std::sqrt(sum_sq / N);
    // TensorFlow's floor on stddev keeps constant images (stddev 0) finite.
    const double scale = 1.0 / std::fmax(stddev, 1.0 / std::sqrt(static_cast<double>(N)));
    for (int i = 0; i < N; i++) y[i] = static_cast<float>((x[i] - mean) * scale);
  }
}

void sgd_update(float* param, const float* grad, float lr, std::size_t n) {
  for (std::size_t i = 0; i < n; i++) param[i] -= lr * grad[i];
}

}  // namespace edgetrain::kernels
