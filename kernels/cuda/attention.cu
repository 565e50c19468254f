// Row softmax and multi-head attention over ragged batches, one block per
// (query row, head): plain kernels that keep the probabilities (the CPU
// backend's contract). cuDNN's fused attention replaces them later.
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

constexpr int kThreads = 128;

// probs, x: (R, L); valid: (R) or null
__global__ void softmax_forward_kernel(float* probs, const float* x, int L, float scale,
                                       const int32_t* valid) {
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  const int n = valid ? min(max(valid[row], 0), L) : L;
  const float* xr = x + row * L;
  float* pr = probs + row * L;
  float top = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) top = fmaxf(top, xr[j] * scale);
  top = cuda::block_max(top, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) sum += expf(xr[j] * scale - top);
  sum = cuda::block_sum(sum, shared);
  for (int j = threadIdx.x; j < L; j += blockDim.x)
    pr[j] = j < n ? expf(xr[j] * scale - top) / sum : 0.0f;
}

// dx = scale * probs * (dprobs - sum(dprobs * probs)).  dx, dprobs, probs: (R, L)
__global__ void softmax_backward_kernel(float* dx, const float* dprobs, const float* probs, int L,
                                        float scale) {
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  float dot = 0.0f;
  for (int j = threadIdx.x; j < L; j += blockDim.x) dot += dprobs[row * L + j] * probs[row * L + j];
  dot = cuda::block_sum(dot, shared);
  for (int j = threadIdx.x; j < L; j += blockDim.x)
    dx[row * L + j] = scale * probs[row * L + j] * (dprobs[row * L + j] - dot);
}

// The sequence that holds global row `row`.  offsets: (B+1)
__device__ int sequence_of(const int32_t* offsets, int batch, int row) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

struct AttentionShape {
  const int32_t* q_offsets;   // (B+1)
  const int32_t* k_offsets;   // (B+1)
  const int64_t* p_offsets;   // (B+1): start of each sequence's probabilities
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
// out: (Nq, H*D) dense; q: stride q_stride; k, v: stride kv_stride
__global__ void attention_forward_kernel(float* out, float* probs, const float* q, const float* k,
                                         const float* v, AttentionShape s) {
  extern __shared__ float scores[];
  __shared__ float shared[32];
  const int row = blockIdx.x, h = blockIdx.y, D = s.head_dim;
  const QueryRow r = locate_query(s, row);
  const int b = r.b, i = r.i, lq = r.lq, k0 = r.k0, lk = r.lk, visible = r.visible;
  const float scale = r.scale;
  const float* qr = q + static_cast<size_t>(row) * s.q_stride + h * D;
  float top = -INFINITY;
  for (int j = threadIdx.x; j < visible; j += blockDim.x) {
    const float* kr = k + static_cast<size_t>(k0 + j) * s.kv_stride + h * D;
    float dot = 0.0f;
    for (int d = 0; d < D; ++d) dot += qr[d] * kr[d];
    scores[j] = dot * scale;
    top = fmaxf(top, scores[j]);
  }
  top = cuda::block_max(top, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < visible; j += blockDim.x) {
    scores[j] = expf(scores[j] - top);
    sum += scores[j];
  }
  sum = cuda::block_sum(sum, shared);
  float* pr = probs + prob_row(s, b, h, i, lq, lk);
  for (int j = threadIdx.x; j < lk; j += blockDim.x) {
    const float p = j < visible ? scores[j] / sum : 0.0f;
    if (j < visible) scores[j] = p;
    pr[j] = p;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < visible; ++j)
      acc += scores[j] * v[static_cast<size_t>(k0 + j) * s.kv_stride + h * D + d];
    out[static_cast<size_t>(row) * s.heads * D + h * D + d] = acc;
  }
}

// Per query row: dS = P (dP - sum(P dP)) * scale with dP = dout v^T, kept in
// `dscores` (the probabilities' layout); dq = dS k.  grid (Nq, H)
__global__ void attention_backward_query_kernel(float* dq, float* dscores, const float* dout,
                                                const float* probs, const float* k, const float* v,
                                                AttentionShape s) {
  __shared__ float shared[32];
  const int row = blockIdx.x, h = blockIdx.y, D = s.head_dim;
  const QueryRow r = locate_query(s, row);
  const int b = r.b, i = r.i, lq = r.lq, k0 = r.k0, lk = r.lk, visible = r.visible;
  const float scale = r.scale;
  const float* dr = dout + static_cast<size_t>(row) * s.heads * D + h * D;
  const float* pr = probs + prob_row(s, b, h, i, lq, lk);
  float* dsr = dscores + prob_row(s, b, h, i, lq, lk);
  float p_dp = 0.0f;
  for (int j = threadIdx.x; j < lk; j += blockDim.x) {
    float dp = 0.0f;
    if (j < visible) {
      const float* vr = v + static_cast<size_t>(k0 + j) * s.kv_stride + h * D;
      for (int d = 0; d < D; ++d) dp += dr[d] * vr[d];
    }
    dsr[j] = dp;  // dP for now
    p_dp += pr[j] * dp;
  }
  p_dp = cuda::block_sum(p_dp, shared);  // also orders the dP writes before the reads below
  for (int j = threadIdx.x; j < lk; j += blockDim.x) dsr[j] = pr[j] * (dsr[j] - p_dp) * scale;
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < visible; ++j)
      acc += dsr[j] * k[static_cast<size_t>(k0 + j) * s.kv_stride + h * D + d];
    dq[static_cast<size_t>(row) * s.q_stride + h * D + d] = acc;
  }
}

// Per key row j: dk = dS^T q and dv = P^T dout over the queries that see it.
// grid (Nk, H)
__global__ void attention_backward_key_kernel(float* dk, float* dv, const float* dscores,
                                              const float* probs, const float* q,
                                              const float* dout, AttentionShape s) {
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
      acc_k += dscores[at] * q[static_cast<size_t>(q0 + i) * s.q_stride + h * D + d];
      acc_v += probs[at] * dout[static_cast<size_t>(q0 + i) * s.heads * D + h * D + d];
    }
    dk[static_cast<size_t>(row) * s.kv_stride + h * D + d] = acc_k;
    dv[static_cast<size_t>(row) * s.kv_stride + h * D + d] = acc_v;
  }
}

AttentionShape shape_of(const Ragged& qs, const Ragged& ks, const AttentionConfig& cfg,
                        const int64_t* p_offsets, int q_stride, int kv_stride) {
  return AttentionShape{qs.device_offsets, ks.device_offsets, p_offsets, qs.batch, cfg.heads,
                        cfg.head_dim,      q_stride,          kv_stride, cfg.causal, cfg.scale,
                        cfg.ref_len};
}

}  // namespace

void CudaOps::softmax_forward(float* probs, const float* x, int R, int L, float scale,
                              const int32_t* valid) {
  if (R == 0 || L == 0) return;
  int32_t* device_valid = nullptr;
  if (valid) {
    device_valid = static_cast<int32_t*>(scratch(kValid, sizeof(int32_t) * R));
    copy_to_device(device_valid, valid, sizeof(int32_t) * R);
  }
  softmax_forward_kernel<<<R, kThreads, 0, stream_>>>(probs, x, L, scale, device_valid);
  cuda::check(cudaGetLastError(), "softmax_forward");
}

void CudaOps::softmax_backward(float* dx, const float* dprobs, const float* probs, int R, int L,
                               float scale) {
  if (R == 0 || L == 0) return;
  softmax_backward_kernel<<<R, kThreads, 0, stream_>>>(dx, dprobs, probs, L, scale);
  cuda::check(cudaGetLastError(), "softmax_backward");
}

const int64_t* CudaOps::prob_offsets(const Ragged& qs, const Ragged& ks, int heads) {
  // Sequence b's block holds H * Lq_b * Lk_b probabilities, head-major.
  std::vector<int64_t> offsets(qs.batch + 1, 0);  // host (B+1)
  for (int b = 0; b < qs.batch; ++b) {
    offsets[b + 1] = offsets[b] + static_cast<int64_t>(heads) * qs.length(b) * ks.length(b);
  }
  auto* device = static_cast<int64_t*>(scratch(kProbOffsets, sizeof(int64_t) * offsets.size()));
  copy_to_device(device, offsets.data(), sizeof(int64_t) * offsets.size());
  return device;
}

void CudaOps::attention_forward(float* out, float* probs, const float* q, int q_stride,
                                const float* k, const float* v, int kv_stride, const Ragged& qs,
                                const Ragged& ks, const AttentionConfig& cfg) {
  if (qs.total == 0) return;
  const int64_t* p_offsets = prob_offsets(qs, ks, cfg.heads);
  const AttentionShape s = shape_of(qs, ks, cfg, p_offsets, q_stride, kv_stride);
  const dim3 grid(qs.total, cfg.heads);
  const size_t shared = sizeof(float) * static_cast<size_t>(ks.max_len > 0 ? ks.max_len : 1);
  attention_forward_kernel<<<grid, kThreads, shared, stream_>>>(out, probs, q, k, v, s);
  cuda::check(cudaGetLastError(), "attention_forward");
}

void CudaOps::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                 const float* probs, const float* q, int q_stride, const float* k,
                                 const float* v, int kv_stride, const Ragged& qs, const Ragged& ks,
                                 const AttentionConfig& cfg) {
  if (qs.total == 0) return;
  const int64_t* p_offsets = prob_offsets(qs, ks, cfg.heads);
  const AttentionShape s = shape_of(qs, ks, cfg, p_offsets, q_stride, kv_stride);
  auto* dscores = static_cast<float*>(
      scratch(kAttentionGrad, sizeof(float) * attention_probs_size(qs, ks, cfg.heads)));
  attention_backward_query_kernel<<<dim3(qs.total, cfg.heads), kThreads, 0, stream_>>>(
      dq, dscores, dout, probs, k, v, s);
  cuda::check(cudaGetLastError(), "attention_backward (queries)");
  attention_backward_key_kernel<<<dim3(ks.total, cfg.heads), kThreads, 0, stream_>>>(
      dk, dv, dscores, probs, q, dout, s);
  cuda::check(cudaGetLastError(), "attention_backward (keys)");
}

}  // namespace mpiformer
