// Label-smoothed cross entropy fused with its gradient (one block per row;
// softmax and loss in fp32, the probabilities never stored). The batch's
// sums are reduced in a fixed order in device memory: no host copy, and the
// same result every run.
#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

using cuda::load;
using cuda::store;
using cuda::typed;

constexpr int kThreads = 256;

struct RowResult {
  double loss;  // 0 on pad rows
  double nll;   // -log p(target), unsmoothed; 0 on pad rows
  int counted;  // target is not pad
  int correct;  // argmax == target (first index among ties)
};

// A thread's (then the block's) view of a row of logits: the largest, the
// sum of exp(x - top) over the elements seen, their plain sum, and the first
// index holding the largest. Merged in a fixed tree, so the row's figures
// are the same every run.
struct RowState {
  float top, sum_exp, sum;
  int first;
};

__device__ __forceinline__ void absorb(RowState& s, float x, int j) {
  if (x > s.top) {
    s.sum_exp = s.sum_exp * expf(s.top - x) + 1.0f;
    s.top = x;
    s.first = j;
  } else {
    s.sum_exp += expf(x - s.top);  // a tie keeps the earlier index
  }
  s.sum += x;
}

// Symmetric in a and b (exactly, in floating point), so every lane of a
// butterfly ends with the same result.
__device__ __forceinline__ RowState merge(const RowState& a, const RowState& b) {
  const float top = fmaxf(a.top, b.top);
  const float ea = a.top == -INFINITY ? 0.0f : a.sum_exp * expf(a.top - top);
  const float eb = b.top == -INFINITY ? 0.0f : b.sum_exp * expf(b.top - top);
  const int first = a.top > b.top ? a.first : b.top > a.top ? b.first : min(a.first, b.first);
  return RowState{top, ea + eb, a.sum + b.sum, first};
}

__device__ RowState block_merge(RowState s, RowState* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  for (int round = 0; round < 2; ++round) {
    for (int offset = 16; offset > 0; offset >>= 1) {
      const RowState other{__shfl_xor_sync(0xffffffffu, s.top, offset),
                           __shfl_xor_sync(0xffffffffu, s.sum_exp, offset),
                           __shfl_xor_sync(0xffffffffu, s.sum, offset),
                           __shfl_xor_sync(0xffffffffu, s.first, offset)};
      s = merge(s, other);
    }
    if (round == 1) break;
    __syncthreads();  // shared may still be read from an earlier call
    if (lane == 0) shared[warp] = s;
    __syncthreads();
    s = lane < warps ? shared[lane] : RowState{-INFINITY, 0.0f, 0.0f, INT_MAX};
  }
  return s;
}

// loss = logsumexp(x) - (1-e) x_t - e/(V-1) (sum(x) - x_t) - constant; with
// compute_grad the row becomes (softmax(x) - q) * grad_scale (0 on pad rows).
// One pass reads the row (16-byte loads, an online softmax), a second
// writes the gradient: the fewest bytes a row that does not fit on chip
// allows. logits: (N, V) rows `stride` apart, targets: (N), rows: (N)
template <typename T>
__global__ void cross_entropy_kernel(T* logits, const int32_t* targets, RowResult* rows, int V,
                                     int stride, float on_target, float off_target, double constant,
                                     int pad_id, float grad_scale, bool compute_grad) {
  constexpr int kVec = cuda::kVecSize<T>;
  __shared__ RowState shared[32];
  const size_t row = blockIdx.x;
  T* x = logits + row * stride;
  const int target = targets[row];
  if (target == pad_id) {
    if (compute_grad)
      for (int j = threadIdx.x; j < V; j += blockDim.x) store(x, j, 0.0f);
    if (threadIdx.x == 0) rows[row] = RowResult{0.0, 0.0, 0, 0};
    return;
  }
  const int vectorized = cuda::vectorized_prefix(x, V);
  RowState state{-INFINITY, 0.0f, 0.0f, INT_MAX};
  for (int j0 = threadIdx.x * kVec; j0 < vectorized; j0 += blockDim.x * kVec) {
    float v[kVec];
    cuda::load_vec(x + j0, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) absorb(state, v[k], j0 + k);
  }
  for (int j = vectorized + threadIdx.x; j < V; j += blockDim.x) absorb(state, load(x, j), j);
  state = block_merge(state, shared);
  const float target_logit = load(x, target);
  if (threadIdx.x == 0) {
    const double log_sum_exp = state.top + log(static_cast<double>(state.sum_exp));
    rows[row] =
        RowResult{log_sum_exp - static_cast<double>(on_target) * target_logit -
                      static_cast<double>(off_target) * (state.sum - target_logit) - constant,
                  log_sum_exp - target_logit, 1, state.first == target ? 1 : 0};
  }
  if (compute_grad) {
    __syncthreads();  // every thread has read x[target]
    const float top = state.top, prob_scale = grad_scale / state.sum_exp;
    const float off = off_target * grad_scale, on = on_target * grad_scale;
    for (int j0 = threadIdx.x * kVec; j0 < vectorized; j0 += blockDim.x * kVec) {
      float v[kVec];
      cuda::load_vec(x + j0, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        v[k] = expf(v[k] - top) * prob_scale - (j0 + k == target ? on : off);
      cuda::store_vec(x + j0, v);
    }
    for (int j = vectorized + threadIdx.x; j < V; j += blockDim.x)
      store(x, j, expf(load(x, j) - top) * prob_scale - (j == target ? on : off));
  }
}

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

}  // namespace

void CudaOps::cross_entropy(Act logits, const int32_t* targets, int N, int V, float smoothing,
                            int pad_id, float grad_scale, bool compute_grad, LossSums* sums,
                            int stride) {
  if (N == 0) return;
  const double off_target = V > 1 ? static_cast<double>(smoothing) / (V - 1) : 0.0;
  auto* rows = static_cast<RowResult*>(scratch(kRowResults, sizeof(RowResult) * N));
  cuda::dispatch(logits.dtype, [&](auto t) {
    using T = decltype(t);
    cross_entropy_kernel<<<N, kThreads, 0, stream_>>>(
        typed<T>(logits), targets, rows, V, stride > 0 ? stride : V, 1.0f - smoothing,
        static_cast<float>(off_target), label_smoothing_constant(smoothing, V), pad_id, grad_scale,
        compute_grad);
  });
  add_row_results_kernel<<<1, 1024, 0, stream_>>>(sums, rows, N);
  cuda::check(cudaGetLastError(), "cross_entropy");
}

}  // namespace mpiformer
