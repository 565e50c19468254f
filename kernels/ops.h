// The op interface: every numerical operation the model performs, with one
// implementation per backend (kernels/cpu is the reference, kernels/cuda the
// fast GPU path). Model code calls only this interface.
//
// Conventions
// - Sequences are packed without padding ("ragged"): token i of sequence b is
//   row offsets[b] + i of a (N, C) tensor, N = offsets[B]. Padding never costs
//   a FLOP; per-sequence lengths are honoured by construction.
// - Every pointer is backend memory (host memory for the CPU backend) except
//   where a comment says "host".
// - Parameter gradients are always accumulated (+=), so micro-batches of one
//   step add up. Input gradients are written (=) unless the op takes an
//   `accumulate` flag.
// - Shapes are written beside every pointer: (N, C) is row-major, C fastest.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/dropout_mask.h"

namespace mpiformer {

enum class Activation { kGelu, kRelu };
enum class AttentionScale { kStandard, kLogLength };

// Row offsets of a ragged batch; lengths[b] = offsets[b+1] - offsets[b].
struct Ragged {
  const int32_t* host_offsets = nullptr;    // host (B+1)
  const int32_t* device_offsets = nullptr;  // backend (B+1); equals host_offsets on CPU
  int batch = 0;                            // B
  int total = 0;                            // N = offsets[B]
  int max_len = 0;                          // max over b of lengths[b]
  int length(int b) const { return host_offsets[b + 1] - host_offsets[b]; }
};

struct AttentionConfig {
  int heads = 1;     // H
  int head_dim = 1;  // D; model width C = H * D
  bool causal = false;
  AttentionScale scale = AttentionScale::kStandard;
  // log-length: scale = ln(n) / ln(ref_len) / sqrt(D), n = keys the query may see.
  float ref_len = 512.0f;
};

// Sums over the weighted rows of a batch; divisions happen once, at the end.
struct LossSums {
  double loss = 0.0;    // sum of per-token losses over weighted rows
  int64_t tokens = 0;   // rows whose target is not pad
  int64_t correct = 0;  // weighted rows whose argmax equals the target
  LossSums& operator+=(const LossSums& o) {
    loss += o.loss, tokens += o.tokens, correct += o.correct;
    return *this;
  }
};

struct AdamWConfig {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: p -= lr * wd * p
  int64_t step = 1;           // 1-based, for bias correction
  float grad_scale = 1.0f;    // gradients are multiplied by this first (clipping)
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;

  // ---- memory -----------------------------------------------------------
  virtual void* allocate(size_t bytes) = 0;  // zero-filled, 64-byte aligned
  virtual void release(void* ptr) = 0;
  virtual void copy_to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(float* x, size_t n) = 0;  // x: (n)
  virtual void synchronize() = 0;
  // Peak of the backend's own allocations so far, in bytes.
  virtual size_t peak_allocated_bytes() const = 0;
  // Whether the host may read and write this backend's memory directly
  // (CPU: yes; a GPU's: no, copy_to_host and copy_to_device).
  virtual bool host_accessible() const { return true; }

  // ---- elementwise ------------------------------------------------------
  // out = a + b; out may alias a or b.  out, a, b: (n)
  virtual void add(float* out, const float* a, const float* b, size_t n) = 0;

  // out = act(x); out may alias x only for the forward pass of ReLU.
  // out, x: (n)
  virtual void activation_forward(float* out, const float* x, size_t n, Activation act) = 0;
  // dx = act'(x) * dout.  dx, dout, x: (n)
  virtual void activation_backward(float* dx, const float* dout, const float* x, size_t n,
                                   Activation act) = 0;

  // Inverted dropout with a mask regenerated from (seed, stream, index) by a
  // counter-based hash, so backward stores nothing and any backend agrees.
  // out = x * keep / (1 - p); out may alias x.  out, x: (n)
  virtual void dropout_forward(float* out, const float* x, size_t n, float p, uint64_t seed,
                               uint64_t stream) = 0;
  // dx = dout * keep / (1 - p); dx may alias dout.  dx, dout: (n)
  virtual void dropout_backward(float* dx, const float* dout, size_t n, float p, uint64_t seed,
                                uint64_t stream) = 0;

  // ---- embeddings -------------------------------------------------------
  // out[i] = table[ids[i]] * scale.  out: (N, C), ids: (N), table: (V, C)
  virtual void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                                 float scale) = 0;
  // dtable[ids[i]] += dout[i] * scale.  dtable: (V, C), dout: (N, C), ids: (N)
  virtual void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N,
                                  int C, float scale) = 0;
  // x[i] += table[positions[i]].  x: (N, C), positions: (N), table: (L, C)
  virtual void positional_add_forward(float* x, const int32_t* positions, const float* table, int N,
                                      int C) = 0;
  // dtable[positions[i]] += dx[i].  dtable: (L, C), dx: (N, C)
  virtual void positional_add_backward(float* dtable, const float* dx, const int32_t* positions,
                                       int N, int C) = 0;

  // ---- layer norm -------------------------------------------------------
  // out = (x - mean) * rstd * gamma + beta, per row.
  // out, x: (N, C), mean, rstd: (N) saved for backward, gamma, beta: (C)
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* x,
                                 const float* gamma, const float* beta, int N, int C,
                                 float eps) = 0;
  // dx (= or += with accumulate): (N, C), dgamma, dbeta (+=): (C)
  virtual void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dout,
                                  const float* x, const float* gamma, const float* mean,
                                  const float* rstd, int N, int C, bool accumulate) = 0;

  // ---- GEMM -------------------------------------------------------------
  // out = x @ weight^T + bias.  out: (N, OC), x: (N, IC), weight: (OC, IC),
  // bias: (OC) or null
  virtual void matmul_forward(float* out, const float* x, const float* weight, const float* bias,
                              int N, int IC, int OC) = 0;
  // dx (= or += with accumulate; null to skip): (N, IC), dweight (+=): (OC, IC),
  // dbias (+=, null to skip): (OC), dout: (N, OC)
  virtual void matmul_backward(float* dx, float* dweight, float* dbias, const float* dout,
                               const float* x, const float* weight, int N, int IC, int OC,
                               bool accumulate) = 0;

  // ---- softmax ----------------------------------------------------------
  // Row softmax of x * scale over the first `valid[r]` columns (all when valid
  // is null); columns past valid[r] get probability 0.
  // probs, x: (R, L), valid: host (R) or null
  virtual void softmax_forward(float* probs, const float* x, int R, int L, float scale,
                               const int32_t* valid) = 0;
  // dx = scale * probs * (dprobs - sum(dprobs * probs)).  dx, dprobs, probs: (R, L)
  virtual void softmax_backward(float* dx, const float* dprobs, const float* probs, int R, int L,
                                float scale) = 0;

  // ---- attention --------------------------------------------------------
  // Multi-head scaled dot-product attention over ragged batches. Query b
  // attends to the keys of sequence b only (key padding by construction),
  // and with `causal` to keys 0..i (requires q and k lengths equal).
  // q: (Nq, H*D) rows `q_stride` floats apart; k, v: (Nk, H*D) rows
  // `kv_stride` apart (so q, k, v may be column slices of one fused QKV
  // tensor); out: (Nq, H*D) dense; probs: attention_probs_size() floats saved
  // for backward.
  virtual void attention_forward(float* out, float* probs, const float* q, int q_stride,
                                 const float* k, const float* v, int kv_stride, const Ragged& qs,
                                 const Ragged& ks, const AttentionConfig& cfg) = 0;
  // dq: (Nq, H*D) stride q_stride; dk, dv: (Nk, H*D) stride kv_stride;
  // all written (=). dout: (Nq, H*D) dense.
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* probs, const float* q, int q_stride, const float* k,
                                  const float* v, int kv_stride, const Ragged& qs, const Ragged& ks,
                                  const AttentionConfig& cfg) = 0;

  // ---- loss -------------------------------------------------------------
  // Label-smoothed softmax cross entropy fused with its gradient. Target
  // distribution: 1-e on the label, e/(V-1) elsewhere; the constant
  // -((1-e)ln(1-e) + e ln(e/(V-1))) is subtracted so a perfect prediction
  // scores 0. Rows whose target is pad_id have weight 0.
  // With compute_grad, logits are overwritten by dlogits = (p - q) * grad_scale
  // (0 on pad rows): the probabilities are never stored.
  // logits: (N, V), targets: (N)
  virtual LossSums cross_entropy(float* logits, const int32_t* targets, int N, int V,
                                 float smoothing, int pad_id, float grad_scale,
                                 bool compute_grad) = 0;

  // ---- optimizer --------------------------------------------------------
  // AdamW on one tensor. params, grads, m, v: (n)
  virtual void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                            const AdamWConfig& cfg) = 0;
  // sum of x[i]^2, accumulated in double.  x: (n)
  virtual double sum_squares(const float* x, size_t n) = 0;
};

// Attention probabilities saved by attention_forward: H * sum_b Lq_b * Lk_b floats.
size_t attention_probs_size(const Ragged& qs, const Ragged& ks, int heads);

// Per-query attention scale for the query that sees `visible_keys` keys;
// the same code on the host and in CUDA kernels. Log-length scaling keeps
// the attention entropy roughly constant as the number of visible keys
// grows; a query that sees one key gets scale 0, which is harmless: its
// softmax is 1 on that key whatever the logit.
MPIFORMER_HOST_DEVICE inline float attention_scale(AttentionScale scale, int head_dim,
                                                   float ref_len, int visible_keys) {
  const double standard = 1.0 / sqrt(static_cast<double>(head_dim));
  if (scale == AttentionScale::kStandard) return static_cast<float>(standard);
  const double n = visible_keys > 1 ? static_cast<double>(visible_keys) : 1.0;
  return static_cast<float>(log(n) / log(static_cast<double>(ref_len)) * standard);
}
inline float attention_scale(const AttentionConfig& cfg, int visible_keys) {
  return attention_scale(cfg.scale, cfg.head_dim, cfg.ref_len, visible_keys);
}

// The normalising constant of the smoothed target distribution (>= 0).
double label_smoothing_constant(float smoothing, int V);

}  // namespace mpiformer
