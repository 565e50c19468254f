// GEMMs for the CUDA backend: cuBLASLt with fused epilogues, its
// algorithms chosen once per shape and cached, and cuBLAS's cublasGemmEx
// where cuBLASLt offers no algorithm (an epilogue it cannot fuse for these
// types or alignments, or a degenerate shape); the caller then runs the
// epilogue's work as separate kernels. set_timed_search (CudaOps, from
// MPIFORMER_KERNELS gemm=timed) picks instead the fastest of cuBLASLt's
// suggestions, timed once per shape on the call's own operands; in
// deterministic runs only among those that give its first suggestion's
// bits (kernels/gemm_search.h).
//
// Column-major, as cuBLAS sees memory: a row-major (R, C) buffer is a
// column-major (C, R) matrix with leading dimension C. The backend's row-
// major GEMMs are written in those terms in matmul.cu.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/dtype.h"

namespace mpiformer {

class CudaOps;

namespace cuda {

// The CUDA element type of t.
cudaDataType_t cuda_type(DType t);

// *total += the digest (kernels/gemm_search.h) of `bytes` (even) at `data`
// on the device, its 16-bit units numbered from first_index; on `stream`.
void add_bits_digest(const void* data, size_t bytes, uint64_t first_index,
                     unsigned long long* total, cudaStream_t stream);

// Device memory whose bits a timed search compares (an output of a trial):
// `bytes` (even) at `data`, its units numbered from first_index.
struct DigestSpan {
  const void* data;
  size_t bytes;
  uint64_t first_index;
};

// The digest of every span, summed on the device in *total (allocated on
// the first call; the caller frees it) and read back: waits for `stream`.
uint64_t spans_digest(const std::vector<DigestSpan>& spans, unsigned long long** total,
                      cudaStream_t stream);

// The two events a timed search records around its runs, destroyed with
// it (an exception on the way included). Throws std::runtime_error where
// CUDA cannot make them.
struct TimingEvents {
  cudaEvent_t start = nullptr, stop = nullptr;
  TimingEvents();
  ~TimingEvents();
  TimingEvents(const TimingEvents&) = delete;
  TimingEvents& operator=(const TimingEvents&) = delete;
};

// D (m x n, ld ldd) = op(A) op(B) + beta * D, A (ld lda) and B (ld ldb) in
// ab_type, D in d_type, fp32 accumulation; with an epilogue, also bias
// (m or n elements, see cuBLASLt), aux (ld aux_ld) as cuBLASLt defines them.
// batch > 1: that many such GEMMs, each matrix `stride_*` elements past the
// one before, and each bias (gradient) bias_stride past the one before
// (cuBLASLt alone).
struct GemmCall {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int lda = 0;
  const void* b = nullptr;
  int ldb = 0;
  void* d = nullptr;
  int ldd = 0;
  cudaDataType_t ab_type = CUDA_R_32F;
  cudaDataType_t d_type = CUDA_R_32F;
  float beta = 0.0f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS / GELU_AUX_BIAS: input; BGRADB / DGELU_BGRAD: output
  bool fp32_bias = false;      // the bias (or its gradient) in fp32 rather than D's type
  void* aux = nullptr;         // GELU_AUX*: output; DGELU: input
  int aux_ld = 0;
  int batch = 1;
  int stride_a = 0, stride_b = 0, stride_d = 0, bias_stride = 0;
};

class Gemm {
 public:
  // tf32: fp32 GEMMs on TF32 tensor cores; otherwise fp32 stays fp32.
  Gemm(CudaOps& ops, bool tf32);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Runs the call through cuBLASLt. Returns false, having done nothing,
  // when cuBLASLt has no algorithm for it (the caller falls back).
  bool fused(const GemmCall& call);
  // Runs the call's GEMM alone (the epilogue is ignored): cuBLASLt when it
  // can, cublasGemmEx otherwise. Throws std::runtime_error on failure, and
  // std::logic_error for a batch (fused alone takes one).
  void plain(const GemmCall& call);

  // timed: each shape's algorithm is the fastest of cuBLASLt's first 16
  // suggestions, timed on the shape's second call (a shape met once keeps
  // the first), for at most 64 shapes in all; otherwise (the default) its
  // first suggestion. Changing it drops the plans made so far, so that
  // every shape is planned again.
  void set_timed_search(bool timed);
  // deterministic (the default): the timed search keeps the bits of
  // cuBLASLt's first suggestion, setting aside untimed every suggestion
  // whose outputs on the shape's first call differ from its (another order
  // of summing), so the bits never depend on which one won. false: any
  // suggestion may win, and since the fastest can differ between runs,
  // ranks and machines, so may the bits. Changing it under the timed
  // search drops the plans made so far.
  void set_deterministic(bool deterministic);
  // Since construction: "timed 14 GEMM shapes keeping the bits of
  // cuBLASLt's first choice (31 of 190 suggestions set aside for other
  // bits); its first choice was fastest in 9" (", any bits" where they
  // need not match), or empty when nothing was timed.
  std::string timed_search_summary() const;
  // Since construction, the shapes whose epilogue cuBLASLt refused (not
  // counting MPIFORMER_CUBLASLT_EPILOGUES=0): "2 shapes: BGRADB m 768 n 1
  // k 10672, ...", or empty when every epilogue fused.
  std::string unfused_summary() const;

 private:
  struct Plan;
  Plan* plan_for(const GemmCall& call);
  // plan_for's parts: the descriptor and layouts; cuBLASLt's first
  // `requested` suggestions that it can run in the workspace, in its order;
  // the timed search of a shape, whose winner becomes its plan's algorithm.
  void make_descriptors(const GemmCall& call, Plan& plan);
  std::vector<cublasLtMatmulAlgo_t> heuristics(const GemmCall& call, const Plan& plan,
                                               int requested);
  void search(const GemmCall& call, Plan& plan);
  // search's trials: the index of the winner of algos (gemm_search::winner),
  // or -1 when none qualified. Its parts: one run of a candidate into
  // `out`, D itself or, where D accumulates, a stand-in holding D's values
  // (false, the error cleared, if cuBLASLt refused it); its
  // milliseconds over the timed runs, negative if one failed; the digest
  // of what a run wrote (D to `out`, the bias gradient, GELU's input).
  int time_candidates(const GemmCall& call, const Plan& plan,
                      const std::vector<cublasLtMatmulAlgo_t>& algos);
  bool trial_run(const GemmCall& call, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                 void* out);
  float trial_ms(const GemmCall& call, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                 void* out, cudaEvent_t start, cudaEvent_t stop);
  uint64_t outputs_digest(const GemmCall& call, const void* out);
  void drop_plans();
  // Points the plan's descriptor at the call's bias and aux.
  void point_at(const Plan& plan, const GemmCall& call);
  // The workspace of the stream the ops queue on now: the device's, or
  // another's (dweight_stream=side), made on its first GEMM, so that two
  // GEMMs running at once never share one.
  void* workspace();

  CudaOps& ops_;
  bool tf32_;
  bool epilogues_ = true;  // MPIFORMER_CUBLASLT_EPILOGUES=0 turns fusion off (diagnosis)
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;  // the device stream's
  size_t workspace_bytes_ = 0;
  cudaStream_t main_stream_ = nullptr;            // the device's
  void* side_workspace_ = nullptr;                // any other stream's (workspace())
  cudaStream_t blas_stream_ = nullptr;            // blas_'s, set when a call comes on another
  std::unordered_map<std::string, Plan*> plans_;  // owned, by PlanKey (gemm.cu)
  bool timed_ = false;
  bool same_bits_ = true;                       // set_deterministic
  unsigned long long* digest_total_ = nullptr;  // device, made on the first digest
  std::set<std::string> unfused_;               // "EPILOGUE m M n N k K" (unfused_summary)
  int shapes_timed_ = 0;      // shapes whose candidates were timed (more than one)
  int heuristic_kept_ = 0;    // of those, the ones that kept cuBLASLt's first
  int suggestions_ = 0;       // the suggestions those shapes tried
  int other_bits_ = 0;        // of those, the ones set aside for other bits
  int searches_failed_ = 0;   // searches where no candidate could be timed
  int searches_skipped_ = 0;  // shapes past the most searches, kept untimed
};

}  // namespace cuda
}  // namespace mpiformer
