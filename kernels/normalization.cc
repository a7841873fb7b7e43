#include "kernels/normalization.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace edgetrain::kernels {
namespace {

// out[p][c] = inp[p][c]·scale[c] + shift[c] for `positions` rows of C.
void scale_shift(float* out, const float* inp, const float* scale, const float* shift,
                 std::size_t positions, int C) {
  for (std::size_t p = 0; p < positions; p++) {
    const float* x = inp + p * C;
    float* y = out + p * C;
    for (int c = 0; c < C; c++) y[c] = x[c] * scale[c] + shift[c];
  }
}

}  // namespace

// ---------------------------------------------------------------- reference: group norm

void group_norm_forward_reference(float* out, float* mean, float* invstd, const float* inp,
                                  const float* gamma, const float* beta, int B, int HW, int C,
                                  int G, float eps) {
  const int Cg = C / G;
  const double M = static_cast<double>(HW) * Cg;
  for (int b = 0; b < B; b++) {
    const float* x = inp + static_cast<std::size_t>(b) * HW * C;
    float* y = out + static_cast<std::size_t>(b) * HW * C;
    for (int g = 0; g < G; g++) {
      double sum = 0;
      for (int p = 0; p < HW; p++)
        for (int c = g * Cg; c < (g + 1) * Cg; c++) sum += x[p * C + c];
      const double mu = sum / M;
      double squares = 0;
      for (int p = 0; p < HW; p++)
        for (int c = g * Cg; c < (g + 1) * Cg; c++) {
          const double d = x[p * C + c] - mu;
          squares += d * d;
        }
      const double rstd = 1.0 / std::sqrt(squares / M + eps);
      mean[b * G + g] = static_cast<float>(mu);
      invstd[b * G + g] = static_cast<float>(rstd);
      for (int p = 0; p < HW; p++)
        for (int c = g * Cg; c < (g + 1) * Cg; c++)
          y[p * C + c] = static_cast<float>((x[p * C + c] - mu) * rstd * gamma[c] + beta[c]);
    }
  }
}

void group_norm_backward_reference(float* dinp, float* dgamma, float* dbeta, const float* dout,
                                   const float* inp, const float* mean, const float* invstd,
                                   const float* gamma, int B, int HW, int C, int G) {
  const int Cg = C / G;
  const double M = static_cast<double>(HW) * Cg;
  for (int c = 0; c < C; c++) {
    const int g = c / Cg;
    double dg = 0, db = 0;
    for (int b = 0; b < B; b++)
      for (int p = 0; p < HW; p++) {
        const std::size_t i = (static_cast<std::size_t>(b) * HW + p) * C + c;
        dg += dout[i] * (inp[i] - static_cast<double>(mean[b * G + g])) * invstd[b * G + g];
        db += dout[i];
      }
    dgamma[c] = static_cast<float>(dg);
    dbeta[c] = static_cast<float>(db);
  }
  if (!dinp) return;
  for (int b = 0; b < B; b++) {
    const std::size_t base = static_cast<std::size_t>(b) * HW * C;
    for (int g = 0; g < G; g++) {
      const double mu = mean[b * G + g], rstd = invstd[b * G + g];
      // dx̂ = dy·gamma; dx = rstd·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)) over the group.
      double sum_dxhat = 0, sum_dxhat_xhat = 0;
      for (int p = 0; p < HW; p++)
        for (int c = g * Cg; c < (g + 1) * Cg; c++) {
          const std::size_t i = base + static_cast<std::size_t>(p) * C + c;
          const double dxhat = static_cast<double>(dout[i]) * gamma[c];
          sum_dxhat += dxhat;
          sum_dxhat_xhat += dxhat * (inp[i] - mu) * rstd;
        }
      for (int p = 0; p < HW; p++)
        for (int c = g * Cg; c < (g + 1) * Cg; c++) {
          const std::size_t i = base + static_cast<std::size_t>(p) * C + c;
          const double xhat = (inp[i] - mu) * rstd;
          const double dxhat = static_cast<double>(dout[i]) * gamma[c];
          dinp[i] = static_cast<float>(rstd * (dxhat - sum_dxhat / M - xhat * sum_dxhat_xhat / M));
        }
    }
  }
}

// ---------------------------------------------------------------- reference: batch norm

void batch_norm_forward_reference(float* out, float* mean, float* invstd, const float* inp,
                                  const float* gamma, const float* beta, int B, int HW, int C,
                                  float eps) {
  const std::size_t positions = static_cast<std::size_t>(B) * HW;
  for (int c = 0; c < C; c++) {
    double sum = 0;
    for (std::size_t p = 0; p < positions; p++) sum += inp[p * C + c];
    const double mu = sum / static_cast<double>(positions);
    double squares = 0;
    for (std::size_t p = 0; p < positions; p++) {
      const double d = inp[p * C + c] - mu;
      squares += d * d;
    }
    const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(positions) + eps);
    mean[c] = static_cast<float>(mu);
    invstd[c] = static_cast<float>(rstd);
    for (std::size_t p = 0; p < positions; p++)
      out[p * C + c] = static_cast<float>((inp[p * C + c] - mu) * rstd * gamma[c] + beta[c]);
  }
}

void batch_norm_backward_reference(float* dinp, float* dgamma, float* dbeta, const float* dout,
                                   const float* inp, const float* mean, const float* invstd,
                                   const float* gamma, int B, int HW, int C) {
  const std::size_t positions = static_cast<std::size_t>(B) * HW;
  const double M = static_cast<double>(positions);
  for (int c = 0; c < C; c++) {
    const double mu = mean[c], rstd = invstd[c];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (std::size_t p = 0; p < positions; p++) {
      const double xhat = (inp[p * C + c] - mu) * rstd;
      sum_dy += dout[p * C + c];
      sum_dy_xhat += dout[p * C + c] * xhat;
    }
    dgamma[c] = static_cast<float>(sum_dy_xhat);
    dbeta[c] = static_cast<float>(sum_dy);
    if (!dinp) continue;
    for (std::size_t p = 0; p < positions; p++) {
      const double xhat = (inp[p * C + c] - mu) * rstd;
      dinp[p * C + c] = static_cast<float>(gamma[c] * rstd *
                                           (dout[p * C + c] - sum_dy / M - xhat * sum_dy_xhat / M));
    }
  }
}

void batch_norm_inference(float* out, const float* inp, const float* gamma, const float* beta,
                          const float* running_mean, const float* running_var, int B, int HW, int C,
                          float eps) {
  // One scale and shift per channel; C is at most a few hundred, so on the stack in chunks
  // would do as well, but the loop below needs no scratch at all.
  const std::size_t positions = static_cast<std::size_t>(B) * HW;
  for (std::size_t p = 0; p < positions; p++) {
    for (int c = 0; c < C; c++) {
      const float scale = gamma[c] / std::sqrt(running_var[c] + eps);
      out[p * C + c] = (inp[p * C + c] - running_mean[c]) * scale + beta[c];
    }
  }
}

void batch_norm_update_running(float* running_mean, float* running_var, const float* mean,
                               const float* invstd, int C, std::size_t positions, float momentum,
                               float eps) {
  const double unbias =
      positions > 1 ? static_cast<double>(positions) / static_cast<double>(positions - 1) : 1.0;
  for (int c = 0; c < C; c++) {
    // invstd = 1/sqrt(var + eps): recover the biased variance the forward pass used.
    const double var = std::max(
        0.0, 1.0 / (static_cast<double>(invstd[c]) * invstd[c]) - static_cast<double>(eps));
    running_mean[c] = (1 - momentum) * running_mean[c] + momentum * mean[c];
    running_var[c] = static_cast<float>((1 - momentum) * running_var[c] + momentum * var * unbias);
  }
}

// ---------------------------------------------------------------- fast: group norm

GroupNormOp::GroupNormOp(int B, int HW, int C, int G, float eps)
    : B_(B), HW_(HW), C_(C), G_(G), eps_(eps) {
  if (B < 1 || HW < 1 || C < 1 || G < 1 || C % G != 0)
    throw std::invalid_argument("GroupNormOp: " + std::to_string(C) + " channels in " +
                                std::to_string(G) + " groups");
  mean_.resize(static_cast<std::size_t>(B) * G);
  invstd_.resize(static_cast<std::size_t>(B) * G);
  for (auto* v : {&sum_a_, &sum_b_, &coef_a_, &coef_b_, &coef_c_}) v->resize(C);
}

void GroupNormOp::forward(float* out, const float* inp, const float* gamma, const float* beta) {
  const int Cg = C_ / G_;
  const float M = static_cast<float>(HW_) * Cg;
  float* sum = sum_a_.data();
  float* squares = sum_b_.data();
  float* reference = coef_c_.data();
  for (int b = 0; b < B_; b++) {
    const std::size_t base = static_cast<std::size_t>(b) * HW_ * C_;
    const float* x = inp + base;
    // One pass of shifted sums: Σ(x − K) and Σ(x − K)² per channel, K a value of the group
    // (its first), so the variance Σ(x − K)²/M − (Σ(x − K)/M)² does not cancel as
    // E[x²] − E[x]² would when the mean is large against the spread.
    for (int g = 0; g < G_; g++)
      for (int c = g * Cg; c < (g + 1) * Cg; c++) reference[c] = x[g * Cg];
    for (int c = 0; c < C_; c++) sum[c] = squares[c] = 0;
    for (int p = 0; p < HW_; p++)
      for (int c = 0; c < C_; c++) {
        const float d = x[p * C_ + c] - reference[c];
        sum[c] += d;
        squares[c] += d * d;
      }
    float* scale = coef_a_.data();
    float* shift = coef_b_.data();
    for (int g = 0; g < G_; g++) {
      float s1 = 0, s2 = 0;
      for (int c = g * Cg; c < (g + 1) * Cg; c++) {
        s1 += sum[c];
        s2 += squares[c];
      }
      const float shifted_mean = s1 / M;
      const float var = std::max(0.0f, s2 / M - shifted_mean * shifted_mean);
      const float mu = reference[g * Cg] + shifted_mean;
      const float rstd = 1.0f / std::sqrt(var + eps_);
      mean_[b * G_ + g] = mu;
      invstd_[b * G_ + g] = rstd;
      for (int c = g * Cg; c < (g + 1) * Cg; c++) {
        scale[c] = gamma[c] * rstd;
        shift[c] = beta[c] - mu * scale[c];
      }
    }
    scale_shift(out + base, x, scale, shift, static_cast<std::size_t>(HW_), C_);
  }
}

void GroupNormOp::backward(float* dinp, float* dgamma, float* dbeta, const float* dout,
                           const float* inp, const float* gamma) {
  const int Cg = C_ / G_;
  const float M = static_cast<float>(HW_) * Cg;
  for (int c = 0; c < C_; c++) dgamma[c] = dbeta[c] = 0;
  float* sum_dy = sum_a_.data();
  float* sum_dy_xc = sum_b_.data();  // Σ dy·(x − mean): x̂ without the 1/std
  float* a = coef_a_.data();
  float* bcoef = coef_b_.data();
  float* channel_mean = coef_c_.data();
  for (int b = 0; b < B_; b++) {
    const std::size_t base = static_cast<std::size_t>(b) * HW_ * C_;
    const float* x = inp + base;
    const float* dy = dout + base;
    for (int g = 0; g < G_; g++)
      for (int c = g * Cg; c < (g + 1) * Cg; c++) channel_mean[c] = mean_[b * G_ + g];
    for (int c = 0; c < C_; c++) sum_dy[c] = sum_dy_xc[c] = 0;
    for (int p = 0; p < HW_; p++)
      for (int c = 0; c < C_; c++) {
        sum_dy[c] += dy[p * C_ + c];
        sum_dy_xc[c] += dy[p * C_ + c] * (x[p * C_ + c] - channel_mean[c]);
      }
    for (int g = 0; g < G_; g++) {
      const float rstd = invstd_[b * G_ + g];
      float s1 = 0, s2 = 0;  // Σ dx̂ and Σ dx̂·x̂ over the group, dx̂ = dy·gamma
      for (int c = g * Cg; c < (g + 1) * Cg; c++) {
        dgamma[c] += rstd * sum_dy_xc[c];
        dbeta[c] += sum_dy[c];
        s1 += gamma[c] * sum_dy[c];
        s2 += gamma[c] * rstd * sum_dy_xc[c];
      }
      // dx = rstd·(gamma·dy − s1/M − x̂·s2/M) = a[c]·dy + b[c]·(x − mean) − rstd·s1/M
      for (int c = g * Cg; c < (g + 1) * Cg; c++) {
        a[c] = gamma[c] * rstd;
        bcoef[c] = -rstd * rstd * s2 / M;
        sum_dy[c] = -rstd * s1 / M;  // reused: the constant term
      }
    }
    if (!dinp) continue;
    float* dx = dinp + base;
    for (int p = 0; p < HW_; p++)
      for (int c = 0; c < C_; c++)
        dx[p * C_ + c] =
            a[c] * dy[p * C_ + c] + bcoef[c] * (x[p * C_ + c] - channel_mean[c]) + sum_dy[c];
  }
}

// ---------------------------------------------------------------- fast: batch norm

BatchNormOp::BatchNormOp(int max_batch, int HW, int C, float eps)
    : max_batch_(max_batch), HW_(HW), C_(C), eps_(eps) {
  if (max_batch < 1 || HW < 1 || C < 1) throw std::invalid_argument("BatchNormOp: empty shape");
  mean_.resize(C);
  invstd_.resize(C);
  sum_a_.resize(C);
  sum_b_.resize(C);
  for (auto* v : {&coef_a_, &coef_b_, &coef_c_}) v->resize(C);
}

void BatchNormOp::forward_training(float* out, const float* inp, const float* gamma,
                                   const float* beta, int count) {
  if (count < 1 || count > max_batch_)
    throw std::invalid_argument("BatchNormOp: " + std::to_string(count) + " rows, built for 1.." +
                                std::to_string(max_batch_));
  const std::size_t positions = static_cast<std::size_t>(count) * HW_;
  // Double accumulators: a batch of 32 at 28x28 sums 25,088 values per channel.
  double* sum = sum_a_.data();
  for (int c = 0; c < C_; c++) sum[c] = 0;
  for (std::size_t p = 0; p < positions; p++)
    for (int c = 0; c < C_; c++) sum[c] += inp[p * C_ + c];
  float* mu = mean_.data();
  for (int c = 0; c < C_; c++) mu[c] = static_cast<float>(sum[c] / static_cast<double>(positions));
  double* squares = sum_b_.data();
  for (int c = 0; c < C_; c++) squares[c] = 0;
  for (std::size_t p = 0; p < positions; p++)
    for (int c = 0; c < C_; c++) {
      const double d = inp[p * C_ + c] - mu[c];
      squares[c] += d * d;
    }
  float* scale = coef_a_.data();
  float* shift = coef_b_.data();
  for (int c = 0; c < C_; c++) {
    invstd_[c] =
        static_cast<float>(1.0 / std::sqrt(squares[c] / static_cast<double>(positions) + eps_));
    scale[c] = gamma[c] * invstd_[c];
    shift[c] = beta[c] - mu[c] * scale[c];
  }
  scale_shift(out, inp, scale, shift, static_cast<std::size_t>(max_batch_) * HW_, C_);
}

void BatchNormOp::backward(float* dinp, float* dgamma, float* dbeta, const float* dout,
                           const float* inp, const float* gamma, int count) {
  const std::size_t positions = static_cast<std::size_t>(count) * HW_;
  const float* mu = mean_.data();
  double* sum_dy = sum_a_.data();
  double* sum_dy_xc = sum_b_.data();
  for (int c = 0; c < C_; c++) sum_dy[c] = sum_dy_xc[c] = 0;
  for (std::size_t p = 0; p < positions; p++)
    for (int c = 0; c < C_; c++) {
      sum_dy[c] += dout[p * C_ + c];
      sum_dy_xc[c] += static_cast<double>(dout[p * C_ + c]) * (inp[p * C_ + c] - mu[c]);
    }
  const double M = static_cast<double>(positions);
  float* a = coef_a_.data();
  float* bcoef = coef_b_.data();
  float* constant = coef_c_.data();
  for (int c = 0; c < C_; c++) {
    const double rstd = invstd_[c];
    dgamma[c] = static_cast<float>(rstd * sum_dy_xc[c]);
    dbeta[c] = static_cast<float>(sum_dy[c]);
    // dx = gamma·rstd·(dy − Σdy/M − x̂·Σ(dy·x̂)/M) = a·dy + b·(x − mean) + constant
    a[c] = static_cast<float>(gamma[c] * rstd);
    bcoef[c] = static_cast<float>(-gamma[c] * rstd * rstd * rstd * sum_dy_xc[c] / M);
    constant[c] = static_cast<float>(-gamma[c] * rstd * sum_dy[c] / M);
  }
  if (!dinp) return;
  for (std::size_t p = 0; p < positions; p++)
    for (int c = 0; c < C_; c++)
      dinp[p * C_ + c] =
          a[c] * dout[p * C_ + c] + bcoef[c] * (inp[p * C_ + c] - mu[c]) + constant[c];
  // Padding rows are outside the statistics: no gradient flows to them.
  std::fill(dinp + positions * C_, dinp + static_cast<std::size_t>(max_batch_) * HW_ * C_, 0.0f);
}

}  // namespace edgetrain::kernels
