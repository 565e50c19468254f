// Layer norm over the last dimension, biased variance, rstd = 1/sqrt(var + eps).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace mpiformer {
namespace {

// Rows per backward task. dgamma and dbeta are summed per block of rows and
// the blocks are then added in a fixed order, so the result does not depend
// on the thread count.
constexpr int kRowBlock = 32;
// Columns per task of the final reduction over row blocks.
constexpr int kColumnBlock = 64;

// out, x: (C), gamma, beta: (C); returns mean and rstd of the row.
MPIFORMER_HOT void layernorm_row(float* out, float* mean_out, float* rstd_out, const float* x,
                                 const float* gamma, const float* beta, int C, float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; ++c) sum += x[c];
  const float mean = sum / C;
  // Two passes over a row that sits in L1: exact enough, no cancellation.
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (int c = 0; c < C; ++c) sum_sq += (x[c] - mean) * (x[c] - mean);
  const float rstd = 1.0f / std::sqrt(sum_sq / C + eps);
#pragma omp simd
  for (int c = 0; c < C; ++c) out[c] = (x[c] - mean) * rstd * gamma[c] + beta[c];
  *mean_out = mean;
  *rstd_out = rstd;
}

// One row of the backward pass. With xhat = (x - mean) * rstd and
// g = dout * gamma: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
// dx, dout, x: (C), gamma: (C), dgamma, dbeta: (C) partial sums (+=)
MPIFORMER_HOT void layernorm_backward_row(float* dx, float* dgamma, float* dbeta, const float* dout,
                                          const float* x, const float* gamma, float mean,
                                          float rstd, int C, bool accumulate) {
  float g_sum = 0.0f;
  float g_xhat_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, g_xhat_sum)
  for (int c = 0; c < C; ++c) {
    const float xhat = (x[c] - mean) * rstd;
    const float g = dout[c] * gamma[c];
    g_sum += g;
    g_xhat_sum += g * xhat;
  }
  const float g_mean = g_sum / C;
  const float g_xhat_mean = g_xhat_sum / C;
  // Two copies of the loop so the = case never reads dx.
  if (accumulate) {
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - mean) * rstd;
      dx[c] += rstd * (dout[c] * gamma[c] - g_mean - xhat * g_xhat_mean);
      dgamma[c] += dout[c] * xhat;
      dbeta[c] += dout[c];
    }
  } else {
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - mean) * rstd;
      dx[c] = rstd * (dout[c] * gamma[c] - g_mean - xhat * g_xhat_mean);
      dgamma[c] += dout[c] * xhat;
      dbeta[c] += dout[c];
    }
  }
}

// out = LN(x) for every row.  out, x: (N, C)
void layernorm_rows(float* out, float* mean, float* rstd, const float* x, const float* gamma,
                    const float* beta, int N, int C, float eps) {
  const bool threaded = cpu::worth_threading(static_cast<size_t>(N) * C);
#pragma omp parallel for schedule(static) if (threaded)
  for (int i = 0; i < N; ++i) {
    const size_t row = static_cast<size_t>(i) * C;
    layernorm_row(out + row, mean + i, rstd + i, x + row, gamma, beta, C, eps);
  }
}

}  // namespace

void CpuOps::layernorm_forward(Act out, float* mean, float* rstd, Act x, Act gamma, Act beta, int N,
                               int C, float eps) {
  Fp32 f(*this);
  const size_t n = static_cast<size_t>(N) * C;
  const float* xf = f.in(x, n);
  const float* g = f.in(gamma, C);
  const float* b = f.in(beta, C);
  layernorm_rows(f.out(out, n), mean, rstd, xf, g, b, N, C, eps);
}

void CpuOps::residual_layernorm_forward(Act sum, Act out, float* mean, float* rstd, Act s, Act y,
                                        const Dropout& d, Act gamma, Act beta, int N, int C,
                                        float eps) {
  // The sum is rounded to its storage type before the norm reads it, as the
  // fused GPU kernel normalises the stored residual stream.
  const size_t n = static_cast<size_t>(N) * C;
  {
    Fp32 f(*this);
    const float* sf = f.in(s, n);
    const float* dy = f.in(y, n);
    if (d.p > 0.0f) {
      float* dropped = f.temp(n);
      cpu::apply_dropout(dropped, dy, n, d);
      dy = dropped;
    }
    float* total = f.out(sum, n);
    const bool threaded = cpu::worth_threading(n);
#pragma omp parallel for simd schedule(static) if (threaded)
    for (size_t i = 0; i < n; ++i) total[i] = sf[i] + dy[i];
  }
  layernorm_forward(out, mean, rstd, sum, gamma, beta, N, C, eps);
}

void CpuOps::layernorm_backward(Act dx, float* dgamma, float* dbeta, Act dout, Act x, Act gamma,
                                const float* mean, const float* rstd, int N, int C, bool accumulate,
                                float* dx_sums) {
  Fp32 f(*this);
  const size_t n = static_cast<size_t>(N) * C;
  const float* dy = f.in(dout, n);
  const float* xf = f.in(x, n);
  const float* g = f.in(gamma, C);
  float* d = accumulate ? f.inout(dx, n) : f.out(dx, n);
  if (accumulate && dx_sums) cpu::add_column_sums(dx_sums, d, N, C, C);
  layernorm_backward_f32(d, dgamma, dbeta, dy, xf, g, mean, rstd, N, C, accumulate);
}

void CpuOps::layernorm_backward_f32(float* dx, float* dgamma, float* dbeta, const float* dout,
                                    const float* x, const float* gamma, const float* mean,
                                    const float* rstd, int N, int C, bool accumulate) {
  const int blocks = (N + kRowBlock - 1) / kRowBlock;
  // partial: (blocks, 2, C) = dgamma then dbeta of each block of rows
  float* partial = grow(float_scratch_, static_cast<size_t>(blocks) * 2 * C);
  const bool threaded = cpu::worth_threading(static_cast<size_t>(N) * C);
#pragma omp parallel if (threaded)
  {
#pragma omp for schedule(static)
    for (int block = 0; block < blocks; ++block) {
      float* block_dgamma = partial + static_cast<size_t>(block) * 2 * C;  // (C)
      float* block_dbeta = block_dgamma + C;                               // (C)
      std::memset(block_dgamma, 0, 2 * C * sizeof(float));
      const int end = std::min(N, (block + 1) * kRowBlock);
      for (int i = block * kRowBlock; i < end; ++i) {
        const size_t row = static_cast<size_t>(i) * C;
        layernorm_backward_row(dx + row, block_dgamma, block_dbeta, dout + row, x + row, gamma,
                               mean[i], rstd[i], C, accumulate);
      }
    }
    // Reduce the blocks column-wise in block order.
    const int column_tasks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp for schedule(static)
    for (int task = 0; task < column_tasks; ++task) {
      const int c0 = task * kColumnBlock;
      const int c1 = std::min(C, c0 + kColumnBlock);
      for (int block = 0; block < blocks; ++block) {
        const float* block_dgamma = partial + static_cast<size_t>(block) * 2 * C;  // (C)
        const float* block_dbeta = block_dgamma + C;                               // (C)
#pragma omp simd
        for (int c = c0; c < c1; ++c) {
          dgamma[c] += block_dgamma[c];
          dbeta[c] += block_dbeta[c];
        }
      }
    }
  }
}

}  // namespace mpiformer
