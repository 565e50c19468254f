// Decoding attention (Ops::attention_listed): each query row against the
// key rows it lists, one (row, head) pair per task. A row's scores, softmax
// and weighted sum run in an order fixed by its list alone (no GEMM whose
// bits depend on other rows), so a sentence decodes to the same bits alone
// or in a batch, from a cache or recomputed. And the cache's row copy
// (Ops::scatter_rows).
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/softmax_row.h"
#include "kernels/cpu/vec_math.h"

namespace mpiformer {
namespace {

constexpr int kLanes = 8;

// One (row, head): scores[j] = q . k[list[j]], P = softmax(scores * scale),
// out = sum_j P[j] v[list[j]] in list order.  q, out: (D); k, v: rows
// `stride` apart; scores: scratch (n)
MPIFORMER_HOT void attend_one(float* out, const float* q, const float* k, const float* v,
                              int stride, const int32_t* list, int n, int D, float scale,
                              float* scores) {
  for (int j = 0; j < n; ++j) {
    const float* kj = k + static_cast<size_t>(list[j]) * stride;  // (D)
    float acc[kLanes] = {};
    int d0 = 0;
    for (; d0 + kLanes <= D; d0 += kLanes) {
      for (int l = 0; l < kLanes; ++l) acc[l] += q[d0 + l] * kj[d0 + l];
    }
    for (int l = 0; d0 + l < D; ++l) acc[l] += q[d0 + l] * kj[d0 + l];
    for (int width = kLanes / 2; width > 0; width /= 2) {
      for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
    }
    scores[j] = acc[0];
  }
  cpu::softmax_row(scores, scores, n, n, scale);
  std::fill(out, out + D, 0.0f);
  for (int j = 0; j < n; ++j) {
    const float* vj = v + static_cast<size_t>(list[j]) * stride;  // (D)
    const float p = scores[j];
    for (int d = 0; d < D; ++d) out[d] += p * vj[d];
  }
}

}  // namespace

void CpuOps::attention_listed(Act out, Act q, int q_stride, Act k, Act v, int kv_stride,
                              const KeyLists& keys, const AttentionConfig& cfg) {
  const int H = cfg.heads, D = cfg.head_dim, C = H * D, R = keys.queries;
  if (R == 0) return;
  Fp32 f(*this);
  const float* qf = f.in(q, R, q_stride, C);
  const float* kf = f.in(k, keys.key_rows, kv_stride, C);
  const float* vf = f.in(v, keys.key_rows, kv_stride, C);
  float* of = f.out(out, static_cast<size_t>(R) * C);
  const size_t longest = std::max(keys.longest, 1);
  float* scratch = grow(float_scratch_, longest * omp_get_max_threads());
  size_t work = 0;
  for (int r = 0; r < R; ++r) work += static_cast<size_t>(keys.length(r)) * C;
  const int tasks = R * H;
#pragma omp parallel for schedule(dynamic, 4) if (cpu::worth_threading(2 * work))
  for (int task = 0; task < tasks; ++task) {
    const int r = task / H, h = task % H;
    const int n = keys.length(r);
    float* out_rh = of + static_cast<size_t>(r) * C + h * D;  // (D)
    if (n == 0) {
      std::fill(out_rh, out_rh + D, 0.0f);
      continue;
    }
    attend_one(out_rh, qf + static_cast<size_t>(r) * q_stride + h * D, kf + h * D, vf + h * D,
               kv_stride, keys.host_rows + keys.host_starts[r], n, D, attention_scale(cfg, n),
               scratch + longest * omp_get_thread_num());
  }
}

void CpuOps::scatter_rows(Act dst, int dst_stride, Act src, int src_stride, const int32_t* rows,
                          int n, int width) {
  const size_t element = dtype_bytes(dst.dtype);
  for (int i = 0; i < n; ++i) {
    std::memcpy(static_cast<char*>(dst.data) + static_cast<size_t>(rows[i]) * dst_stride * element,
                static_cast<const char*>(src.data) + static_cast<size_t>(i) * src_stride * element,
                static_cast<size_t>(width) * element);
  }
}

}  // namespace mpiformer
