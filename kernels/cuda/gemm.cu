// cuBLASLt with fused epilogues for the CUDA backend (gemm.h): algorithms
// chosen once per shape and cached (cuBLASLt's first suggestion, or with
// the timed search the fastest of several), cublasGemmEx where it has none.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/digest_kernels.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/gemm_search.h"

namespace mpiformer {

namespace cuda {

namespace {

// The epilogues matmul.cu asks for, by name.
const char* epilogue_name(cublasLtEpilogue_t epilogue) {
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX:
      return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU:
      return "DGELU";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "BGRADB";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
      return "DGELU_BGRAD";
    default:
      return "epilogue";
  }
}

// Hopper's kernels want up to 32 MiB (NVIDIA's recommendation for sm_90).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// The timed search (set_timed_search): cuBLASLt's suggestions asked for,
// and each one's timed runs after an untimed warm-up (whose outputs'
// digest, in deterministic runs, must match the first suggestion's). A
// shape is searched on its second call, so that a shape met once (ragged
// batches give a new token count at almost every step) costs no search,
// and at most kMostSearches shapes are searched in all.
constexpr int kCandidates = 16;
constexpr int kTimedRuns = 3;
constexpr int kSearchOnCall = 2;
constexpr int kMostSearches = 64;

// Whether two algorithms are the same (cuBLASLt's opaque bytes).
bool same_algo(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// The largest power of two up to 256 that divides the address: what
// cuBLASLt may assume of a pointer.
int alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// Bytes per element of a type cuda_type gives.
size_t element_bytes(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : 2;
}

// What cuBLASLt may assume of every matrix of a batch `stride` elements of
// `bytes` each apart: the base pointer's alignment, and the stride's.
int alignment_of(const void* p, int batch, int stride, size_t bytes) {
  const int base = alignment_of(p);
  if (batch <= 1) return base;
  const size_t stride_bytes = size_t(stride) * bytes;
  int a = base;
  while (a > 1 && stride_bytes % a != 0) a /= 2;
  return a;
}

// The elements a column-major rows x cols matrix with leading dimension ld
// spans, from its first to its last.
size_t span(int ld, int rows, int cols) {
  return cols > 0 ? size_t(ld) * size_t(cols - 1) + size_t(rows) : 0;
}

// The alignments of A, B and D, every matrix of a batch.
int align_a(const GemmCall& c) {
  return alignment_of(c.a, c.batch, c.stride_a, element_bytes(c.ab_type));
}
int align_b(const GemmCall& c) {
  return alignment_of(c.b, c.batch, c.stride_b, element_bytes(c.ab_type));
}
int align_d(const GemmCall& c) {
  return alignment_of(c.d, c.batch, c.stride_d, element_bytes(c.d_type));
}

// The elements D spans, every matrix of a batch.
size_t d_span(const GemmCall& c) {
  return size_t(c.stride_d) * size_t(c.batch - 1) + span(c.ldd, c.m, c.n);
}

// A layout as `batch` matrices `stride` elements apart.
void set_batch(cublasLtMatrixLayout_t layout, int batch, int stride) {
  const int32_t count = batch;
  const int64_t offset = stride;
  check(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                         sizeof count),
        "cublasLtMatrixLayoutSetAttribute");
  check(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                         &offset, sizeof offset),
        "cublasLtMatrixLayoutSetAttribute");
}

}  // namespace

void add_bits_digest(const void* data, size_t bytes, uint64_t first_index,
                     unsigned long long* total, cudaStream_t stream) {
  const size_t units = bytes / 2;
  if (units == 0) return;
  bits_digest_kernel<<<digest_blocks(units), kDigestThreads, 0, stream>>>(
      static_cast<const uint16_t*>(data), units, first_index, total);
  check(cudaGetLastError(), "bits_digest_kernel");
}

uint64_t spans_digest(const std::vector<DigestSpan>& spans, unsigned long long** total,
                      cudaStream_t stream) {
  if (!*total) check(cudaMalloc(total, sizeof **total), "cudaMalloc (search digest)");
  check(cudaMemsetAsync(*total, 0, sizeof **total, stream), "cudaMemsetAsync");
  for (const DigestSpan& s : spans) add_bits_digest(s.data, s.bytes, s.first_index, *total, stream);
  unsigned long long sum = 0;
  check(cudaMemcpyAsync(&sum, *total, sizeof sum, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (search digest)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return sum;
}

TimingEvents::TimingEvents() {
  check(cudaEventCreate(&start), "cudaEventCreate");
  if (const cudaError_t status = cudaEventCreate(&stop); status != cudaSuccess) {
    cudaEventDestroy(start);  // no destructor runs after a constructor throws
    check(status, "cudaEventCreate");
  }
}

TimingEvents::~TimingEvents() {
  if (stop) cudaEventDestroy(stop);
  if (start) cudaEventDestroy(start);
}

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
  // accumulate (beta != 0): the timed search checked the bits under one of
  // the two, and an algorithm's order of sums may keep them under one alone.
  int trans_a, trans_b, m, n, k, lda, ldb, ldd, ab_type, d_type, epilogue, aux_ld, accumulate,
      fp32_bias;
  int batch, stride_a, stride_b, stride_d, bias_stride;
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
  int calls = 0;          // the shape's calls so far
  bool searched = false;  // the timed search has had its turn
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
  main_stream_ = blas_stream_ = ops_.stream();
  check(cublasSetStream(blas_, blas_stream_), "cublasSetStream");
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
  if (digest_total_) cudaFree(digest_total_);
  if (workspace_) cudaFree(workspace_);
  if (side_workspace_) cudaFree(side_workspace_);
  if (blas_) cublasDestroy(blas_);
  if (lt_) cublasLtDestroy(lt_);
}

std::string Gemm::unfused_summary() const {
  if (unfused_.empty()) return "";
  std::string text =
      std::to_string(unfused_.size()) + (unfused_.size() == 1 ? " shape" : " shapes");
  const char* separator = ": ";
  for (const std::string& shape : unfused_) {
    text += separator + shape;
    separator = ", ";
  }
  return text;
}

void Gemm::set_timed_search(bool timed) {
  if (timed == timed_) return;
  timed_ = timed;
  drop_plans();
}

void Gemm::set_deterministic(bool deterministic) {
  if (deterministic == same_bits_) return;
  same_bits_ = deterministic;
  if (timed_) drop_plans();
}

void Gemm::drop_plans() {
  // The plans made the other way keep their algorithms: plan every shape again.
  for (auto& [key, plan] : plans_) delete plan;
  plans_.clear();
}

std::string Gemm::timed_search_summary() const {
  if (shapes_timed_ == 0) return "";
  std::string text =
      "timed " + std::to_string(shapes_timed_) + " GEMM shape" + (shapes_timed_ == 1 ? "" : "s");
  if (same_bits_) {
    text += " keeping the bits of cuBLASLt's first choice (" + std::to_string(other_bits_) +
            " of " + std::to_string(suggestions_) + " suggestions set aside for other bits)";
  } else {
    text += ", any bits";
  }
  text += "; its first choice was fastest in " + std::to_string(heuristic_kept_);
  if (searches_skipped_ > 0)
    text += "; " + std::to_string(searches_skipped_) + " more shapes kept it untimed (at most " +
            std::to_string(kMostSearches) + " searches)";
  return text;
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
                    c.beta != 0.0f,
                    c.fp32_bias,
                    c.batch,
                    c.stride_a,
                    c.stride_b,
                    c.stride_d,
                    c.bias_stride,
                    align_a(c),
                    align_b(c),
                    align_d(c),
                    c.bias ? alignment_of(c.bias) : 0,
                    c.aux ? alignment_of(c.aux) : 0};
  const std::string text = key.text();
  Plan* plan = plans_[text];
  if (!plan) {
    plan = plans_[text] = new Plan;
    make_descriptors(c, *plan);
    // cuBLASLt's first suggestion, until a timed search picks another.
    const std::vector<cublasLtMatmulAlgo_t> algos = heuristics(c, *plan, 1);
    plan->supported = !algos.empty();
    if (plan->supported) plan->algo = algos[0];
  }
  ++plan->calls;
  if (timed_ && plan->supported && !plan->searched && plan->calls == kSearchOnCall)
    search(c, *plan);
  return plan;
}

void Gemm::make_descriptors(const GemmCall& c, Plan& plan) {
  const bool fp32 = c.ab_type == CUDA_R_32F;
  const cublasComputeType_t compute =
      fp32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check(cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t size) {
    check(cublasLtMatmulDescSetAttribute(plan.desc, attr, value, size),
          "cublasLtMatmulDescSetAttribute");
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a);
  set(CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b);
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epilogue, sizeof c.epilogue);
  if (c.bias) {
    // The bias (or its gradient) has D's type, as cuBLASLt requires outside
    // fp8, unless the call asks for fp32 (where cuBLASLt has an algorithm).
    const cudaDataType_t bias_type = c.fp32_bias ? CUDA_R_32F : c.d_type;
    set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof c.bias);
    if (c.batch > 1) {
      const int64_t stride = c.bias_stride;
      set(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &stride, sizeof stride);
    }
  }
  if (c.aux) {
    const int64_t ld = c.aux_ld;
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.aux, sizeof c.aux);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
  }
  // Layouts as stored, before op(): A is m x k unless transposed, and so on.
  check(cublasLtMatrixLayoutCreate(&plan.a, c.ab_type, c.trans_a ? c.k : c.m, c.trans_a ? c.m : c.k,
                                   c.lda),
        "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&plan.b, c.ab_type, c.trans_b ? c.n : c.k, c.trans_b ? c.k : c.n,
                                   c.ldb),
        "cublasLtMatrixLayoutCreate");
  check(cublasLtMatrixLayoutCreate(&plan.d, c.d_type, c.m, c.n, c.ldd),
        "cublasLtMatrixLayoutCreate");
  if (c.batch > 1) {
    set_batch(plan.a, c.batch, c.stride_a);
    set_batch(plan.b, c.batch, c.stride_b);
    set_batch(plan.d, c.batch, c.stride_d);
  }
}

std::vector<cublasLtMatmulAlgo_t> Gemm::heuristics(const GemmCall& c, const Plan& plan,
                                                   int requested) {
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = workspace_bytes_;
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, sizeof workspace),
        "cublasLtMatmulPreferenceSetAttribute");
  // C is D (in place), so both have D's alignment.
  const uint32_t align[4] = {static_cast<uint32_t>(align_a(c)), static_cast<uint32_t>(align_b(c)),
                             static_cast<uint32_t>(align_d(c)), static_cast<uint32_t>(align_d(c))};
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    check(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]),
          "cublasLtMatmulPreferenceSetAttribute");
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(requested);
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      lt_, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, requested, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (status != CUBLAS_STATUS_SUCCESS) return algos;
  for (int i = 0; i < found; ++i) {
    const cublasLtMatmulHeuristicResult_t& r = results[i];
    if (r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= workspace) algos.push_back(r.algo);
  }
  return algos;
}

void Gemm::search(const GemmCall& c, Plan& plan) {
  plan.searched = true;
  if (shapes_timed_ + searches_failed_ >= kMostSearches) {
    ++searches_skipped_;
    return;
  }
  // The algorithm in use first (the bits to keep), then cuBLASLt's others.
  std::vector<cublasLtMatmulAlgo_t> algos = {plan.algo};
  for (const cublasLtMatmulAlgo_t& algo : heuristics(c, plan, kCandidates))
    if (!same_algo(algo, plan.algo)) algos.push_back(algo);
  if (algos.size() < 2) return;  // nothing to choose between
  ops_.finish_side_stream();     // no weight gradient beside the trials
  const int best = time_candidates(c, plan, algos);
  if (best < 0) {
    ++searches_failed_;  // none could be timed: the first stays
    return;
  }
  ++shapes_timed_;
  if (best == 0) ++heuristic_kept_;
  plan.algo = algos[best];
}

int Gemm::time_candidates(const GemmCall& c, const Plan& plan,
                          const std::vector<cublasLtMatmulAlgo_t>& algos) {
  // The real call follows and overwrites what the trials write (D, aux, the
  // bias gradient), except a D it accumulates into (beta != 0): then the
  // trials accumulate in place, as the real call does (an algorithm may not
  // write out of place), into a stand-in of D's size (ldd x n) that each
  // warm-up first fills with D, D untouched.
  void* out = c.d;
  const bool stand_in = c.beta != 0.0f;
  const size_t out_bytes = d_span(c) * element_bytes(c.d_type);
  if (stand_in && cudaMalloc(&out, out_bytes) != cudaSuccess) {
    cudaGetLastError();  // no room to time: keep cuBLASLt's first, the error cleared
    return -1;
  }
  if (stand_in) ops_.cuda_device().count_workspace(out_bytes);
  point_at(plan, c);
  const TimingEvents events;
  std::vector<gemm_search::Trial> trials;
  for (size_t i = 0; i < algos.size(); ++i) {
    gemm_search::Trial trial;
    if (stand_in) {
      check(cudaMemcpyAsync(out, c.d, out_bytes, cudaMemcpyDeviceToDevice, ops_.stream()),
            "cudaMemcpyAsync (timed search's stand-in D)");
    }
    trial.ran = trial_run(c, plan, algos[i], out);  // the warm-up, untimed (first launch, caches)
    if (trial.ran && same_bits_) trial.digest = outputs_digest(c, out);
    trials.push_back(trial);
    if (same_bits_ && !trials[0].ran) break;  // no bits to keep: cuBLASLt's first stays
    if (same_bits_ && gemm_search::other_bits(trials, i))
      ++other_bits_;  // set aside, untimed
    else if (trial.ran)
      trials[i].ms = trial_ms(c, plan, algos[i], out, events.start, events.stop);
  }
  suggestions_ += static_cast<int>(trials.size());
  if (stand_in) {
    // Trials may still be running when a candidate failed after others queued.
    check(cudaStreamSynchronize(ops_.stream()), "cudaStreamSynchronize");
    check(cudaFree(out), "cudaFree (timed search's stand-in D)");
    ops_.cuda_device().uncount_workspace(out_bytes);
  }
  return gemm_search::winner(trials, same_bits_);
}

bool Gemm::trial_run(const GemmCall& c, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                     void* out) {
  const float alpha = 1.0f;
  if (cublasLtMatmul(lt_, plan.desc, &alpha, c.a, plan.a, c.b, plan.b, &c.beta, out, plan.d, out,
                     plan.d, &algo, workspace(), workspace_bytes_,
                     ops_.stream()) == CUBLAS_STATUS_SUCCESS)
    return true;
  cudaGetLastError();  // a candidate cuBLASLt refuses is skipped; it never fails the call
  return false;
}

float Gemm::trial_ms(const GemmCall& c, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                     void* out, cudaEvent_t start, cudaEvent_t stop) {
  check(cudaEventRecord(start, ops_.stream()), "cudaEventRecord");
  for (int r = 0; r < kTimedRuns; ++r) {
    if (!trial_run(c, plan, algo, out)) return -1.0f;
  }
  check(cudaEventRecord(stop, ops_.stream()), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  return ms;
}

uint64_t Gemm::outputs_digest(const GemmCall& c, const void* out) {
  const size_t bytes = element_bytes(c.d_type);
  std::vector<DigestSpan> spans = {{out, d_span(c) * bytes, 0}};
  // The other outputs an epilogue writes: the bias gradient (BGRADB: n
  // elements, summed over k; DGELU_BGRAD: m, summed over n; its order may
  // differ too) and GELU's input.
  const size_t bias_bytes = c.fp32_bias ? 4 : bytes;
  if (c.epilogue == CUBLASLT_EPILOGUE_BGRADB)
    spans.push_back({c.bias,
                     (size_t(c.bias_stride) * size_t(c.batch - 1) + size_t(c.n)) * bias_bytes,
                     gemm_search::kOutputStride});
  if (c.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD)
    spans.push_back({c.bias,
                     (size_t(c.bias_stride) * size_t(c.batch - 1) + size_t(c.m)) * bias_bytes,
                     gemm_search::kOutputStride});
  if (c.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || c.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
    spans.push_back({c.aux, span(c.aux_ld, c.m, c.n) * bytes, 2 * gemm_search::kOutputStride});
  return spans_digest(spans, &digest_total_, ops_.stream());
}

void Gemm::point_at(const Plan& plan, const GemmCall& c) {
  // The pointers are the call's own; the plan only fixed their alignment.
  if (c.bias) {
    check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias,
                                         sizeof c.bias),
          "cublasLtMatmulDescSetAttribute");
  }
  if (c.aux) {
    check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                         &c.aux, sizeof c.aux),
          "cublasLtMatmulDescSetAttribute");
  }
}

void* Gemm::workspace() {
  if (ops_.stream() == main_stream_) return workspace_;
  if (!side_workspace_) {
    check(cudaMalloc(&side_workspace_, workspace_bytes_), "cudaMalloc (cuBLASLt workspace)");
    ops_.count_workspace(workspace_bytes_);
  }
  return side_workspace_;
}

bool Gemm::fused(const GemmCall& c) {
  if (c.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !epilogues_) return false;
  // Degenerate shapes go to cublasGemmEx (cuBLASLt's heuristics refuse some).
  const bool degenerate = c.m <= 1 || c.n <= 1 || c.k <= 1;
  Plan* plan = degenerate ? nullptr : plan_for(c);
  if (!plan || !plan->supported) {
    if (c.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
      unfused_.insert(std::string(epilogue_name(c.epilogue)) + " m " + std::to_string(c.m) + " n " +
                      std::to_string(c.n) + " k " + std::to_string(c.k));
    return false;
  }
  point_at(*plan, c);
  const float alpha = 1.0f;
  check(cublasLtMatmul(lt_, plan->desc, &alpha, c.a, plan->a, c.b, plan->b, &c.beta, c.d, plan->d,
                       c.d, plan->d, &plan->algo, workspace(), workspace_bytes_, ops_.stream()),
        "cublasLtMatmul");
  return true;
}

void Gemm::plain(const GemmCall& call) {
  if (call.batch > 1)
    throw std::logic_error("Gemm::plain: a batch of GEMMs (only fused takes one)");
  GemmCall c = call;
  c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  c.bias = nullptr;
  c.bias_stride = 0;
  c.aux = nullptr;
  c.aux_ld = 0;
  if (fused(c)) return;
  if (ops_.stream() != blas_stream_) {
    // Setting the stream drops the handle's workspace: set both.
    blas_stream_ = ops_.stream();
    check(cublasSetStream(blas_, blas_stream_), "cublasSetStream");
    check(cublasSetWorkspace(blas_, workspace(), workspace_bytes_), "cublasSetWorkspace");
  }
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
