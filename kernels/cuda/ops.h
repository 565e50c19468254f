// The CUDA backend's ops: every op of kernels/ops.h on one GPU (a
// CudaDevice, kernels/cuda/device.h), in fp32, bf16 or fp16, checked
// against the CPU reference by tests/cuda_ops_test.cpp (label gpu).
//
// - GEMMs through cuBLASLt (gemm.cu, matmul.cu): bf16/fp16 inputs with fp32
//   accumulation, fused epilogues (bias; GELU keeping its pre-activation;
//   GELU backward; bias gradient), fp32 weight gradients accumulated in
//   place. fp32 GEMMs stay fp32 unless the backend was made with tf32.
// - Attention through cuDNN's fused flash attention (attention_cudnn.cpp)
//   for bf16/fp16 on packed ragged sequences when the build has the cuDNN
//   frontend; plain kernels (attention.cu) otherwise and for fp32.
// - Row kernels for layer norm (fused with the residual add), the fused
//   cross entropy, the classifier's pooling and ZLPR loss (classify.cu) and
//   AdamW over the whole flat buffer with the clip taken on the device.
//
// Stream order: every op is queued on the device's stream. Nothing in a
// step waits for the device except what the caller reads back (loss sums,
// the norm). Scratch and library workspaces grow to the largest request
// and count in the device's peak, so once the shapes of a run have been
// seen nothing is allocated.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>

#include "kernels/cuda/device.h"
#include "kernels/kernel_switches.h"
#include "kernels/ops.h"

namespace mpiformer {

namespace cuda {

// Throws std::runtime_error "cuBLAS error in WHAT: status" on failure (the
// CUDA runtime's check is kernels/cuda/device.h's).
void check(cublasStatus_t status, const char* what);

// Blocks of `threads` covering n items (at least one block, a bounded grid).
inline unsigned blocks_for(size_t n, unsigned threads = 256) {
  const size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b == 0 ? 1 : (b > 65535u * 32u ? 65535u * 32u : b));
}

class Gemm;            // gemm.cu
struct GemmCall;       // gemm.h
class FlashAttention;  // attention_cudnn.cpp

}  // namespace cuda

// The plain attention kernels (MPIFORMER_PLAIN_ATTENTION, read once by
// CudaOps): flash, tiled as FlashAttention-2 (attention_flash.cu), for
// heads up to 128; naive, a block per query row keeping P and dS in
// scratch (attention.cu), for the rest.
enum class PlainAttention { kFlash, kNaive };

class CudaOps final : public Ops {
 public:
  // The ops on `device`, which they own, with their library handles on its
  // stream. tf32: fp32 GEMMs on TF32 tensor cores. Throws
  // std::runtime_error.
  explicit CudaOps(std::unique_ptr<CudaDevice> device, bool tf32 = false);
  ~CudaOps() override;

  CudaDevice& cuda_device() const { return *gpu_; }
  // The stream the ops queue on: the device's, or while a weight gradient
  // runs beside (dweight_stream=side) the side stream.
  cudaStream_t stream() const { return stream_; }

  // Also the GEMMs' timed search's (cuda::Gemm::set_deterministic).
  void set_deterministic(bool deterministic) override;
  bool deterministic() const { return deterministic_; }
  void set_attention_path(AttentionPath path) override;
  AttentionPath attention_path() const { return attention_path_; }
  std::string attention_kernels() const override;
  std::string gemm_search() const override;
  std::string attention_search() const override;
  std::string gemm_unfused() const override;
  std::string kernel_choices() const override { return describe(switches_); }
  std::string candidate_calls() const override { return describe(candidate_calls_); }
  bool direct_exact_sum() const override {
    return switches_.exact == KernelSwitches::Exact::kDirect;
  }
  bool bias_grad_in_norm() const override {
    return switches_.dbias_out == KernelSwitches::DBiasOut::kNorm;
  }
  bool bias_grad_in_activation() const override {
    return switches_.dbias_in == KernelSwitches::DBiasIn::kDGelu;
  }
  AttentionCalls attention_calls() const override;
  AttentionPreparation prepare_attention(const std::vector<AttentionCase>& cases, DType dtype,
                                         bool backward) override;
  // Each family's older or newer path (MPIFORMER_KERNELS, read once at
  // construction; tests and timings set them per call).
  void set_kernel_switches(const KernelSwitches& switches);
  const KernelSwitches& kernel_switches() const { return switches_; }
  // Waits for the work queued on dweight_stream=side's stream (none where
  // there is none): the GEMMs' timed search times its trials alone.
  void finish_side_stream();
  // A call that asked for family f's newer path, and whether it ran it.
  void count_candidate(CandidateCalls::Family f, bool ran) { candidate_calls_.count(f, ran); }
  const CandidateCalls& candidate_counts() const { return candidate_calls_; }
  // Tests run both plain paths on one backend.
  void set_plain_attention(PlainAttention p) { plain_attention_ = p; }
  PlainAttention plain_attention() const { return plain_attention_; }

  // The compute ops of kernels/op_table.h, defined by family in
  // kernels/cuda/FAMILY.cu (the CPU's names; GEMMs on gemm.cu's cuBLASLt,
  // attention also in attention_cudnn.cpp and attention_flash.cu).
#define MPIFORMER_OP(name, family, dtype, sizes, parameters, arguments) \
  void name parameters override;
#include "kernels/op_table.h"
#undef MPIFORMER_OP
  size_t attention_scratch_bytes(DType dtype, size_t tokens, size_t longest,
                                 const AttentionConfig& cfg, bool backward) const override;

  // Device scratch that grows to the largest request and is then reused;
  // counted in the device's peak_allocated_bytes. Growing waits for the stream (the old
  // buffer may still be in use), so it happens on the first steps only.
  enum Slot {
    // Naive attention's probabilities (recomputed in backward) and dS, flash
    // attention's delta, or cuDNN's workspace: one call at a time uses it.
    kAttentionScores,
    kAttentionOffsets,    // plain attention: where each sequence's block (or tiles) start
    kAttentionQuery,      // cuDNN: q with the log-length factor folded in
    kAttentionQueryGrad,  // cuDNN: the gradient at that q
    kAttentionStats,      // cuDNN's dense backward: the stats packed (B, H, S)
    kColumnSums,          // partial column sums (bias and layer-norm gradients)
    kBiasGrad,            // a GEMM epilogue's bias gradient before it is added
    kPreBiasGrad,         // the same for dx's epilogue (dbias_in=dgelu), beside a side-stream dW
    kPreColumnSums,       // the same for its column sums where that epilogue cannot run
    kWeightGradParts,     // dweight=split: each token range's dW before they are added
    kRowResults,          // cross entropy's and ZLPR's per-row results
    kReduce,              // block partial sums
    kSlots
  };
  void* scratch(Slot slot, size_t bytes);
  // Counts a library's workspace in the device's peak figure.
  void count_workspace(size_t bytes) {
    gpu_->count_workspace(bytes);
  }

 private:
  // The plain attention kernels (attention.cu), for fp32 and where cuDNN
  // cannot run.
  void plain_attention_forward(Act out, float* stats, Act q, int q_stride, Act k, Act v,
                               int kv_stride, const Ragged& qs, const Ragged& ks,
                               const AttentionConfig& cfg);
  void plain_attention_backward(Act dq, Act dk, Act dv, Act dout, Act out, const float* stats,
                                Act q, int q_stride, Act k, Act v, int kv_stride, const Ragged& qs,
                                const Ragged& ks, const AttentionConfig& cfg);
  // A call cuDNN did not take: an error with --attention cudnn, else counted.
  void refused_by_cudnn(const char* what);
  // layer norm's block backward, the default (layernorm.cu): dx and the
  // partial column sums it returns (`sums` of them: dgamma's, dbeta's and
  // where 3 dx_sums', as layernorm_rows::Sums), *blocks of them. (N, C)
  // rows.
  float* block_layernorm_backward(Act dx, int sums, Act dout, Act x, Act gamma, const float* mean,
                                  const float* rstd, int N, int C, bool accumulate, int* blocks);
  // Column sums of a (N, C) gradient added into fp32 sums (+=) in a fixed
  // order: bias gradients. dst: (C), src: (N, C) rows `stride` apart; the
  // blocks' partial sums in scratch `partials`.
  void add_column_sums(float* dst, Act src, int N, int C, int stride, Slot partials = kColumnSums);
  // matmul_backward's dx (= or +=): its GEMM, with GELU's backward fused
  // where cuBLASLt can, and fused.pre_bias_grad's sums (+=) with it
  // (DGELU_BGRAD) where it can, else from a column-sum pass over dx.
  void input_gradient(Act dx, Act dout, Act weight, int N, int IC, int OC, bool accumulate,
                      const FusedActivation& fused, int ldd);
  // Its GEMM without an epilogue, then the activation's backward apart.
  void plain_input_gradient(Act dx, const cuda::GemmCall& call, const FusedActivation& fused);
  // dweight_stream=side's fork and join: made, the side stream (made on
  // first use) waits for everything queued on the device's stream, and the
  // ops queue their work on it; to_main() queues them on the device's
  // stream again; at its end (to_main() first if it has not run, as when
  // an exception leaves early) the device's stream waits for the side
  // stream's work.
  class SideStream {
   public:
    explicit SideStream(CudaOps& ops);
    ~SideStream();
    SideStream(const SideStream&) = delete;
    SideStream& operator=(const SideStream&) = delete;
    void to_main();

   private:
    CudaOps& ops_;
    cudaStream_t main_;
    bool on_side_ = true;
  };
  // The side stream and its two events, all made or none.
  void make_side_stream();
  // matmul_backward's dW (+=) and dbias (+=): one GEMM with the bias
  // gradient fused where cuBLASLt can, or split (below); under
  // dbias=columns the bias gradient from column sums of dout.
  void weight_gradient(float* dweight, float* dbias, Act dout, Act x, int N, int IC, int OC,
                       int ldd);
  // matmul_backward's dW (+=) and dbias (+=) under dweight=split
  // (kernels/dweight_split.h): the GEMM as a batch over token ranges, each
  // with its bias gradient fused where cuBLASLt can (column sums where
  // not), then the parts' sums added in order. False, having done nothing,
  // where the shape takes no split or cuBLASLt has no batched algorithm.
  bool split_weight_gradient(float* dweight, float* dbias, Act dout, Act x, int N, int IC, int OC,
                             int ldd);
  // dbias=columns: the bias gradients come from column sums, not BGRADB.
  bool bias_grad_apart() const {
    return switches_.dbias == KernelSwitches::DBias::kColumns;
  }
  // Whether the warp kernels are asked for (layernorm=warp, or for the
  // backward layernorm_backward=warp) and take rows of C in these buffers
  // (counted).
  bool warp_layernorm(bool backward, DType dtype, int C,
                      std::initializer_list<const void*> buffers);
  // sum (+=) the parts of partial (parts, stride), count elements each, in order.
  void add_split_parts(float* sum, const float* partial, size_t count, size_t stride, int parts);

  std::unique_ptr<CudaDevice> gpu_;  // first: the members below release into it
  cudaStream_t stream_ = nullptr;    // gpu_'s (side_stream_ while a SideStream lives)
  bool deterministic_ = true;        // set_deterministic: cuDNN's attention, the GEMM search
  AttentionPath attention_path_ = AttentionPath::kAuto;
  PlainAttention plain_attention_ = PlainAttention::kFlash;
  KernelSwitches switches_;
  CandidateCalls candidate_calls_;     // since construction
  size_t shared_per_block_optin_ = 0;  // the most shared memory a block may ask for
  int multiprocessors_ = 1;            // the device's SMs
  // dweight_stream=side's stream and the events between it and the
  // device's (SideStream), made on first use.
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  AttentionCalls attention_calls_;
  std::string no_cudnn_reason_;  // why flash_ is null
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<cuda::FlashAttention> flash_;  // null without cuDNN (no_cudnn_reason_)
  // Whether cuDNN is asked for an attention call in `dtype` (it runs bf16
  // and fp16).
  bool asks_cudnn(DType dtype) const;
  void* scratch_[kSlots] = {};
  size_t scratch_bytes_[kSlots] = {};
};

}  // namespace mpiformer
