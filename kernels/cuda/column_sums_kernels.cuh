// Column sums of a row-major (N, C) matrix whose rows are ld elements
// apart: the bias gradients where cuBLASLt does not fuse them, or where
// dbias=columns takes them out of the weight gradient's GEMM
// (kernels/kernel_switches.h). Block (x, y) sums rows [kRowBlock y,
// kRowBlock (y + 1)) of its columns into partial[y]; a second kernel adds
// the row blocks' partials in block order into dst. Each column's rows are
// summed in order in fp32, so the bits are the same whether a thread loads
// kVec columns at once (16 bytes, where the rows are aligned) or one.
// Also run on the CPU under emulation (tests/column_sums_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mpiformer::cuda::column_sums {

constexpr int kRowBlock = 64;
constexpr int kThreads = 256;      // the most threads a block of either kernel has
constexpr int kTotalThreads = 64;  // total_kernel's: more blocks, more SMs reading partials

// Whether rows of C elements ld apart from `src` all start 16-byte aligned
// and hold whole vectors: then kVecSize<T> columns go in one load.
template <typename T>
bool vectorizable(const T* src, int C, int ld) {
  const auto address = reinterpret_cast<uintptr_t>(src);
  return address % 16 == 0 && (static_cast<size_t>(ld) * sizeof(T)) % 16 == 0 &&
         C % kVecSize<T> == 0;
}

// A launch's grid and threads a block.
struct Launch {
  dim3 grid;
  int threads;
};

// partial_kernel<T, kVec> over N rows of C columns: a thread per `vec`
// columns of a row block, blocks no wider than the row's vectors (rounded
// to warps), so that narrow rows leave no idle threads.
inline Launch partial_launch(int N, int C, int vec) {
  const int vectors = C / vec;
  const int threads = vectors < kThreads ? (vectors + 31) / 32 * 32 : kThreads;
  return {dim3((vectors + threads - 1) / threads, (N + kRowBlock - 1) / kRowBlock), threads};
}

// total_kernel over C columns.
inline Launch total_launch(int C) {
  return {dim3((C + kTotalThreads - 1) / kTotalThreads), kTotalThreads};
}

// partial[y][c] = sum of src[r][c] over the block's rows r, in order.
// kVec: columns per thread, 1 or kVecSize<T> (vectorizable).
// partial: (row blocks, C); src: (N, C) rows ld apart
template <typename T, int kVec>
__global__ void partial_kernel(float* partial, const T* src, int N, int C, int ld) {
  const int r0 = blockIdx.y * kRowBlock, r1 = min(N, r0 + kRowBlock);
  const int vectors = C / kVec;
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < vectors; v += gridDim.x * blockDim.x) {
    float sum[kVec] = {};
#pragma unroll 8
    for (int r = r0; r < r1; ++r) {  // unrolled: 8 rows' loads in flight
      const T* row = src + static_cast<size_t>(r) * ld + static_cast<size_t>(v) * kVec;
      float x[kVec];
      if constexpr (kVec == 1)
        x[0] = load(row, 0);
      else
        load_vec(row, x);
#pragma unroll
      for (int k = 0; k < kVec; ++k) sum[k] += x[k];
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      partial[static_cast<size_t>(blockIdx.y) * C + static_cast<size_t>(v) * kVec + k] = sum[k];
  }
}

// dst[c] += the sum over row blocks b of partial[b][c], in block order.
__global__ void total_kernel(float* dst, const float* partial, int blocks, int C) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    float sum = 0.0f;
#pragma unroll 8
    for (int b = 0; b < blocks; ++b)  // unrolled: 8 blocks' partials in flight
      sum += partial[static_cast<size_t>(b) * C + c];
    dst[c] += sum;
  }
}

}  // namespace mpiformer::cuda::column_sums
