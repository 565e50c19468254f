// Layer norm over the last dimension (biased variance, rstd = 1/sqrt(var +
// eps)), the CPU backend's formulas. Forward, with the residual add (and
// dropout) fused in front of it: rows of up to 1024 elements on the
// warp-per-row kernels of layernorm_warp.cu (the default, layernorm=warp),
// the rest and layernorm=block one block per row. Backward (the default,
// layernorm_backward=block: layernorm_block_kernels.cuh) one warp per row,
// its gamma and beta gradients (and dx_sums where asked for) summed per
// warp, per block of rows and then across blocks in a fixed order: no
// float atomics, the same sums every run; layernorm_backward=warp takes
// such rows to layernorm_warp.cu's backward.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layernorm_block_kernels.cuh"
#include "kernels/cuda/layernorm_warp.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/layernorm_rows.h"

namespace mpiformer {

namespace {

using cuda::load;
using cuda::store;
using cuda::typed;

constexpr int kThreads = 256;

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

}  // namespace

bool CudaOps::warp_layernorm(bool backward, DType dtype, int C,
                             std::initializer_list<const void*> buffers) {
  const auto path = backward ? switches_.layernorm_backward : switches_.layernorm;
  if (path != KernelSwitches::LayerNorm::kWarp) return false;
  const bool takes = cuda::layernorm_warp_takes(dtype, C, buffers);
  count_candidate(backward ? CandidateCalls::kLayerNormBackward : CandidateCalls::kLayerNorm,
                  takes);
  return takes;
}

void CudaOps::layernorm_forward(Act out, float* mean, float* rstd, Act x, Act gamma, Act beta,
                                int N, int C, float eps) {
  if (N == 0) return;
  if (warp_layernorm(false, out.dtype, C, {out.data, x.data, gamma.data, beta.data})) {
    cuda::layernorm_warp_forward(stream_, Act(), out, mean, rstd, x, Act(), Dropout{}, gamma, beta,
                                 N, C, eps);
    return;
  }
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
  if (warp_layernorm(false, out.dtype, C,
                     {sum.data, out.data, s.data, y.data, gamma.data, beta.data})) {
    cuda::layernorm_warp_forward(stream_, sum, out, mean, rstd, s, y, d, gamma, beta, N, C, eps);
    return;
  }
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
                                 bool accumulate, float* dx_sums) {
  if (N == 0) return;
  if (dx_sums) count_candidate(CandidateCalls::kDBiasOut, accumulate);
  const layernorm_rows::Sums sums{dgamma, dbeta, accumulate ? dx_sums : nullptr};
  if (warp_layernorm(true, dx.dtype, C, {dx.data, dout.data, x.data, gamma.data})) {
    const size_t blocks = layernorm_rows::backward_blocks(N);
    auto* partial =
        static_cast<float*>(scratch(kColumnSums, sizeof(float) * sums.count() * blocks * C));
    cuda::layernorm_warp_backward(stream_, dx, sums, partial, dout, x, gamma, mean, rstd, N, C,
                                  accumulate);
    return;
  }
  int blocks = 0;
  float* partial = block_layernorm_backward(dx, sums.count(), dout, x, gamma, mean, rstd, N, C,
                                            accumulate, &blocks);
  // One load in flight a thread: the block path as it was measured.
  cuda::layernorm_param_grads(stream_, sums, partial, blocks, C, 1);
}

// The block backward, the default (a warp per row, two passes over it):
// dx, and the blocks' partial column sums it returns (`sums` of them, as
// layernorm_rows::Sums), *blocks of them.
float* CudaOps::block_layernorm_backward(Act dx, int sums, Act dout, Act x, Act gamma,
                                         const float* mean, const float* rstd, int N, int C,
                                         bool accumulate, int* blocks_out) {
  // 8 warps of two rows each, fewer where dgamma's and dbeta's
  // accumulators would pass the 48 KiB of shared memory a block gets
  // without asking (dx_sums' then ask for more).
  constexpr size_t kSharedBytes = size_t{48} << 10;
  const size_t per_warp = sizeof(float) * 2 * static_cast<size_t>(C);
  const int warps = static_cast<int>(std::clamp<size_t>(kSharedBytes / per_warp, 1, 8));
  const size_t shared = per_warp / 2 * sums * warps;
  const int rows_per_block = 2 * warps;
  const int blocks = (N + rows_per_block - 1) / rows_per_block;
  auto* partial = static_cast<float*>(
      scratch(kColumnSums, sizeof(float) * sums * static_cast<size_t>(blocks) * C));
  cuda::dispatch(dx.dtype, [&](auto t) {
    using T = decltype(t);
    if (shared > kSharedBytes) {
      cuda::check(cudaFuncSetAttribute(cuda::layernorm_block::backward_kernel<T>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared)),
                  "cudaFuncSetAttribute (layernorm_backward)");
    }
    cuda::layernorm_block::backward_kernel<<<blocks, 32 * warps, shared, stream_>>>(
        typed<T>(dx), partial, typed<T>(dout), typed<T>(x), typed<T>(gamma), mean, rstd, N, C,
        rows_per_block, accumulate, sums);
  });
  cuda::check(cudaGetLastError(), "layernorm_backward");
  *blocks_out = blocks;
  return partial;
}

}  // namespace mpiformer
