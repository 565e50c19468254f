// GEMMs for the CUDA backend: cuBLASLt with fused epilogues, its
// algorithms chosen once per shape and cached, and cuBLAS's cublasGemmEx
// where cuBLASLt offers no algorithm (an epilogue it cannot fuse for these
// types or alignments, or a degenerate shape); the caller then runs the
// epilogue's work as separate kernels. set_timed_search (CudaOps, from
// MPIFORMER_KERNELS gemm=timed) picks instead the fastest of cuBLASLt's
// suggestions, timed once per shape on the call's own operands.
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

// D (m x n, ld ldd) = op(A) op(B) + beta * D, A (ld lda) and B (ld ldb) in
// ab_type, D in d_type, fp32 accumulation; with an epilogue, also bias
// (m or n elements, see cuBLASLt), aux (ld aux_ld) as cuBLASLt defines them.
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
  const void* bias = nullptr;  // BIAS / GELU_AUX_BIAS: input; BGRADB: output
  void* aux = nullptr;         // GELU_AUX*: output; DGELU: input
  int aux_ld = 0;
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
  // can, cublasGemmEx otherwise. Throws std::runtime_error on failure.
  void plain(const GemmCall& call);

  // timed: each shape's algorithm is the fastest of cuBLASLt's first 8
  // suggestions, timed when the shape first runs; otherwise (the default)
  // its first suggestion. Off by default because the fastest can differ
  // between runs and machines, and algorithms may sum in different orders:
  // a timed choice gives up run-to-run bitwise equality. Changing it drops
  // the plans made so far, so that every shape is planned again.
  void set_timed_search(bool timed);
  // Since construction: "timed 14 GEMM shapes; cuBLASLt's first choice was
  // fastest in 9", or empty when nothing was timed.
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
  // the index of the one to keep.
  void make_descriptors(const GemmCall& call, Plan& plan);
  std::vector<cublasLtMatmulAlgo_t> heuristics(const GemmCall& call, const Plan& plan,
                                               int requested);
  size_t choose(const GemmCall& call, const Plan& plan,
                const std::vector<cublasLtMatmulAlgo_t>& algos);
  // The timed search: the index of the fastest of algos, or -1 when none
  // could be timed; one candidate's milliseconds, negative if it failed.
  int time_candidates(const GemmCall& call, const Plan& plan,
                      const std::vector<cublasLtMatmulAlgo_t>& algos);
  float trial_ms(const GemmCall& call, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                 void* out, cudaEvent_t start, cudaEvent_t stop);
  // Points the plan's descriptor at the call's bias and aux.
  void point_at(const Plan& plan, const GemmCall& call);

  CudaOps& ops_;
  bool tf32_;
  bool epilogues_ = true;  // MPIFORMER_CUBLASLT_EPILOGUES=0 turns fusion off (diagnosis)
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::unordered_map<std::string, Plan*> plans_;  // owned, by PlanKey (gemm.cu)
  bool timed_ = false;
  std::set<std::string> unfused_;  // "EPILOGUE m M n N k K" (unfused_summary)
  int shapes_timed_ = 0;           // shapes whose candidates were timed (more than one)
  int heuristic_kept_ = 0;         // of those, the ones that kept cuBLASLt's first
};

}  // namespace cuda
}  // namespace mpiformer
