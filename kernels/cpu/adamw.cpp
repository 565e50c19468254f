// AdamW (decoupled weight decay) and the squared norm used for clipping.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace mpiformer {
namespace {

// The block of the sum_squares partial sums, whose fixed size keeps that sum
// independent of the thread count.
constexpr size_t kChunk = 16384;

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float inv_bias1;  // 1 / (1 - beta1^t)
  float inv_bias2;  // 1 / (1 - beta2^t)
};

// params, grads, m, v: (n)
MPIFORMER_HOT void adamw_chunk(float* params, const float* grads, float* m, float* v, size_t n,
                               const AdamWStep s) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i] * s.grad_scale;
    const float m_i = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    const float v_i = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    m[i] = m_i;
    v[i] = v_i;
    const float m_hat = m_i * s.inv_bias1;
    const float v_hat = v_i * s.inv_bias2;
    params[i] -= s.lr * (m_hat / (std::sqrt(v_hat) + s.eps) + s.weight_decay * params[i]);
  }
}

// Sum of squares of a chunk, accumulated in double.  x: (n)
MPIFORMER_HOT double sum_squares_chunk(const float* x, size_t n) {
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

}  // namespace

void CpuOps::adamw_update(float* params, const float* grads, float* m, float* v, Act compute,
                          size_t n, const AdamWRange* ranges, int range_count,
                          const AdamWConfig& cfg, const double* grad_norm_sq) {
  const double t = static_cast<double>(std::max<int64_t>(cfg.step, 1));
  const double norm = std::sqrt(*grad_norm_sq) * cfg.inv_loss_scale;
  AdamWStep s;
  s.lr = cfg.lr;
  s.beta1 = cfg.beta1;
  s.beta2 = cfg.beta2;
  s.eps = cfg.eps;
  s.grad_scale = clip_factor(norm, cfg.max_norm) * cfg.inv_loss_scale;
  // Bias corrections in double: 1 - 0.999^t loses digits in float for small t.
  s.inv_bias1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(cfg.beta1), t)));
  s.inv_bias2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(cfg.beta2), t)));
  // Elementwise: any split of the ranges over threads gives the same bits.
#pragma omp parallel for schedule(dynamic, 1) if (cpu::worth_threading(n))
  for (int r = 0; r < range_count; ++r) {
    AdamWStep range_step = s;
    range_step.weight_decay = ranges[r].weight_decay;
    const size_t begin = ranges[r].begin;
    adamw_chunk(params + begin, grads + begin, m + begin, v + begin, ranges[r].end - begin,
                range_step);
  }
  if (compute) convert(compute, params, n);
}

void CpuOps::sum_squares(double* out, const float* x, size_t n) {
  const size_t chunks = (n + kChunk - 1) / kChunk;
  double* partial = grow(double_scratch_, chunks);  // (chunks)
#pragma omp parallel for schedule(static) if (cpu::worth_threading(n))
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * kChunk;
    partial[c] = sum_squares_chunk(x + begin, std::min(kChunk, n - begin));
  }
  double total = 0.0;
  for (size_t c = 0; c < chunks; ++c) total += partial[c];
  *out = total;
}

void CpuOps::sum_squares_blocks(double* partial, const float* x, size_t n) {
  const size_t blocks = norm_blocks(n);
#pragma omp parallel for schedule(static) if (cpu::worth_threading(n))
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * kNormBlockFloats;
    partial[b] = sum_squares_chunk(x + begin, std::min(kNormBlockFloats, n - begin));
  }
}

void CpuOps::sum_doubles(double* out, const double* x, size_t n) {
  double total = 0.0;  // in index order, on one thread
  for (size_t i = 0; i < n; ++i) total += x[i];
  *out = total;
}

}  // namespace mpiformer
