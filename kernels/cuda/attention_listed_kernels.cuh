// Decoding attention's kernel (launched by attention_listed.cu; run on the
// CPU by tests/attention_listed_emulation_test.cpp, where tests/emulated_cuda
// stands in for the CUDA built-ins). One block per (query row, head): the
// block scores the row's listed keys into shared memory, takes their
// softmax with block-wide max and sum, and each thread then sums the values
// of its output columns in list order. A list longer than the shared
// memory holds is taken in chunks, the sums so far rescaled to each new
// largest score (as flash attention does); a list of one chunk gives the
// bits of a single pass.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/ops.h"

namespace mpiformer::cuda::attention_listed {

constexpr int kThreads = 128;
// Scores of one chunk at most (a list up to this long is one pass).
constexpr int kMaxChunk = 11000;
// The dynamic shared memory a block may take without opting in: 48 KiB.
constexpr int kSharedFloats = 12288;

// Keys a chunk holds for head size D: 32 floats for the reductions and D
// for the output's sums share the block's shared memory with the scores.
// 0 when D leaves no room.
constexpr int chunk_for(int D) {
  const int room = kSharedFloats - 32 - D;
  return room < 1 ? 0 : room < kMaxChunk ? room : kMaxChunk;
}

// The dynamic shared memory of a launch whose lists are up to `longest`
// keys: (32) reductions, (D) the output's sums, (min(longest, chunk)) scores.
constexpr int shared_floats(int D, int longest, int chunk) {
  return 32 + D + (longest < chunk ? longest : chunk);
}

extern __shared__ float listed_shared[];  // (shared_floats)

// out: (R, H*D), q: (R, H*D) rows q_stride apart, k, v: rows kv_stride
// apart, starts: (R+1), rows: (starts[R]); chunk: chunk_for(D) (or less).
template <typename T>
__global__ void attention_listed_kernel(T* out, const T* q, int q_stride, const T* k, const T* v,
                                        int kv_stride, const int32_t* starts, const int32_t* rows,
                                        int H, int D, AttentionScale scale_kind, float ref_len,
                                        int chunk) {
  float* reduce = listed_shared;  // (32)
  float* sums = reduce + 32;      // (D): sum_j e^(s_j - top) v_j so far
  float* scores = sums + D;       // (chunk)
  const int r = blockIdx.x / H, h = blockIdx.x % H;
  const int first = starts[r], n = starts[r + 1] - first;
  T* out_rh = out + static_cast<size_t>(r) * H * D + h * D;  // (D)
  if (n == 0) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) store(out_rh, d, 0.0f);
    return;
  }
  const float scale = attention_scale(scale_kind, D, ref_len, n);
  const T* q_rh = q + static_cast<size_t>(r) * q_stride + h * D;  // (D)
  float top = -INFINITY, sum = 0.0f;  // the largest score so far, and sum_j e^(s_j - top)
  for (int begin = 0; begin < n; begin += chunk) {
    const int m = min(chunk, n - begin);
    const int32_t* listed = rows + first + begin;  // (m)
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
      const T* kj = k + static_cast<size_t>(listed[j]) * kv_stride + h * D;  // (D)
      float s = 0.0f;
      for (int d = 0; d < D; ++d) s += load(q_rh, d) * load(kj, d);
      scores[j] = s * scale;
    }
    __syncthreads();
    float chunk_top = -INFINITY;
    for (int j = threadIdx.x; j < m; j += blockDim.x) chunk_top = fmaxf(chunk_top, scores[j]);
    const float new_top = fmaxf(top, cuda::block_max(chunk_top, reduce));
    float chunk_sum = 0.0f;
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
      const float e = expf(scores[j] - new_top);
      scores[j] = e;
      chunk_sum += e;
    }
    chunk_sum = cuda::block_sum(chunk_sum, reduce);
    __syncthreads();
    // The earlier chunks' sums at the new largest score (none on the first).
    const float factor = begin == 0 ? 0.0f : expf(top - new_top);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < m; ++j) {
        acc += scores[j] * load(v + static_cast<size_t>(listed[j]) * kv_stride + h * D, d);
      }
      sums[d] = begin == 0 ? acc : sums[d] * factor + acc;
    }
    sum = begin == 0 ? chunk_sum : sum * factor + chunk_sum;
    top = new_top;
    __syncthreads();  // the next chunk's scores overwrite these
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) store(out_rh, d, sums[d] / sum);
}

}  // namespace mpiformer::cuda::attention_listed
