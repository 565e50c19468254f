// The op interface: every numerical operation the model performs, with one
// implementation per backend (kernels/cpu is the reference, kernels/cuda the
// fast GPU path). Model code calls only this interface and its Device's.
//
// An Ops does math only. It runs on a Device (kernels/device.h), which owns
// the memory every pointer below lives in, the copies to and from the host
// and the stream the ops are queued on: code that holds an Ops reaches
// them through ops.device(). Wrappers of the math (kernels/observed_ops.h)
// wrap an Ops and leave its Device alone.
//
// Conventions
// - Sequences are packed without padding ("ragged"): token i of sequence b is
//   row offsets[b] + i of a (N, C) tensor, N = offsets[B]. Padding never costs
//   a FLOP; per-sequence lengths are honoured by construction.
// - Every pointer is the device's memory (host memory for the CPU backend)
//   except where a comment says "host".
// - Precision (kernels/dtype.h): activations, their gradients and the compute
//   copy of the weights are `Act` (fp32, bf16 or fp16); master weights,
//   parameter gradients, optimizer state, layer-norm statistics and loss sums
//   are fp32 or wider. Ops compute in fp32 and round what they store.
// - Stream order: ops are queued on the device's stream and return at once;
//   nothing in a training step waits for the device. Only the device's
//   copy_to_host, copy_to_device and synchronize wait.
// - Parameter gradients are always accumulated (+=), so micro-batches of one
//   step add up. Input gradients are written (=) unless the op takes an
//   `accumulate` flag.
// - Shapes are written beside every pointer: (N, C) is row-major, C fastest.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/dropout_mask.h"
#include "kernels/dtype.h"
#include "kernels/op_choices.h"

namespace mpiformer {

// Attention calls (forward and backward) so far, by the kernels that ran.
struct AttentionCalls {
  int64_t library = 0;    // the fused library kernel
  int64_t plain = 0;      // the plain kernels
  int64_t fallbacks = 0;  // of the plain ones: cases the library was asked and refused
  int64_t graphs = 0;     // the library's plans held now
};
const char* to_string(AttentionPath p);
// "12 calls on cuDNN, 0 calls on the plain kernels (3 cuDNN did not take)".
std::string attention_summary(const AttentionCalls& calls);
// The calls between two counts (`since` earlier than `now`): a window's.
// Graphs held are now's.
AttentionCalls calls_since(const AttentionCalls& now, const AttentionCalls& since);

// Row offsets of a ragged batch; lengths[b] = offsets[b+1] - offsets[b].
struct Ragged {
  const int32_t* host_offsets = nullptr;    // host (B+1)
  const int32_t* device_offsets = nullptr;  // backend (B+1); equals host_offsets on CPU
  int batch = 0;                            // B
  int total = 0;                            // N = offsets[B]
  int max_len = 0;                          // max over b of lengths[b]
  // Changes whenever new offsets are uploaded to device_offsets, so a
  // backend may keep what it derives from them (per-batch attention
  // metadata) for every layer of a micro-batch. 0: derive anew each call.
  uint64_t version = 0;
  int length(int b) const { return host_offsets[b + 1] - host_offsets[b]; }
};

// The rows of a batch grouped by the table row they read, for a
// deterministic embedding backward: rows[starts[g] .. starts[g+1]) read
// table row keys[g], in ascending order. Built on the host by
// group_rows_by_key (kernels/ops_common.cpp) and uploaded with the batch.
struct RowGroups {
  const int32_t* keys = nullptr;    // backend (G)
  const int32_t* starts = nullptr;  // backend (G+1)
  const int32_t* rows = nullptr;    // backend (N)
  int groups = 0;                   // G
};

// Decoding: which key rows each query row attends. Query row r attends
// rows[starts[r] .. starts[r+1]) of the keys, in that order (the rows of
// its own sequence held in a key/value cache, or of its source sentence).
struct KeyLists {
  const int32_t* host_starts = nullptr;    // host (R+1)
  const int32_t* device_starts = nullptr;  // backend (R+1)
  const int32_t* host_rows = nullptr;      // host (starts[R])
  const int32_t* device_rows = nullptr;    // backend (starts[R])
  int queries = 0;                         // R
  int key_rows = 0;                        // P: rows of k and v (every listed row is below it)
  int longest = 0;                         // the longest list
  int length(int r) const { return host_starts[r + 1] - host_starts[r]; }
};

struct AttentionConfig {
  int heads = 1;     // H
  int head_dim = 1;  // D; model width C = H * D
  bool causal = false;
  AttentionScale scale = AttentionScale::kStandard;
  // log-length: scale = ln(n) / ln(ref_len) / sqrt(D), n = keys the query may see.
  float ref_len = 512.0f;
};

// The largest batch of one class of a run's batches on one side of a model
// (a length bucket's: src/data/batch_source.h): what a backend prepares its
// attention for before the first step.
struct SideBound {
  int sequences = 0;   // at most this many sequences
  int longest = 0;     // none longer
  int64_t tokens = 0;  // at most this many rows in all
};

// One attention call of a model at the largest batch of one class: queries
// from side q, keys from side k (the same side for self-attention).
struct AttentionCase {
  AttentionConfig cfg;
  int q_stride = 0, kv_stride = 0;  // as attention_forward takes them
  SideBound q, k;
};

// What Ops::prepare_attention did, for the start line.
struct AttentionPreparation {
  int cases = 0;               // distinct shapes prepared (after rounding)
  int graphs = 0;              // library plans built (forward and backward)
  int refused = 0;             // of those, cases the library does not take
  double seconds = 0.0;        // building them
  size_t workspace_bytes = 0;  // reserved once, shared by every call
  std::string first_refusal;   // why the library refused the first it refused
};

// Inverted dropout whose mask is a counter-based hash of (seed, stream,
// element index): backward regenerates it and every backend agrees.
// p = 0: no dropout.
struct Dropout {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// An activation fused into a GEMM (see matmul_forward and matmul_backward).
// A null `pre` means no activation.
struct FusedActivation {
  Activation act = Activation::kGelu;
  Act pre;
};

// Sums over the weighted rows of a batch; divisions happen once, at the end.
// Plain data, so backends accumulate it in their own memory.
struct LossSums {
  double loss = 0.0;    // sum of per-token losses over weighted rows (label-smoothed)
  double nll = 0.0;     // sum of -log p(target): the true negative log-likelihood
  int64_t tokens = 0;   // rows whose target is not pad
  int64_t correct = 0;  // weighted rows whose argmax equals the target
  LossSums& operator+=(const LossSums& o) {
    loss += o.loss, nll += o.nll, tokens += o.tokens, correct += o.correct;
    return *this;
  }
};

// A contiguous run of the flat parameter buffer with one weight decay (at
// most kAdamWRangeFloats long, so the runs spread over a GPU's blocks).
constexpr size_t kAdamWRangeFloats = size_t{1} << 16;

// The gradient norm's block: sum_squares_blocks writes one partial sum per
// block of this many floats, and a sharded optimizer's slices start on a
// block boundary, so every rank's partials are the unsharded run's.
constexpr size_t kNormBlockFloats = 4096;
inline size_t norm_blocks(size_t n) {
  return (n + kNormBlockFloats - 1) / kNormBlockFloats;
}
struct AdamWRange {
  size_t begin = 0, end = 0;  // floats from the start of the buffer
  float weight_decay = 0.0f;  // decoupled: p -= lr * wd * p
};

struct AdamWConfig {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  int64_t step = 1;             // 1-based, for bias correction
  float inv_loss_scale = 1.0f;  // gradients carry the loss scale; this removes it
  float max_norm = 0.0f;        // global-norm clipping (0: off)
};

// The clip factor for a gradient of global norm `norm`: brings it to at most
// max_norm (1 when max_norm <= 0 or the norm is within it). The 1e-6 keeps
// the clipped norm just under max_norm, as torch's clip does. Host and device.
MPIFORMER_HOST_DEVICE inline float clip_factor(double norm, float max_norm) {
  if (max_norm > 0.0f && norm > max_norm) return static_cast<float>(max_norm / (norm + 1e-6));
  return 1.0f;
}

// Where the time of a step goes (`bench --profile`).
enum class OpFamily {
  kGemm,
  kAttention,
  kNorm,
  kElementwise,
  kEmbedding,
  kLoss,
  kOptimizer,
  kCount
};
const char* to_string(OpFamily f);

class Ops {
 public:
  // The ops run on `device`, which outlives them.
  explicit Ops(Device& device) : device_(device) {}
  virtual ~Ops() = default;
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;

  // The memory, copies and stream of these ops.
  Device& device() const { return device_; }

  // ---- configuration ----------------------------------------------------
  // These choose among the kernels of the math below, so they are the ops'
  // (a wrapper passes them on) and not the device's, which does no math.
  // Whether results must be reproducible bit for bit (--deterministic):
  // a backend may then refuse faster algorithms whose sums depend on
  // timing (cuDNN's attention backward).
  virtual void set_deterministic(bool deterministic) { (void)deterministic; }
  // Decoding (src/model/decoding.h) must give the same bits for a sentence
  // whatever other sentences share its calls, with or without a key/value
  // cache. With this on, each row of matmul_forward depends on that row
  // alone: the CPU backend then multiplies on a kernel of its own, since
  // OpenBLAS's bits for a row depend on the rows beside it. The other
  // forward ops are row by row already. A GPU backend may ignore it: its
  // decoding is exact to rounding only. While it is on the weights do not
  // change: the backend may keep what it derives from them (the CPU its
  // packed copies, batch_invariant_bytes of them) until it is turned off.
  virtual void set_batch_invariant(bool on) { (void)on; }
  virtual bool batch_invariant() const { return false; }
  virtual size_t batch_invariant_bytes(size_t weight_floats) const {
    (void)weight_floats;
    return 0;
  }
  // Chooses the attention kernels (--attention). Throws
  // std::runtime_error when the path cannot run here (cudnn without cuDNN).
  virtual void set_attention_path(AttentionPath path);
  // Which attention kernels run, and why, for the start line.
  virtual std::string attention_kernels() const { return "the CPU backend's"; }
  virtual AttentionCalls attention_calls() const { return {}; }
  // Prepares the attention kernels for every batch shape a run will make,
  // before its first step, so that no step waits for it: cuDNN builds a
  // graph per case (rounded shapes) and reserves the largest workspace of
  // them once, which every later call uses. backward: training. Throws
  // std::runtime_error when that workspace does not fit in the device's
  // free memory. The CPU and the plain kernels prepare nothing.
  virtual AttentionPreparation prepare_attention(const std::vector<AttentionCase>& cases,
                                                 DType dtype, bool backward) {
    (void)cases, (void)dtype, (void)backward;
    return {};
  }

  // ---- precision --------------------------------------------------------
  // dst = src rounded to dst's type (the compute copy of the weights).
  // dst: (n), src: (n) fp32
  virtual void convert(Act dst, const float* src, size_t n) = 0;

  // ---- elementwise ------------------------------------------------------
  // out = dropout(x); out may alias x. The backward is the same op on the
  // gradient (the mask and scale are regenerated).  out, x: (n)
  virtual void dropout(Act out, Act x, size_t n, const Dropout& d) = 0;
  // dx = act'(pre) * dout, for an activation whose backward follows no GEMM
  // (the mlm head); dx may alias dout.  dx, dout, pre: (n)
  virtual void activation_backward(Act dx, Act dout, Act pre, size_t n, Activation act) = 0;

  // ---- embeddings -------------------------------------------------------
  // out[i] = tokens[ids[i]] * scale + positions[pos[i]].
  // out: (N, C), ids, pos: (N), tokens: (V, C), positions: (L, C) (a
  // learned table's compute copy, or fixed sinusoids)
  virtual void embedding_forward(Act out, const int32_t* ids, Act tokens, const int32_t* pos,
                                 Act positions, int N, int C, float scale) = 0;
  // dtokens[ids[i]] += dout[i] * scale and, when dpositions is not null,
  // dpositions[pos[i]] += dout[i]; each row of a table sums its rows in
  // ascending order (no float atomics: deterministic).
  // dtokens: (V, C), dpositions: (L, C) or null, dout: (N, C)
  virtual void embedding_backward(float* dtokens, float* dpositions, Act dout,
                                  const RowGroups& by_id, const RowGroups& by_pos, int N, int C,
                                  float scale) = 0;

  // ---- layer norm -------------------------------------------------------
  // out = (x - mean) * rstd * gamma + beta, per row.
  // out, x: (N, C), mean, rstd: (N) saved for backward, gamma, beta: (C)
  virtual void layernorm_forward(Act out, float* mean, float* rstd, Act x, Act gamma, Act beta,
                                 int N, int C, float eps) = 0;
  // A residual connection and the layer norm after it, in one pass:
  // sum = s + dropout(y), out = LN(sum).  sum, out, s, y: (N, C)
  virtual void residual_layernorm_forward(Act sum, Act out, float* mean, float* rstd, Act s, Act y,
                                          const Dropout& d, Act gamma, Act beta, int N, int C,
                                          float eps) = 0;
  // dx (= or += with accumulate): (N, C), dgamma, dbeta (+=): (C)
  virtual void layernorm_backward(Act dx, float* dgamma, float* dbeta, Act dout, Act x, Act gamma,
                                  const float* mean, const float* rstd, int N, int C,
                                  bool accumulate) = 0;

  // ---- GEMM -------------------------------------------------------------
  // out = act(x @ weight^T + bias); with an activation, fused.pre (N, OC)
  // keeps x @ weight^T + bias for the backward pass.
  // out: (N, OC) rows out_stride elements apart (0: OC; a padded stride
  // keeps wide GEMMs aligned), x: (N, IC), weight: (OC, IC), bias: (OC) or null
  virtual void matmul_forward(Act out, Act x, Act weight, Act bias, int N, int IC, int OC,
                              const FusedActivation& fused = {}, int out_stride = 0) = 0;
  // dx (= or += with accumulate; null to skip): (N, IC), dweight (+=):
  // (OC, IC), dbias (+=, null to skip): (OC), dout: (N, OC) rows dout_stride
  // apart (0: OC). With an activation (fused.pre: (N, IC), the forward's
  // pre-activation of x), dx = act'(pre) * (dout @ weight): the gradient at
  // the pre-activation (accumulate must be false).
  virtual void matmul_backward(Act dx, float* dweight, float* dbias, Act dout, Act x, Act weight,
                               int N, int IC, int OC, bool accumulate,
                               const FusedActivation& fused = {}, int dout_stride = 0) = 0;

  // ---- attention --------------------------------------------------------
  // Multi-head scaled dot-product attention over ragged batches. Query b
  // attends to the keys of sequence b only (key padding by construction),
  // and with `causal` to keys 0..i (requires q and k lengths equal).
  // q: (Nq, H*D) rows `q_stride` elements apart; k, v: (Nk, H*D) rows
  // `kv_stride` apart (so q, k, v may be column slices of one fused QKV
  // tensor); out: (Nq, H*D) dense. Saved for backward: out and
  // stats (Nq, H), each query row's log-sum-exp of its scaled scores (not
  // the probabilities).
  virtual void attention_forward(Act out, float* stats, Act q, int q_stride, Act k, Act v,
                                 int kv_stride, const Ragged& qs, const Ragged& ks,
                                 const AttentionConfig& cfg) = 0;
  // dq: (Nq, H*D) stride q_stride; dk, dv: (Nk, H*D) stride kv_stride; all
  // written (=). dout, out: (Nq, H*D) dense; stats: (Nq, H) from forward.
  virtual void attention_backward(Act dq, Act dk, Act dv, Act dout, Act out, const float* stats,
                                  Act q, int q_stride, Act k, Act v, int kv_stride,
                                  const Ragged& qs, const Ragged& ks,
                                  const AttentionConfig& cfg) = 0;
  // The most scratch the two calls above take for `tokens` packed query
  // rows of sequences up to `longest` long (keys likewise): the scores a
  // plain kernel keeps grow with longest^2, which a memory estimate must
  // count. backward: the larger need of attention_backward.
  virtual size_t attention_scratch_bytes(DType dtype, size_t tokens, size_t longest,
                                         const AttentionConfig& cfg, bool backward) const = 0;

  // Decoding: each query row against its own list of key rows (KeyLists),
  // scaled as a query that sees that many keys (cfg.causal is not read: the
  // list is what the row may see); a row with an empty list gets 0. A row's
  // result depends on its query and its listed keys alone, in any batch.
  // out: (R, H*D) dense, q: (R, H*D) rows q_stride apart, k, v: (P, H*D)
  // rows kv_stride apart (a key/value cache, or an encoder's memory)
  virtual void attention_listed(Act out, Act q, int q_stride, Act k, Act v, int kv_stride,
                                const KeyLists& keys, const AttentionConfig& cfg) = 0;
  // Decoding: dst row rows[i] = src row i, `width` elements each, for i < n
  // (a step's keys and values into the cache rows they were given). dst and
  // src share a dtype; the rows are distinct.  src: (n, width) rows
  // src_stride apart, dst: rows dst_stride apart, rows: backend (n)
  virtual void scatter_rows(Act dst, int dst_stride, Act src, int src_stride, const int32_t* rows,
                            int n, int width) = 0;

  // ---- loss -------------------------------------------------------------
  // Label-smoothed softmax cross entropy fused with its gradient. Target
  // distribution: 1-e on the label, e/(V-1) elsewhere; the constant
  // -((1-e)ln(1-e) + e ln(e/(V-1))) is subtracted so a perfect prediction
  // scores 0. Rows whose target is pad_id have weight 0. Softmax and loss in
  // fp32. With compute_grad, logits are overwritten by
  // dlogits = (p - q) * grad_scale (0 on pad rows): the probabilities are
  // never stored. The batch's sums are added to *sums in row order.
  // logits: (N, V) rows `stride` elements apart (0: V), targets: (N),
  // sums: backend (1)
  virtual void cross_entropy(Act logits, const int32_t* targets, int N, int V, float smoothing,
                             int pad_id, float grad_scale, bool compute_grad, LossSums* sums,
                             int stride = 0) = 0;

  // ---- classification (--model classify) ---------------------------------
  // One row per sequence: out[b] = x[offsets[b]] (cls: the first row) or the
  // mean of rows [offsets[b], offsets[b+1]) (mean; 0 for an empty sequence).
  // out: (B, C), x: (N, C)
  virtual void pool_forward(Act out, Act x, const Ragged& rows, int C, PoolKind kind) = 0;
  // The backward of pool_forward, written (=): cls: dx = dout[b] on the first
  // row of sequence b and 0 on its other rows; mean: dout[b] / length(b) on
  // every row of b.  dx: (N, C), dout: (B, C)
  virtual void pool_backward(Act dx, Act dout, const Ragged& rows, int C, PoolKind kind) = 0;
  // Multi-label ZLPR loss with soft targets t in [0, 1], per row of K scores s:
  //   log(1 + sum_i (1 - t_i) e^{s_i}) + log(1 + sum_i t_i e^{-s_i}),
  // both terms as log-sum-exp over {0} and the weighted exponents, so any
  // finite score is safe. Label i is predicted when s_i > 0 and true when
  // t_i >= 0.5. With compute_grad, logits are overwritten by
  // dlogits * grad_scale, dloss/ds_i = (1 - t_i) e^{s_i - A} - t_i e^{-s_i - B}
  // (A and B the two log-sum-exps). Added to *sums in row order: loss and nll
  // (both the ZLPR loss), tokens (rows) and correct (rows whose predicted set
  // equals the true set). label_counts (+=) holds, for each label, its true
  // positives, false positives and false negatives: rows [0, K), [K, 2K),
  // [2K, 3K). Every sum is fp64 or an integer, in an order fixed by B and K.
  // logits: (B, K) rows `stride` elements apart (0: K), targets: (B, K) fp32,
  // sums: backend (1), label_counts: backend (3 K) int64
  virtual void zlpr_loss(Act logits, const float* targets, int B, int K, float grad_scale,
                         bool compute_grad, LossSums* sums, int64_t* label_counts,
                         int stride = 0) = 0;

  // ---- exact gradient sum (src/parallel/gradient_reducer.h) -------------
  // Math on the device's memory, so ops like the rest (and timed with
  // them), though the reducer, not the model, calls them.
  // fixed[i] += round(grads[i] * 2^fraction_bits) for every i with
  // |grads[i]| < 2^limit_bits; each other element (NaN too) adds 1 to
  // *out_of_range instead. Integer sums: any order gives the same result.
  // fixed: backend (n) int64, grads: backend (n) fp32, out_of_range: backend (1)
  virtual void fixed_point_accumulate(int64_t* fixed, int64_t* out_of_range, const float* grads,
                                      size_t n, int fraction_bits, int limit_bits) = 0;
  // out[i] = fixed[i] * 2^-fraction_bits, or NaN everywhere when
  // *out_of_range > 0.  out: backend (n) fp32, fixed: backend (n), out_of_range: backend (1)
  virtual void fixed_point_to_float(float* out, const int64_t* fixed, const int64_t* out_of_range,
                                    size_t n, int fraction_bits) = 0;

  // ---- optimizer --------------------------------------------------------
  // *out = sum of x[i]^2, accumulated in double in an order that depends on
  // n only.  x: (n), out: backend (1)
  virtual void sum_squares(double* out, const float* x, size_t n) = 0;
  // partial[b] = sum of x[i]^2 over block b, i in [b * kNormBlockFloats,
  // min(n, (b + 1) * kNormBlockFloats)), in double, in an order that depends
  // on the block's length only (the gradient norm: any slice of x that
  // starts on a block boundary gives the same partials).
  // x: (n), partial: backend (norm_blocks(n))
  virtual void sum_squares_blocks(double* partial, const float* x, size_t n) = 0;
  // *out = sum of x[0, n) in an order that depends on n only (0 when n is 0).
  // x: backend (n), out: backend (1)
  virtual void sum_doubles(double* out, const double* x, size_t n) = 0;
  // One AdamW update of every range of the flat buffers, in one pass (one
  // launch on a GPU, a block per range). Gradients are multiplied by cfg.inv_loss_scale and by
  // clip_factor(sqrt(*grad_norm_sq) * inv_loss_scale, max_norm) first, so
  // the clip is decided on the device. compute (the compute copy of the
  // weights) is refreshed; null when the compute precision is fp32.
  // params, grads, m, v: (n) fp32, compute: (n), ranges: backend (R),
  // grad_norm_sq: backend (1), from sum_squares
  virtual void adamw_update(float* params, const float* grads, float* m, float* v, Act compute,
                            size_t n, const AdamWRange* ranges, int range_count,
                            const AdamWConfig& cfg, const double* grad_norm_sq) = 0;

 private:
  Device& device_;
};

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

// Groups rows 0..N-1 by keys[row] (host data): the host side of RowGroups.
// out_keys: (G), out_starts: (G+1), out_rows: (N); returns G.
int group_rows_by_key(const int32_t* keys, int N, std::vector<int32_t>* out_keys,
                      std::vector<int32_t>* out_starts, std::vector<int32_t>* out_rows);

}  // namespace mpiformer
