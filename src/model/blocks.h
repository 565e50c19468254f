// The shared blocks every model kind is built from: layer norm, the three
// sub-layers (self-attention, cross-attention, MLP), the residual wrapper
// that applies pre- or post-LN around a sub-layer, and the embedding.
//
// Each block registers its parameters in the ParameterSet, allocates the
// activations it saves for backward once, for the model's capacity, and
// exposes forward/backward over packed (ragged) rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "src/core/config.h"
#include "src/model/parameters.h"

namespace mpiformer {

// Activation buffers owned by a model, released together.
class ActivationArena {
 public:
  explicit ActivationArena(Ops& ops) : ops_(ops) {}
  ~ActivationArena();
  ActivationArena(const ActivationArena&) = delete;
  ActivationArena& operator=(const ActivationArena&) = delete;
  float* floats(size_t n);
  int32_t* ints(size_t n);
  size_t bytes() const { return bytes_; }

 private:
  Ops& ops_;
  std::vector<void*> blocks_;
  size_t bytes_ = 0;
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
};

// A dropout site: a distinct mask stream per (pass, site).
uint64_t dropout_stream(uint64_t pass, uint64_t site);

struct LayerNorm {
  int gamma = -1, beta = -1;  // parameter indices, (C) each
  float* out = nullptr;       // (N, C)
  float* mean = nullptr;      // (N)
  float* rstd = nullptr;      // (N)

  void init(BlockContext& ctx, ActivationArena& arena, const std::string& name, int rows);
  // out = LN(x).  x: (N, C)
  void forward(BlockContext& ctx, const float* x, int N);
  // dx (= or +=): (N, C), dout: (N, C), x: the forward input (N, C)
  void backward(BlockContext& ctx, float* dx, const float* dout, const float* x, int N,
                bool accumulate);
};

// Scratch gradients shared by all sub-layers of a model (backward runs one
// sub-layer at a time).
struct BlockScratch {
  float* y = nullptr;     // (N, C) sub-layer output before the residual
  float* dy = nullptr;    // (N, C)
  float* du = nullptr;    // (N, C)
  float* datt = nullptr;  // (N, C)
  float* dqkv = nullptr;  // (N, 3C)
  float* dff = nullptr;   // (N, F)
  float* dff2 = nullptr;  // (N, F)
  float* dkv = nullptr;   // (Nk, 2C) cross-attention keys and values
  void init(ActivationArena& arena, int rows, int memory_rows, int C, int F);
};

// A sub-layer f inside its residual connection:
//   pre-LN:  out = s + dropout(f(LN(s)))
//   post-LN: out = LN(s + dropout(f(s)))
class Sublayer {
 public:
  enum class Kind { kSelfAttention, kCrossAttention, kMlp };

  // rows: capacity of the stream (N); memory_rows: capacity of the encoder
  // memory that cross-attention reads (Nk).
  void init(BlockContext& ctx, ActivationArena& arena, const std::string& name, Kind kind,
            bool causal, int rows, int memory_rows, int max_len, uint64_t site,
            float residual_init_std);

  // Returns the output stream (N, C), stored by this sub-layer.
  // s: (N, C) input stream; memory: (Nk, C) encoder output for cross-attention.
  const float* forward(BlockContext& ctx, BlockScratch& scratch, const float* s, const Ragged& rows,
                       const float* memory, const Ragged& memory_rows);

  // dstream: on entry d(output), on exit d(s); `spare` is a second (N, C)
  // buffer the post-LN path swaps with it. dmemory (+=): (Nk, C).
  void backward(BlockContext& ctx, BlockScratch& scratch, float*& dstream, float*& spare,
                const float* s, const Ragged& rows, const float* memory, float* dmemory,
                const Ragged& memory_rows);

  // Parameters this sub-layer adds to the FLOP count's N.
  int64_t parameter_count(const ParameterSet& params) const;
  // Lowest buffer offset of its parameters: once backward has passed this
  // sub-layer, gradients from here up are final.
  size_t first_offset(const ParameterSet& params) const;

 private:
  // f(u) into y, and its backward: dy -> du (= or += with accumulate).
  void inner_forward(BlockContext& ctx, float* y, const float* u, const Ragged& rows,
                     const float* memory, const Ragged& memory_rows);
  void inner_backward(BlockContext& ctx, BlockScratch& scratch, float* du, bool accumulate,
                      const float* dy, const float* u, const Ragged& rows, const float* memory,
                      float* dmemory, const Ragged& memory_rows);

  Kind kind_ = Kind::kMlp;
  bool causal_ = false;
  uint64_t site_ = 0;
  std::vector<int> param_ids_;
  LayerNorm norm_;
  float* sum_ = nullptr;  // (N, C) s + dropout(y): the output (pre) or the norm input (post)

  // attention: in (3C, C) fused QKV [self] or q (C, C) + kv (2C, C) [cross]; out (C, C)
  int w_in_ = -1, b_in_ = -1, w_kv_ = -1, b_kv_ = -1, w_out_ = -1, b_out_ = -1;
  float* qkv_ = nullptr;    // self (N, 3C); cross: q (N, C)
  float* kv_ = nullptr;     // cross (Nk, 2C)
  float* probs_ = nullptr;  // attention_probs_size floats
  float* att_ = nullptr;    // (N, C)
  AttentionConfig attention_;
  // mlp: fc (F, C), proj (C, F)
  float* ff_ = nullptr;      // (N, F) pre-activation
  float* ff_act_ = nullptr;  // (N, F)
};

// Token embedding (shared table), positions (learned table or fixed
// sinusoids) and embedding dropout.
class Embedding {
 public:
  void init(BlockContext& ctx, ActivationArena& arena, int rows, int table_index,
            int positions_index, const float* sinusoids, uint64_t site);
  // out: (N, C) = tokens[ids] * scale + positions[pos], then dropout.
  // ids, positions: backend (N)
  const float* forward(BlockContext& ctx, const int32_t* ids, const int32_t* positions, int N);
  // dx: (N, C) d(out), consumed (dropout is undone in place).
  void backward(BlockContext& ctx, float* dx, const int32_t* ids, const int32_t* positions, int N);

 private:
  int table_ = -1;                    // (V, C)
  int positions_ = -1;                // (L, C) learned, or -1
  const float* sinusoids_ = nullptr;  // (L, C) when not learned
  float scale_ = 1.0f;
  uint64_t site_ = 0;
  float* out_ = nullptr;  // (N, C)
};

// Fixed sinusoidal positions of the original Transformer. table: host (L, C)
void sinusoid_table(float* table, int L, int C);

}  // namespace mpiformer
