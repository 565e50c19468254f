// cuBLASLt with fused epilogues for the CUDA backend (gemm.h): algorithms
// chosen once per shape and cached, cublasGemmEx where cuBLASLt has none.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"

namespace mpiformer {

namespace cuda {

namespace {

// Hopper's kernels want up to 32 MiB (NVIDIA's recommendation for sm_90).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// The largest power of two up to 256 that divides the address: what
// cuBLASLt may assume of a pointer.
int alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

}  // namespace

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// What decides the algorithm: everything but the pointers themselves.
struct PlanKey {
  int trans_a, trans_b, m, n, k, lda, ldb, ldd, ab_type, d_type, epilogue, aux_ld;
  int align_a, align_b, align_d, align_bias, align_aux;
  std::string text() const {
    return std::string(reinterpret_cast<const char*>(this), sizeof *this);
  }
};

struct Gemm::Plan {
  bool supported = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Gemm::Gemm(CudaOps& ops, bool tf32) : ops_(ops), tf32_(tf32) {
  const char* fusion = std::getenv("MPIFORMER_CUBLASLT_EPILOGUES");
  epilogues_ = !(fusion && std::strcmp(fusion, "0") == 0);
  check(cublasLtCreate(&lt_), "cublasLtCreate");
  check(cublasCreate(&blas_), "cublasCreate");
  check(cublasSetStream(blas_, ops_.stream()), "cublasSetStream");
  // fp32 means fp32: no TF32 behind the caller's back.
  check(cublasSetMathMode(blas_, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH),
        "cublasSetMathMode");
  check(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc (cuBLASLt workspace)");
  workspace_bytes_ = kWorkspaceBytes;
  ops_.count_workspace(kWorkspaceBytes);
  // One workspace for both libraries: they run on one stream, never at once.
  check(cublasSetWorkspace(blas_, workspace_, workspace_bytes_), "cublasSetWorkspace");
}

Gemm::~Gemm() {
  for (auto& [key, plan] : plans_) delete plan;
  if (workspace_) cudaFree(workspace_);
  if (blas_) cublasDestroy(blas_);
  if (lt_) cublasLtDestroy(lt_);
}

Gemm::Plan* Gemm::plan_for(const GemmCall& c) {
  const PlanKey key{c.trans_a,
                    c.trans_b,
                    c.m,
                    c.n,
                    c.k,
                    c.lda,
                    c.ldb,
                    c.ldd,
                    static_cast<int>(c.ab_type),
                    static_cast<int>(c.d_type),
                    static_cast<int>(c.epilogue),
                    c.aux_ld,
                    alignment_of(c.a),
                    alignment_of(c.b),
                    alignment_of(c.d),
                    c.bias ? alignment_of(c.bias) : 0,
                    c.aux ? alignment_of(c.aux) : 0};
  const std::string text = key.text();
  if (const auto it = plans_.find(text); it != plans_.end()) return it->second;

  auto* plan = new Plan;
  plans_[text] = plan;
  const bool fp32 = c.ab_type == CUDA_R_32F;
  const cublasComputeType_t compute =
      fp32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t size) {
    check(cublasLtMatmulDescSetAttribute(plan->desc, attr, value, size),
          "cublasLtMatmulDescSetAttribute");
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a);
  set(CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b);
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epilogue, sizeof c.epilogue);
  if (c.bias) {
    // The bias (or its gradient) has D's type, as cuBLASLt requires outside fp8.
    const cudaDataType_t bias_type = c.d_type;
    set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof c.bias);
  }
  if (c.aux) {
    const int64_t ld = c.aux_ld;
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.aux, sizeof c.aux);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
  }
  // Layouts as stored, before op(): A is m x k unless transposed, and so on.
  check(cublasLtMatrixLayoutCreate(&plan->a, c.ab_type, c.trans_a ? c.k : c.m,
                                   c.trans_a ? c.m : c.k, c.lda),
        "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&plan->b, c.ab_type, c.trans_b ? c.n : c.k,
                                   c.trans_b ? c.k : c.n, c.ldb),
        "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&plan->d, c.d_type, c.m, c.n, c.ldd),
        "cublasLtMatrixLayoutCreate");

  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = workspace_bytes_;
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, sizeof workspace),
        "cublasLtMatmulPreferenceSetAttribute");
  const uint32_t align[4] = {static_cast<uint32_t>(key.align_a), static_cast<uint32_t>(key.align_b),
                             static_cast<uint32_t>(key.align_d),
                             static_cast<uint32_t>(key.align_d)};
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    check(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]),
          "cublasLtMatmulPreferenceSetAttribute");
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      lt_, plan->desc, plan->a, plan->b, plan->d, plan->d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  plan->supported = status == CUBLAS_STATUS_SUCCESS && found > 0 &&
                    result.state == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= workspace;
  if (plan->supported) plan->algo = result.algo;
  return plan;
}

bool Gemm::fused(const GemmCall& c) {
  if (c.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !epilogues_) return false;
  // Degenerate shapes go to cublasGemmEx (cuBLASLt's heuristics refuse some).
  if (c.m <= 1 || c.n <= 1 || c.k <= 1) return false;
  Plan* plan = plan_for(c);
  if (!plan->supported) return false;
  // The pointers are the call's own; the plan only fixed their alignment.
  if (c.bias) {
    check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias,
                                         sizeof c.bias),
          "cublasLtMatmulDescSetAttribute");
  }
  if (c.aux) {
    check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                         &c.aux, sizeof c.aux),
          "cublasLtMatmulDescSetAttribute");
  }
  const float alpha = 1.0f;
  check(cublasLtMatmul(lt_, plan->desc, &alpha, c.a, plan->a, c.b, plan->b, &c.beta, c.d, plan->d,
                       c.d, plan->d, &plan->algo, workspace_, workspace_bytes_, ops_.stream()),
        "cublasLtMatmul");
  return true;
}

void Gemm::plain(const GemmCall& call) {
  GemmCall c = call;
  c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  c.bias = nullptr;
  c.aux = nullptr;
  c.aux_ld = 0;
  if (fused(c)) return;
  const float alpha = 1.0f;
  const cublasComputeType_t compute =
      c.ab_type == CUDA_R_32F && !tf32_ ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  check(cublasGemmEx(blas_, c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                     c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, c.m, c.n, c.k, &alpha, c.a, c.ab_type,
                     c.lda, c.b, c.ab_type, c.ldb, &c.beta, c.d, c.d_type, c.ldd, compute,
                     CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

}  // namespace cuda

}  // namespace mpiformer
