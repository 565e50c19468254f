// The CUDA backend (fp32): every op of kernels/ops.h on one GPU, checked
// against the CPU reference by tests/cuda_ops_test.cpp (label gpu). GEMMs go
// through cuBLAS; the other ops are plain kernels, one file per op family.
// Every kernel runs on the backend's stream; copies to and from the host
// synchronise with it.
//
// Still to come (see the CUDA issue): cuBLASLt with fused epilogues, cuDNN
// fused attention, bf16/fp16 with a loss scaler, and the NCCL transport.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <unordered_map>

#include "kernels/ops.h"

namespace mpiformer {

namespace cuda {

// Throws std::runtime_error "CUDA error in WHAT: reason" on failure.
void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);

// Blocks of `threads` covering n items (at least one block).
inline unsigned blocks_for(size_t n, unsigned threads = 256) {
  const size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b == 0 ? 1 : (b > 65535u * 32u ? 65535u * 32u : b));
}

}  // namespace cuda

class CudaOps final : public Ops {
 public:
  // Binds this process to `device` (cudaSetDevice) and creates its stream
  // and cuBLAS handle. Throws std::runtime_error.
  explicit CudaOps(int device);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  std::string name() const override { return name_; }
  int device() const { return device_; }

  // ---- memory (cuda_ops.cu) -------------------------------------------------
  void* allocate(size_t bytes) override;
  void release(void* ptr) override;
  void copy_to_device(void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void fill_zero(float* x, size_t n) override;
  void synchronize() override;
  size_t peak_allocated_bytes() const override { return peak_bytes_; }
  bool host_accessible() const override { return false; }

  // ---- elementwise, embeddings (cuda_ops.cu) --------------------------------
  void add(float* out, const float* a, const float* b, size_t n) override;
  void activation_forward(float* out, const float* x, size_t n, Activation act) override;
  void activation_backward(float* dx, const float* dout, const float* x, size_t n,
                           Activation act) override;
  void dropout_forward(float* out, const float* x, size_t n, float p, uint64_t seed,
                       uint64_t stream) override;
  void dropout_backward(float* dx, const float* dout, size_t n, float p, uint64_t seed,
                        uint64_t stream) override;
  void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                         float scale) override;
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N, int C,
                          float scale) override;
  void positional_add_forward(float* x, const int32_t* positions, const float* table, int N,
                              int C) override;
  void positional_add_backward(float* dtable, const float* dx, const int32_t* positions, int N,
                               int C) override;

  // ---- layer norm (layernorm.cu) --------------------------------------------
  void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* gamma,
                         const float* beta, int N, int C, float eps) override;
  void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dout, const float* x,
                          const float* gamma, const float* mean, const float* rstd, int N, int C,
                          bool accumulate) override;

  // ---- GEMM (matmul.cu) -----------------------------------------------------
  void matmul_forward(float* out, const float* x, const float* weight, const float* bias, int N,
                      int IC, int OC) override;
  void matmul_backward(float* dx, float* dweight, float* dbias, const float* dout, const float* x,
                       const float* weight, int N, int IC, int OC, bool accumulate) override;

  // ---- softmax and attention (attention.cu) ---------------------------------
  void softmax_forward(float* probs, const float* x, int R, int L, float scale,
                       const int32_t* valid) override;
  void softmax_backward(float* dx, const float* dprobs, const float* probs, int R, int L,
                        float scale) override;
  void attention_forward(float* out, float* probs, const float* q, int q_stride, const float* k,
                         const float* v, int kv_stride, const Ragged& qs, const Ragged& ks,
                         const AttentionConfig& cfg) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs,
                          const float* q, int q_stride, const float* k, const float* v,
                          int kv_stride, const Ragged& qs, const Ragged& ks,
                          const AttentionConfig& cfg) override;

  // ---- loss and optimizer (loss_optim.cu) -----------------------------------
  LossSums cross_entropy(float* logits, const int32_t* targets, int N, int V, float smoothing,
                         int pad_id, float grad_scale, bool compute_grad) override;
  void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                    const AdamWConfig& cfg) override;
  double sum_squares(const float* x, size_t n) override;

 private:
  // Device scratch that grows to the largest request and is then reused
  // (not counted in peak_allocated_bytes).
  void* scratch(int slot, size_t bytes);
  // Where each sequence's block of attention probabilities starts, uploaded
  // to scratch slot kProbOffsets.  returns: device (B+1)
  const int64_t* prob_offsets(const Ragged& qs, const Ragged& ks, int heads);

  enum Slot { kProbOffsets, kAttentionGrad, kValid, kReduce, kSlots };
  int device_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* scratch_[kSlots] = {};
  size_t scratch_bytes_[kSlots] = {};
  std::unordered_map<void*, size_t> sizes_;
  size_t current_bytes_ = 0;
  size_t peak_bytes_ = 0;
};

}  // namespace mpiformer
