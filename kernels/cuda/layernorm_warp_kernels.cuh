// The warp-per-row layer norm's device code (launched by layernorm_warp.cu;
// run on the CPU by tests/layernorm_emulation_test.cpp, where
// tests/emulated_cuda stands in for the CUDA built-ins): the block kernels'
// formulas (layernorm.cu) with each row held in registers, so that it is
// read from memory once, and its sums in the fixed order of
// kernels/layernorm_rows.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/dropout_mask.h"
#include "kernels/layernorm_rows.h"
#include "kernels/ops.h"

namespace mpiformer::cuda {

namespace layernorm_warp {

namespace rows = layernorm_rows;

constexpr int kThreads = rows::kWarps * rows::kLanes;

// The backward's dynamic shared memory: (kWarps, 2, C) floats.
extern __shared__ float warp_shared[];

// x rounded to T and widened again: the value a store then a load gives.
template <typename T>
__device__ __forceinline__ float rounded(float x) {
  T t;
  store(&t, 0, x);
  return load(&t, 0);
}

// A lane's slots of a row: slot i holds vector rows::vector_of(lane, i)
// where that is below `vectors`.  v: (kSlots, kVec), row: (C)
template <typename T, int kSlots>
__device__ __forceinline__ void load_slots(float (&v)[kSlots][kVecSize<T>], const T* row, int lane,
                                           int vectors) {
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (rows::vector_of(lane, i) < vectors)
      load_vec(row + rows::vector_of(lane, i) * kVecSize<T>, v[i]);
}

// x = s + dropout(y) of one row in v, stored rounded to sum and then read
// as stored.  v: (kSlots, kVec); sum, s, y: the row (C) at element `base`
template <typename T, int kSlots>
__device__ void residual_slots(float (&v)[kSlots][kVecSize<T>], T* sum, const T* s, const T* y,
                               const Dropout& d, size_t base, int lane, int vectors) {
  constexpr int kVec = kVecSize<T>;
  const float keep_scale = d.p > 0.0f ? (d.p < 1.0f ? 1.0f / (1.0f - d.p) : 0.0f) : 1.0f;
  load_slots<T, kSlots>(v, s + base, lane, vectors);
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int c0 = rows::vector_of(lane, i) * kVec;
    if (rows::vector_of(lane, i) >= vectors) continue;
    float dy[kVec];
    load_vec(y + base + c0, dy);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (d.p > 0.0f)
        dy[k] = dropout_keep(d.seed, d.stream, base + c0 + k, d.p) ? dy[k] * keep_scale : 0.0f;
      v[i][k] += dy[k];
    }
    store_vec(sum + base + c0, v[i]);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[i][k] = rounded<T>(v[i][k]);
  }
}

// One warp per row (kWarps rows a block). sum, out, s, y: (N, C); mean,
// rstd: (N); gamma, beta: (C). y null: the row is s, sum untouched.
template <typename T, int kSlots>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(T* sum, T* out, float* mean, float* rstd, const T* s, const T* y, Dropout d,
                   const T* gamma, const T* beta, int N, int C, float eps) {
  constexpr int kVec = kVecSize<T>;
  const int lane = threadIdx.x % rows::kLanes;
  const int row = blockIdx.x * rows::kWarps + threadIdx.x / rows::kLanes;
  if (row >= N) return;
  const int vectors = rows::row_vectors(C, kVec);
  const size_t base = static_cast<size_t>(row) * C;
  float v[kSlots][kVec] = {};
  if (y)
    residual_slots<T, kSlots>(v, sum, s, y, d, base, lane, vectors);
  else
    load_slots<T, kSlots>(v, s + base, lane, vectors);
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (rows::vector_of(lane, i) < vectors)
#pragma unroll
      for (int k = 0; k < kVec; ++k) total += v[i][k];
  const float m = warp_sum(total) / C;
  float squares = 0.0f;
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (rows::vector_of(lane, i) < vectors)
#pragma unroll
      for (int k = 0; k < kVec; ++k) squares += (v[i][k] - m) * (v[i][k] - m);
  const float r = 1.0f / sqrtf(warp_sum(squares) / C + eps);
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int c0 = rows::vector_of(lane, i) * kVec;
    if (rows::vector_of(lane, i) >= vectors) continue;
    float g[kVec], b[kVec], o[kVec];
    load_vec(gamma + c0, g);
    load_vec(beta + c0, b);
#pragma unroll
    for (int k = 0; k < kVec; ++k) o[k] = (v[i][k] - m) * r * g[k] + b[k];
    store_vec(out + base + c0, o);
  }
  if (lane == 0) mean[row] = m, rstd[row] = r;
}

// One row's dx (= or +=) from registers, its dgamma and dbeta added into
// the lane's sums.  g, dgamma, dbeta: (kSlots, kVec); dx, dout, x: (N, C)
template <typename T, int kSlots>
__device__ void backward_row(float (&dgamma)[kSlots][kVecSize<T>],
                             float (&dbeta)[kSlots][kVecSize<T>],
                             const float (&g)[kSlots][kVecSize<T>], T* dx, const T* dout,
                             const T* x, float m, float s, size_t base, int lane, int C,
                             bool accumulate) {
  constexpr int kVec = kVecSize<T>;
  const int vectors = rows::row_vectors(C, kVec);
  float xv[kSlots][kVec] = {}, dv[kSlots][kVec] = {};
  load_slots<T, kSlots>(xv, x + base, lane, vectors);
  load_slots<T, kSlots>(dv, dout + base, lane, vectors);
  // dx = rstd * (gd - mean(gd) - xhat * mean(gd * xhat)), gd = dout * gamma
  float gd_sum = 0.0f, gd_xhat_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (rows::vector_of(lane, i) < vectors)
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float gd = dv[i][k] * g[i][k];
        gd_sum += gd;
        gd_xhat_sum += gd * (xv[i][k] - m) * s;
      }
  const float gd_mean = warp_sum(gd_sum) / C, gd_xhat_mean = warp_sum(gd_xhat_sum) / C;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int c0 = rows::vector_of(lane, i) * kVec;
    if (rows::vector_of(lane, i) >= vectors) continue;
    float out[kVec];
    if (accumulate) load_vec(dx + base + c0, out);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float xhat = (xv[i][k] - m) * s;
      const float d = s * (dv[i][k] * g[i][k] - gd_mean - xhat * gd_xhat_mean);
      out[k] = accumulate ? out[k] + d : d;
      dgamma[i][k] += dv[i][k] * xhat;
      dbeta[i][k] += dv[i][k];
    }
    store_vec(dx + base + c0, out);
  }
}

// Block b takes rows [32 b, 32 b + 32): warp w rows 32 b + w + 8 k. Each
// lane sums its columns' dgamma and dbeta over its rows in registers; the
// block then adds its warps in order into its partial.
// dx, dout, x: (N, C); partial: (blocks, 2, C); shared: (kWarps, 2, C)
template <typename T, int kSlots>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(T* dx, float* partial, const T* dout, const T* x, const T* gamma,
                    const float* mean, const float* rstd, int N, int C, bool accumulate) {
  constexpr int kVec = kVecSize<T>;
  float* warp_sums = warp_shared;
  const int lane = threadIdx.x % rows::kLanes, warp = threadIdx.x / rows::kLanes;
  const int vectors = rows::row_vectors(C, kVec);
  float g[kSlots][kVec] = {}, dgamma[kSlots][kVec] = {}, dbeta[kSlots][kVec] = {};
  load_slots<T, kSlots>(g, gamma, lane, vectors);
  int row = rows::backward_first_row(blockIdx.x, warp);
  for (int k = 0; k < rows::kBackwardRowsPerWarp && row < N; ++k, row += rows::kWarps)
    backward_row<T, kSlots>(dgamma, dbeta, g, dx, dout, x, mean[row], rstd[row],
                            static_cast<size_t>(row) * C, lane, C, accumulate);
  float* mine = warp_sums + static_cast<size_t>(warp) * 2 * C;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int c0 = rows::vector_of(lane, i) * kVec;
    if (rows::vector_of(lane, i) >= vectors) continue;
#pragma unroll
    for (int k = 0; k < kVec; ++k) mine[c0 + k] = dgamma[i][k], mine[C + c0 + k] = dbeta[i][k];
  }
  __syncthreads();
  float* block_partial = partial + static_cast<size_t>(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    float total = 0.0f;
    for (int w = 0; w < rows::kWarps; ++w) total += warp_sums[static_cast<size_t>(w) * 2 * C + c];
    block_partial[c] = total;
  }
}

// Calls fn(std::integral_constant<int, slots>{}) for the instance that
// holds `slots` vectors per lane (rows::lane_slots).
template <typename Fn>
void with_slots(int slots, Fn&& fn) {
  switch (slots) {
    case 1:
      return fn(std::integral_constant<int, 1>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    case 3:
      return fn(std::integral_constant<int, 3>{});
    case 4:
      return fn(std::integral_constant<int, 4>{});
    case 6:
      return fn(std::integral_constant<int, 6>{});
    case 8:
      return fn(std::integral_constant<int, 8>{});
  }
  throw std::logic_error("layernorm_warp: no kernel holds " + std::to_string(slots) + " vectors");
}

}  // namespace layernorm_warp

}  // namespace mpiformer::cuda
