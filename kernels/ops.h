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
  // > 0: every sequence of the class has this many tokens (at most
  // `longest`), and its full batches are `sequences` of them (a benchmark's
  // one batch of equal lengths, a bucket of one length:
  // src/data/shard_source.cpp), so a layout made for that shape alone
  // serves those (attention=dense); a batch of another count takes the
  // class's ragged layout. 0: lengths differ.
  int one_length = 0;
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
// A null `pre` means no activation. pre_bias_grad, in matmul_backward
// with `pre` only: where not null, the sums over rows of the dx it writes
// (the gradient at pre) are added to it (+=, (IC)), the bias gradient of
// the layer that made pre.
struct FusedActivation {
  Activation act = Activation::kGelu;
  Act pre;
  float* pre_bias_grad = nullptr;
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
  // What the GEMMs' timed search chose (MPIFORMER_KERNELS=gemm=timed), for
  // bench's report; empty where nothing was timed.
  virtual std::string gemm_search() const { return ""; }
  // What cuDNN attention's plan search found (MPIFORMER_KERNELS=
  // attention_plan=timed, kernels/attention_search.h), for bench's report;
  // empty where no graph was searched.
  virtual std::string attention_search() const { return ""; }
  // The GEMM shapes whose fused epilogue (bias, GELU, bias gradient) the
  // GPU's library refused, so that its work ran as separate kernels, for
  // bench's report; empty where every one fused.
  virtual std::string gemm_unfused() const { return ""; }
  // The kernel switches the backend runs under (kernels/kernel_switches.h's
  // describe), for start lines and bench; empty on the CPU, which has none.
  virtual std::string kernel_choices() const { return ""; }
  // How often each candidate asked for ran (kernel_switches.h's
  // CandidateCalls), for bench; empty where none was asked for.
  virtual std::string candidate_calls() const { return ""; }
  // Whether the exact gradient sum writes its first contribution rather
  // than adding it to a zeroed buffer, and rounds one rank's single
  // contribution in place (src/parallel/gradient_reducer.h; the same bits
  // either way). The CPU does; a GPU unless MPIFORMER_KERNELS=exact=buffered.
  virtual bool direct_exact_sum() const { return true; }
  // Whether the model hands a pre-norm sublayer's output-projection bias
  // gradient to the layer norm backward after it (layernorm_backward's
  // dx_sums) rather than to that projection's matmul_backward: a GPU under
  // MPIFORMER_KERNELS=dbias_out=norm. The CPU sums it beside the GEMM.
  virtual bool bias_grad_in_norm() const { return false; }
  // Whether the model hands an MLP's first-layer bias gradient to the
  // second layer's matmul_backward (FusedActivation::pre_bias_grad), whose
  // activation backward writes the gradient it sums, rather than to the
  // first layer's: a GPU under MPIFORMER_KERNELS=dbias_in=dgelu. The CPU
  // sums it beside the first layer's GEMM.
  virtual bool bias_grad_in_activation() const { return false; }
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

  // ---- the compute ops: kernels/op_table.h declares each once -------------
#define MPIFORMER_OP(name, family, dtype, sizes, parameters, arguments) \
  virtual void name parameters = 0;
#include "kernels/op_table.h"
#undef MPIFORMER_OP

  // The most scratch attention_forward and attention_backward take for
  // `tokens` packed query rows of sequences up to `longest` long (keys
  // likewise): the scores a plain kernel keeps grow with longest^2, which a
  // memory estimate must count. backward: the larger need of
  // attention_backward.
  virtual size_t attention_scratch_bytes(DType dtype, size_t tokens, size_t longest,
                                         const AttentionConfig& cfg, bool backward) const = 0;

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
