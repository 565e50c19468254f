// GEMMs for the CUDA backend: cuBLASLt with fused epilogues, its
// algorithms chosen once per shape and cached, and cuBLAS's cublasGemmEx
// where cuBLASLt offers no algorithm (an epilogue it cannot fuse for these
// types or alignments, or a degenerate shape); the caller then runs the
// epilogue's work as separate kernels.
//
// Column-major, as cuBLAS sees memory: a row-major (R, C) buffer is a
// column-major (C, R) matrix with leading dimension C. The backend's row-
// major GEMMs are written in those terms in matmul.cu.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <unordered_map>

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

 private:
  struct Plan;
  Plan* plan_for(const GemmCall& call);

  CudaOps& ops_;
  bool tf32_;
  bool epilogues_ = true;  // MPIFORMER_CUBLASLT_EPILOGUES=0 turns fusion off (diagnosis)
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::unordered_map<std::string, Plan*> plans_;
};

}  // namespace cuda
}  // namespace mpiformer
