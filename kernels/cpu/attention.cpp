// Multi-head attention over ragged batches. Each (sequence, head) pair is an
// independent task: small SGEMMs and a row softmax per block of queries. OpenMP spreads the
// pairs over the cores, and OpenBLAS (its OpenMP build) runs single-threaded
// inside the parallel region, so there is no nested oversubscription.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/softmax_row.h"

namespace mpiformer {
namespace {

// Zero `rows` rows of `width` floats that lie `stride` floats apart: a head's
// column slice of a possibly fused tensor, never more.  x: (rows, stride)
void zero_slice(float* x, int rows, int width, int stride) {
  for (int i = 0; i < rows; ++i) {
    std::memset(x + static_cast<size_t>(i) * stride, 0, width * sizeof(float));
  }
}

// Start of each sequence's probs block: H * sum_{b' < b} Lq_b' * Lk_b'.
// starts: host (B + 1)
void probs_block_starts(size_t* starts, const Ragged& qs, const Ragged& ks, int heads) {
  starts[0] = 0;
  for (int b = 0; b < qs.batch; ++b) {
    starts[b + 1] = starts[b] + static_cast<size_t>(heads) * qs.length(b) * ks.length(b);
  }
}

// Keys query i may see: i + 1 under the causal mask, all Lk otherwise.
int visible_keys(const AttentionConfig& cfg, int i, int Lk) {
  return cfg.causal ? std::min(i + 1, Lk) : Lk;
}

// Queries per block. Under the causal mask the queries [r0, r0 + rows) see
// keys [0, r0 + rows) only, so blocks of queries let the GEMMs skip most of
// the masked upper triangle (about half the FLOPs of long sequences) at the
// price of smaller GEMMs; without the mask one block holds every query.
constexpr int kCausalBlockRows = 64;
int query_block_rows(const AttentionConfig& cfg, int Lq) {
  return cfg.causal ? kCausalBlockRows : std::max(Lq, 1);
}

// Keys a block of queries ending before query `end` needs.
int keys_of_block(const AttentionConfig& cfg, int end, int Lk) {
  return cfg.causal ? std::min(end, Lk) : Lk;
}

// Whether SGEMM may be called from inside our parallel loop. The OpenMP and
// serial OpenBLAS builds then run it on the calling thread; the pthread build
// hands it to its own pool, and many concurrent callers spin on that pool
// (measured ~30x slower), so there the loop runs serially and each GEMM is
// threaded instead.
bool blas_runs_on_caller() {
  const int parallel = openblas_get_parallel();  // 0 serial, 1 pthreads, 2 OpenMP
  return parallel != 1;
}

}  // namespace

void CpuOps::attention_forward(float* out, float* probs, const float* q, int q_stride,
                               const float* k, const float* v, int kv_stride, const Ragged& qs,
                               const Ragged& ks, const AttentionConfig& cfg) {
  const int H = cfg.heads;
  const int D = cfg.head_dim;
  const int C = H * D;
  size_t* starts = grow(index_scratch_, static_cast<size_t>(qs.batch) + 1);
  probs_block_starts(starts, qs, ks, H);
  const int tasks = qs.batch * H;
  const bool parallel_tasks =
      blas_runs_on_caller() && cpu::worth_threading(attention_probs_size(qs, ks, H) * D);

#pragma omp parallel for schedule(dynamic, 1) if (parallel_tasks)
  for (int task = 0; task < tasks; ++task) {
    const int b = task / H;
    const int h = task % H;
    const int Lq = qs.length(b);
    const int Lk = ks.length(b);
    const size_t q_row = qs.host_offsets[b];
    const size_t k_row = ks.host_offsets[b];
    const float* q_bh = q + q_row * q_stride + h * D;                    // (Lq, D) ld q_stride
    const float* k_bh = k + k_row * kv_stride + h * D;                   // (Lk, D) ld kv_stride
    const float* v_bh = v + k_row * kv_stride + h * D;                   // (Lk, D) ld kv_stride
    float* out_bh = out + q_row * C + h * D;                             // (Lq, D) ld C
    float* p_bh = probs + starts[b] + static_cast<size_t>(h) * Lq * Lk;  // (Lq, Lk)
    if (Lq == 0) continue;
    if (Lk == 0) {  // nothing to attend to: the output is 0
      zero_slice(out_bh, Lq, D, C);
      continue;
    }
    const int block_rows = query_block_rows(cfg, Lq);
    for (int r0 = 0; r0 < Lq; r0 += block_rows) {
      const int rows = std::min(Lq - r0, block_rows);
      const int keys = keys_of_block(cfg, r0 + rows, Lk);
      float* p_rows = p_bh + static_cast<size_t>(r0) * Lk;  // (rows, Lk), first `keys` computed
      // S = Q K^T, then P = softmax(S * scale_i) row by row over the visible
      // keys; softmax_row zeroes the rest of the row.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, D, 1.0f,
                  q_bh + static_cast<size_t>(r0) * q_stride, q_stride, k_bh, kv_stride, 0.0f,
                  p_rows, Lk);
      for (int i = r0; i < r0 + rows; ++i) {
        const int visible = visible_keys(cfg, i, Lk);
        float* row = p_bh + static_cast<size_t>(i) * Lk;  // (Lk)
        cpu::softmax_row(row, row, visible, Lk, attention_scale(cfg, visible));
      }
      // O = P V
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, keys, 1.0f, p_rows, Lk, v_bh,
                  kv_stride, 0.0f, out_bh + static_cast<size_t>(r0) * C, C);
    }
  }
}

void CpuOps::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* probs, const float* q, int q_stride, const float* k,
                                const float* v, int kv_stride, const Ragged& qs, const Ragged& ks,
                                const AttentionConfig& cfg) {
  const int H = cfg.heads;
  const int D = cfg.head_dim;
  const int C = H * D;
  size_t* starts = grow(index_scratch_, static_cast<size_t>(qs.batch) + 1);
  probs_block_starts(starts, qs, ks, H);
  size_t largest_block = 0;
  for (int b = 0; b < qs.batch; ++b) {
    largest_block = std::max(largest_block, static_cast<size_t>(qs.length(b)) * ks.length(b));
  }
  // One dP / dS block per thread: (threads, largest Lq * Lk)
  const int threads = omp_get_max_threads();
  float* scratch = grow(float_scratch_, largest_block * threads);
  const int tasks = qs.batch * H;
  const bool parallel_tasks =
      blas_runs_on_caller() && cpu::worth_threading(attention_probs_size(qs, ks, H) * D);

#pragma omp parallel for schedule(dynamic, 1) if (parallel_tasks)
  for (int task = 0; task < tasks; ++task) {
    const int b = task / H;
    const int h = task % H;
    const int Lq = qs.length(b);
    const int Lk = ks.length(b);
    const size_t q_row = qs.host_offsets[b];
    const size_t k_row = ks.host_offsets[b];
    const float* q_bh = q + q_row * q_stride + h * D;   // (Lq, D) ld q_stride
    const float* k_bh = k + k_row * kv_stride + h * D;  // (Lk, D) ld kv_stride
    const float* v_bh = v + k_row * kv_stride + h * D;  // (Lk, D) ld kv_stride
    const float* do_bh = dout + q_row * C + h * D;      // (Lq, D) ld C
    float* dq_bh = dq + q_row * q_stride + h * D;       // (Lq, D) ld q_stride
    float* dk_bh = dk + k_row * kv_stride + h * D;      // (Lk, D) ld kv_stride
    float* dv_bh = dv + k_row * kv_stride + h * D;      // (Lk, D) ld kv_stride
    if (Lq == 0 || Lk == 0) {  // no query-key pair: every gradient of this slice is 0
      zero_slice(dq_bh, Lq, D, q_stride);
      zero_slice(dk_bh, Lk, D, kv_stride);
      zero_slice(dv_bh, Lk, D, kv_stride);
      continue;
    }
    const float* p_bh = probs + starts[b] + static_cast<size_t>(h) * Lq * Lk;  // (Lq, Lk)
    float* ds_bh = scratch + largest_block * omp_get_thread_num();             // (Lq, Lk)

    // Several query blocks add into dK and dV, so those start from 0.
    const int block_rows = query_block_rows(cfg, Lq);
    float kv_beta = 0.0f;
    if (block_rows < Lq) {
      zero_slice(dk_bh, Lk, D, kv_stride);
      zero_slice(dv_bh, Lk, D, kv_stride);
      kv_beta = 1.0f;
    }
    for (int r0 = 0; r0 < Lq; r0 += block_rows) {
      const int rows = std::min(Lq - r0, block_rows);
      const int keys = keys_of_block(cfg, r0 + rows, Lk);
      const float* p_rows = p_bh + static_cast<size_t>(r0) * Lk;  // (rows, Lk)
      float* ds_rows = ds_bh + static_cast<size_t>(r0) * Lk;      // (rows, Lk), first `keys` used
      const float* q_rows = q_bh + static_cast<size_t>(r0) * q_stride;  // (rows, D)
      const float* do_rows = do_bh + static_cast<size_t>(r0) * C;       // (rows, D)

      // dV (+)= P^T dO
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, D, rows, 1.0f, p_rows, Lk, do_rows,
                  C, kv_beta, dv_bh, kv_stride);
      // dP = dO V^T, then dS = P * (dP - rowsum(dP * P)) * scale_i in place.
      // Masked keys have P = 0 and so get dS = 0.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, D, 1.0f, do_rows, C, v_bh,
                  kv_stride, 0.0f, ds_rows, Lk);
      for (int i = r0; i < r0 + rows; ++i) {
        const int visible = visible_keys(cfg, i, Lk);
        const size_t row = static_cast<size_t>(i) * Lk;
        cpu::softmax_backward_row(ds_bh + row, ds_bh + row, p_bh + row, keys,
                                  attention_scale(cfg, visible));
      }
      // dQ = dS K, dK (+)= dS^T Q
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, keys, 1.0f, ds_rows, Lk, k_bh,
                  kv_stride, 0.0f, dq_bh + static_cast<size_t>(r0) * q_stride, q_stride);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, D, rows, 1.0f, ds_rows, Lk, q_rows,
                  q_stride, kv_beta, dk_bh, kv_stride);
    }
  }
}

}  // namespace mpiformer
