// Layer norm over the last dimension (biased variance, rstd = 1/sqrt(var +
// eps)), one block per row, the CPU backend's formulas; the residual add
// (with dropout) fused in front of it; and a backward whose gamma and beta
// gradients are summed per block of rows and then across blocks in a fixed
// order: no float atomics, the same sums every run.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

using cuda::load;
using cuda::store;
using cuda::typed;

constexpr int kThreads = 256;
// Rows per backward block: gamma and beta partial sums are kept per block.
constexpr int kRowBlock = 32;

// out = LN(x) of one row, given x's row already in memory (it may be the
// row the same threads just wrote: each thread reads back only its own
// columns). out, x: (C), gamma, beta: (C)
template <typename T>
__device__ void layernorm_row(T* out, float* mean_out, float* rstd_out, const T* x, const T* gamma,
                              const T* beta, int C, float eps, float* shared) {
  float sum = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) sum += load(x, c);
  const float mean = cuda::block_sum(sum, shared) / C;
  float sum_sq = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = load(x, c) - mean;
    sum_sq += d * d;
  }
  const float rstd = 1.0f / sqrtf(cuda::block_sum(sum_sq, shared) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    store(out, c, (load(x, c) - mean) * rstd * load(gamma, c) + load(beta, c));
  if (threadIdx.x == 0) {
    *mean_out = mean;
    *rstd_out = rstd;
  }
}

// out, x: (N, C), mean, rstd: (N), gamma, beta: (C)
template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* x,
                                         const T* gamma, const T* beta, int C, float eps) {
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  layernorm_row(out + row * C, mean + row, rstd + row, x + row * C, gamma, beta, C, eps, shared);
}

// sum = s + dropout(y), stored rounded; out = LN(sum) of the stored values.
// sum, out, s, y: (N, C)
template <typename T>
__global__ void residual_layernorm_kernel(T* sum, T* out, float* mean, float* rstd, const T* s,
                                          const T* y, Dropout d, const T* gamma, const T* beta,
                                          int C, float eps) {
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  const float keep_scale = d.p > 0.0f ? (d.p < 1.0f ? 1.0f / (1.0f - d.p) : 0.0f) : 1.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const size_t i = row * C + c;
    float dy = load(y, i);
    if (d.p > 0.0f) dy = dropout_keep(d.seed, d.stream, i, d.p) ? dy * keep_scale : 0.0f;
    store(sum, i, load(s, i) + dy);
  }
  layernorm_row(out + row * C, mean + row, rstd + row, sum + row * C, gamma, beta, C, eps, shared);
}

// Rows [block * kRowBlock, ...) of the backward: dx per row, and this
// block's partial dgamma and dbeta, (2, C), each column owned by one
// thread. dx (= or +=), dout, x: (N, C); partial: (blocks, 2, C)
template <typename T>
__global__ void layernorm_backward_kernel(T* dx, float* partial, const T* dout, const T* x,
                                          const T* gamma, const float* mean, const float* rstd,
                                          int N, int C, bool accumulate) {
  __shared__ float shared[32];
  float* block_dgamma = partial + static_cast<size_t>(blockIdx.x) * 2 * C;
  float* block_dbeta = block_dgamma + C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) block_dgamma[c] = block_dbeta[c] = 0.0f;
  const int end = min(N, static_cast<int>(blockIdx.x + 1) * kRowBlock);
  for (int r = blockIdx.x * kRowBlock; r < end; ++r) {
    const size_t base = static_cast<size_t>(r) * C;
    const float m = mean[r], s = rstd[r];
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * gamma
    float g_sum = 0.0f, g_xhat_sum = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = load(dout, base + c) * load(gamma, c);
      g_sum += g;
      g_xhat_sum += g * (load(x, base + c) - m) * s;
    }
    const float g_mean = cuda::block_sum(g_sum, shared) / C;
    const float g_xhat_mean = cuda::block_sum(g_xhat_sum, shared) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float xhat = (load(x, base + c) - m) * s;
      const float dy = load(dout, base + c);
      const float d = s * (dy * load(gamma, c) - g_mean - xhat * g_xhat_mean);
      store(dx, base + c, accumulate ? load(dx, base + c) + d : d);
      block_dgamma[c] += dy * xhat;
      block_dbeta[c] += dy;
    }
  }
}

// dgamma[c] += sum over blocks of partial[b][0][c], dbeta likewise, in block
// order.  partial: (blocks, 2, C)
__global__ void layernorm_param_grads_kernel(float* dgamma, float* dbeta, const float* partial,
                                             int blocks, int C) {
  MPIFORMER_FOR_EACH(c, static_cast<size_t>(C)) {
    float g = 0.0f, b = 0.0f;
    for (int k = 0; k < blocks; ++k) {
      g += partial[static_cast<size_t>(k) * 2 * C + c];
      b += partial[static_cast<size_t>(k) * 2 * C + C + c];
    }
    dgamma[c] += g;
    dbeta[c] += b;
  }
}

}  // namespace

void CudaOps::layernorm_forward(Act out, float* mean, float* rstd, Act x, Act gamma, Act beta,
                                int N, int C, float eps) {
  if (N == 0) return;
  cuda::dispatch(out.dtype, [&](auto t) {
    using T = decltype(t);
    layernorm_forward_kernel<<<N, kThreads, 0, stream_>>>(typed<T>(out), mean, rstd, typed<T>(x),
                                                          typed<T>(gamma), typed<T>(beta), C, eps);
  });
  cuda::check(cudaGetLastError(), "layernorm_forward");
}

void CudaOps::residual_layernorm_forward(Act sum, Act out, float* mean, float* rstd, Act s, Act y,
                                         const Dropout& d, Act gamma, Act beta, int N, int C,
                                         float eps) {
  if (N == 0) return;
  cuda::dispatch(out.dtype, [&](auto t) {
    using T = decltype(t);
    residual_layernorm_kernel<<<N, kThreads, 0, stream_>>>(typed<T>(sum), typed<T>(out), mean, rstd,
                                                           typed<T>(s), typed<T>(y), d,
                                                           typed<T>(gamma), typed<T>(beta), C, eps);
  });
  cuda::check(cudaGetLastError(), "residual_layernorm_forward");
}

void CudaOps::layernorm_backward(Act dx, float* dgamma, float* dbeta, Act dout, Act x, Act gamma,
                                 const float* mean, const float* rstd, int N, int C,
                                 bool accumulate) {
  if (N == 0) return;
  const int blocks = (N + kRowBlock - 1) / kRowBlock;
  auto* partial = static_cast<float*>(
      scratch(kColumnSums, sizeof(float) * 2 * static_cast<size_t>(blocks) * C));
  cuda::dispatch(dx.dtype, [&](auto t) {
    using T = decltype(t);
    layernorm_backward_kernel<<<blocks, kThreads, 0, stream_>>>(
        typed<T>(dx), partial, typed<T>(dout), typed<T>(x), typed<T>(gamma), mean, rstd, N, C,
        accumulate);
  });
  cuda::check(cudaGetLastError(), "layernorm_backward");
  layernorm_param_grads_kernel<<<cuda::blocks_for(C), kThreads, 0, stream_>>>(dgamma, dbeta,
                                                                              partial, blocks, C);
  cuda::check(cudaGetLastError(), "layernorm_backward (gamma, beta)");
}

}  // namespace mpiformer
