// An Ops that forwards every call to another unchanged and shows each
// compute op, named with its shapes and element type, to hooks of its
// subclasses: ProfiledOps (kernels/profiled_ops.h) times ops by family;
// CheckedOps (kernels/checked_ops.h) waits for the device after each op so
// that a fault names the op that caused it. It wraps the math only: memory,
// copies and the stream are the Device's (kernels/device.h), which it
// shares with the ops it wraps and does not observe.
#pragma once

#include <exception>
#include <initializer_list>
#include <memory>
#include <string>

#include "kernels/ops.h"

namespace mpiformer {

// One compute op as called: its name, family, the type of its activations
// and its sizes by name. Lives for the call.
struct OpCall {
  struct Size {
    template <class T>
    constexpr Size(const char* n, T v) : name(n), value(static_cast<long long>(v)) {}
    const char* name;
    long long value;
  };
  const char* name;
  OpFamily family;
  DType dtype;
  std::initializer_list<Size> sizes;
};
// "matmul_forward (bf16; N 8192, IC 768, OC 2304)".
std::string describe(const OpCall& call);

class ObservedOps : public Ops {
 public:
  // inner's ops, on inner's device.
  explicit ObservedOps(Ops& inner) : ObservedOps(inner, inner.device()) {}
  // inner's ops, reporting `device` as theirs: one that forwards to inner's
  // (tests slow its copies down or make it fault).
  ObservedOps(Ops& inner, Device& device) : Ops(device), inner_(inner) {}
  Ops& inner() { return inner_; }

  void set_deterministic(bool deterministic) override { inner_.set_deterministic(deterministic); }
  void set_batch_invariant(bool on) override { inner_.set_batch_invariant(on); }
  bool batch_invariant() const override { return inner_.batch_invariant(); }
  size_t batch_invariant_bytes(size_t weight_floats) const override {
    return inner_.batch_invariant_bytes(weight_floats);
  }
  void set_attention_path(AttentionPath path) override { inner_.set_attention_path(path); }
  std::string attention_kernels() const override { return inner_.attention_kernels(); }
  AttentionCalls attention_calls() const override { return inner_.attention_calls(); }
  AttentionPreparation prepare_attention(const std::vector<AttentionCase>& cases, DType dtype,
                                         bool backward) override {
    return inner_.prepare_attention(cases, dtype, backward);
  }
  size_t attention_scratch_bytes(DType dtype, size_t tokens, size_t longest,
                                 const AttentionConfig& cfg, bool backward) const override {
    return inner_.attention_scratch_bytes(dtype, tokens, longest, cfg, backward);
  }

  void convert(Act dst, const float* src, size_t n) override {
    observe({"convert", OpFamily::kElementwise, dst.dtype, {{"n", n}}},
            [&] { inner_.convert(dst, src, n); });
  }
  void dropout(Act out, Act x, size_t n, const Dropout& d) override {
    observe({"dropout", OpFamily::kElementwise, out.dtype, {{"n", n}}},
            [&] { inner_.dropout(out, x, n, d); });
  }
  void activation_backward(Act dx, Act dout, Act pre, size_t n, Activation act) override {
    observe({"activation_backward", OpFamily::kElementwise, dx.dtype, {{"n", n}}},
            [&] { inner_.activation_backward(dx, dout, pre, n, act); });
  }
  void embedding_forward(Act out, const int32_t* ids, Act tokens, const int32_t* pos, Act positions,
                         int N, int C, float scale) override {
    observe({"embedding_forward", OpFamily::kEmbedding, out.dtype, {{"N", N}, {"C", C}}},
            [&] { inner_.embedding_forward(out, ids, tokens, pos, positions, N, C, scale); });
  }
  void embedding_backward(float* dtokens, float* dpositions, Act dout, const RowGroups& by_id,
                          const RowGroups& by_pos, int N, int C, float scale) override {
    observe(
        {"embedding_backward",
         OpFamily::kEmbedding,
         dout.dtype,
         {{"N", N}, {"C", C}, {"id groups", by_id.groups}, {"position groups", by_pos.groups}}},
        [&] { inner_.embedding_backward(dtokens, dpositions, dout, by_id, by_pos, N, C, scale); });
  }
  void layernorm_forward(Act out, float* mean, float* rstd, Act x, Act gamma, Act beta, int N,
                         int C, float eps) override {
    observe({"layernorm_forward", OpFamily::kNorm, out.dtype, {{"N", N}, {"C", C}}},
            [&] { inner_.layernorm_forward(out, mean, rstd, x, gamma, beta, N, C, eps); });
  }
  void residual_layernorm_forward(Act sum, Act out, float* mean, float* rstd, Act x, Act y,
                                  const Dropout& d, Act gamma, Act beta, int N, int C,
                                  float eps) override {
    observe({"residual_layernorm_forward", OpFamily::kNorm, out.dtype, {{"N", N}, {"C", C}}}, [&] {
      inner_.residual_layernorm_forward(sum, out, mean, rstd, x, y, d, gamma, beta, N, C, eps);
    });
  }
  void layernorm_backward(Act dx, float* dgamma, float* dbeta, Act dout, Act x, Act gamma,
                          const float* mean, const float* rstd, int N, int C,
                          bool accumulate) override {
    observe({"layernorm_backward", OpFamily::kNorm, dx.dtype, {{"N", N}, {"C", C}}}, [&] {
      inner_.layernorm_backward(dx, dgamma, dbeta, dout, x, gamma, mean, rstd, N, C, accumulate);
    });
  }
  void matmul_forward(Act out, Act x, Act weight, Act bias, int N, int IC, int OC,
                      const FusedActivation& fused, int out_stride) override {
    observe({"matmul_forward",
             OpFamily::kGemm,
             out.dtype,
             {{"N", N},
              {"IC", IC},
              {"OC", OC},
              {"out_stride", out_stride},
              {"bias", bias.data != nullptr},
              {"fused activation", fused.pre.data != nullptr}}},
            [&] { inner_.matmul_forward(out, x, weight, bias, N, IC, OC, fused, out_stride); });
  }
  void matmul_backward(Act dx, float* dweight, float* dbias, Act dout, Act x, Act weight, int N,
                       int IC, int OC, bool accumulate, const FusedActivation& fused,
                       int dout_stride) override {
    observe({"matmul_backward",
             OpFamily::kGemm,
             dout.dtype,
             {{"N", N},
              {"IC", IC},
              {"OC", OC},
              {"dout_stride", dout_stride},
              {"dx", dx.data != nullptr},
              {"dbias", dbias != nullptr},
              {"fused activation", fused.pre.data != nullptr},
              {"accumulate", accumulate}}},
            [&] {
              inner_.matmul_backward(dx, dweight, dbias, dout, x, weight, N, IC, OC, accumulate,
                                     fused, dout_stride);
            });
  }
  void attention_forward(Act out, float* stats, Act q, int q_stride, Act k, Act v, int kv_stride,
                         const Ragged& qs, const Ragged& ks, const AttentionConfig& cfg) override {
    observe(
        {"attention_forward",
         OpFamily::kAttention,
         out.dtype,
         {{"B", qs.batch},
          {"Nq", qs.total},
          {"Nk", ks.total},
          {"longest q", qs.max_len},
          {"longest k", ks.max_len},
          {"heads", cfg.heads},
          {"head size", cfg.head_dim},
          {"causal", cfg.causal},
          {"log-length", cfg.scale == AttentionScale::kLogLength}}},
        [&] { inner_.attention_forward(out, stats, q, q_stride, k, v, kv_stride, qs, ks, cfg); });
  }
  void attention_listed(Act out, Act q, int q_stride, Act k, Act v, int kv_stride,
                        const KeyLists& keys, const AttentionConfig& cfg) override {
    observe({"attention_listed",
             OpFamily::kAttention,
             out.dtype,
             {{"R", keys.queries},
              {"P", keys.key_rows},
              {"longest", keys.longest},
              {"heads", cfg.heads},
              {"head size", cfg.head_dim},
              {"log-length", cfg.scale == AttentionScale::kLogLength}}},
            [&] { inner_.attention_listed(out, q, q_stride, k, v, kv_stride, keys, cfg); });
  }
  void scatter_rows(Act dst, int dst_stride, Act src, int src_stride, const int32_t* rows, int n,
                    int width) override {
    observe({"scatter_rows", OpFamily::kElementwise, dst.dtype, {{"n", n}, {"width", width}}},
            [&] { inner_.scatter_rows(dst, dst_stride, src, src_stride, rows, n, width); });
  }
  void attention_backward(Act dq, Act dk, Act dv, Act dout, Act out, const float* stats, Act q,
                          int q_stride, Act k, Act v, int kv_stride, const Ragged& qs,
                          const Ragged& ks, const AttentionConfig& cfg) override {
    observe({"attention_backward",
             OpFamily::kAttention,
             dout.dtype,
             {{"B", qs.batch},
              {"Nq", qs.total},
              {"Nk", ks.total},
              {"longest q", qs.max_len},
              {"longest k", ks.max_len},
              {"heads", cfg.heads},
              {"head size", cfg.head_dim},
              {"causal", cfg.causal},
              {"log-length", cfg.scale == AttentionScale::kLogLength}}},
            [&] {
              inner_.attention_backward(dq, dk, dv, dout, out, stats, q, q_stride, k, v, kv_stride,
                                        qs, ks, cfg);
            });
  }
  void cross_entropy(Act logits, const int32_t* targets, int N, int V, float smoothing, int pad_id,
                     float grad_scale, bool compute_grad, LossSums* sums, int stride) override {
    observe({"cross_entropy",
             OpFamily::kLoss,
             logits.dtype,
             {{"N", N}, {"V", V}, {"stride", stride}, {"gradient", compute_grad}}},
            [&] {
              inner_.cross_entropy(logits, targets, N, V, smoothing, pad_id, grad_scale,
                                   compute_grad, sums, stride);
            });
  }
  void pool_forward(Act out, Act x, const Ragged& rows, int C, PoolKind kind) override {
    observe({"pool_forward",
             OpFamily::kElementwise,
             out.dtype,
             {{"B", rows.batch}, {"N", rows.total}, {"C", C}}},
            [&] { inner_.pool_forward(out, x, rows, C, kind); });
  }
  void pool_backward(Act dx, Act dout, const Ragged& rows, int C, PoolKind kind) override {
    observe({"pool_backward",
             OpFamily::kElementwise,
             dx.dtype,
             {{"B", rows.batch}, {"N", rows.total}, {"C", C}}},
            [&] { inner_.pool_backward(dx, dout, rows, C, kind); });
  }
  void zlpr_loss(Act logits, const float* targets, int B, int K, float grad_scale,
                 bool compute_grad, LossSums* sums, int64_t* label_counts, int stride) override {
    observe({"zlpr_loss",
             OpFamily::kLoss,
             logits.dtype,
             {{"B", B}, {"K", K}, {"stride", stride}, {"gradient", compute_grad}}},
            [&] {
              inner_.zlpr_loss(logits, targets, B, K, grad_scale, compute_grad, sums, label_counts,
                               stride);
            });
  }
  void fixed_point_accumulate(int64_t* fixed, int64_t* out_of_range, const float* grads, size_t n,
                              int fraction_bits, int limit_bits) override {
    observe({"fixed_point_accumulate",
             OpFamily::kOptimizer,
             DType::kF32,
             {{"n", n}, {"fraction bits", fraction_bits}, {"limit bits", limit_bits}}},
            [&] {
              inner_.fixed_point_accumulate(fixed, out_of_range, grads, n, fraction_bits,
                                            limit_bits);
            });
  }
  void fixed_point_to_float(float* out, const int64_t* fixed, const int64_t* out_of_range, size_t n,
                            int fraction_bits) override {
    observe({"fixed_point_to_float",
             OpFamily::kOptimizer,
             DType::kF32,
             {{"n", n}, {"fraction bits", fraction_bits}}},
            [&] { inner_.fixed_point_to_float(out, fixed, out_of_range, n, fraction_bits); });
  }
  void sum_squares(double* out, const float* x, size_t n) override {
    observe({"sum_squares", OpFamily::kOptimizer, DType::kF32, {{"n", n}}},
            [&] { inner_.sum_squares(out, x, n); });
  }
  void sum_squares_blocks(double* partial, const float* x, size_t n) override {
    observe({"sum_squares_blocks", OpFamily::kOptimizer, DType::kF32, {{"n", n}}},
            [&] { inner_.sum_squares_blocks(partial, x, n); });
  }
  void sum_doubles(double* out, const double* x, size_t n) override {
    observe({"sum_doubles", OpFamily::kOptimizer, DType::kF32, {{"n", n}}},
            [&] { inner_.sum_doubles(out, x, n); });
  }
  void adamw_update(float* params, const float* grads, float* m, float* v, Act compute, size_t n,
                    const AdamWRange* ranges, int range_count, const AdamWConfig& cfg,
                    const double* grad_norm_sq) override {
    observe(
        {"adamw_update", OpFamily::kOptimizer, compute.dtype, {{"n", n}, {"ranges", range_count}}},
        [&] {
          inner_.adamw_update(params, grads, m, v, compute, n, ranges, range_count, cfg,
                              grad_norm_sq);
        });
  }

 protected:
  // Before and after each compute op; failed: the op threw (what is
  // rethrown unless this throws instead).
  virtual void begin(const OpCall& call) { (void)call; }
  virtual void end(const OpCall& call) { (void)call; }
  virtual void failed(const OpCall& call, const std::exception& e) { (void)call, (void)e; }

 private:
  template <class Op>
  void observe(const OpCall& call, Op&& op) {
    begin(call);
    try {
      op();
    } catch (const std::exception& e) {
      failed(call, e);
      throw;
    }
    end(call);
  }

  Ops& inner_;
};

}  // namespace mpiformer
