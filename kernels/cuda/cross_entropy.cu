// Label-smoothed cross entropy fused with its gradient (one block per row,
// cross_entropy_kernels.cuh; softmax and loss in fp32, the probabilities
// never stored, the gradient written over the logits). The batch's sums are
// reduced in a fixed order in device memory: no host copy, and the same
// result every run.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cross_entropy_kernels.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

using cuda::typed;
using cuda::cross_entropy::cross_entropy_kernel;
using cuda::cross_entropy::cross_entropy_pipelined_kernel;
using cuda::cross_entropy::kPipelinedThreads;
using cuda::cross_entropy::kThreads;
using cuda::cross_entropy::RowResult;

// *sums += the rows' results; one block, each thread a fixed stride of
// rows, then a fixed tree: the same order every run.  rows: (N)
__global__ void add_row_results_kernel(LossSums* sums, const RowResult* rows, int N) {
  __shared__ double shared_loss[32];
  __shared__ long long shared_count[32];
  double loss = 0.0, nll = 0.0;
  long long tokens = 0, correct = 0;
  for (int r = threadIdx.x; r < N; r += blockDim.x) {
    loss += rows[r].loss;
    nll += rows[r].nll;
    tokens += rows[r].counted;
    correct += rows[r].correct;
  }
  loss = cuda::block_sum(loss, shared_loss);
  nll = cuda::block_sum(nll, shared_loss);
  tokens = cuda::block_sum(tokens, shared_count);
  correct = cuda::block_sum(correct, shared_count);
  if (threadIdx.x == 0) {
    sums->loss += loss;
    sums->nll += nll;
    sums->tokens += tokens;
    sums->correct += correct;
  }
}

// The pipelined kernel's shared memory for rows of V elements of `t` (two
// rows of span elements, V rounded up to a 16-byte vector), or 0 where a
// block cannot have that much of the `optin` bytes it may ask for (with
// room for the kernel's own 1 KiB) or the rows are not 16-byte aligned.
size_t pipelined_bytes(DType t, const void* logits, int V, int stride, size_t optin, int* span) {
  const size_t element = dtype_bytes(t), vector = 16 / element;
  *span = static_cast<int>((V + vector - 1) / vector * vector);
  const size_t bytes = 2 * static_cast<size_t>(*span) * element;
  const bool aligned =
      reinterpret_cast<uintptr_t>(logits) % 16 == 0 && (stride * element) % 16 == 0;
  return aligned && bytes + 1024 <= optin ? bytes : 0;
}

}  // namespace

void CudaOps::cross_entropy(Act logits, const int32_t* targets, int N, int V, float smoothing,
                            int pad_id, float grad_scale, bool compute_grad, LossSums* sums,
                            int stride) {
  if (N == 0) return;
  const double off_target = V > 1 ? static_cast<double>(smoothing) / (V - 1) : 0.0;
  auto* rows = static_cast<RowResult*>(scratch(kRowResults, sizeof(RowResult) * N));
  const int ld = stride > 0 ? stride : V;
  const float on_target = 1.0f - smoothing;
  const double constant = label_smoothing_constant(smoothing, V);
  if (switches_.loss == KernelSwitches::Loss::kPipelined) {
    int span = 0;
    const size_t bytes =
        pipelined_bytes(logits.dtype, logits.data, V, ld, shared_per_block_optin_, &span);
    count_candidate(CandidateCalls::kLoss, bytes > 0);
    if (bytes > 0) {
      cuda::dispatch(logits.dtype, [&](auto t) {
        using T = decltype(t);
        auto* kernel = cross_entropy_pipelined_kernel<T>;
        cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)),
                    "cudaFuncSetAttribute (cross_entropy, pipelined)");
        const int blocks = std::min(N, multiprocessors_);
        kernel<<<blocks, kPipelinedThreads, bytes, stream_>>>(
            typed<T>(logits), targets, rows, N, V, ld, span, on_target,
            static_cast<float>(off_target), constant, pad_id, grad_scale, compute_grad);
      });
      add_row_results_kernel<<<1, 1024, 0, stream_>>>(sums, rows, N);
      cuda::check(cudaGetLastError(), "cross_entropy (pipelined)");
      return;
    }
  }
  cuda::dispatch(logits.dtype, [&](auto t) {
    using T = decltype(t);
    cross_entropy_kernel<T><<<N, kThreads, 0, stream_>>>(
        typed<T>(logits), targets, rows, V, ld, on_target, static_cast<float>(off_target), constant,
        pad_id, grad_scale, compute_grad);
  });
  add_row_results_kernel<<<1, 1024, 0, stream_>>>(sums, rows, N);
  cuda::check(cudaGetLastError(), "cross_entropy");
}

}  // namespace mpiformer
