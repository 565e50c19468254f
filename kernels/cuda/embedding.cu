// The CUDA backend's embedding lookup, and its backward without float
// atomics (one block per table row, rows added in a fixed order).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace mpiformer {

namespace {

using cuda::blocks_for;
using cuda::load;
using cuda::store;
using cuda::typed;

// out[i] = tokens[ids[i]] * scale + positions[pos[i]].
// out: (N, C), ids, pos: (N), tokens: (V, C), positions: (L, C)
template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* ids, const T* tokens,
                                         const int32_t* pos, const T* positions, int N, int C,
                                         float scale) {
  MPIFORMER_FOR_EACH(i, static_cast<size_t>(N) * C) {
    const size_t row = i / C, col = i % C;
    const float t = load(tokens, static_cast<size_t>(ids[row]) * C + col);
    const float p = load(positions, static_cast<size_t>(pos[row]) * C + col);
    store(out, i, t * scale + p);
  }
}

// One block per group: table row keys[g] gains its rows' sum, added in
// ascending row order, so no two blocks touch one row and no float atomics
// decide the order. dtable: (K, C) fp32, dout: (N, C)
template <typename T>
__global__ void embedding_backward_kernel(float* dtable, const T* dout, RowGroups groups, int C,
                                          float scale) {
  const int g = blockIdx.x;
  const int first = groups.starts[g], last = groups.starts[g + 1];
  float* dst = dtable + static_cast<size_t>(groups.keys[g]) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float sum = 0.0f;
    for (int r = first; r < last; ++r)
      sum += load(dout, static_cast<size_t>(groups.rows[r]) * C + c);
    dst[c] += sum * scale;
  }
}

}  // namespace

void CudaOps::embedding_forward(Act out, const int32_t* ids, Act tokens, const int32_t* pos,
                                Act positions, int N, int C, float scale) {
  if (N == 0) return;
  cuda::dispatch(out.dtype, [&](auto t) {
    using T = decltype(t);
    embedding_forward_kernel<<<blocks_for(static_cast<size_t>(N) * C), 256, 0, stream_>>>(
        typed<T>(out), ids, typed<T>(tokens), pos, typed<T>(positions), N, C, scale);
  });
  cuda::check(cudaGetLastError(), "embedding_forward");
}

void CudaOps::embedding_backward(float* dtokens, float* dpositions, Act dout,
                                 const RowGroups& by_id, const RowGroups& by_pos, int N, int C,
                                 float scale) {
  if (N == 0) return;
  cuda::dispatch(dout.dtype, [&](auto t) {
    using T = decltype(t);
    if (dpositions && by_pos.groups > 0) {
      embedding_backward_kernel<<<by_pos.groups, 256, 0, stream_>>>(dpositions, typed<T>(dout),
                                                                    by_pos, C, 1.0f);
    }
    if (by_id.groups > 0) {
      embedding_backward_kernel<<<by_id.groups, 256, 0, stream_>>>(dtokens, typed<T>(dout), by_id,
                                                                   C, scale);
    }
  });
  cuda::check(cudaGetLastError(), "embedding_backward");
}

}  // namespace mpiformer
