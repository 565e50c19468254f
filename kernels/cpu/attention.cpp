// Multi-head attention over ragged batches. Each (sequence, head) pair is an
// independent task: small SGEMMs and a row softmax per block of queries.
// OpenMP spreads the pairs over the cores and each pair's GEMMs run on its
// thread (cpu::sgemm_serial): no nested oversubscription, and the same bits
// for any thread count.
//
// Like flash attention, forward keeps only each query row's log-sum-exp
// (the stats); backward recomputes the probabilities from it, block by
// block, in per-thread scratch.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/ops.h"
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

// Per-thread scratch of `floats` floats for the (sequence, head) tasks.
float* thread_scratch(float* base, size_t floats) {
  return base + floats * static_cast<size_t>(omp_get_thread_num());
}

// The largest Lq * Lk over the batch's sequences.
size_t largest_block(const Ragged& qs, const Ragged& ks) {
  size_t largest = 0;
  for (int b = 0; b < qs.batch; ++b)
    largest = std::max(largest, static_cast<size_t>(qs.length(b)) * ks.length(b));
  return largest;
}

// Work of the whole batch (multiply-adds of one GEMM), to decide threading.
size_t attention_work(const Ragged& qs, const Ragged& ks, int heads, int head_dim) {
  size_t work = 0;
  for (int b = 0; b < qs.batch; ++b) work += static_cast<size_t>(qs.length(b)) * ks.length(b);
  return work * heads * head_dim;
}

}  // namespace

size_t CpuOps::attention_scratch_bytes(DType dtype, size_t tokens, size_t longest,
                                       const AttentionConfig& cfg, bool backward) const {
  // P (and dS) blocks of the largest sequence per thread, plus fp32 copies
  // of q, k, v, out (and dout, dq, dk, dv) where the compute type is not.
  const size_t blocks = (backward ? 2 : 1) * longest * longest * omp_get_max_threads();
  const size_t widened =
      dtype == DType::kF32 ? 0 : (backward ? 8 : 4) * tokens * cfg.heads * cfg.head_dim;
  return sizeof(float) * (blocks + widened);
}

void CpuOps::attention_forward(Act out, float* stats, Act q, int q_stride, Act k, Act v,
                               int kv_stride, const Ragged& qs, const Ragged& ks,
                               const AttentionConfig& cfg) {
  const int H = cfg.heads;
  const int D = cfg.head_dim;
  const int C = H * D;
  Fp32 f(*this);
  const float* qf = f.in(q, qs.total, q_stride, C);
  const float* kf = f.in(k, ks.total, kv_stride, C);
  const float* vf = f.in(v, ks.total, kv_stride, C);
  float* of = f.out(out, static_cast<size_t>(qs.total) * C);
  const size_t block = largest_block(qs, ks);
  float* scratch = grow(float_scratch_, block * omp_get_max_threads());
  const int tasks = qs.batch * H;
  // Each (sequence, head) task runs its GEMMs on its own thread: the same
  // bits whichever thread takes it.
  const bool parallel_tasks = cpu::worth_threading(attention_work(qs, ks, H, D));

#pragma omp parallel for schedule(dynamic, 1) if (parallel_tasks)
  for (int task = 0; task < tasks; ++task) {
    const int b = task / H;
    const int h = task % H;
    const int Lq = qs.length(b);
    const int Lk = ks.length(b);
    const size_t q_row = qs.host_offsets[b];
    const size_t k_row = ks.host_offsets[b];
    const float* q_bh = qf + q_row * q_stride + h * D;   // (Lq, D) ld q_stride
    const float* k_bh = kf + k_row * kv_stride + h * D;  // (Lk, D) ld kv_stride
    const float* v_bh = vf + k_row * kv_stride + h * D;  // (Lk, D) ld kv_stride
    float* out_bh = of + q_row * C + h * D;              // (Lq, D) ld C
    float* stats_bh = stats + q_row * H + h;             // (Lq) stride H
    if (Lq == 0) continue;
    if (Lk == 0) {  // nothing to attend to: the output is 0
      zero_slice(out_bh, Lq, D, C);
      for (int i = 0; i < Lq; ++i) stats_bh[static_cast<size_t>(i) * H] = 0.0f;
      continue;
    }
    float* p_bh = thread_scratch(scratch, block);  // (Lq, Lk)
    const int block_rows = query_block_rows(cfg, Lq);
    for (int r0 = 0; r0 < Lq; r0 += block_rows) {
      const int rows = std::min(Lq - r0, block_rows);
      const int keys = keys_of_block(cfg, r0 + rows, Lk);
      float* p_rows = p_bh + static_cast<size_t>(r0) * Lk;  // (rows, Lk), first `keys` computed
      // S = Q K^T, then P = softmax(S * scale_i) row by row over the visible
      // keys; softmax_row zeroes the rest of the row and gives its log-sum-exp.
      cpu::sgemm_serial(false, true, rows, keys, D, 1.0f, q_bh + static_cast<size_t>(r0) * q_stride,
                        q_stride, k_bh, kv_stride, 0.0f, p_rows, Lk);
      for (int i = r0; i < r0 + rows; ++i) {
        const int visible = visible_keys(cfg, i, Lk);
        float* row = p_bh + static_cast<size_t>(i) * Lk;  // (Lk)
        stats_bh[static_cast<size_t>(i) * H] =
            cpu::softmax_row(row, row, visible, Lk, attention_scale(cfg, visible));
      }
      // O = P V
      cpu::sgemm_serial(false, false, rows, D, keys, 1.0f, p_rows, Lk, v_bh, kv_stride, 0.0f,
                        out_bh + static_cast<size_t>(r0) * C, C);
    }
  }
}

void CpuOps::attention_backward(Act dq, Act dk, Act dv, Act dout, Act out, const float* stats,
                                Act q, int q_stride, Act k, Act v, int kv_stride, const Ragged& qs,
                                const Ragged& ks, const AttentionConfig& cfg) {
  const int H = cfg.heads;
  const int D = cfg.head_dim;
  const int C = H * D;
  Fp32 f(*this);
  const float* qf = f.in(q, qs.total, q_stride, C);
  const float* kf = f.in(k, ks.total, kv_stride, C);
  const float* vf = f.in(v, ks.total, kv_stride, C);
  const float* dof = f.in(dout, static_cast<size_t>(qs.total) * C);
  // dq, dk, dv may be column slices of one buffer (dQKV): every column of a
  // slice is written, and only the slice is stored back.
  float* dqf = f.out(dq, qs.total, q_stride, C);
  float* dkf = f.out(dk, ks.total, kv_stride, C);
  float* dvf = f.out(dv, ks.total, kv_stride, C);
  // P and dS blocks per thread: (threads, 2, largest Lq * Lk)
  const size_t block = largest_block(qs, ks);
  float* scratch = grow(float_scratch_, 2 * block * omp_get_max_threads());
  const int tasks = qs.batch * H;
  // Each (sequence, head) task runs its GEMMs on its own thread: the same
  // bits whichever thread takes it.
  const bool parallel_tasks = cpu::worth_threading(attention_work(qs, ks, H, D));

#pragma omp parallel for schedule(dynamic, 1) if (parallel_tasks)
  for (int task = 0; task < tasks; ++task) {
    const int b = task / H;
    const int h = task % H;
    const int Lq = qs.length(b);
    const int Lk = ks.length(b);
    const size_t q_row = qs.host_offsets[b];
    const size_t k_row = ks.host_offsets[b];
    const float* q_bh = qf + q_row * q_stride + h * D;   // (Lq, D) ld q_stride
    const float* k_bh = kf + k_row * kv_stride + h * D;  // (Lk, D) ld kv_stride
    const float* v_bh = vf + k_row * kv_stride + h * D;  // (Lk, D) ld kv_stride
    const float* do_bh = dof + q_row * C + h * D;        // (Lq, D) ld C
    const float* stats_bh = stats + q_row * H + h;       // (Lq) stride H
    float* dq_bh = dqf + q_row * q_stride + h * D;       // (Lq, D) ld q_stride
    float* dk_bh = dkf + k_row * kv_stride + h * D;      // (Lk, D) ld kv_stride
    float* dv_bh = dvf + k_row * kv_stride + h * D;      // (Lk, D) ld kv_stride
    if (Lq == 0 || Lk == 0) {  // no query-key pair: every gradient of this slice is 0
      zero_slice(dq_bh, Lq, D, q_stride);
      zero_slice(dk_bh, Lk, D, kv_stride);
      zero_slice(dv_bh, Lk, D, kv_stride);
      continue;
    }
    float* p_bh = thread_scratch(scratch, 2 * block);  // (Lq, Lk)
    float* ds_bh = p_bh + block;                       // (Lq, Lk)

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
      float* p_rows = p_bh + static_cast<size_t>(r0) * Lk;    // (rows, Lk), first `keys` used
      float* ds_rows = ds_bh + static_cast<size_t>(r0) * Lk;  // (rows, Lk), first `keys` used
      const float* q_rows = q_bh + static_cast<size_t>(r0) * q_stride;  // (rows, D)
      const float* do_rows = do_bh + static_cast<size_t>(r0) * C;       // (rows, D)

      // P = exp(S * scale_i - lse_i) over the visible keys, 0 beyond them.
      cpu::sgemm_serial(false, true, rows, keys, D, 1.0f, q_rows, q_stride, k_bh, kv_stride, 0.0f,
                        p_rows, Lk);
      for (int i = r0; i < r0 + rows; ++i) {
        const int visible = visible_keys(cfg, i, Lk);
        float* row = p_bh + static_cast<size_t>(i) * Lk;  // (Lk)
        cpu::softmax_row_from_stats(row, row, visible, keys, attention_scale(cfg, visible),
                                    stats_bh[static_cast<size_t>(i) * H]);
      }
      // dV (+)= P^T dO
      cpu::sgemm_serial(true, false, keys, D, rows, 1.0f, p_rows, Lk, do_rows, C, kv_beta, dv_bh,
                        kv_stride);
      // dP = dO V^T, then dS = P * (dP - rowsum(dP * P)) * scale_i in place.
      // Masked keys have P = 0 and so get dS = 0.
      cpu::sgemm_serial(false, true, rows, keys, D, 1.0f, do_rows, C, v_bh, kv_stride, 0.0f,
                        ds_rows, Lk);
      for (int i = r0; i < r0 + rows; ++i) {
        const int visible = visible_keys(cfg, i, Lk);
        const size_t row = static_cast<size_t>(i) * Lk;
        cpu::softmax_backward_row(ds_bh + row, ds_bh + row, p_bh + row, keys,
                                  attention_scale(cfg, visible));
      }
      // dQ = dS K, dK (+)= dS^T Q
      cpu::sgemm_serial(false, false, rows, D, keys, 1.0f, ds_rows, Lk, k_bh, kv_stride, 0.0f,
                        dq_bh + static_cast<size_t>(r0) * q_stride, q_stride);
      cpu::sgemm_serial(true, false, keys, D, rows, 1.0f, ds_rows, Lk, q_rows, q_stride, kv_beta,
                        dk_bh, kv_stride);
    }
  }
}

}  // namespace mpiformer
