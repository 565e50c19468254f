// The block layer norm backward's device code (layernorm_backward=block,
// the default; launched by layernorm.cu, run on the CPU by
// tests/layernorm_emulation_test.cpp, where tests/emulated_cuda stands in
// for the CUDA built-ins).
#pragma once

#include <cstddef>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer::cuda {

namespace layernorm_block {

// The backward's dynamic shared memory: (warps, sums, C) floats.
extern __shared__ float accumulators[];

// The backward: each warp takes whole rows (warp shuffles, no block
// barriers per row; 16-byte loads where the rows allow) and adds its rows'
// dgamma and dbeta (and, with `sums` 3, the dx they add to: dx_sums) into
// accumulators of its own in shared memory; the block then sums its warps
// in order into its partial. Rows of a block: warp w takes rows w, w +
// warps, ... of them.
// dx (= or +=), dout, x: (N, C); partial: (blocks, sums, C)
template <typename T>
__global__ void backward_kernel(T* dx, float* partial, const T* dout, const T* x, const T* gamma,
                                const float* mean, const float* rstd, int N, int C,
                                int rows_per_block, bool accumulate, int sums) {
  constexpr int kVec = kVecSize<T>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float* warp_dgamma = accumulators + static_cast<size_t>(warp) * sums * C;
  float* warp_dbeta = warp_dgamma + C;
  float* warp_dx_in = sums == 3 ? warp_dbeta + C : nullptr;  // dx as it came
  for (int c = lane; c < sums * C; c += 32) warp_dgamma[c] = 0.0f;
  __syncwarp();
  const int first = blockIdx.x * rows_per_block, end = min(N, first + rows_per_block);
  for (int r = first + warp; r < end; r += warps) {
    const size_t base = static_cast<size_t>(r) * C;
    const T *xr = x + base, *dr = dout + base;
    T* dxr = dx + base;
    const float m = mean[r], s = rstd[r];
    // (C % 4: the accumulators' float4 accesses stay aligned too)
    const bool aligned =
        C % 4 == 0 && aligned16(xr) && aligned16(dr) && aligned16(dxr) && aligned16(gamma);
    // A row that is not (rows of C % 8 == 4 in bf16 alternate) gives its
    // columns to other lanes than its neighbours do: the accumulators'
    // writes are ordered across lanes on either side of it.
    if (!aligned) __syncwarp();
    const int vectorized = aligned ? C / kVec * kVec : 0;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * gamma
    float g_sum = 0.0f, g_xhat_sum = 0.0f;
    for (int c0 = lane * kVec; c0 < vectorized; c0 += 32 * kVec) {
      float xv[kVec], dv[kVec], gv[kVec];
      load_vec(xr + c0, xv);
      load_vec(dr + c0, dv);
      load_vec(gamma + c0, gv);
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
    const float g_mean = warp_sum(g_sum) / C;
    const float g_xhat_mean = warp_sum(g_xhat_sum) / C;
    for (int c0 = lane * kVec; c0 < vectorized; c0 += 32 * kVec) {
      float xv[kVec], dv[kVec], gv[kVec], out[kVec];
      load_vec(xr + c0, xv);
      load_vec(dr + c0, dv);
      load_vec(gamma + c0, gv);
      if (accumulate) load_vec(dxr + c0, out);
      float dgamma[kVec], prior[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xhat = (xv[k] - m) * s;
        const float d = s * (dv[k] * gv[k] - g_mean - xhat * g_xhat_mean);
        prior[k] = accumulate ? out[k] : 0.0f;  // dx as it came
        out[k] = accumulate ? out[k] + d : d;
        dgamma[k] = dv[k] * xhat;
      }
      store_vec(dxr + c0, out);
      // 16-byte read-modify-writes of the accumulators (c0 is a multiple of 4)
#pragma unroll
      for (int k = 0; k < kVec; k += 4) {
        if (warp_dx_in) {
          auto* i4 = reinterpret_cast<float4*>(warp_dx_in + c0 + k);
          float4 in = *i4;
          in.x += prior[k], in.y += prior[k + 1], in.z += prior[k + 2], in.w += prior[k + 3];
          *i4 = in;
        }
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
      const float prior = accumulate ? load(dxr, c) : 0.0f;
      store(dxr, c, accumulate ? prior + d : d);
      warp_dgamma[c] += dy * xhat;
      warp_dbeta[c] += dy;
      if (warp_dx_in) warp_dx_in[c] += prior;
    }
    if (!aligned) __syncwarp();
  }
  __syncthreads();
  float* block_partial = partial + static_cast<size_t>(blockIdx.x) * sums * C;
  for (int c = threadIdx.x; c < sums * C; c += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += accumulators[static_cast<size_t>(w) * sums * C + c];
    block_partial[c] = sum;
  }
}

}  // namespace layernorm_block

}  // namespace mpiformer::cuda
