// Token embedding lookup plus positions, and its backward.
//
// The backward adds rows into tables where ids repeat. It walks the row
// groups (RowGroups: the rows that read one table row, ascending), so threads
// never share a table row and each row's sum runs in ascending row order:
// deterministic for any thread count, and the order a GPU uses too.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/ops.h"

namespace mpiformer {
namespace {

// dtable[keys[g]] += dout[rows[r]] * scale for the rows r of each group g.
// dtable: (K, C), dout: (N, C)
void add_grouped_rows(float* dtable, const float* dout, const RowGroups& groups, int N, int C,
                      float scale) {
  const bool threaded = cpu::worth_threading(static_cast<size_t>(N) * C);
#pragma omp parallel for schedule(dynamic, 16) if (threaded)
  for (int g = 0; g < groups.groups; ++g) {
    float* dst = dtable + static_cast<size_t>(groups.keys[g]) * C;  // dst: (C)
    for (int r = groups.starts[g]; r < groups.starts[g + 1]; ++r) {
      const float* src = dout + static_cast<size_t>(groups.rows[r]) * C;  // src: (C)
#pragma omp simd
      for (int c = 0; c < C; ++c) dst[c] += src[c] * scale;
    }
  }
}

}  // namespace

void CpuOps::embedding_forward(Act out, const int32_t* ids, Act tokens, const int32_t* pos,
                               Act positions, int N, int C, float scale) {
  Fp32 f(*this);
  // The tables are widened whole: a reference path, not a fast one.
  int32_t max_id = 0, max_pos = 0;
  for (int i = 0; i < N; ++i)
    max_id = std::max(max_id, ids[i]), max_pos = std::max(max_pos, pos[i]);
  const float* table = f.in(tokens, static_cast<size_t>(max_id + 1) * C);       // (V, C)
  const float* ptable = f.in(positions, static_cast<size_t>(max_pos + 1) * C);  // (L, C)
  float* y = f.out(out, static_cast<size_t>(N) * C);
  const bool threaded = cpu::worth_threading(static_cast<size_t>(N) * C);
#pragma omp parallel for schedule(static) if (threaded)
  for (int i = 0; i < N; ++i) {
    const float* t = table + static_cast<size_t>(ids[i]) * C;   // t: (C)
    const float* p = ptable + static_cast<size_t>(pos[i]) * C;  // p: (C)
    float* dst = y + static_cast<size_t>(i) * C;                // dst: (C)
#pragma omp simd
    for (int c = 0; c < C; ++c) dst[c] = t[c] * scale + p[c];
  }
}

void CpuOps::embedding_backward(float* dtokens, float* dpositions, Act dout, const RowGroups& by_id,
                                const RowGroups& by_pos, int N, int C, float scale) {
  Fp32 f(*this);
  const float* d = f.in(dout, static_cast<size_t>(N) * C);
  if (dpositions) add_grouped_rows(dpositions, d, by_pos, N, C, 1.0f);
  add_grouped_rows(dtokens, d, by_id, N, C, scale);
}

}  // namespace mpiformer
