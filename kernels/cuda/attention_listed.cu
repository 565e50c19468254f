// Decoding attention on the GPU (Ops::attention_listed): one block per
// (query row, head). The block scores the row's listed keys into shared
// memory, takes the softmax with block-wide max and sum, and each thread
// then sums the values of its output columns in list order. Plain and
// small: a decoding step has one row per live hypothesis. And the cache's
// row copy (Ops::scatter_rows): a block per row.
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

using cuda::load;
using cuda::store;
using cuda::typed;

constexpr int kThreads = 128;
// Scores of one row live in shared memory: lists up to this long.
constexpr int kMaxListedKeys = 11000;

// out: (R, H*D), q: (R, H*D) rows q_stride apart, k, v: rows kv_stride
// apart, starts: (R+1), rows: (starts[R])
template <typename T>
__global__ void attention_listed_kernel(T* out, const T* q, int q_stride, const T* k, const T* v,
                                        int kv_stride, const int32_t* starts, const int32_t* rows,
                                        int H, int D, AttentionScale scale_kind, float ref_len) {
  extern __shared__ float shared[];  // (32) for the reductions, then (n) scores
  float* reduce = shared;
  float* scores = shared + 32;
  const int r = blockIdx.x / H, h = blockIdx.x % H;
  const int first = starts[r], n = starts[r + 1] - first;
  T* out_rh = out + static_cast<size_t>(r) * H * D + h * D;  // (D)
  if (n == 0) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) store(out_rh, d, 0.0f);
    return;
  }
  const float scale = attention_scale(scale_kind, D, ref_len, n);
  const T* q_rh = q + static_cast<size_t>(r) * q_stride + h * D;  // (D)
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const T* kj = k + static_cast<size_t>(rows[first + j]) * kv_stride + h * D;  // (D)
    float s = 0.0f;
    for (int d = 0; d < D; ++d) s += load(q_rh, d) * load(kj, d);
    scores[j] = s * scale;
  }
  __syncthreads();
  float top = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) top = fmaxf(top, scores[j]);
  top = cuda::block_max(top, reduce);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = expf(scores[j] - top);
    scores[j] = e;
    sum += e;
  }
  sum = cuda::block_sum(sum, reduce);
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) {
      acc += scores[j] * load(v + static_cast<size_t>(rows[first + j]) * kv_stride + h * D, d);
    }
    store(out_rh, d, acc / sum);
  }
}

// dst row rows[i] = src row i, `width` elements.  src: (n, width) rows
// src_stride apart, dst: rows dst_stride apart, rows: (n)
template <typename T>
__global__ void scatter_rows_kernel(T* dst, int dst_stride, const T* src, int src_stride,
                                    const int32_t* rows, int width) {
  const T* from = src + static_cast<size_t>(blockIdx.x) * src_stride;
  T* to = dst + static_cast<size_t>(rows[blockIdx.x]) * dst_stride;
  for (int j = threadIdx.x; j < width; j += blockDim.x) to[j] = from[j];
}

}  // namespace

void CudaOps::attention_listed(Act out, Act q, int q_stride, Act k, Act v, int kv_stride,
                               const KeyLists& keys, const AttentionConfig& cfg) {
  const int R = keys.queries, H = cfg.heads, D = cfg.head_dim;
  if (R == 0) return;
  if (keys.longest > kMaxListedKeys) {
    throw std::runtime_error("attention_listed: a list of " + std::to_string(keys.longest) +
                             " keys, more than the " + std::to_string(kMaxListedKeys) +
                             " the GPU kernel holds in shared memory");
  }
  const size_t shared = (32 + static_cast<size_t>(keys.longest)) * sizeof(float);
  cuda::dispatch(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    attention_listed_kernel<<<static_cast<unsigned>(R) * H, kThreads, shared, stream_>>>(
        typed<T>(out), typed<T>(q), q_stride, typed<T>(k), typed<T>(v), kv_stride,
        keys.device_starts, keys.device_rows, H, D, cfg.scale, cfg.ref_len);
  });
  cuda::check(cudaGetLastError(), "attention_listed");
}

void CudaOps::scatter_rows(Act dst, int dst_stride, Act src, int src_stride, const int32_t* rows,
                           int n, int width) {
  if (n == 0) return;
  cuda::dispatch(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    scatter_rows_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream_>>>(
        typed<T>(dst), dst_stride, typed<T>(src), src_stride, rows, width);
  });
  cuda::check(cudaGetLastError(), "scatter_rows");
}

}  // namespace mpiformer
