// The CPU backend: the reference implementation of every op in kernels/ops.h,
// made fast with OpenBLAS SGEMM for the matmuls, OpenMP across rows or
// (sequence, head) pairs elsewhere, and AVX2 clones of the hot row loops.
// Member definitions are split by op family over kernels/cpu/*.cpp.
#pragma once

#include <cstddef>
#include <vector>

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

}  // namespace cpu

class CpuOps final : public Ops {
 public:
  CpuOps() = default;
  ~CpuOps() override = default;

  std::string name() const override { return "cpu"; }

  // ---- memory (cpu_ops.cpp) ----------------------------------------------
  void* allocate(size_t bytes) override;
  void release(void* ptr) override;
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void fill_zero(float* x, size_t n) override;
  void synchronize() override {}
  size_t peak_allocated_bytes() const override { return peak_bytes_; }

  // ---- elementwise (elementwise.cpp) ---------------------------------------
  void add(float* out, const float* a, const float* b, size_t n) override;
  void activation_forward(float* out, const float* x, size_t n, Activation act) override;
  void activation_backward(float* dx, const float* dout, const float* x, size_t n,
                           Activation act) override;
  void dropout_forward(float* out, const float* x, size_t n, float p, uint64_t seed,
                       uint64_t stream) override;
  void dropout_backward(float* dx, const float* dout, size_t n, float p, uint64_t seed,
                        uint64_t stream) override;

  // ---- embeddings (embedding.cpp) ------------------------------------------
  void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                         float scale) override;
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N, int C,
                          float scale) override;
  void positional_add_forward(float* x, const int32_t* positions, const float* table, int N,
                              int C) override;
  void positional_add_backward(float* dtable, const float* dx, const int32_t* positions, int N,
                               int C) override;

  // ---- layer norm (layernorm.cpp) ------------------------------------------
  void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* gamma,
                         const float* beta, int N, int C, float eps) override;
  void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dout, const float* x,
                          const float* gamma, const float* mean, const float* rstd, int N, int C,
                          bool accumulate) override;

  // ---- GEMM (matmul.cpp) ---------------------------------------------------
  void matmul_forward(float* out, const float* x, const float* weight, const float* bias, int N,
                      int IC, int OC) override;
  void matmul_backward(float* dx, float* dweight, float* dbias, const float* dout, const float* x,
                       const float* weight, int N, int IC, int OC, bool accumulate) override;

  // ---- softmax (softmax.cpp) -----------------------------------------------
  void softmax_forward(float* probs, const float* x, int R, int L, float scale,
                       const int32_t* valid) override;
  void softmax_backward(float* dx, const float* dprobs, const float* probs, int R, int L,
                        float scale) override;

  // ---- attention (attention.cpp) -------------------------------------------
  void attention_forward(float* out, float* probs, const float* q, int q_stride, const float* k,
                         const float* v, int kv_stride, const Ragged& qs, const Ragged& ks,
                         const AttentionConfig& cfg) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs,
                          const float* q, int q_stride, const float* k, const float* v,
                          int kv_stride, const Ragged& qs, const Ragged& ks,
                          const AttentionConfig& cfg) override;

  // ---- loss (cross_entropy.cpp) --------------------------------------------
  LossSums cross_entropy(float* logits, const int32_t* targets, int N, int V, float smoothing,
                         int pad_id, float grad_scale, bool compute_grad) override;

  // ---- optimizer (adamw.cpp) -----------------------------------------------
  void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                    const AdamWConfig& cfg) override;
  double sum_squares(const float* x, size_t n) override;

 private:
  // Scratch that grows to the largest request and is then reused, so the
  // step loop does not allocate once the first step has run. Not counted in
  // peak_allocated_bytes (that reports the model's own buffers).
  template <typename T>
  static T* grow(std::vector<T>& buffer, size_t count) {
    if (buffer.size() < count) buffer.resize(count);
    return buffer.data();
  }

  std::vector<float> float_scratch_;    // attention dP per thread; layer-norm partial sums
  std::vector<double> double_scratch_;  // per-row / per-chunk partial sums (deterministic order)
  std::vector<size_t> index_scratch_;   // attention: start of each sequence's probs block

  size_t current_bytes_ = 0;
  size_t peak_bytes_ = 0;
};

}  // namespace mpiformer
