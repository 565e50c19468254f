#include "src/model/blocks.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <utility>

#include "kernels/dropout_mask.h"

namespace mpiformer {

// ---- arena ----------------------------------------------------------------

ActivationArena::~ActivationArena() {
  for (void* p : blocks_) ops_.device().release(p);
}

void* ActivationArena::bytes(size_t n) {
  total_bytes_ += (n + 63) / 64 * 64;  // backends align to 64 bytes
  if (measure_only_) return reinterpret_cast<void*>(uintptr_t{64});
  void* p = ops_.device().allocate(n);
  blocks_.push_back(p);
  return p;
}

Act ActivationArena::acts(size_t n) {
  return Act(bytes(n * dtype_bytes(compute_)), compute_);
}

float* ActivationArena::floats(size_t n) {
  return static_cast<float*>(bytes(n * sizeof(float)));
}

int32_t* ActivationArena::ints(size_t n) {
  return static_cast<int32_t*>(bytes(n * sizeof(int32_t)));
}

uint64_t dropout_stream(uint64_t pass, uint64_t site) {
  return mix64(pass) ^ site;
}

Dropout dropout_at(const BlockContext& ctx, uint64_t site) {
  if (!ctx.training || !(ctx.config->dropout > 0.0f)) return {};
  return Dropout{ctx.config->dropout, ctx.dropout_seed, dropout_stream(ctx.dropout_pass, site)};
}

// ---- layer norm -----------------------------------------------------------

void LayerNorm::init(BlockContext& ctx, ActivationArena& arena, const std::string& name, int rows,
                     const LayerNorm* shared, bool own_out) {
  const int C = ctx.config->d_model;
  gamma = ctx.params->add(name + ".gamma", {C}, false, Init::kOnes);
  beta = ctx.params->add(name + ".beta", {C}, false, Init::kZeros);
  if (shared) {
    out = shared->out;
    mean = shared->mean;
    rstd = shared->rstd;
    return;
  }
  if (own_out) out = arena.acts(static_cast<size_t>(rows) * C);
  mean = arena.floats(rows);
  rstd = arena.floats(rows);
}

void LayerNorm::forward(BlockContext& ctx, Act x, int N, Act into) {
  ctx.ops->layernorm_forward(into ? into : out, mean, rstd, x, ctx.params->weight(gamma),
                             ctx.params->weight(beta), N, ctx.config->d_model, ctx.config->ln_eps);
}

void LayerNorm::backward(BlockContext& ctx, Act dx, Act dout, Act x, int N, bool accumulate,
                         float* dx_sums) {
  ctx.ops->layernorm_backward(dx, ctx.params->grad(gamma), ctx.params->grad(beta), dout, x,
                              ctx.params->weight(gamma), mean, rstd, N, ctx.config->d_model,
                              accumulate, dx_sums);
}

// ---- scratch --------------------------------------------------------------

namespace {

size_t aligned256(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// Where BlockScratch lays its buffers: each one's byte offset from the base
// (256-byte aligned, as cuBLASLt assumes of its operands), in the order of
// `buffers` below, and the bytes in all. The attention's gradients come
// last, so that the MLP's activation (--recompute activation) can lie over
// them: an MLP never touches them, and an attention sub-layer never touches
// the activation; past them only when d-ff exceeds 4 d-model.
struct ScratchLayout {
  std::array<size_t, 8> offsets{};  // y, dy, du, dff, dkv, datt, dqkv, act
  size_t total = 0;
};

ScratchLayout scratch_layout(DType dtype, int rows, int memory_rows, int C, int F,
                             bool activation) {
  const size_t n = static_cast<size_t>(rows), c = static_cast<size_t>(C);
  const size_t f = static_cast<size_t>(F), bytes = dtype_bytes(dtype);
  const size_t elements[] = {
      n * c, n * c, n * c, n * f, static_cast<size_t>(memory_rows) * 2 * c, n * c, n * 3 * c};
  ScratchLayout layout;
  for (size_t i = 0; i < std::size(elements); ++i) {
    layout.offsets[i] = layout.total;
    layout.total += aligned256(elements[i] * bytes);
  }
  layout.offsets[7] = layout.offsets[5];  // act over datt and dqkv
  if (activation)
    layout.total = std::max(layout.total, layout.offsets[7] + aligned256(n * f * bytes));
  return layout;
}

}  // namespace

size_t BlockScratch::bytes(DType dtype, int rows, int memory_rows, int C, int F, bool activation) {
  return scratch_layout(dtype, rows, memory_rows, C, F, activation).total;
}

void BlockScratch::init(void* base, DType dtype, int rows, int memory_rows, int C, int F,
                        bool activation) {
  Act* buffers[] = {&y, &dy, &du, &dff, &dkv, &datt, &dqkv, &act};
  const ScratchLayout layout = scratch_layout(dtype, rows, memory_rows, C, F, activation);
  for (size_t i = 0; i < std::size(buffers); ++i)
    *buffers[i] = Act(static_cast<unsigned char*>(base) + layout.offsets[i], dtype);
  if (memory_rows == 0) dkv = Act();  // no encoder
  if (!activation) act = Act();
}

// ---- sub-layer ------------------------------------------------------------

void Sublayer::init(BlockContext& ctx, ActivationArena& arena, const std::string& name, Kind kind,
                    bool causal, int rows, int memory_rows, uint64_t site, float residual_init_std,
                    const Sublayer* shared, bool own_output) {
  const ModelConfig& m = *ctx.config;
  const int C = m.d_model, F = m.d_ff;
  const size_t N = rows;
  kind_ = kind;
  site_ = site;
  ParameterSet& p = *ctx.params;
  const float std = 0.02f;

  norm_.init(ctx, arena, name + ".norm", rows, shared ? &shared->norm_ : nullptr,
             !norm_in_scratch(ctx));

  attention_.heads = m.heads;
  attention_.head_dim = C / m.heads;
  attention_.causal = causal;
  attention_.scale = m.attention_scale;
  attention_.ref_len = m.attention_ref_len;

  switch (kind) {
    case Kind::kSelfAttention:
      w_in_ = p.add(name + ".qkv.weight", {3 * C, C}, true, Init::kNormal, std);
      b_in_ = p.add(name + ".qkv.bias", {3 * C}, false, Init::kZeros);
      w_out_ = p.add(name + ".out.weight", {C, C}, true, Init::kNormal, residual_init_std);
      b_out_ = p.add(name + ".out.bias", {C}, false, Init::kZeros);
      break;
    case Kind::kCrossAttention:
      w_in_ = p.add(name + ".q.weight", {C, C}, true, Init::kNormal, std);
      b_in_ = p.add(name + ".q.bias", {C}, false, Init::kZeros);
      w_kv_ = p.add(name + ".kv.weight", {2 * C, C}, true, Init::kNormal, std);
      b_kv_ = p.add(name + ".kv.bias", {2 * C}, false, Init::kZeros);
      w_out_ = p.add(name + ".out.weight", {C, C}, true, Init::kNormal, residual_init_std);
      b_out_ = p.add(name + ".out.bias", {C}, false, Init::kZeros);
      break;
    case Kind::kMlp:
      w_in_ = p.add(name + ".fc.weight", {F, C}, true, Init::kNormal, std);
      b_in_ = p.add(name + ".fc.bias", {F}, false, Init::kZeros);
      w_out_ = p.add(name + ".proj.weight", {C, F}, true, Init::kNormal, residual_init_std);
      b_out_ = p.add(name + ".proj.bias", {C}, false, Init::kZeros);
      break;
  }
  param_ids_ = {norm_.gamma, norm_.beta, w_in_, b_in_, w_out_, b_out_};
  if (w_kv_ >= 0) param_ids_.insert(param_ids_.end(), {w_kv_, b_kv_});

  if (shared) {
    sum_ = shared->sum_;
    qkv_ = shared->qkv_;
    kv_ = shared->kv_;
    stats_ = shared->stats_;
    att_ = shared->att_;
    ff_ = shared->ff_;
    ff_act_ = shared->ff_act_;
    if (own_output) {
      // The next layer's input outlives this layer's turn in the shared set.
      if (m.pre_norm) {
        sum_ = arena.acts(N * C);
      } else {
        norm_.out = arena.acts(N * C);
      }
    }
    return;
  }
  sum_ = arena.acts(N * C);
  switch (kind) {
    case Kind::kSelfAttention:
      qkv_ = arena.acts(N * 3 * C);
      stats_ = arena.floats(N * m.heads);
      att_ = arena.acts(N * C);
      break;
    case Kind::kCrossAttention:
      qkv_ = arena.acts(N * C);
      kv_ = arena.acts(static_cast<size_t>(memory_rows) * 2 * C);
      stats_ = arena.floats(N * m.heads);
      att_ = arena.acts(N * C);
      break;
    case Kind::kMlp:
      ff_ = arena.acts(N * F);
      if (!ctx.recompute_activation) ff_act_ = arena.acts(N * F);
      break;
  }
}

size_t Sublayer::first_offset(const ParameterSet& params) const {
  size_t lowest = params.count();
  for (int id : param_ids_) lowest = std::min(lowest, params.info()[id].offset);
  return lowest;
}

void Sublayer::inner_forward(BlockContext& ctx, BlockScratch& scratch, Act u, const Ragged& rows,
                             Act memory, const Ragged& memory_rows) {
  Ops& ops = *ctx.ops;
  ParameterSet& p = *ctx.params;
  const int C = ctx.config->d_model, F = ctx.config->d_ff, N = rows.total;
  Act y = scratch.y;
  switch (kind_) {
    case Kind::kSelfAttention:
      // qkv: (N, 3C) = u @ W_qkv^T; q, k, v are column slices of it
      ops.matmul_forward(qkv_, u, p.weight(w_in_), p.weight(b_in_), N, C, 3 * C);
      ops.attention_forward(att_, stats_, qkv_, 3 * C, qkv_ + C, qkv_ + 2 * C, 3 * C, rows, rows,
                            attention_);
      break;
    case Kind::kCrossAttention:
      // q: (N, C) from the decoder; kv: (Nk, 2C) from the encoder memory
      ops.matmul_forward(qkv_, u, p.weight(w_in_), p.weight(b_in_), N, C, C);
      ops.matmul_forward(kv_, memory, p.weight(w_kv_), p.weight(b_kv_), memory_rows.total, C,
                         2 * C);
      ops.attention_forward(att_, stats_, qkv_, C, kv_, kv_ + C, 2 * C, rows, memory_rows,
                            attention_);
      break;
    case Kind::kMlp: {
      // ff_act = act(u @ W_fc^T + b), keeping the pre-activation ff_
      const Act ff_act = activation(scratch);
      ops.matmul_forward(ff_act, u, p.weight(w_in_), p.weight(b_in_), N, C, F,
                         FusedActivation{ctx.config->activation, ff_});
      ops.matmul_forward(y, ff_act, p.weight(w_out_), p.weight(b_out_), N, F, C);
      return;
    }
  }
  ops.matmul_forward(y, att_, p.weight(w_out_), p.weight(b_out_), N, C, C);
}

void Sublayer::init_cache(ActivationArena& arena, int cache_rows, int C) {
  if (kind_ == Kind::kSelfAttention && cache_rows > 0)
    cache_ = arena.acts(static_cast<size_t>(cache_rows) * 3 * C);
}

void Sublayer::keep_memory(BlockContext& ctx, BlockScratch& scratch, Act memory, int n,
                           const int32_t* rows) {
  if (kind_ != Kind::kCrossAttention) return;
  const int C = ctx.config->d_model;
  // kv: (n, 2C) from the encoder rows, as inner_forward makes it, staged in
  // dkv (decoding runs no backward pass) and then put in its memory rows
  ctx.ops->matmul_forward(scratch.dkv, memory, ctx.params->weight(w_kv_), ctx.params->weight(b_kv_),
                          n, C, 2 * C);
  ctx.ops->scatter_rows(kv_, 2 * C, scratch.dkv, 2 * C, rows, n, 2 * C);
}

void Sublayer::decode_forward(BlockContext& ctx, BlockScratch& scratch, Act u, int R,
                              const int32_t* cache_rows, const KeyLists& self_keys,
                              const KeyLists& cross_keys) {
  Ops& ops = *ctx.ops;
  ParameterSet& p = *ctx.params;
  const int C = ctx.config->d_model;
  switch (kind_) {
    case Kind::kSelfAttention:
      // qkv of the new rows: (R, 3C), kept in their cache rows
      ops.matmul_forward(qkv_, u, p.weight(w_in_), p.weight(b_in_), R, C, 3 * C);
      ops.scatter_rows(cache_, 3 * C, qkv_, 3 * C, cache_rows, R, 3 * C);
      ops.attention_listed(att_, qkv_, 3 * C, cache_ + C, cache_ + 2 * C, 3 * C, self_keys,
                           attention_);
      break;
    case Kind::kCrossAttention:
      // q: (R, C); kv: (Nk, 2C) kept by keep_memory
      ops.matmul_forward(qkv_, u, p.weight(w_in_), p.weight(b_in_), R, C, C);
      ops.attention_listed(att_, qkv_, C, kv_, kv_ + C, 2 * C, cross_keys, attention_);
      break;
    case Kind::kMlp: {
      const Ragged rows{nullptr, nullptr, 1, R, R, 0};
      inner_forward(ctx, scratch, u, rows, Act(), Ragged{});
      return;
    }
  }
  ops.matmul_forward(scratch.y, att_, p.weight(w_out_), p.weight(b_out_), R, C, C);
}

Act Sublayer::residual_forward(BlockContext& ctx, BlockScratch& scratch, Act s, int N,
                               LayerNorm& next_norm) {
  const ParameterSet& p = *ctx.params;
  ctx.ops->residual_layernorm_forward(sum_, next_norm.out, next_norm.mean, next_norm.rstd, s,
                                      scratch.y, dropout_at(ctx, site_), p.weight(next_norm.gamma),
                                      p.weight(next_norm.beta), N, ctx.config->d_model,
                                      ctx.config->ln_eps);
  return sum_;
}

void Sublayer::inner_backward(BlockContext& ctx, BlockScratch& scratch, Act du, bool accumulate,
                              Act dy, Act u, const Ragged& rows, Act memory, Act dmemory,
                              const Ragged& memory_rows, float* out_bias_grad) {
  Ops& ops = *ctx.ops;
  ParameterSet& p = *ctx.params;
  const int C = ctx.config->d_model, F = ctx.config->d_ff, N = rows.total;
  switch (kind_) {
    case Kind::kSelfAttention:
      ops.matmul_backward(scratch.datt, p.grad(w_out_), out_bias_grad, dy, att_, p.weight(w_out_),
                          N, C, C, false);
      ops.attention_backward(scratch.dqkv, scratch.dqkv + C, scratch.dqkv + 2 * C, scratch.datt,
                             att_, stats_, qkv_, 3 * C, qkv_ + C, qkv_ + 2 * C, 3 * C, rows, rows,
                             attention_);
      ops.matmul_backward(du, p.grad(w_in_), p.grad(b_in_), scratch.dqkv, u, p.weight(w_in_), N, C,
                          3 * C, accumulate);
      break;
    case Kind::kCrossAttention:
      ops.matmul_backward(scratch.datt, p.grad(w_out_), out_bias_grad, dy, att_, p.weight(w_out_),
                          N, C, C, false);
      // dq lands in dqkv's first N*C elements (dense, stride C)
      ops.attention_backward(scratch.dqkv, scratch.dkv, scratch.dkv + C, scratch.datt, att_, stats_,
                             qkv_, C, kv_, kv_ + C, 2 * C, rows, memory_rows, attention_);
      ops.matmul_backward(dmemory, p.grad(w_kv_), p.grad(b_kv_), scratch.dkv, memory,
                          p.weight(w_kv_), memory_rows.total, C, 2 * C, true);
      ops.matmul_backward(du, p.grad(w_in_), p.grad(b_in_), scratch.dqkv, u, p.weight(w_in_), N, C,
                          C, accumulate);
      break;
    case Kind::kMlp: {
      // --recompute activation: act(ff_) again, from its stored (rounded)
      // copy; in fp32 the bits forward made.
      if (!ff_act_)
        ops.activation_forward(scratch.act, ff_, static_cast<size_t>(N) * F,
                               ctx.config->activation);
      // dff = act'(ff_) * (dy @ W_proj): the activation's backward fused,
      // and where the backend asks (dbias_in=dgelu) with it the first
      // layer's bias gradient, the sum of dff over tokens, which the
      // first layer's weight gradient would otherwise read dff again for.
      float* in_bias_grad = p.grad(b_in_);
      const bool in_activation = ops.bias_grad_in_activation();
      const FusedActivation fused{ctx.config->activation, ff_,
                                  in_activation ? in_bias_grad : nullptr};
      ops.matmul_backward(scratch.dff, p.grad(w_out_), out_bias_grad, dy, activation(scratch),
                          p.weight(w_out_), N, F, C, false, fused);
      ops.matmul_backward(du, p.grad(w_in_), in_activation ? nullptr : in_bias_grad, scratch.dff, u,
                          p.weight(w_in_), N, C, F, accumulate);
      break;
    }
  }
}

void Sublayer::backward(BlockContext& ctx, BlockScratch& scratch, Act& dstream, Act& spare, Act s,
                        const Ragged& rows, Act memory, Act dmemory, const Ragged& memory_rows) {
  Ops& ops = *ctx.ops;
  const int N = rows.total, C = ctx.config->d_model;
  const size_t n = static_cast<size_t>(N) * C;
  const bool pre = ctx.config->pre_norm;

  // dsum: gradient at s + dropout(y)
  Act dsum = dstream;
  if (!pre) {
    norm_.backward(ctx, spare, dstream, sum_, N, false);
    dsum = spare;
  }
  Act dy = dsum;
  const Dropout d = dropout_at(ctx, site_);
  if (d.p > 0.0f) {
    ops.dropout(scratch.dy, dsum, n, d);
    dy = scratch.dy;
  }
  if (pre) {
    // --recompute activation: u = LN(s) again, into y (free in backward),
    // by the row routine forward's fused residual add ran on the stored
    // sum: the same bits.
    Act u = norm_.out;
    if (norm_in_scratch(ctx)) {
      norm_.forward(ctx, s, N, scratch.y);
      u = scratch.y;
    }
    // ds = dsum + LN'(f'(dy)); dstream already holds dsum. The output
    // projection's bias gradient is the sum of dy over tokens: without
    // dropout dy is dsum, which the norm's backward reads anyway as the dx
    // it adds to, so where the backend asks (dbias_out=norm) it sums it
    // there rather than in the projection's weight gradient.
    float* out_bias_grad = ctx.params->grad(b_out_);
    const bool in_norm = dy.data == dstream.data && ops.bias_grad_in_norm();
    inner_backward(ctx, scratch, scratch.du, false, dy, u, rows, memory, dmemory, memory_rows,
                   in_norm ? nullptr : out_bias_grad);
    norm_.backward(ctx, dstream, scratch.du, s, N, true, in_norm ? out_bias_grad : nullptr);
  } else {
    // ds = dsum + f'(dy), accumulated into dsum (= spare), which becomes the stream
    inner_backward(ctx, scratch, dsum, true, dy, s, rows, memory, dmemory, memory_rows,
                   ctx.params->grad(b_out_));
    std::swap(dstream, spare);
  }
}

// ---- embedding ------------------------------------------------------------

void Embedding::init(BlockContext& ctx, ActivationArena& arena, int rows, int table_index,
                     int positions_index, Act sinusoids, uint64_t site) {
  table_ = table_index;
  positions_ = positions_index;
  sinusoids_ = sinusoids;
  site_ = site;
  // Sinusoids have unit amplitude, so embeddings are scaled to match, as in
  // the original Transformer; learned positions follow GPT-2 (no scale).
  scale_ = sinusoids ? std::sqrt(static_cast<float>(ctx.config->d_model)) : 1.0f;
  out_ = arena.acts(static_cast<size_t>(rows) * ctx.config->d_model);
}

Act Embedding::forward(BlockContext& ctx, const int32_t* ids, const int32_t* pos, int N) {
  Ops& ops = *ctx.ops;
  ParameterSet& p = *ctx.params;
  const int C = ctx.config->d_model;
  ops.embedding_forward(out_, ids, p.weight(table_), pos,
                        positions_ >= 0 ? p.weight(positions_) : sinusoids_, N, C, scale_);
  const Dropout d = dropout_at(ctx, site_);
  if (d.p > 0.0f) ops.dropout(out_, out_, static_cast<size_t>(N) * C, d);
  return out_;
}

void Embedding::backward(BlockContext& ctx, Act dx, const RowGroups& by_id, const RowGroups& by_pos,
                         int N) {
  Ops& ops = *ctx.ops;
  ParameterSet& p = *ctx.params;
  const int C = ctx.config->d_model;
  const Dropout d = dropout_at(ctx, site_);
  if (d.p > 0.0f) ops.dropout(dx, dx, static_cast<size_t>(N) * C, d);
  ops.embedding_backward(p.grad(table_), positions_ >= 0 ? p.grad(positions_) : nullptr, dx, by_id,
                         by_pos, N, C, scale_);
}

void sinusoid_table(float* table, int L, int C) {
  for (int pos = 0; pos < L; ++pos) {
    for (int i = 0; i < C / 2; ++i) {
      const double freq = std::pow(10000.0, -2.0 * i / C);
      table[static_cast<size_t>(pos) * C + 2 * i] = static_cast<float>(std::sin(pos * freq));
      table[static_cast<size_t>(pos) * C + 2 * i + 1] = static_cast<float>(std::cos(pos * freq));
    }
    if (C % 2) table[static_cast<size_t>(pos) * C + C - 1] = 0.0f;
  }
}

}  // namespace mpiformer
