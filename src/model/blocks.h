// The shared blocks every model kind is built from: layer norm, the three
// sub-layers (self-attention, cross-attention, MLP), the residual connection
// fused with the layer norm that follows it, and the embedding.
//
// Each block registers its parameters in the ParameterSet, allocates the
// activations it saves for backward once, for the model's capacity, and
// exposes forward/backward over packed (ragged) rows. Activations are in the
// model's compute precision (Act); statistics and gradients of parameters
// are fp32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "src/core/config.h"
#include "src/core/parameters.h"

namespace mpiformer {

// Activation buffers owned by a model, released together.
// A measuring arena (Model::measure) only adds up the bytes and hands out
// placeholder addresses that nothing may touch.
class ActivationArena {
 public:
  ActivationArena(Ops& ops, DType compute, bool measure_only = false)
      : ops_(ops), compute_(compute), measure_only_(measure_only) {}
  ~ActivationArena();
  ActivationArena(const ActivationArena&) = delete;
  ActivationArena& operator=(const ActivationArena&) = delete;
  Act acts(size_t n);  // n elements in the compute precision
  float* floats(size_t n);
  int32_t* ints(size_t n);
  void* bytes(size_t n);
  size_t total_bytes() const { return total_bytes_; }

 private:
  Ops& ops_;
  DType compute_;
  bool measure_only_;
  size_t total_bytes_ = 0;
  std::vector<void*> blocks_;
};

// What every block needs to know of the model and the current pass.
struct BlockContext {
  Ops* ops = nullptr;
  ParameterSet* params = nullptr;
  const ModelConfig* config = nullptr;
  // The pass: dropout is applied when training and p > 0.
  bool training = false;
  uint64_t dropout_seed = 0;
  uint64_t dropout_pass = 0;  // identifies (step, micro-batch)
  // --recompute activation: an MLP's activation is not kept for backward
  // but made again there from its kept pre-activation (BlockScratch::act),
  // and in pre-LN models a sub-layer's input norm from the kept stream
  // (forward's in BlockScratch::du, backward's in BlockScratch::y).
  bool recompute_activation = false;
};

// A dropout site: a distinct mask stream per (pass, site).
uint64_t dropout_stream(uint64_t pass, uint64_t site);
// The dropout of `site` in the current pass (p = 0 when not training).
Dropout dropout_at(const BlockContext& ctx, uint64_t site);

struct LayerNorm {
  int gamma = -1, beta = -1;  // parameter indices, (C) each
  Act out;                    // (N, C)
  float* mean = nullptr;      // (N)
  float* rstd = nullptr;      // (N)

  // shared: a norm whose buffers this one takes turns with (null: its own).
  // own_out false: `out` is left for the model to point at scratch.
  void init(BlockContext& ctx, ActivationArena& arena, const std::string& name, int rows,
            const LayerNorm* shared = nullptr, bool own_out = true);
  // out (or `into`, when given) = LN(x).  x: (N, C)
  void forward(BlockContext& ctx, Act x, int N, Act into = Act());
  // dx (= or +=): (N, C), dout: (N, C), x: the forward input (N, C);
  // dx_sums (+=, accumulate only; null to skip): (C), the sums over rows of
  // dx as it came in (Ops::layernorm_backward)
  void backward(BlockContext& ctx, Act dx, Act dout, Act x, int N, bool accumulate,
                float* dx_sums = nullptr);
};

// Scratch gradients shared by all sub-layers of a model (backward runs one
// sub-layer at a time). Nothing in them outlives a sub-layer's call, so the
// model lays other short-lived buffers over them (its head's logits).
struct BlockScratch {
  Act y;     // (N, C) sub-layer output before the residual
  Act dy;    // (N, C)
  Act du;    // (N, C)
  Act datt;  // (N, C)
  Act dqkv;  // (N, 3C)
  Act dff;   // (N, F)
  Act dkv;   // (Nk, 2C) cross-attention keys and values
  // (N, F) --recompute activation: the MLP's activation, made in its
  // forward and again in its backward, over datt and dqkv (which only
  // attention uses); null otherwise
  Act act;
  // The bytes init lays out for these sizes in `dtype` (with `act` when
  // `activation`).
  static size_t bytes(DType dtype, int rows, int memory_rows, int C, int F, bool activation);
  // The buffers laid one after another from `base` (bytes(...) of memory),
  // `act` over datt and dqkv, each 256-byte aligned, as cuBLASLt assumes of
  // its operands.
  void init(void* base, DType dtype, int rows, int memory_rows, int C, int F, bool activation);
};

// A sub-layer f inside its residual connection:
//   pre-LN:  out = s + dropout(f(LN(s)))
//   post-LN: out = LN(s + dropout(f(s)))
// Forward runs in two parts so the residual add fuses with the layer norm
// after it: the sub-layer's own (post-LN) or the next sub-layer's (pre-LN).
class Sublayer {
 public:
  enum class Kind { kSelfAttention, kCrossAttention, kMlp };

  // rows: capacity of the stream (N); memory_rows: capacity of the encoder
  // memory that cross-attention reads (Nk). shared: the sub-layer of the
  // same kind in another layer whose activation buffers this one takes turns
  // with (--recompute layer); null: buffers of its own. own_output (with
  // shared): the stream it hands the next layer (pre-LN: its sum; post-LN:
  // its norm's output) stays its own, as that layer's kept input.
  void init(BlockContext& ctx, ActivationArena& arena, const std::string& name, Kind kind,
            bool causal, int rows, int memory_rows, uint64_t site, float residual_init_std,
            const Sublayer* shared = nullptr, bool own_output = false);

  // y = f(u) into scratch.y.  u: (N, C) the sub-layer's input (LN(s) in
  // pre-LN models, s in post-LN); memory: (Nk, C) encoder output.
  void inner_forward(BlockContext& ctx, BlockScratch& scratch, Act u, const Ragged& rows,
                     Act memory, const Ragged& memory_rows);
  // Decoding: a self-attention sub-layer keeps keys and values of
  // `cache_rows` rows (the fused QKV rows of its steps, (P, 3C)).
  void init_cache(ActivationArena& arena, int cache_rows, int C);
  // y = f(u) into scratch.y for the R rows of a decoding step: self-
  // attention writes row r's QKV to cache row cache_rows[r] and attends the
  // rows each lists in self_keys; cross-attention attends the memory rows
  // of cross_keys, whose keys and values keep_memory stored.
  // u: (R, C), cache_rows: backend (R)
  void decode_forward(BlockContext& ctx, BlockScratch& scratch, Act u, int R,
                      const int32_t* cache_rows, const KeyLists& self_keys,
                      const KeyLists& cross_keys);
  // cross-attention: the keys and values of n encoder rows, stored at
  // memory rows `rows` for the decoding steps that follow (other rows stay
  // as they were). memory: (n, C), rows: backend (n)
  void keep_memory(BlockContext& ctx, BlockScratch& scratch, Act memory, int n,
                   const int32_t* rows);

  // sum = s + dropout(scratch.y), then next_norm = LN(sum). Returns sum,
  // (N, C), stored by this sub-layer.
  Act residual_forward(BlockContext& ctx, BlockScratch& scratch, Act s, int N,
                       LayerNorm& next_norm);

  // dstream: on entry d(output), on exit d(s); `spare` is a second (N, C)
  // buffer the post-LN path swaps with it. dmemory (+=): (Nk, C).
  void backward(BlockContext& ctx, BlockScratch& scratch, Act& dstream, Act& spare, Act s,
                const Ragged& rows, Act memory, Act dmemory, const Ragged& memory_rows);

  LayerNorm& norm() { return norm_; }
  // --recompute activation in pre-LN models: the input norm's output is
  // not kept; forward writes it to scratch (Model::Impl::build), backward
  // makes it again.
  static bool norm_in_scratch(const BlockContext& ctx) {
    return ctx.recompute_activation && ctx.config->pre_norm;
  }
  // Lowest buffer offset of its parameters: once backward has passed this
  // sub-layer, gradients from here up are final.
  size_t first_offset(const ParameterSet& params) const;

 private:
  // f's backward: dy -> du (= or += with accumulate); the output
  // projection's bias gradient into out_bias_grad (+=; null: summed
  // elsewhere, by the norm's backward).
  void inner_backward(BlockContext& ctx, BlockScratch& scratch, Act du, bool accumulate, Act dy,
                      Act u, const Ragged& rows, Act memory, Act dmemory, const Ragged& memory_rows,
                      float* out_bias_grad);

  Kind kind_ = Kind::kMlp;
  uint64_t site_ = 0;
  std::vector<int> param_ids_;
  LayerNorm norm_;
  Act sum_;  // (N, C) s + dropout(y): the output (pre) or the norm input (post)

  // attention: in (3C, C) fused QKV [self] or q (C, C) + kv (2C, C) [cross]; out (C, C)
  int w_in_ = -1, b_in_ = -1, w_kv_ = -1, b_kv_ = -1, w_out_ = -1, b_out_ = -1;
  Act qkv_;                 // self (N, 3C); cross: q (N, C)
  Act cache_;               // decoding, self: (P, 3C) the QKV rows of every step
  Act kv_;                  // cross (Nk, 2C)
  float* stats_ = nullptr;  // (N, H) each query row's log-sum-exp, for backward
  Act att_;                 // (N, C)
  AttentionConfig attention_;
  // mlp: fc (F, C), proj (C, F)
  Act ff_;      // (N, F) pre-activation
  Act ff_act_;  // (N, F); null with --recompute activation (scratch.act)
  // The MLP's activation (N, F): its own, or the scratch's.
  Act activation(const BlockScratch& scratch) const { return ff_act_ ? ff_act_ : scratch.act; }
};

// Token embedding (shared table), positions (learned table or fixed
// sinusoids) and embedding dropout.
class Embedding {
 public:
  // sinusoids: (L, C) in the compute precision when positions are not learned
  void init(BlockContext& ctx, ActivationArena& arena, int rows, int table_index,
            int positions_index, Act sinusoids, uint64_t site);
  // out: (N, C) = tokens[ids] * scale + positions[pos], then dropout.
  // ids, pos: backend (N)
  Act forward(BlockContext& ctx, const int32_t* ids, const int32_t* pos, int N);
  // dx: (N, C) d(out), consumed (dropout is undone in place). by_id, by_pos:
  // the batch's rows grouped by id and by position.
  void backward(BlockContext& ctx, Act dx, const RowGroups& by_id, const RowGroups& by_pos, int N);

 private:
  int table_ = -1;      // (V, C)
  int positions_ = -1;  // (L, C) learned, or -1
  Act sinusoids_;       // (L, C) when not learned
  float scale_ = 1.0f;
  uint64_t site_ = 0;
  Act out_;  // (N, C)
};

// The patch embedding of a ViT: each row of `patches` holds one patch's
// pixels and a one-hot of its position, so one GEMM projects the pixels and
// adds a learned position (the weight's last L columns are the position
// table; a CLS row has no pixels, so its embedding is bias + its position's
// column, a learned vector of its own). Then embedding dropout.
class PatchEmbedding {
 public:
  void init(BlockContext& ctx, ActivationArena& arena, int rows, int weight_index, int bias_index,
            uint64_t site);
  // out: (N, C).  patches: (N, F), F = ModelConfig::patch_features()
  Act forward(BlockContext& ctx, Act patches, int N);
  // dx: (N, C) d(out), consumed (dropout is undone in place).
  void backward(BlockContext& ctx, Act dx, Act patches, int N);

 private:
  int weight_ = -1;  // (C, F)
  int bias_ = -1;    // (C)
  uint64_t site_ = 0;
  Act out_;  // (N, C)
};

// Fixed sinusoidal positions of the original Transformer. table: host (L, C)
void sinusoid_table(float* table, int L, int C);

}  // namespace mpiformer
