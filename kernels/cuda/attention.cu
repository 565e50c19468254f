// Multi-head attention over ragged batches: cuDNN's fused flash attention
// for bf16 and fp16 where the build has it (attention_cudnn.cpp), and plain
// kernels, one block per (query row, head), for fp32 and as the fallback.
//
// The plain kernels keep what flash attention keeps: the output and each
// query row's log-sum-exp. Backward recomputes the probabilities from it
// into scratch (P and dS of one layer at a time), then a key pass sums
// dK and dV over the queries that see each key. The plain path runs the
// tiled flash kernels (attention_flash.cu) instead wherever they take the
// head size, unless MPIFORMER_PLAIN_ATTENTION=naive.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_flash.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

using cuda::load;
using cuda::store;
using cuda::typed;

constexpr int kThreads = 128;

// The sequence that holds global row `row`.  offsets: (B+1)
__device__ int sequence_of(const int32_t* offsets, int batch, int row) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

struct AttentionShape {
  const int32_t* q_offsets;  // (B+1)
  const int32_t* k_offsets;  // (B+1)
  const int64_t* p_offsets;  // (B+1): start of each sequence's probabilities (backward)
  int batch, heads, head_dim, q_stride, kv_stride;
  bool causal;
  AttentionScale scale;
  float ref_len;
};

// Query row `row`: its sequence b, index i in it, the sequence's lengths,
// first key row, the keys it sees and its scale.
struct QueryRow {
  int b, i, lq, k0, lk, visible;
  float scale;
};
__device__ QueryRow locate_query(const AttentionShape& s, int row) {
  QueryRow r;
  r.b = sequence_of(s.q_offsets, s.batch, row);
  r.i = row - s.q_offsets[r.b];
  r.lq = s.q_offsets[r.b + 1] - s.q_offsets[r.b];
  r.k0 = s.k_offsets[r.b];
  r.lk = s.k_offsets[r.b + 1] - r.k0;
  r.visible = s.causal ? min(r.i + 1, r.lk) : r.lk;
  r.scale = attention_scale(s.scale, s.head_dim, s.ref_len, r.visible);
  return r;
}

// Where row i of head h of sequence b keeps its probabilities (Lk of them).
__device__ size_t prob_row(const AttentionShape& s, int b, int h, int i, int lq, int lk) {
  return static_cast<size_t>(s.p_offsets[b]) + (static_cast<size_t>(h) * lq + i) * lk;
}

// grid (Nq, H); dynamic shared memory: max Lk floats.
// out: (Nq, H*D) dense; q: stride q_stride; k, v: stride kv_stride;
// stats: (Nq, H)
template <typename T>
__global__ void attention_forward_kernel(T* out, float* stats, const T* q, const T* k, const T* v,
                                         AttentionShape s) {
  extern __shared__ float scores[];
  __shared__ float shared[32];
  const int row = blockIdx.x, h = blockIdx.y, D = s.head_dim;
  const QueryRow r = locate_query(s, row);
  const int k0 = r.k0, visible = r.visible;
  const size_t q_base = static_cast<size_t>(row) * s.q_stride + h * D;
  float top = -INFINITY;
  for (int j = threadIdx.x; j < visible; j += blockDim.x) {
    const size_t k_base = static_cast<size_t>(k0 + j) * s.kv_stride + h * D;
    float dot = 0.0f;
    for (int d = 0; d < D; ++d) dot += load(q, q_base + d) * load(k, k_base + d);
    scores[j] = dot * r.scale;
    top = fmaxf(top, scores[j]);
  }
  top = cuda::block_max(top, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < visible; j += blockDim.x) {
    scores[j] = expf(scores[j] - top);
    sum += scores[j];
  }
  sum = cuda::block_sum(sum, shared);  // its barriers also publish scores[]
  if (threadIdx.x == 0)
    stats[static_cast<size_t>(row) * s.heads + h] = visible > 0 ? top + logf(sum) : 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < visible; ++j)
      acc += scores[j] * load(v, static_cast<size_t>(k0 + j) * s.kv_stride + h * D + d);
    store(out, static_cast<size_t>(row) * s.heads * D + h * D + d, visible > 0 ? acc / sum : 0.0f);
  }
}

// Per query row: P = exp(S * scale - lse) recomputed, dP = dout v^T,
// dS = P (dP - sum(P dP)) * scale, both kept in the probabilities' layout;
// dq = dS k.  grid (Nq, H)
template <typename T>
__global__ void attention_backward_query_kernel(T* dq, float* probs, float* dscores,
                                                const float* stats, const T* dout, const T* q,
                                                const T* k, const T* v, AttentionShape s) {
  __shared__ float shared[32];
  const int row = blockIdx.x, h = blockIdx.y, D = s.head_dim;
  const QueryRow r = locate_query(s, row);
  const int b = r.b, i = r.i, lq = r.lq, k0 = r.k0, lk = r.lk, visible = r.visible;
  const float lse = stats[static_cast<size_t>(row) * s.heads + h];
  const size_t q_base = static_cast<size_t>(row) * s.q_stride + h * D;
  const size_t do_base = static_cast<size_t>(row) * s.heads * D + h * D;
  float* pr = probs + prob_row(s, b, h, i, lq, lk);
  float* dsr = dscores + prob_row(s, b, h, i, lq, lk);
  float p_dp = 0.0f;
  for (int j = threadIdx.x; j < lk; j += blockDim.x) {
    float p = 0.0f, dp = 0.0f;
    if (j < visible) {
      const size_t k_base = static_cast<size_t>(k0 + j) * s.kv_stride + h * D;
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) {
        dot += load(q, q_base + d) * load(k, k_base + d);
        dp += load(dout, do_base + d) * load(v, k_base + d);
      }
      p = expf(dot * r.scale - lse);
    }
    pr[j] = p;
    dsr[j] = dp;  // dP for now
    p_dp += p * dp;
  }
  p_dp = cuda::block_sum(p_dp, shared);  // also orders the writes above before the reads below
  for (int j = threadIdx.x; j < lk; j += blockDim.x) dsr[j] = pr[j] * (dsr[j] - p_dp) * r.scale;
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < visible; ++j)
      acc += dsr[j] * load(k, static_cast<size_t>(k0 + j) * s.kv_stride + h * D + d);
    store(dq, q_base + d, acc);
  }
}

// Per key row j: dk = dS^T q and dv = P^T dout over the queries that see it.
// grid (Nk, H)
template <typename T>
__global__ void attention_backward_key_kernel(T* dk, T* dv, const float* dscores,
                                              const float* probs, const T* q, const T* dout,
                                              AttentionShape s) {
  const int row = blockIdx.x, h = blockIdx.y, D = s.head_dim;
  const int b = sequence_of(s.k_offsets, s.batch, row);
  const int j = row - s.k_offsets[b];
  const int q0 = s.q_offsets[b], lq = s.q_offsets[b + 1] - q0;
  const int lk = s.k_offsets[b + 1] - s.k_offsets[b];
  const int first = s.causal ? j : 0;  // causal: queries i >= j see key j
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc_k = 0.0f, acc_v = 0.0f;
    for (int i = first; i < lq; ++i) {
      const size_t at = prob_row(s, b, h, i, lq, lk) + j;
      acc_k += dscores[at] * load(q, static_cast<size_t>(q0 + i) * s.q_stride + h * D + d);
      acc_v += probs[at] * load(dout, static_cast<size_t>(q0 + i) * s.heads * D + h * D + d);
    }
    store(dk, static_cast<size_t>(row) * s.kv_stride + h * D + d, acc_k);
    store(dv, static_cast<size_t>(row) * s.kv_stride + h * D + d, acc_v);
  }
}

// Sequence b's block of probabilities: H * Lq_b * Lk_b floats, head-major.
// offsets: (B+1) each
__global__ void prob_offsets_kernel(int64_t* p_offsets, const int32_t* q_offsets,
                                    const int32_t* k_offsets, int batch, int heads) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int64_t total = 0;
  p_offsets[0] = 0;
  for (int b = 0; b < batch; ++b) {
    total += static_cast<int64_t>(heads) * (q_offsets[b + 1] - q_offsets[b]) *
             (k_offsets[b + 1] - k_offsets[b]);
    p_offsets[b + 1] = total;
  }
}

// One thread per slot s (and one for the end): lengths and ragged offsets,
// slots past the batch empty with offsets at the end.
__global__ void attention_meta_kernel(cuda::AttentionMeta meta, const int32_t* q_offsets,
                                      const int32_t* k_offsets, int batch, int slots,
                                      int64_t q_stride, int64_t kv_stride, int64_t o_stride,
                                      int64_t stats_stride) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s > slots) return;
  const int b = min(s, batch);
  const int64_t q = q_offsets[b], k = k_offsets[b];
  meta.ro_q[s] = q * q_stride;
  meta.ro_kv[s] = k * kv_stride;
  meta.ro_o[s] = q * o_stride;
  meta.ro_stats[s] = q * stats_stride;
  if (s < slots) {
    meta.seq_q[s] = s < batch ? q_offsets[s + 1] - q_offsets[s] : 0;
    meta.seq_kv[s] = s < batch ? k_offsets[s + 1] - k_offsets[s] : 0;
  }
}

// dst[row, c] = src[row, c] * ln(n) / ln(ref), n the keys query `row` sees.
template <typename T>
__global__ void scale_queries_kernel(T* dst, int dst_stride, const T* src, int src_stride,
                                     AttentionShape s, int C) {
  MPIFORMER_FOR_EACH(i, static_cast<size_t>(s.q_offsets[s.batch]) * C) {
    const int row = static_cast<int>(i / C), c = static_cast<int>(i % C);
    const int b = sequence_of(s.q_offsets, s.batch, row);
    const int lk = s.k_offsets[b + 1] - s.k_offsets[b];
    const int visible = s.causal ? min(row - s.q_offsets[b] + 1, lk) : lk;
    const float factor = visible > 1 ? static_cast<float>(log(static_cast<double>(visible)) /
                                                          log(static_cast<double>(s.ref_len)))
                                     : 0.0f;
    store(dst, static_cast<size_t>(row) * dst_stride + c,
          load(src, static_cast<size_t>(row) * src_stride + c) * factor);
  }
}

// packed (B, H, S) from stats (B * S, H), i over packed.  n = B * H * S
__global__ void pack_stats_kernel(float* packed, const float* stats, int S, int H, size_t n) {
  MPIFORMER_FOR_EACH(i, n) {
    const size_t s = i % S, h = i / S % H, b = i / (static_cast<size_t>(S) * H);
    packed[i] = stats[(b * S + s) * H + h];
  }
}

AttentionShape shape_of(const Ragged& qs, const Ragged& ks, const AttentionConfig& cfg,
                        const int64_t* p_offsets, int q_stride, int kv_stride) {
  return AttentionShape{qs.device_offsets, ks.device_offsets, p_offsets,  qs.batch,
                        cfg.heads,         cfg.head_dim,      q_stride,   kv_stride,
                        cfg.causal,        cfg.scale,         cfg.ref_len};
}

}  // namespace

namespace cuda {

void launch_attention_meta(const AttentionMeta& meta, const int32_t* q_offsets,
                           const int32_t* k_offsets, int batch, int slots, int64_t q_stride,
                           int64_t kv_stride, int64_t o_stride, int64_t stats_stride,
                           cudaStream_t stream) {
  attention_meta_kernel<<<(slots + 1 + 127) / 128, 128, 0, stream>>>(
      meta, q_offsets, k_offsets, batch, slots, q_stride, kv_stride, o_stride, stats_stride);
  check(cudaGetLastError(), "attention metadata");
}

void launch_scale_queries(Act dst, int dst_stride, Act src, int src_stride, const Ragged& qs,
                          const Ragged& ks, const AttentionConfig& cfg, cudaStream_t stream) {
  if (qs.total == 0) return;
  const AttentionShape s = shape_of(qs, ks, cfg, nullptr, src_stride, 0);
  const int C = cfg.heads * cfg.head_dim;
  dispatch(dst.dtype, [&](auto t) {
    using T = decltype(t);
    scale_queries_kernel<<<blocks_for(static_cast<size_t>(qs.total) * C), 256, 0, stream>>>(
        typed<T>(dst), dst_stride, typed<T>(src), src_stride, s, C);
  });
  check(cudaGetLastError(), "log-length scale of the queries");
}

void launch_pack_stats(float* packed, const float* stats, int batch, int length, int heads,
                       cudaStream_t stream) {
  const size_t n = static_cast<size_t>(batch) * length * heads;
  if (n == 0) return;
  pack_stats_kernel<<<blocks_for(n), 256, 0, stream>>>(packed, stats, length, heads, n);
  check(cudaGetLastError(), "attention statistics, packed");
}

}  // namespace cuda

bool CudaOps::asks_cudnn(DType dtype) const {
  return flash_ && attention_path_ != AttentionPath::kPlain && dtype != DType::kF32;
}

size_t CudaOps::attention_scratch_bytes(DType dtype, size_t tokens, size_t longest,
                                        const AttentionConfig& cfg, bool backward) const {
  // The flash kernels keep no scores. With cuDNN asked its figure stands:
  // it covers a case cuDNN refuses on either plain path.
  if (!asks_cudnn(dtype) && plain_attention_ == PlainAttention::kFlash &&
      cuda::flash_attention_covers(cfg.head_dim))
    return cuda::flash_attention_scratch_bytes(tokens, cfg, backward);
  return cuda::attention_scratch_bytes(dtype, tokens, longest, cfg, backward, asks_cudnn(dtype));
}

void CudaOps::set_attention_path(AttentionPath path) {
  if (path == AttentionPath::kCudnn && !flash_)
    throw std::runtime_error("--attention cudnn: " + no_cudnn_reason_);
  attention_path_ = path;
}

std::string CudaOps::attention_kernels() const {
  const std::string plain = plain_attention_ == PlainAttention::kFlash
                                ? "the plain CUDA kernels (tiled, flash-style)"
                                : "the plain CUDA kernels (naive: MPIFORMER_PLAIN_ATTENTION=naive)";
  if (attention_path_ == AttentionPath::kPlain) return plain + " (--attention plain)";
  if (!flash_) return plain + " (" + no_cudnn_reason_ + ")";
  const std::string cudnn = "cuDNN's fused flash attention (" + flash_->version() + ")";
  if (attention_path_ == AttentionPath::kCudnn)
    return cudnn + " for bf16 and fp16; a case it refuses is an error (--attention cudnn)";
  return cudnn + " for bf16 and fp16, " + plain + " where it does not take a case";
}

AttentionCalls CudaOps::attention_calls() const {
  AttentionCalls calls = attention_calls_;
  calls.graphs = flash_ ? flash_->graphs() : 0;
  return calls;
}

AttentionPreparation CudaOps::prepare_attention(const std::vector<AttentionCase>& cases,
                                                DType dtype, bool backward) {
  if (!asks_cudnn(dtype) || cases.empty()) return {};
  return flash_->prepare(cases, dtype, backward);
}

void CudaOps::attention_forward(Act out, float* stats, Act q, int q_stride, Act k, Act v,
                                int kv_stride, const Ragged& qs, const Ragged& ks,
                                const AttentionConfig& cfg) {
  if (qs.total == 0) return;
  if (asks_cudnn(out.dtype)) {
    if (flash_->forward(out, stats, q, q_stride, k, v, kv_stride, qs, ks, cfg)) {
      ++attention_calls_.library;
      return;
    }
    refused_by_cudnn("forward");
  }
  ++attention_calls_.plain;
  plain_attention_forward(out, stats, q, q_stride, k, v, kv_stride, qs, ks, cfg);
}

void CudaOps::attention_backward(Act dq, Act dk, Act dv, Act dout, Act out, const float* stats,
                                 Act q, int q_stride, Act k, Act v, int kv_stride, const Ragged& qs,
                                 const Ragged& ks, const AttentionConfig& cfg) {
  if (qs.total == 0) return;
  if (asks_cudnn(dout.dtype)) {
    if (flash_->backward(dq, dk, dv, dout, out, stats, q, q_stride, k, v, kv_stride, qs, ks, cfg)) {
      ++attention_calls_.library;
      return;
    }
    refused_by_cudnn("backward");
  }
  ++attention_calls_.plain;
  plain_attention_backward(dq, dk, dv, dout, out, stats, q, q_stride, k, v, kv_stride, qs, ks, cfg);
}

void CudaOps::refused_by_cudnn(const char* what) {
  if (attention_path_ == AttentionPath::kCudnn) {
    throw std::runtime_error(std::string("--attention cudnn: cuDNN does not take this attention ") +
                             what + ": " + flash_->refusal());
  }
  ++attention_calls_.fallbacks;
}

void CudaOps::plain_attention_forward(Act out, float* stats, Act q, int q_stride, Act k, Act v,
                                      int kv_stride, const Ragged& qs, const Ragged& ks,
                                      const AttentionConfig& cfg) {
  if (plain_attention_ == PlainAttention::kFlash && cuda::flash_attention_covers(cfg.head_dim)) {
    auto* tiles = static_cast<int32_t*>(
        scratch(kAttentionOffsets, cuda::flash_attention_tiles_bytes(qs.batch)));
    cuda::flash_attention_forward(out, stats, q, q_stride, k, v, kv_stride, qs, ks, cfg, tiles,
                                  stream_);
    return;
  }
  const AttentionShape s = shape_of(qs, ks, cfg, nullptr, q_stride, kv_stride);
  const dim3 grid(qs.total, cfg.heads);
  // Three floats of slack: ptxas merges the guarded loads of the scores'
  // last 1-3 elements into one 12-byte load (compute-sanitizer's memcheck
  // flags its unused part past the end).
  const size_t shared = sizeof(float) * (static_cast<size_t>(std::max(ks.max_len, 1)) + 3);
  cuda::dispatch(out.dtype, [&](auto t) {
    using T = decltype(t);
    attention_forward_kernel<<<grid, kThreads, shared, stream_>>>(typed<T>(out), stats, typed<T>(q),
                                                                  typed<T>(k), typed<T>(v), s);
  });
  cuda::check(cudaGetLastError(), "attention_forward");
}

void CudaOps::plain_attention_backward(Act dq, Act dk, Act dv, Act dout, Act out,
                                       const float* stats, Act q, int q_stride, Act k, Act v,
                                       int kv_stride, const Ragged& qs, const Ragged& ks,
                                       const AttentionConfig& cfg) {
  if (plain_attention_ == PlainAttention::kFlash && cuda::flash_attention_covers(cfg.head_dim)) {
    auto* tiles = static_cast<int32_t*>(
        scratch(kAttentionOffsets, cuda::flash_attention_tiles_bytes(qs.batch)));
    auto* delta = static_cast<float*>(
        scratch(kAttentionScores, cuda::flash_attention_delta_bytes(qs.total, cfg.heads)));
    cuda::flash_attention_backward(dq, dk, dv, dout, out, stats, q, q_stride, k, v, kv_stride, qs,
                                   ks, cfg, tiles, delta, stream_);
    return;
  }
  // The probabilities and dS of this call: H * sum_b Lq_b * Lk_b each.
  const size_t floats = cuda::plain_attention_scores_bytes(qs, ks, cfg.heads) / (2 * sizeof(float));
  auto* probs = static_cast<float*>(scratch(kAttentionScores, 2 * sizeof(float) * (floats + 1)));
  float* dscores = probs + floats + 1;
  auto* p_offsets =
      static_cast<int64_t*>(scratch(kAttentionOffsets, sizeof(int64_t) * (qs.batch + 1)));
  prob_offsets_kernel<<<1, 1, 0, stream_>>>(p_offsets, qs.device_offsets, ks.device_offsets,
                                            qs.batch, cfg.heads);
  const AttentionShape s = shape_of(qs, ks, cfg, p_offsets, q_stride, kv_stride);
  cuda::dispatch(dq.dtype, [&](auto t) {
    using T = decltype(t);
    attention_backward_query_kernel<<<dim3(qs.total, cfg.heads), kThreads, 0, stream_>>>(
        typed<T>(dq), probs, dscores, stats, typed<T>(dout), typed<T>(q), typed<T>(k), typed<T>(v),
        s);
    if (ks.total > 0) {
      attention_backward_key_kernel<<<dim3(ks.total, cfg.heads), kThreads, 0, stream_>>>(
          typed<T>(dk), typed<T>(dv), dscores, probs, typed<T>(q), typed<T>(dout), s);
    }
  });
  cuda::check(cudaGetLastError(), "attention_backward");
}

}  // namespace mpiformer
