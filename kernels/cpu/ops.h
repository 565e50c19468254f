// The CPU backend's ops: the reference implementation of every op in
// kernels/ops.h, on a CpuDevice (kernels/cpu/device.h), made fast with
// OpenBLAS SGEMM for the matmuls, OpenMP across rows or (sequence, head)
// pairs elsewhere, and AVX2 clones of the hot row loops.
// Member definitions are split by op family over kernels/cpu/*.cpp.
//
// The kernels compute in fp32. Data in another compute precision (bf16,
// fp16) is widened into scratch, run through the same fp32 kernels and
// rounded where it is stored, which is what a GPU kernel does too: this
// backend is then the reference of the GPU's bf16 and fp16 ops as well.
#pragma once

#include <cstddef>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cpu/device.h"
#include "kernels/ops.h"

namespace mpiformer {

namespace cpu {

// Work (elements touched, roughly) below which an op runs on one thread: a
// parallel region costs microseconds, and far more when the cores are
// shared (a descheduled thread holds up the barrier), which small models
// and tests hit all the time.
inline bool worth_threading(size_t work) {
  return work >= (size_t{1} << 15);
}

// sums[c] += the sum over rows of rows[i * ld + c], each column's rows in
// order (threads split the columns: the same bits for any thread count).
// A bias gradient (matmul.cpp), or layer norm's dx_sums (layernorm.cpp).
// sums: (C), rows: (N, C) rows ld apart
void add_column_sums(float* sums, const float* rows, int N, int C, int ld);

// Elementwise fp32 kernels shared by the op families (elementwise.cpp).
// out = act(x); out may alias x.  out, x: (n)
void activation_forward(float* out, const float* x, size_t n, Activation act);
// dx = act'(x) * dout; dx may alias dout.  dx, dout, x: (n)
void activation_backward(float* dx, const float* dout, const float* x, size_t n, Activation act);
// out = dropout(x); out may alias x.  out, x: (n)
void apply_dropout(float* out, const float* x, size_t n, const Dropout& d);

// Row-major SGEMM (gemm.cpp): C (M, N) = alpha op(A) (M, K) op(B) (K, N) + beta C.
// sgemm_serial runs on the calling thread; sgemm splits C into fixed tiles
// over the threads. Both give the same bits for any thread count.
void sgemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                  int lda, const float* B, int ldb, float beta, float* C, int ldc);
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);
// out (N, OC) rows ldo apart = x (N, K) @ w^T (w: (OC, K)) + bias (or null),
// each row in an order fixed by K alone, whatever rows share the call
// (row_gemm.cpp): the batch-invariant GEMM of decoding. packed: w as
// pack_weights laid it out, or null (packed call by call).
void row_gemm(float* out, int ldo, const float* x, const float* w, const float* bias, int N, int K,
              int OC, const float* packed = nullptr);
// w (OC, K) laid out for row_gemm: packed (packed_weights_size(K, OC)).
size_t packed_weights_size(int K, int OC);
void pack_weights(float* packed, const float* w, int K, int OC);

}  // namespace cpu

class CpuOps final : public Ops {
 public:
  // The ops on `device`, which they own.
  explicit CpuOps(std::unique_ptr<CpuDevice> device)
      : Ops(*device), owned_device_(std::move(device)) {}
  ~CpuOps() override = default;

  // The compute ops of kernels/op_table.h, defined by family in
  // kernels/cpu/FAMILY.cpp: elementwise, embedding, layernorm, matmul,
  // attention, attention_listed, cross_entropy, classify, fixed_point, adamw.
#define MPIFORMER_OP(name, family, dtype, sizes, parameters, arguments) \
  void name parameters override;
#include "kernels/op_table.h"
#undef MPIFORMER_OP
  size_t attention_scratch_bytes(DType dtype, size_t tokens, size_t longest,
                                 const AttentionConfig& cfg, bool backward) const override;
  // Decoding's batch-invariant GEMM (matmul.cpp).
  void set_batch_invariant(bool on) override;
  bool batch_invariant() const override {
    return batch_invariant_;
  }
  size_t batch_invariant_bytes(size_t weight_floats) const override;

 private:
  // fp32 views of Act data for the kernels: the data itself when it is
  // fp32, else a widened copy in scratch that is rounded back into the data
  // (outputs) when the view ends. One per op call.
  class Fp32 {
   public:
    explicit Fp32(CpuOps& ops) : ops_(ops) {}
    ~Fp32();
    Fp32(const Fp32&) = delete;
    Fp32& operator=(const Fp32&) = delete;
    // A read-only view of n elements.
    const float* in(Act a, size_t n);
    // A view whose contents are stored back: `out` need not be read first,
    // `inout` is (accumulated outputs).
    float* out(Act a, size_t n) { return view(a, n, false, true); }
    float* inout(Act a, size_t n) { return view(a, n, true, true); }
    // A strided column slice: `rows` rows of `width` elements, `stride`
    // apart (e.g. the k columns of a fused QKV tensor). Only the slice is
    // stored back, so slices of one buffer may be viewed side by side.
    const float* in(Act a, size_t rows, size_t stride, size_t width) {
      return view(a, extent(rows, stride, width), true, false);
    }
    float* out(Act a, size_t rows, size_t stride, size_t width) {
      return slice(a, rows, stride, width, false);
    }
    float* inout(Act a, size_t rows, size_t stride, size_t width) {
      return slice(a, rows, stride, width, true);
    }
    // fp32 scratch of n floats, zero-filled, for this call.
    float* temp(size_t n);

   private:
    static size_t extent(size_t rows, size_t stride, size_t width) {
      return rows == 0 ? 0 : (rows - 1) * stride + width;
    }
    float* view(Act a, size_t n, bool read, bool write);
    float* slice(Act a, size_t rows, size_t stride, size_t width, bool read);
    struct Stored {  // rows of width elements, stride apart
      Act dst;
      size_t rows, stride, width;
      float* src;
    };
    CpuOps& ops_;
    std::vector<Stored> stores_;
    size_t slots_used_ = 0;
  };

  // Scratch that grows to the largest request and is then reused, so the
  // step loop does not allocate once the first step has run. Not counted in
  // the device's peak_allocated_bytes (that reports the model's own buffers).
  template <typename T>
  static T* grow(std::vector<T>& buffer, size_t count) {
    if (buffer.size() < count) buffer.resize(count);
    return buffer.data();
  }

  // The fp32 kernels behind the ops (each op widens, calls one, rounds).
  void layernorm_backward_f32(float* dx, float* dgamma, float* dbeta, const float* dout,
                              const float* x, const float* gamma, const float* mean,
                              const float* rstd, int N, int C, bool accumulate);
  void matmul_backward_f32(float* dx, float* dweight, float* dbias, const float* dout,
                           int dout_stride, const float* x, const float* weight, int N, int IC,
                           int OC, bool accumulate);

  std::unique_ptr<CpuDevice> owned_device_;
  std::vector<std::vector<float>> widened_;  // Fp32 views' scratch, slot by slot
  std::vector<float> float_scratch_;    // attention P and dS per thread; layer-norm partial sums
  std::vector<double> double_scratch_;  // per-row / per-chunk partial sums (deterministic order)
  bool batch_invariant_ = false;        // set_batch_invariant: matmul_forward on cpu::row_gemm
  // While batch-invariant: row_gemm's packed copy of each fp32 weight, by its
  // address (the weights do not change meanwhile), up to kMaxPackedFloats.
  struct Packed {
    int K = 0, OC = 0;
    std::vector<float> floats;
  };
  const float* packed_weight(const float* w, int K, int OC);
  std::unordered_map<const float*, Packed> packed_weights_;
  size_t packed_floats_ = 0;
};

}  // namespace mpiformer
