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

// The floating-point operations of a call where its sizes tell them: a
// GEMM's 2 N IC OC per product (matmul_backward's dx and dW), attention's
// 4 B Lq Lk H D forward on a batch of equal lengths, halved where causal
// (the masked half not counted), and 2.5 times that backward (the
// conventions of the TFLOP/s figures in docs/GPU_RESULTS.md); 0 for other
// ops and for a ragged batch, whose products its totals do not tell.
double call_flops(const OpCall& call);

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
  std::string gemm_search() const override { return inner_.gemm_search(); }
  std::string attention_search() const override { return inner_.attention_search(); }
  std::string gemm_unfused() const override { return inner_.gemm_unfused(); }
  std::string kernel_choices() const override { return inner_.kernel_choices(); }
  std::string candidate_calls() const override { return inner_.candidate_calls(); }
  bool direct_exact_sum() const override { return inner_.direct_exact_sum(); }
  bool bias_grad_in_norm() const override { return inner_.bias_grad_in_norm(); }
  bool bias_grad_in_activation() const override { return inner_.bias_grad_in_activation(); }
  AttentionCalls attention_calls() const override { return inner_.attention_calls(); }
  AttentionPreparation prepare_attention(const std::vector<AttentionCase>& cases, DType dtype,
                                         bool backward) override {
    return inner_.prepare_attention(cases, dtype, backward);
  }
  size_t attention_scratch_bytes(DType dtype, size_t tokens, size_t longest,
                                 const AttentionConfig& cfg, bool backward) const override {
    return inner_.attention_scratch_bytes(dtype, tokens, longest, cfg, backward);
  }

  // The compute ops of kernels/op_table.h, each observed, then forwarded.
#define MPIFORMER_OP(name, family, dtype, sizes, parameters, arguments) \
  void name parameters override {                                       \
    observe({#name, OpFamily::family, dtype, MPIFORMER_OP_SIZES sizes}, \
            [&] { inner_.name arguments; });                            \
  }
#define MPIFORMER_OP_SIZES(...) __VA_ARGS__
#include "kernels/op_table.h"
#undef MPIFORMER_OP_SIZES
#undef MPIFORMER_OP

 protected:
  // Before and after each compute op; failed: the op threw (what is
  // rethrown unless this throws instead).
  virtual void begin(const OpCall& call) {
    (void)call;
  }
  virtual void end(const OpCall& call) {
    (void)call;
  }
  virtual void failed(const OpCall& call, const std::exception& e) {
    (void)call, (void)e;
  }

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
