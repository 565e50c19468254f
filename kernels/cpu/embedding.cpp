// Token embedding lookup and learned positional embedding add.
//
// The backward passes scatter-add rows into a table where ids repeat, so
// threads split the columns rather than the rows: no two threads touch the
// same table entry and the sum order is fixed (deterministic for any thread
// count).
#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"

namespace mpiformer {
namespace {

// Columns per backward task: 4 cache lines of floats.
constexpr int kColumnBlock = 64;

// dtable[ids[i], c0:c1] += dout[i, c0:c1] * scale over all rows i.
// dtable: (V, C), dout: (N, C), ids: (N)
void scatter_add_rows(float* dtable, const float* dout, const int32_t* ids, int N, int C,
                      float scale) {
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
  const bool threaded = cpu::worth_threading(static_cast<size_t>(N) * C);
#pragma omp parallel for schedule(static) if (threaded)
  for (int block = 0; block < blocks; ++block) {
    const int c0 = block * kColumnBlock;
    const int c1 = std::min(C, c0 + kColumnBlock);
    for (int i = 0; i < N; ++i) {
      float* dst = dtable + static_cast<size_t>(ids[i]) * C;  // dst: (C)
      const float* src = dout + static_cast<size_t>(i) * C;   // src: (C)
#pragma omp simd
      for (int c = c0; c < c1; ++c) dst[c] += src[c] * scale;
    }
  }
}

}  // namespace

void CpuOps::embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                               float scale) {
  const bool threaded = cpu::worth_threading(static_cast<size_t>(N) * C);
#pragma omp parallel for schedule(static) if (threaded)
  for (int i = 0; i < N; ++i) {
    const float* src = table + static_cast<size_t>(ids[i]) * C;  // src: (C)
    float* dst = out + static_cast<size_t>(i) * C;               // dst: (C)
#pragma omp simd
    for (int c = 0; c < C; ++c) dst[c] = src[c] * scale;
  }
}

void CpuOps::embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N, int C,
                                float scale) {
  scatter_add_rows(dtable, dout, ids, N, C, scale);
}

void CpuOps::positional_add_forward(float* x, const int32_t* positions, const float* table, int N,
                                    int C) {
  const bool threaded = cpu::worth_threading(static_cast<size_t>(N) * C);
#pragma omp parallel for schedule(static) if (threaded)
  for (int i = 0; i < N; ++i) {
    const float* src = table + static_cast<size_t>(positions[i]) * C;  // src: (C)
    float* dst = x + static_cast<size_t>(i) * C;                       // dst: (C)
#pragma omp simd
    for (int c = 0; c < C; ++c) dst[c] += src[c];
  }
}

void CpuOps::positional_add_backward(float* dtable, const float* dx, const int32_t* positions,
                                     int N, int C) {
  scatter_add_rows(dtable, dx, positions, N, C, 1.0f);
}

}  // namespace mpiformer
