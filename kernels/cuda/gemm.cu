// The CUDA backend's dense layers on cuBLASLt (gemm.h), with the row-major
// to column-major mapping of every GEMM, and the kernels that stand in for
// an epilogue cuBLASLt cannot fuse.
//
// Row-major x (N, IC) is column-major IC x N (ld IC), W (OC, IC) is IC x OC
// (ld IC), out (N, OC) is OC x N (ld OC, or the padded stride). So
//   out^T (OC x N) = W^T x^T:   A = W (transposed), B = x,      m OC, n N, k IC
//   dx^T  (IC x N) = W dout^T:  A = W,              B = dout,   m IC, n N, k OC
//   dW^T  (IC x OC) += x^T dout: A = x,             B = dout^T, m IC, n OC, k N
// and the bias gradient of the dW GEMM (BGRADB) sums B over k: over tokens.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace cuda {

namespace {

// Hopper's kernels want up to 32 MiB (NVIDIA's recommendation for sm_90).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

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

// The largest power of two up to 256 that divides the address: what
// cuBLASLt may assume of a pointer.
int alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

}  // namespace

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

// ---- the backend's GEMM ops -------------------------------------------------

namespace {

using cuda::load;
using cuda::store;
using cuda::typed;

constexpr int kThreads = 256;
// Rows per block of the column sums (bias gradients): partial sums per block
// of rows, then across blocks in order, so the sum never depends on timing.
constexpr int kRowBlock = 64;

// out[r, c] += bias[c] (rows `ld` apart).  out: (N, OC), bias: (OC)
template <typename T>
__global__ void add_bias_kernel(T* out, const T* bias, int N, int OC, int ld) {
  MPIFORMER_FOR_EACH(i, static_cast<size_t>(N) * OC) {
    const size_t r = i / OC, c = i % OC;
    store(out, r * ld + c, load(out, r * ld + c) + load(bias, c));
  }
}

// out = act(pre).  pre: (N, OC) dense, out: (N, OC) rows ldo apart
template <typename T>
__global__ void activation_kernel(T* out, const T* pre, int N, int OC, int ldo, bool gelu) {
  MPIFORMER_FOR_EACH(i, static_cast<size_t>(N) * OC) {
    const float x = load(pre, i);
    const size_t r = i / OC, c = i % OC;
    store(out, r * ldo + c, gelu ? cuda::gelu(x) : fmaxf(x, 0.0f));
  }
}

// dx = act'(pre) * dx in place.  dx, pre: (n)
template <typename T>
__global__ void activation_grad_kernel(T* dx, const T* pre, size_t n, bool gelu) {
  MPIFORMER_FOR_EACH(i, n) {
    const float x = load(pre, i);
    store(dx, i, (gelu ? cuda::gelu_grad(x) : (x > 0.0f ? 1.0f : 0.0f)) * load(dx, i));
  }
}

// partial[b][c] = sum of src[r][c] over block b's rows.  src: (N, C) rows
// ld apart, partial: (blocks, C)
template <typename T>
__global__ void column_partial_kernel(float* partial, const T* src, int N, int C, int ld) {
  const int r0 = blockIdx.y * kRowBlock, r1 = min(N, r0 + kRowBlock);
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    float sum = 0.0f;
    for (int r = r0; r < r1; ++r) sum += load(src, static_cast<size_t>(r) * ld + c);
    partial[static_cast<size_t>(blockIdx.y) * C + c] = sum;
  }
}

// dst[c] += sum over blocks of partial[b][c], in block order.
__global__ void column_total_kernel(float* dst, const float* partial, int blocks, int C) {
  MPIFORMER_FOR_EACH(c, static_cast<size_t>(C)) {
    float sum = 0.0f;
    for (int b = 0; b < blocks; ++b) sum += partial[static_cast<size_t>(b) * C + c];
    dst[c] += sum;
  }
}

// dst += src.  dst, src: (n)
__global__ void add_kernel(float* dst, const float* src, size_t n) {
  MPIFORMER_FOR_EACH(i, n) dst[i] += src[i];
}

// The output features of a wide layer whose count is not a multiple of 8
// run as an aligned part and a tail of fewer than 8: with an odd OC (GPT-2's
// 50257 tokens) every contiguous extent of the logits and of their
// gradient is odd, and cuBLASLt then picks kernels 3 to 7 times slower on
// an H100 than for 50256 (the vocabulary GEMMs ran at 93 and 197 TFLOP/s).
// returns: the aligned part's OC (OC itself when no split pays)
int aligned_features(int OC) {
  constexpr int kSplitFrom = 256;
  return OC >= kSplitFrom && OC % 8 != 0 ? OC / 8 * 8 : OC;
}

}  // namespace

void CudaOps::add_column_sums(float* dst, Act src, int N, int C, int stride) {
  if (N == 0 || C == 0) return;
  const int blocks = (N + kRowBlock - 1) / kRowBlock;
  auto* partial =
      static_cast<float*>(scratch(kColumnSums, sizeof(float) * static_cast<size_t>(blocks) * C));
  const dim3 grid((C + kThreads - 1) / kThreads, blocks);
  cuda::dispatch(src.dtype, [&](auto t) {
    using T = decltype(t);
    column_partial_kernel<<<grid, kThreads, 0, stream_>>>(partial, typed<T>(src), N, C, stride);
  });
  column_total_kernel<<<cuda::blocks_for(C), kThreads, 0, stream_>>>(dst, partial, blocks, C);
  cuda::check(cudaGetLastError(), "column sums");
}

void CudaOps::matmul_forward(Act out, Act x, Act weight, Act bias, int N, int IC, int OC,
                             const FusedActivation& fused, int out_stride) {
  if (N == 0 || OC == 0) return;
  const int ldo = out_stride > 0 ? out_stride : OC;
  if (const int head = aligned_features(OC); head < OC && !fused.pre) {
    matmul_forward(out, x, weight, bias, N, IC, head, {}, ldo);
    matmul_forward(out + head, x, weight + static_cast<size_t>(head) * IC,
                   bias ? bias + head : bias, N, IC, OC - head, {}, ldo);
    return;
  }
  const cudaDataType_t type = cuda::cuda_type(out.dtype);
  // out^T (OC x N) = W^T x^T
  cuda::GemmCall call;
  call.trans_a = true;
  call.m = OC, call.n = N, call.k = IC;
  call.a = weight.data, call.lda = IC;
  call.b = x.data, call.ldb = IC;
  call.ab_type = call.d_type = type;
  const bool gelu = fused.pre && fused.act == Activation::kGelu;
  if (gelu) {
    // act(x W^T + b) into out, x W^T + b into pre (ld OC)
    call.d = out.data, call.ldd = ldo;
    call.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    call.bias = bias.data;
    call.aux = fused.pre.data, call.aux_ld = OC;
    if (gemm_->fused(call)) return;
  } else if (!fused.pre) {
    call.d = out.data, call.ldd = ldo;
    if (bias) {
      call.epilogue = CUBLASLT_EPILOGUE_BIAS;
      call.bias = bias.data;
    }
    if (gemm_->fused(call)) return;
  }
  // Unfused: the GEMM into pre (or out), then the bias and the activation.
  const Act target = fused.pre ? fused.pre : out;
  const int ld = fused.pre ? OC : ldo;
  call.d = target.data, call.ldd = ld;
  gemm_->plain(call);
  cuda::dispatch(out.dtype, [&](auto t) {
    using T = decltype(t);
    if (bias) {
      add_bias_kernel<<<cuda::blocks_for(static_cast<size_t>(N) * OC), kThreads, 0, stream_>>>(
          typed<T>(target), typed<T>(bias), N, OC, ld);
    }
    if (fused.pre) {
      const size_t n = static_cast<size_t>(N) * OC;
      activation_kernel<<<cuda::blocks_for(n), kThreads, 0, stream_>>>(
          typed<T>(out), typed<T>(fused.pre), N, OC, ldo, fused.act == Activation::kGelu);
    }
  });
  cuda::check(cudaGetLastError(), "matmul_forward (epilogue)");
}

void CudaOps::matmul_backward(Act dx, float* dweight, float* dbias, Act dout, Act x, Act weight,
                              int N, int IC, int OC, bool accumulate, const FusedActivation& fused,
                              int dout_stride) {
  if (N == 0) return;
  const int ldd = dout_stride > 0 ? dout_stride : OC;
  if (const int head = aligned_features(OC); head < OC && !fused.pre) {
    // dx sums over the features: the tail's share is added to the head's.
    matmul_backward(dx, dweight, dbias, dout, x, weight, N, IC, head, accumulate, {}, ldd);
    matmul_backward(dx, dweight + static_cast<size_t>(head) * IC, dbias ? dbias + head : nullptr,
                    dout + head, x, weight + static_cast<size_t>(head) * IC, N, IC, OC - head, true,
                    {}, ldd);
    return;
  }
  const cudaDataType_t type = cuda::cuda_type(dout.dtype);
  if (dx) {
    // dx^T (IC x N) = W dout^T
    cuda::GemmCall call;
    call.m = IC, call.n = N, call.k = OC;
    call.a = weight.data, call.lda = IC;
    call.b = dout.data, call.ldb = ldd;
    call.d = dx.data, call.ldd = IC;
    call.ab_type = call.d_type = type;
    call.beta = accumulate ? 1.0f : 0.0f;
    bool done = false;
    if (fused.pre && fused.act == Activation::kGelu && !accumulate) {
      call.epilogue = CUBLASLT_EPILOGUE_DGELU;
      call.aux = fused.pre.data, call.aux_ld = IC;
      done = gemm_->fused(call);
    } else if (!fused.pre) {
      done = gemm_->fused(call);
    }
    if (!done) {
      gemm_->plain(call);
      if (fused.pre) {
        const size_t n = static_cast<size_t>(N) * IC;
        cuda::dispatch(dx.dtype, [&](auto t) {
          using T = decltype(t);
          activation_grad_kernel<<<cuda::blocks_for(n), kThreads, 0, stream_>>>(
              typed<T>(dx), typed<T>(fused.pre), n, fused.act == Activation::kGelu);
        });
        cuda::check(cudaGetLastError(), "matmul_backward (activation)");
      }
    }
  }
  if (OC == 0 || IC == 0) return;
  // dW^T (IC x OC) += x^T dout, fp32, with the bias gradient (a sum over
  // tokens of dout) from the same pass when cuBLASLt can fuse it.
  cuda::GemmCall call;
  call.trans_b = true;
  call.m = IC, call.n = OC, call.k = N;
  call.a = x.data, call.lda = IC;
  call.b = dout.data, call.ldb = ldd;
  call.d = dweight, call.ldd = IC;
  call.ab_type = type;
  call.d_type = CUDA_R_32F;
  call.beta = 1.0f;
  if (dbias) {
    // BGRADB writes (=) the bias gradient: to scratch, then added.
    auto* grad = static_cast<float*>(scratch(kBiasGrad, sizeof(float) * OC));
    call.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    call.bias = grad;
    if (gemm_->fused(call)) {
      add_kernel<<<cuda::blocks_for(OC), kThreads, 0, stream_>>>(dbias, grad, OC);
      cuda::check(cudaGetLastError(), "matmul_backward (bias gradient)");
      return;
    }
  }
  gemm_->plain(call);
  if (dbias) add_column_sums(dbias, dout, N, OC, ldd);
}

}  // namespace mpiformer
