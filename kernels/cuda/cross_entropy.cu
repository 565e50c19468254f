// Label-smoothed cross entropy fused with its gradient (one block per row,
// cross_entropy_kernels.cuh; softmax and loss in fp32, the probabilities
// never stored, the gradient written over the logits). The batch's sums are
// reduced in a fixed order in device memory: no host copy, and the same
// result every run.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cross_entropy_kernels.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

using cuda::typed;
using cuda::cross_entropy::cross_entropy_kernel;
using cuda::cross_entropy::cross_entropy_staged_kernel;
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

// The shared memory a staged row of V elements takes, or 0 where a block
// cannot have that much of the `optin` bytes it may ask for (with room for
// the kernel's own 1 KiB).
size_t staged_row_bytes(DType t, int V, size_t optin) {
  const size_t bytes = (static_cast<size_t>(V) * dtype_bytes(t) + 15) / 16 * 16;
  return bytes + 1024 <= optin ? bytes : 0;
}

}  // namespace

void CudaOps::cross_entropy(Act logits, const int32_t* targets, int N, int V, float smoothing,
                            int pad_id, float grad_scale, bool compute_grad, LossSums* sums,
                            int stride) {
  if (N == 0) return;
  const double off_target = V > 1 ? static_cast<double>(smoothing) / (V - 1) : 0.0;
  auto* rows = static_cast<RowResult*>(scratch(kRowResults, sizeof(RowResult) * N));
  const size_t staged = switches_.loss == KernelSwitches::Loss::kStaged
                            ? staged_row_bytes(logits.dtype, V, shared_per_block_optin_)
                            : 0;
  const bool staging = staged > 0;
  if (switches_.loss == KernelSwitches::Loss::kStaged)
    count_candidate(CandidateCalls::kLoss, staging);
  cuda::dispatch(logits.dtype, [&](auto t) {
    using T = decltype(t);
    auto* kernel = staging ? cross_entropy_staged_kernel<T> : cross_entropy_kernel<T>;
    if (staging)
      cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(staged)),
                  "cudaFuncSetAttribute (cross_entropy, staged)");
    kernel<<<N, kThreads, staging ? staged : 0, stream_>>>(
        typed<T>(logits), targets, rows, V, stride > 0 ? stride : V, 1.0f - smoothing,
        static_cast<float>(off_target), label_smoothing_constant(smoothing, V), pad_id, grad_scale,
        compute_grad);
  });
  add_row_results_kernel<<<1, 1024, 0, stream_>>>(sums, rows, N);
  cuda::check(cudaGetLastError(), "cross_entropy");
}

}  // namespace mpiformer
