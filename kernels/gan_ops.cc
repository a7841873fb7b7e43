#include "kernels/gan_ops.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/xnnpack_setup.h"

namespace edgetrain::kernels {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

void check(xnn_status status, const char* what) {
  if (status != xnn_status_success)
    throw std::runtime_error(std::string(what) + " failed (status " + std::to_string(status) + ")");
}

// The conv whose forward is the transposed conv's input gradient.
Conv2dShape adjoint_shape(const Deconv2dShape& s) {
  return Conv2dShape{s.B, s.OH(), s.OW(), s.OC, s.C, s.KH, s.KW, s.stride, s.pad};
}

// [A][taps][B] -> [B][taps][A]
void swap_outer(float* out, const float* inp, std::size_t A, std::size_t taps, std::size_t B) {
  for (std::size_t a = 0; a < A; a++)
    for (std::size_t t = 0; t < taps; t++)
      for (std::size_t b = 0; b < B; b++) out[(b * taps + t) * A + a] = inp[(a * taps + t) * B + b];
}

}  // namespace

void leaky_relu_forward(float* out, const float* inp, std::size_t n, float slope) {
  for (std::size_t i = 0; i < n; i++) out[i] = inp[i] > 0 ? inp[i] : slope * inp[i];
}

void leaky_relu_backward(float* dinp, const float* dout, const float* inp, std::size_t n,
                         float slope) {
  for (std::size_t i = 0; i < n; i++) dinp[i] = inp[i] > 0 ? dout[i] : slope * dout[i];
}

void tanh_forward(float* out, const float* inp, std::size_t n) {
  for (std::size_t i = 0; i < n; i++) out[i] = std::tanh(inp[i]);
}

void tanh_backward(float* dinp, const float* dout, const float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; i++) dinp[i] = dout[i] * (1.0f - out[i] * out[i]);
}

void sigmoid_forward(float* out, const float* inp, std::size_t n) {
  for (std::size_t i = 0; i < n; i++) {
    const float x = inp[i];
    // e^-|x| never overflows; the two branches are the same function.
    const float e = std::exp(-std::fabs(x));
    out[i] = x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
  }
}

float bce_with_logits_forward(const float* logits, const float* targets, std::size_t n) {
  double sum = 0;
  for (std::size_t i = 0; i < n; i++) {
    const double x = logits[i], t = targets[i];
    sum += std::max(x, 0.0) - x * t + std::log1p(std::exp(-std::fabs(x)));
  }
  return n ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f;
}

void bce_with_logits_backward(float* dlogits, const float* logits, const float* targets,
                              std::size_t n) {
  sigmoid_forward(dlogits, logits, n);
  const float scale = n ? 1.0f / static_cast<float>(n) : 0.0f;
  for (std::size_t i = 0; i < n; i++) dlogits[i] = (dlogits[i] - targets[i]) * scale;
}

void deconv2d_forward_reference(float* out, const float* inp, const float* weight,
                                const float* bias, const Deconv2dShape& s) {
  const int OH = s.OH(), OW = s.OW();
  for (int b = 0; b < s.B; b++) {
    float* o = out + static_cast<std::size_t>(b) * OH * OW * s.OC;
    for (int p = 0; p < OH * OW; p++)
      for (int oc = 0; oc < s.OC; oc++)
        o[static_cast<std::size_t>(p) * s.OC + oc] = bias ? bias[oc] : 0.0f;
    for (int iy = 0; iy < s.H; iy++)
      for (int ix = 0; ix < s.W; ix++) {
        const float* x = inp + ((static_cast<std::size_t>(b) * s.H + iy) * s.W + ix) * s.C;
        for (int ky = 0; ky < s.KH; ky++) {
          const int oy = iy * s.stride - s.pad + ky;
          if (oy < 0 || oy >= OH) continue;
          for (int kx = 0; kx < s.KW; kx++) {
            const int ox = ix * s.stride - s.pad + kx;
            if (ox < 0 || ox >= OW) continue;
            float* y = o + (static_cast<std::size_t>(oy) * OW + ox) * s.OC;
            for (int oc = 0; oc < s.OC; oc++) {
              const float* w =
                  weight + ((static_cast<std::size_t>(oc) * s.KH + ky) * s.KW + kx) * s.C;
              float acc = 0;
              for (int c = 0; c < s.C; c++) acc += x[c] * w[c];
              y[oc] += acc;
            }
          }
        }
      }
  }
}

void deconv2d_backward_reference(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const Deconv2dShape& s) {
  const int OH = s.OH(), OW = s.OW();
  std::fill(dweight, dweight + static_cast<std::size_t>(s.OC) * s.KH * s.KW * s.C, 0.0f);
  if (dbias) std::fill(dbias, dbias + s.OC, 0.0f);
  if (dinp) std::fill(dinp, dinp + static_cast<std::size_t>(s.B) * s.H * s.W * s.C, 0.0f);
  for (int b = 0; b < s.B; b++) {
    const float* g = dout + static_cast<std::size_t>(b) * OH * OW * s.OC;
    if (dbias)
      for (int p = 0; p < OH * OW; p++)
        for (int oc = 0; oc < s.OC; oc++) dbias[oc] += g[static_cast<std::size_t>(p) * s.OC + oc];
    for (int iy = 0; iy < s.H; iy++)
      for (int ix = 0; ix < s.W; ix++) {
        const std::size_t at = ((static_cast<std::size_t>(b) * s.H + iy) * s.W + ix) * s.C;
        const float* x = inp + at;
        for (int ky = 0; ky < s.KH; ky++) {
          const int oy = iy * s.stride - s.pad + ky;
          if (oy < 0 || oy >= OH) continue;
          for (int kx = 0; kx < s.KW; kx++) {
            const int ox = ix * s.stride - s.pad + kx;
            if (ox < 0 || ox >= OW) continue;
            const float* gy = g + (static_cast<std::size_t>(oy) * OW + ox) * s.OC;
            for (int oc = 0; oc < s.OC; oc++) {
              const std::size_t w_at =
                  ((static_cast<std::size_t>(oc) * s.KH + ky) * s.KW + kx) * s.C;
              for (int c = 0; c < s.C; c++) {
                dweight[w_at + c] += gy[oc] * x[c];
                if (dinp) dinp[at + c] += gy[oc] * weight[w_at + c];
              }
            }
          }
        }
      }
  }
}

Deconv2dXnn::Deconv2dXnn(const Deconv2dShape& shape, pthreadpool_t pool)
    : s_(shape),
      pool_(pool),
      adjoint_(adjoint_shape(shape), Activation::none, pool),
      weight_swapped_(static_cast<std::size_t>(shape.OC) * shape.KH * shape.KW * shape.C),
      dweight_swapped_(weight_swapped_.size()) {
  ensure_xnnpack_initialized();
  if (s_.B < 1 || s_.H < 1 || s_.W < 1 || s_.C < 1 || s_.OC < 1 || s_.KH < 1 || s_.KW < 1 ||
      s_.stride < 1 || s_.pad < 0 || s_.adj < 0 || s_.adj >= s_.stride || s_.OH() < 1 ||
      s_.OW() < 1)
    throw std::invalid_argument(
        "Deconv2dXnn: bad shape (adj must be below the stride, the output non-empty)");
  // The adjoint convolution must map the output size back to exactly H x W.
  const Conv2dShape a = adjoint_.shape();
  if (a.OH() != s_.H || a.OW() != s_.W)
    throw std::invalid_argument("Deconv2dXnn: padding larger than the kernel allows");
}

void Deconv2dXnn::forward(float* out, const float* inp, const float* weight, const float* bias) {
  const auto p = static_cast<std::uint32_t>(s_.pad);
  check(xnn_create_deconvolution2d_nhwc_f32(p, p, p, p, s_.KH, s_.KW, s_.stride, s_.stride, 1, 1,
                                            /*groups=*/1, s_.C, s_.OC, s_.C, s_.OC, weight, bias,
                                            -kInfinity, kInfinity, 0, forward_op_.out_param()),
        "xnn_create_deconvolution2d_nhwc_f32");
  check(xnn_setup_deconvolution2d_nhwc_f32(forward_op_.get(), s_.B, s_.H, s_.W, s_.adj, s_.adj, inp,
                                           out, pool_),
        "xnn_setup_deconvolution2d_nhwc_f32");
  check(xnn_run_operator(forward_op_.get(), pool_), "xnn_run_operator (deconvolution)");
}

void Deconv2dXnn::backward(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight) {
  const std::size_t taps = static_cast<std::size_t>(s_.KH) * s_.KW;
  if (dbias) bias_backward(dbias, dout, static_cast<std::size_t>(s_.B) * s_.OH() * s_.OW(), s_.OC);
  if (dinp) {
    swap_outer(weight_swapped_.data(), weight, s_.OC, taps, s_.C);
    adjoint_.forward(dinp, dout, weight_swapped_.data(), nullptr);
  }
  // dweight[oc][t][c] = Σ inp[..c] · dout[..oc] at the tap: the adjoint conv's weight gradient
  // [c][t][oc] with `inp` as its output gradient and `dout` as its input.
  adjoint_.backward(nullptr, dweight_swapped_.data(), nullptr, inp, nullptr, dout,
                    weight_swapped_.data());
  swap_outer(dweight, dweight_swapped_.data(), s_.C, taps, s_.OC);
}

void adam_update(float* param, float* m, float* v, const float* grad, std::size_t n,
                 const AdamSettings& adam, std::uint64_t step) {
  if (step < 1) throw std::invalid_argument("adam_update: step counts from 1");
  const double correction1 =
      1.0 - std::pow(static_cast<double>(adam.beta1), static_cast<double>(step));
  const double correction2 =
      1.0 - std::pow(static_cast<double>(adam.beta2), static_cast<double>(step));
  const float step_size = static_cast<float>(adam.lr / correction1);
  const float root_correction2 = static_cast<float>(std::sqrt(correction2));
  for (std::size_t i = 0; i < n; i++) {
    m[i] = adam.beta1 * m[i] + (1.0f - adam.beta1) * grad[i];
    v[i] = adam.beta2 * v[i] + (1.0f - adam.beta2) * grad[i] * grad[i];
    param[i] -= step_size * m[i] / (std::sqrt(v[i]) / root_correction2 + adam.epsilon);
  }
}

}  // namespace edgetrain::kernels
