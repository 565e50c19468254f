// Layer norm over the last dimension (biased variance, rstd = 1/sqrt(var +
// eps)), one block per row; the CPU backend's formulas.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

constexpr int kThreads = 256;

// out, x: (N, C), mean, rstd: (N), gamma, beta: (C)
__global__ void layernorm_forward_kernel(float* out, float* mean_out, float* rstd_out,
                                         const float* x, const float* gamma, const float* beta,
                                         int C, float eps) {
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  const float* xr = x + row * C;
  float sum = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) sum += xr[c];
  const float mean = cuda::block_sum(sum, shared) / C;
  float sum_sq = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) sum_sq += (xr[c] - mean) * (xr[c] - mean);
  const float rstd = 1.0f / sqrtf(cuda::block_sum(sum_sq, shared) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    out[row * C + c] = (xr[c] - mean) * rstd * gamma[c] + beta[c];
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * gamma;
// dgamma += dout * xhat and dbeta += dout, summed over rows with atomics.
__global__ void layernorm_backward_kernel(float* dx, float* dgamma, float* dbeta, const float* dout,
                                          const float* x, const float* gamma, const float* mean,
                                          const float* rstd, int C, bool accumulate) {
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  const float* xr = x + row * C;
  const float* dr = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float g_sum = 0.0f, g_xhat_sum = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = dr[c] * gamma[c];
    g_sum += g;
    g_xhat_sum += g * (xr[c] - m) * r;
  }
  const float g_mean = cuda::block_sum(g_sum, shared) / C;
  const float g_xhat_mean = cuda::block_sum(g_xhat_sum, shared) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (xr[c] - m) * r;
    const float d = r * (dr[c] * gamma[c] - g_mean - xhat * g_xhat_mean);
    dx[row * C + c] = accumulate ? dx[row * C + c] + d : d;
    atomicAdd(dgamma + c, dr[c] * xhat);
    atomicAdd(dbeta + c, dr[c]);
  }
}

}  // namespace

void CudaOps::layernorm_forward(float* out, float* mean, float* rstd, const float* x,
                                const float* gamma, const float* beta, int N, int C, float eps) {
  if (N == 0) return;
  layernorm_forward_kernel<<<N, kThreads, 0, stream_>>>(out, mean, rstd, x, gamma, beta, C, eps);
  cuda::check(cudaGetLastError(), "layernorm_forward");
}

void CudaOps::layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dout,
                                 const float* x, const float* gamma, const float* mean,
                                 const float* rstd, int N, int C, bool accumulate) {
  if (N == 0) return;
  layernorm_backward_kernel<<<N, kThreads, 0, stream_>>>(dx, dgamma, dbeta, dout, x, gamma, mean,
                                                         rstd, C, accumulate);
  cuda::check(cudaGetLastError(), "layernorm_backward");
}

}  // namespace mpiformer
