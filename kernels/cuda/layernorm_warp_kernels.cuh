// The warp-per-row layer norm's device code (launched by layernorm_warp.cu;
// run on the CPU by tests/layernorm_emulation_test.cpp, where
// tests/emulated_cuda stands in for the CUDA built-ins): the block kernels'
// formulas (layernorm.cu) with each row held in registers, so that it is
// read from memory once (the backward's as stored, with the next row's
// loads in flight), and its sums in the fixed order of
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

// The backward's dynamic shared memory: (kWarps, sums, sum_span) floats,
// sums the column sums it keeps (layernorm_rows::Sums::count()).
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

// A lane's slots of a row as stored (16 bytes each, widened where used):
// half the registers of floats in bf16 and fp16, so that the backward
// holds a row and the next one's loads and still leaves room for more
// warps on an SM.  raw: (kSlots), row: (C)
template <typename T, int kSlots>
__device__ __forceinline__ void load_raw_slots(uint4 (&raw)[kSlots], const T* row, int lane,
                                               int vectors) {
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (rows::vector_of(lane, i) < vectors)
      raw[i] = *reinterpret_cast<const uint4*>(row + rows::vector_of(lane, i) * kVecSize<T>);
}

// The kVec elements of T in a raw slot, widened.
template <typename T>
__device__ __forceinline__ void widen_slot(const uint4& raw, float (&v)[kVecSize<T>]) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVecSize<T>; ++k) v[k] = load(e, k);
}

// The backward's per-warp sums of dgamma and dbeta in shared memory, lane
// by lane: element k of a lane's slot i sits at (i kVec + k) 32 + lane, so
// that a warp's 32 lanes touch 32 consecutive floats (no bank conflicts).
// Each array (dgamma's, dbeta's, and dx_sums' where kept) takes sum_span
// floats.
template <int kSlots, int kVec>
__host__ __device__ constexpr int sum_span() {
  return kSlots * kVec * rows::kLanes;
}
template <int kVec>
__device__ __forceinline__ int sum_index(int lane, int i, int k) {
  return (i * kVec + k) * rows::kLanes + lane;
}
// Where column c's sum sits (the lane and slot that hold it).
template <int kVec>
__device__ __forceinline__ int sum_index_of_column(int c) {
  const int v = c / kVec;
  return sum_index<kVec>(v % rows::kLanes, v / rows::kLanes, c % kVec);
}

// One row's x and dout as stored (a lane's slots), and its mean and rstd.
template <int kSlots>
struct RawRow {
  uint4 x[kSlots], dout[kSlots];
  float mean, rstd;
};

// Starts the loads of row r (0 <= r < N) into `raw`.  x, dout: (N, C)
template <typename T, int kSlots>
__device__ __forceinline__ void load_raw_row(RawRow<kSlots>& raw, const T* x, const T* dout,
                                             const float* mean, const float* rstd, int r, int C,
                                             int lane, int vectors) {
  load_raw_slots<T, kSlots>(raw.x, x + static_cast<size_t>(r) * C, lane, vectors);
  load_raw_slots<T, kSlots>(raw.dout, dout + static_cast<size_t>(r) * C, lane, vectors);
  raw.mean = mean[r];
  raw.rstd = rstd[r];
}

// Whether backward_row loads the dx it adds to (accumulate) before the
// row's sums rather than after: the loads of all its slots then overlap
// the sums and each other, in registers that ptxas finds up to 3 slots
// (bf16 and fp16 rows up to 768, fp32 up to 384) without spilling.
template <int kSlots>
constexpr bool kEarlyPrior = kSlots <= 3;

// A lane's hint that dx's row r (C elements) be brought into L2, for the
// += of its row a row ahead: the 128-byte lines the row touches, from the
// line its first byte is in (a row starts on 16 bytes, not on a line), a
// line per lane in turn.  dx: (N, C)
template <typename T>
__device__ __forceinline__ void prefetch_row_l2(const T* dx, int r, int C, int lane) {
  constexpr uintptr_t kLine = 128;
  const T* row = dx + static_cast<size_t>(r) * C;
  const uintptr_t first = reinterpret_cast<uintptr_t>(row) / kLine * kLine;
  const uintptr_t end = reinterpret_cast<uintptr_t>(row + C);
  for (uintptr_t line = first + lane * kLine; line < end; line += rows::kLanes * kLine)
    prefetch_l2(reinterpret_cast<const void*>(line));
}

// One row's dx (= or +=) from its raw slots, its dgamma and dbeta (and
// with kSums 3 the dx it adds to) added into the warp's sums in shared
// memory (each lane its own columns, in row order).
// gamma: (kSlots) raw; sums: (kSums, sum_span) lane by lane; dx: (N, C)
template <typename T, int kSlots, int kSums>
__device__ void backward_row(float* sums, const uint4 (&gamma)[kSlots], const RawRow<kSlots>& row,
                             T* dx, size_t base, int lane, int C, bool accumulate) {
  constexpr int kVec = kVecSize<T>, kSpan = sum_span<kSlots, kVec>();
  const int vectors = rows::row_vectors(C, kVec);
  const float m = row.mean, s = row.rstd;
  uint4 prior[kSlots] = {};  // dx as stored, where kEarlyPrior
  if (kEarlyPrior<kSlots> && accumulate) load_raw_slots<T, kSlots>(prior, dx + base, lane, vectors);
  // dx = rstd * (gd - mean(gd) - xhat * mean(gd * xhat)), gd = dout * gamma
  float gd_sum = 0.0f, gd_xhat_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    if (rows::vector_of(lane, i) >= vectors) continue;
    float xv[kVec], dv[kVec], g[kVec];
    widen_slot<T>(row.x[i], xv);
    widen_slot<T>(row.dout[i], dv);
    widen_slot<T>(gamma[i], g);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float gd = dv[k] * g[k];
      gd_sum += gd;
      gd_xhat_sum += gd * (xv[k] - m) * s;
    }
  }
  const float gd_mean = warp_sum(gd_sum) / C, gd_xhat_mean = warp_sum(gd_xhat_sum) / C;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int c0 = rows::vector_of(lane, i) * kVec;
    if (rows::vector_of(lane, i) >= vectors) continue;
    float xv[kVec], dv[kVec], g[kVec], out[kVec];
    widen_slot<T>(row.x[i], xv);
    widen_slot<T>(row.dout[i], dv);
    widen_slot<T>(gamma[i], g);
    if (accumulate) {
      if (kEarlyPrior<kSlots>)
        widen_slot<T>(prior[i], out);
      else
        load_vec(dx + base + c0, out);
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float xhat = (xv[k] - m) * s;
      const float d = s * (dv[k] * g[k] - gd_mean - xhat * gd_xhat_mean);
      if (kSums == 3 && accumulate)  // dx as it came
        sums[2 * kSpan + sum_index<kVec>(lane, i, k)] += out[k];
      out[k] = accumulate ? out[k] + d : d;
      sums[sum_index<kVec>(lane, i, k)] += dv[k] * xhat;
      sums[kSpan + sum_index<kVec>(lane, i, k)] += dv[k];
    }
    store_vec(dx + base + c0, out);
  }
}

// Block b takes rows [32 b, 32 b + 32): warp w rows 32 b + w + 8 k, each
// row's loads started while the row before is worked on. Each warp sums
// its rows' dgamma and dbeta (kSums 2), and the dx they add to (kSums 3,
// accumulate only), in its shared memory, each lane its own columns; the
// block then adds its warps in order into its partial. Up to 4 slots
// (C <= 1024 in bf16 and fp16, 512 in fp32) the registers leave room for
// two blocks on an SM (bf16's 4 slots spill a few bytes).
// dx, dout, x: (N, C); partial: (blocks, kSums, C);
// shared: (kWarps, kSums, sum_span) lane by lane
template <typename T, int kSlots, int kSums = 2>
__global__ void __launch_bounds__(kThreads, kSlots <= 4 ? 2 : 1)
    backward_kernel(T* dx, float* partial, const T* dout, const T* x, const T* gamma,
                    const float* mean, const float* rstd, int N, int C, bool accumulate) {
  constexpr int kVec = kVecSize<T>, kSpan = sum_span<kSlots, kVec>();
  const int lane = threadIdx.x % rows::kLanes, warp = threadIdx.x / rows::kLanes;
  const int vectors = rows::row_vectors(C, kVec);
  float* sums = warp_shared + static_cast<size_t>(warp) * kSums * kSpan;
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
#pragma unroll
    for (int k = 0; k < kVec; ++k)
#pragma unroll
      for (int j = 0; j < kSums; ++j) sums[j * kSpan + sum_index<kVec>(lane, i, k)] = 0.0f;
  uint4 g[kSlots] = {};
  load_raw_slots<T, kSlots>(g, gamma, lane, vectors);
  int row = rows::backward_first_row(blockIdx.x, warp);
  RawRow<kSlots> current = {}, next = {};
  if (row < N) load_raw_row<T, kSlots>(current, x, dout, mean, rstd, row, C, lane, vectors);
#pragma unroll
  for (int k = 0; k < rows::kBackwardRowsPerWarp; ++k, row += rows::kWarps) {
    if (row >= N) break;
    const int after = row + rows::kWarps;
    if (k + 1 < rows::kBackwardRowsPerWarp && after < N) {
      load_raw_row<T, kSlots>(next, x, dout, mean, rstd, after, C, lane, vectors);
      if (accumulate) prefetch_row_l2(dx, after, C, lane);
    }
    backward_row<T, kSlots, kSums>(sums, g, current, dx, static_cast<size_t>(row) * C, lane, C,
                                   accumulate);
    current = next;
  }
  __syncthreads();
  float* block_partial = partial + static_cast<size_t>(blockIdx.x) * kSums * C;
  for (int c = threadIdx.x; c < kSums * C; c += blockDim.x) {
    const int array = c / C;
    const int at = array * kSpan + sum_index_of_column<kVec>(c - array * C);
    float total = 0.0f;
    for (int w = 0; w < rows::kWarps; ++w)
      total += warp_shared[static_cast<size_t>(w) * kSums * kSpan + at];
    block_partial[c] = total;
  }
}

// The reduction of either backward's partials into their column sums
// (layernorm_param_grads): blocks of kParamColumns columns by kParamRows
// rows of threads.
constexpr int kParamColumns = 32, kParamRows = 8, kParamThreads = kParamColumns * kParamRows;
// Loads of partials each thread of the warp path keeps in flight before
// it adds them (the block path keeps 1, as it was measured).
constexpr int kParamLoadsInFlight = 16;
// param_grads_kernel's sums of its thread rows (at namespace scope, where
// the CPU emulation of the kernels also finds one per block).
static __shared__ float param_row_sums[kParamRows][kParamColumns + 1];

// dgamma[c] += the sum over blocks of partial[b][0][c], dbeta likewise
// ([b][1][c]), and dx_sums where kept ([b][2][c]: layernorm_rows::Sums),
// in one fixed order for any timing: thread row y
// (threadIdx.x / 32) sums blocks y, y + 8, ... in order, then row 0 the 8
// rows' sums in order. Each thread loads kInFlight partials before adding
// them in that order, so that it waits on memory once per kInFlight
// partials: the same bits for any kInFlight (the grid is 2C / 32 blocks,
// 48 for GPT-2, 72 with dx_sums, fewer than the SMs, so the loads each
// keeps in flight set the rate).
// partial: (blocks, sums.count(), C); kParamThreads threads;
// grid ceil(sums.count() C / 32)
template <int kInFlight>
__global__ void __launch_bounds__(kParamThreads)
    param_grads_kernel(rows::Sums sums, const float* partial, int blocks, int C) {
  const int column = threadIdx.x % kParamColumns, y = threadIdx.x / kParamColumns;
  const int c = blockIdx.x * kParamColumns + column, columns = sums.count() * C;
  const size_t step = static_cast<size_t>(columns);
  float sum = 0.0f;
  if (c < columns) {
    constexpr int kStride = kParamRows * kInFlight;
    int b = y;
    for (; b + kStride - kParamRows < blocks; b += kStride) {
      float loaded[kInFlight];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i)
        loaded[i] = partial[static_cast<size_t>(b + i * kParamRows) * step + c];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) sum += loaded[i];
    }
    for (; b < blocks; b += kParamRows) sum += partial[static_cast<size_t>(b) * step + c];
  }
  param_row_sums[y][column] = sum;
  __syncthreads();
  if (y != 0 || c >= columns) return;
  float total = 0.0f;
  for (int r = 0; r < kParamRows; ++r) total += param_row_sums[r][column];
  *sums.target(c, C) += total;
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
