// The squared gradient norm, and AdamW over every range of the flat buffers
// in one launch with the clip decided on the device. The norm is reduced in
// a fixed order in device memory: no host copy, and the same result every
// run.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

using cuda::store;
using cuda::typed;

constexpr int kThreads = 256;

// partial[block] = sum of x[i]^2 over the block's grid-stride share.  x: (n)
__global__ void sum_squares_kernel(double* partial, const float* x, size_t n) {
  __shared__ double shared[32];
  double sum = 0.0;
  MPIFORMER_FOR_EACH(i, n) sum += static_cast<double>(x[i]) * x[i];
  sum = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// partial[block] = sum of x[i]^2 over norm block blockIdx.x (one CUDA block
// per kNormBlockFloats floats, so a block's order depends on its length only).
// x: (n), partial: (norm_blocks(n))
__global__ void sum_squares_blocks_kernel(double* partial, const float* x, size_t n) {
  __shared__ double shared[32];
  const size_t begin = static_cast<size_t>(blockIdx.x) * kNormBlockFloats;
  const size_t end = begin + kNormBlockFloats < n ? begin + kNormBlockFloats : n;
  double sum = 0.0;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    sum += static_cast<double>(x[i]) * x[i];
  sum = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// *out = sum of x[0 .. n) in a tree fixed by n.  One block.  x: (n)
__global__ void sum_doubles_kernel(double* out, const double* x, size_t n) {
  __shared__ double shared[32];
  double sum = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i];
  sum = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) *out = sum;
}

struct AdamWStep {
  float lr, beta1, beta2, eps, inv_bias1, inv_bias2, inv_loss_scale, max_norm;
};

// One block per range of the flat buffers (ranges are short: see AdamW).
// Gradients are unscaled and clipped by a factor taken from the norm on the
// device. compute (null in fp32 runs) gets the updated weights rounded.
// params, grads, m, v, compute: (n); ranges: (R); grad_norm_sq: (1)
template <typename T>
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, T* compute,
                             const AdamWRange* ranges, AdamWStep s, const double* grad_norm_sq) {
  const AdamWRange range = ranges[blockIdx.x];
  const double norm = sqrt(*grad_norm_sq) * s.inv_loss_scale;
  const float grad_scale = clip_factor(norm, s.max_norm) * s.inv_loss_scale;
  for (size_t i = range.begin + threadIdx.x; i < range.end; i += blockDim.x) {
    const float g = grads[i] * grad_scale;
    const float m_i = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    const float v_i = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    m[i] = m_i;
    v[i] = v_i;
    const float m_hat = m_i * s.inv_bias1, v_hat = v_i * s.inv_bias2;
    const float p =
        params[i] - s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + range.weight_decay * params[i]);
    params[i] = p;
    if (compute) store(compute, i, p);
  }
}

}  // namespace

void CudaOps::sum_squares(double* out, const float* x, size_t n) {
  // The grid depends on n only, so the sum's order does too.
  const unsigned blocks = std::min(cuda::blocks_for(n, kThreads), 1024u);
  auto* partial = static_cast<double*>(scratch(kReduce, sizeof(double) * blocks));
  if (n > 0)
    sum_squares_kernel<<<blocks, kThreads, 0, stream_>>>(partial, x, n);
  else
    cuda::check(cudaMemsetAsync(partial, 0, sizeof(double), stream_), "cudaMemsetAsync");
  sum_doubles_kernel<<<1, 1024, 0, stream_>>>(out, partial, n > 0 ? blocks : 1);
  cuda::check(cudaGetLastError(), "sum_squares");
}

void CudaOps::sum_squares_blocks(double* partial, const float* x, size_t n) {
  const size_t blocks = norm_blocks(n);
  if (blocks == 0) return;
  sum_squares_blocks_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream_>>>(partial, x, n);
  cuda::check(cudaGetLastError(), "sum_squares_blocks");
}

void CudaOps::sum_doubles(double* out, const double* x, size_t n) {
  sum_doubles_kernel<<<1, 1024, 0, stream_>>>(out, x, n);
  cuda::check(cudaGetLastError(), "sum_doubles");
}

void CudaOps::adamw_update(float* params, const float* grads, float* m, float* v, Act compute,
                           size_t n, const AdamWRange* ranges, int range_count,
                           const AdamWConfig& cfg, const double* grad_norm_sq) {
  if (n == 0 || range_count == 0) return;
  const double t = static_cast<double>(cfg.step > 1 ? cfg.step : 1);
  const AdamWStep s{cfg.lr,
                    cfg.beta1,
                    cfg.beta2,
                    cfg.eps,
                    static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(cfg.beta1), t))),
                    static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(cfg.beta2), t))),
                    cfg.inv_loss_scale,
                    cfg.max_norm};
  const unsigned grid = static_cast<unsigned>(range_count);
  if (!compute) {
    adamw_kernel<float>
        <<<grid, kThreads, 0, stream_>>>(params, grads, m, v, nullptr, ranges, s, grad_norm_sq);
  } else {
    cuda::dispatch(compute.dtype, [&](auto tag) {
      using T = decltype(tag);
      adamw_kernel<<<grid, kThreads, 0, stream_>>>(params, grads, m, v, typed<T>(compute), ranges,
                                                   s, grad_norm_sq);
    });
  }
  cuda::check(cudaGetLastError(), "adamw_update");
}

}  // namespace mpiformer
