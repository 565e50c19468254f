// Elementwise ops: the compute copy of the weights, activations (GELU tanh
// approximation as in GPT-2, ReLU) and counter-based inverted dropout.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace mpiformer {
namespace {

// Elements per OpenMP task: large enough to amortise the scheduling, small
// enough to split a (N, 4C) activation over every core.
constexpr size_t kChunk = 16384;

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

MPIFORMER_HOT void gelu_forward_chunk(float* out, const float* x, size_t n) {  // out, x: (n)
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float t = cpu::fast_tanh(kGeluC * (xi + kGeluA * xi * xi * xi));
    out[i] = 0.5f * xi * (1.0f + t);
  }
}

// d/dx 0.5 x (1 + tanh(u)), u = c (x + a x^3):
//   0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3 a x^2)
MPIFORMER_HOT void gelu_backward_chunk(float* dx, const float* dout, const float* x,
                                       size_t n) {  // dx, dout, x: (n)
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float t = cpu::fast_tanh(kGeluC * (xi + kGeluA * xi * xi * xi));
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * xi * xi);
    dx[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * du);
  }
}

// out[i] = in[i] * keep_scale where element first + i survives, else 0.
// This is dropout_keep() restated in integers so that it vectorises (AVX2
// has no 64-bit-integer-to-float conversion): with k = hash >> 40 < 2^24,
// k * 2^-24 >= p exactly when k >= ceil(p * 2^24). The tests pin the two to
// the same mask. Branch-free: no misprediction follows a drop.
// out, in: (n)
MPIFORMER_HOT void dropout_chunk(float* out, const float* in, size_t first, size_t n,
                                 uint64_t keep_threshold, float keep_scale, uint64_t stream_key) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const float scaled = in[i] * keep_scale;  // read unconditionally: no masked load
    out[i] = (mix64(stream_key + first + i) >> 40) >= keep_threshold ? scaled : 0.0f;
  }
}

}  // namespace

namespace cpu {

// Forward and backward apply the same mask, regenerated from (seed, stream,
// index): out[i] = in[i] / (1 - p) where kept, 0 where dropped.
void apply_dropout(float* out, const float* in, size_t n, const Dropout& d) {  // out, in: (n)
  const float p = d.p;
  if (!(p > 0.0f)) {
    if (out != in) std::memcpy(out, in, n * sizeof(float));
    return;
  }
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  const auto keep_threshold =
      static_cast<uint64_t>(std::ceil(static_cast<double>(std::min(p, 1.0f)) * 16777216.0));
  const uint64_t stream_key = mix64(d.seed ^ mix64(d.stream));  // as in dropout_keep()
  const size_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (worth_threading(n))
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * kChunk;
    dropout_chunk(out + begin, in + begin, begin, std::min(kChunk, n - begin), keep_threshold,
                  keep_scale, stream_key);
  }
}

void activation_forward(float* out, const float* x, size_t n, Activation act) {
  if (act == Activation::kRelu) {
#pragma omp parallel for simd schedule(static) if (worth_threading(n))
    for (size_t i = 0; i < n; ++i) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return;
  }
  const size_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (worth_threading(n))
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * kChunk;
    gelu_forward_chunk(out + begin, x + begin, std::min(kChunk, n - begin));
  }
}

void activation_backward(float* dx, const float* dout, const float* x, size_t n, Activation act) {
  if (act == Activation::kRelu) {
#pragma omp parallel for simd schedule(static) if (worth_threading(n))
    for (size_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dout[i] : 0.0f;
    return;
  }
  const size_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (worth_threading(n))
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * kChunk;
    gelu_backward_chunk(dx + begin, dout + begin, x + begin, std::min(kChunk, n - begin));
  }
}

}  // namespace cpu

void CpuOps::convert(Act dst, const float* src, size_t n) {
  narrow(dst.data, dst.dtype, src, n);
}

void CpuOps::dropout(Act out, Act x, size_t n, const Dropout& d) {
  Fp32 f(*this);
  const float* in = f.in(x, n);
  cpu::apply_dropout(f.out(out, n), in, n, d);
}

void CpuOps::activation_forward(Act out, Act pre, size_t n, Activation act) {
  Fp32 f(*this);
  const float* x = f.in(pre, n);
  cpu::activation_forward(f.out(out, n), x, n, act);
}

void CpuOps::activation_backward(Act dx, Act dout, Act pre, size_t n, Activation act) {
  Fp32 f(*this);
  const float* dy = f.in(dout, n);
  const float* x = f.in(pre, n);
  cpu::activation_backward(f.out(dx, n), dy, x, n, act);
}

}  // namespace mpiformer
