// Decoding attention on the GPU (Ops::attention_listed): a block per
// (query row, head), attention_listed_kernels.cuh. Plain and small: a
// decoding step has one row per live hypothesis. And the cache's row copy
// (Ops::scatter_rows): a block per row.
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_listed_kernels.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace mpiformer {

namespace {

using cuda::typed;
using cuda::attention_listed::kThreads;

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
  const int chunk = cuda::attention_listed::chunk_for(D);
  if (chunk == 0) {
    throw std::runtime_error("attention_listed: head size " + std::to_string(D) +
                             " leaves no room for scores in a block's 48 KiB of shared memory");
  }
  const size_t shared =
      sizeof(float) * cuda::attention_listed::shared_floats(D, keys.longest, chunk);
  cuda::dispatch(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda::attention_listed::
        attention_listed_kernel<<<static_cast<unsigned>(R) * H, kThreads, shared, stream_>>>(
            typed<T>(out), typed<T>(q), q_stride, typed<T>(k), typed<T>(v), kv_stride,
            keys.device_starts, keys.device_rows, H, D, cfg.scale, cfg.ref_len, chunk);
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
