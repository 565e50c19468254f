// Layer norm over the last dimension (biased variance, rstd = 1/sqrt(var +
// eps)), the CPU backend's formulas. Forward, with the residual add (and
// dropout) fused in front of it: rows of up to 1024 elements on the
// warp-per-row kernels of layernorm_warp.cu (the default, layernorm=warp),
// the rest and layernorm=block one block per row. Backward (the default,
// layernorm_backward=block) one warp per row, its gamma and beta gradients
// summed per warp, per block of rows and then across blocks in a fixed
// order: no float atomics, the same sums every run;
// layernorm_backward=warp takes such rows to layernorm_warp.cu's backward.
#include <algorithm>

#include "kernels/cuda/common.cuh"
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

// The backward: each warp takes whole rows (warp shuffles, no block
// barriers per row; 16-byte loads where the rows allow) and adds its rows'
// dgamma and dbeta into accumulators of its own in shared memory; the
// block then sums its warps in order into its partial. Rows of a block:
// warp w takes rows w, w + warps, ... of them.
// dx (= or +=), dout, x: (N, C); partial: (blocks, 2, C)
template <typename T>
__global__ void layernorm_backward_kernel(T* dx, float* partial, const T* dout, const T* x,
                                          const T* gamma, const float* mean, const float* rstd,
                                          int N, int C, int rows_per_block, bool accumulate) {
  constexpr int kVec = cuda::kVecSize<T>;
  extern __shared__ float accumulators[];  // (warps, 2, C)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float* warp_dgamma = accumulators + static_cast<size_t>(warp) * 2 * C;
  float* warp_dbeta = warp_dgamma + C;
  for (int c = lane; c < C; c += 32) warp_dgamma[c] = warp_dbeta[c] = 0.0f;
  __syncwarp();
  const int first = blockIdx.x * rows_per_block, end = min(N, first + rows_per_block);
  for (int r = first + warp; r < end; r += warps) {
    const size_t base = static_cast<size_t>(r) * C;
    const T *xr = x + base, *dr = dout + base;
    T* dxr = dx + base;
    const float m = mean[r], s = rstd[r];
    // (C % 4: the accumulators' float4 accesses stay aligned too)
    const bool aligned = C % 4 == 0 && cuda::aligned16(xr) && cuda::aligned16(dr) &&
                         cuda::aligned16(dxr) && cuda::aligned16(gamma);
    const int vectorized = aligned ? C / kVec * kVec : 0;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * gamma
    float g_sum = 0.0f, g_xhat_sum = 0.0f;
    for (int c0 = lane * kVec; c0 < vectorized; c0 += 32 * kVec) {
      float xv[kVec], dv[kVec], gv[kVec];
      cuda::load_vec(xr + c0, xv);
      cuda::load_vec(dr + c0, dv);
      cuda::load_vec(gamma + c0, gv);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float g = dv[k] * gv[k];
        g_sum += g;
        g_xhat_sum += g * (xv[k] - m) * s;
      }
    }
    for (int c = vectorized + lane; c < C; c += 32) {
      const float g = load(dr, c) * load(gamma, c);
      g_sum += g;
      g_xhat_sum += g * (load(xr, c) - m) * s;
    }
    const float g_mean = cuda::warp_sum(g_sum) / C;
    const float g_xhat_mean = cuda::warp_sum(g_xhat_sum) / C;
    for (int c0 = lane * kVec; c0 < vectorized; c0 += 32 * kVec) {
      float xv[kVec], dv[kVec], gv[kVec], out[kVec];
      cuda::load_vec(xr + c0, xv);
      cuda::load_vec(dr + c0, dv);
      cuda::load_vec(gamma + c0, gv);
      if (accumulate) cuda::load_vec(dxr + c0, out);
      float dgamma[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xhat = (xv[k] - m) * s;
        const float d = s * (dv[k] * gv[k] - g_mean - xhat * g_xhat_mean);
        out[k] = accumulate ? out[k] + d : d;
        dgamma[k] = dv[k] * xhat;
      }
      cuda::store_vec(dxr + c0, out);
      // 16-byte read-modify-writes of the accumulators (c0 is a multiple of 4)
#pragma unroll
      for (int k = 0; k < kVec; k += 4) {
        auto* g4 = reinterpret_cast<float4*>(warp_dgamma + c0 + k);
        auto* b4 = reinterpret_cast<float4*>(warp_dbeta + c0 + k);
        float4 g = *g4, b = *b4;
        g.x += dgamma[k], g.y += dgamma[k + 1], g.z += dgamma[k + 2], g.w += dgamma[k + 3];
        b.x += dv[k], b.y += dv[k + 1], b.z += dv[k + 2], b.w += dv[k + 3];
        *g4 = g, *b4 = b;
      }
    }
    for (int c = vectorized + lane; c < C; c += 32) {
      const float xhat = (load(xr, c) - m) * s;
      const float dy = load(dr, c);
      const float d = s * (dy * load(gamma, c) - g_mean - xhat * g_xhat_mean);
      store(dxr, c, accumulate ? load(dxr, c) + d : d);
      warp_dgamma[c] += dy * xhat;
      warp_dbeta[c] += dy;
    }
  }
  __syncthreads();
  float* block_partial = partial + static_cast<size_t>(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += accumulators[static_cast<size_t>(w) * 2 * C + c];
    block_partial[c] = sum;
  }
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
                                 bool accumulate) {
  if (N == 0) return;
  if (warp_layernorm(true, dx.dtype, C, {dx.data, dout.data, x.data, gamma.data})) {
    const size_t blocks = layernorm_rows::backward_blocks(N);
    auto* partial = static_cast<float*>(scratch(kColumnSums, sizeof(float) * 2 * blocks * C));
    cuda::layernorm_warp_backward(stream_, dx, dgamma, dbeta, partial, dout, x, gamma, mean, rstd,
                                  N, C, accumulate);
    return;
  }
  int blocks = 0;
  float* partial =
      block_layernorm_backward(dx, dout, x, gamma, mean, rstd, N, C, accumulate, &blocks);
  // One load in flight a thread: the block path as it was measured.
  cuda::layernorm_param_grads(stream_, dgamma, dbeta, partial, blocks, C, 1);
}

// The block backward, the default (a warp per row, two passes over it):
// dx, and the blocks' partial sums it returns, *blocks of them.
float* CudaOps::block_layernorm_backward(Act dx, Act dout, Act x, Act gamma, const float* mean,
                                         const float* rstd, int N, int C, bool accumulate,
                                         int* blocks_out) {
  // 8 warps of two rows each, fewer where their accumulators would pass
  // the 48 KiB of shared memory a block gets without asking.
  constexpr size_t kSharedBytes = size_t{48} << 10;
  const size_t per_warp = sizeof(float) * 2 * static_cast<size_t>(C);
  const int warps = static_cast<int>(std::clamp<size_t>(kSharedBytes / per_warp, 1, 8));
  const size_t shared = per_warp * warps;
  const int rows_per_block = 2 * warps;
  const int blocks = (N + rows_per_block - 1) / rows_per_block;
  auto* partial = static_cast<float*>(
      scratch(kColumnSums, sizeof(float) * 2 * static_cast<size_t>(blocks) * C));
  cuda::dispatch(dx.dtype, [&](auto t) {
    using T = decltype(t);
    if (shared > kSharedBytes) {
      cuda::check(cudaFuncSetAttribute(layernorm_backward_kernel<T>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared)),
                  "cudaFuncSetAttribute (layernorm_backward)");
    }
    layernorm_backward_kernel<<<blocks, 32 * warps, shared, stream_>>>(
        typed<T>(dx), partial, typed<T>(dout), typed<T>(x), typed<T>(gamma), mean, rstd, N, C,
        rows_per_block, accumulate);
  });
  cuda::check(cudaGetLastError(), "layernorm_backward");
  *blocks_out = blocks;
  return partial;
}

}  // namespace mpiformer
