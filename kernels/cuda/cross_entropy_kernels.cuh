// The fused cross entropy's row kernels (launched by cross_entropy.cu; run
// on the CPU by tests/cross_entropy_emulation_test.cpp, where
// tests/emulated_cuda stands in for the CUDA built-ins).
#pragma once

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer::cuda::cross_entropy {

constexpr int kThreads = 256;

// The staged kernel's dynamic shared memory: a row of logits.
extern __shared__ uint4 staged_row[];

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

// block_merge's scratch (at namespace scope, where the CPU emulation of
// the kernels also finds one per block).
static __shared__ RowState merge_scratch[32];

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

// A pad row: its gradient 0 (with compute_grad), its results 0.
// x: (V), a row of logits
template <typename T>
__device__ bool pad_row(T* x, RowResult* result, int target, int pad_id, int V, bool compute_grad) {
  if (target != pad_id) return false;
  if (compute_grad)
    for (int j = threadIdx.x; j < V; j += blockDim.x) store(x, j, 0.0f);
  if (threadIdx.x == 0) *result = RowResult{0.0, 0.0, 0, 0};
  return true;
}

// Thread 0: loss = logsumexp(x) - (1-e) x_t - e/(V-1) (sum(x) - x_t) -
// constant, and the row's other figures, from its merged state.
__device__ void write_row_result(RowResult* result, const RowState& state, float target_logit,
                                 int target, float on_target, float off_target, double constant) {
  if (threadIdx.x != 0) return;
  const double log_sum_exp = state.top + log(static_cast<double>(state.sum_exp));
  *result = RowResult{log_sum_exp - static_cast<double>(on_target) * target_logit -
                          static_cast<double>(off_target) * (state.sum - target_logit) - constant,
                      log_sum_exp - target_logit, 1, state.first == target ? 1 : 0};
}

// The row becomes (softmax - q) * grad_scale, its logits read from `from`
// (the row itself, or its copy in shared memory), elements [0, vectorized)
// in 16-byte vectors.  x, from: (V)
template <typename T>
__device__ void write_gradient(T* x, const T* from, const RowState& state, int V, int vectorized,
                               int target, float on_target, float off_target, float grad_scale) {
  constexpr int kVec = cuda::kVecSize<T>;
  const float top = state.top, prob_scale = grad_scale / state.sum_exp;
  const float off = off_target * grad_scale, on = on_target * grad_scale;
  for (int j0 = threadIdx.x * kVec; j0 < vectorized; j0 += blockDim.x * kVec) {
    float v[kVec];
    cuda::load_vec(from + j0, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      v[k] = expf(v[k] - top) * prob_scale - (j0 + k == target ? on : off);
    cuda::store_vec(x + j0, v);
  }
  for (int j = vectorized + threadIdx.x; j < V; j += blockDim.x)
    store(x, j, expf(load(from, j) - top) * prob_scale - (j == target ? on : off));
}

// With compute_grad the row becomes (softmax(x) - q) * grad_scale (0 on
// pad rows). One pass reads the row (16-byte loads, an online softmax), a
// second writes the gradient, reading the row again (from L2 while it is
// still there). logits: (N, V) rows `stride` apart, targets: (N), rows: (N)
template <typename T>
__global__ void cross_entropy_kernel(T* logits, const int32_t* targets, RowResult* rows, int V,
                                     int stride, float on_target, float off_target, double constant,
                                     int pad_id, float grad_scale, bool compute_grad) {
  constexpr int kVec = cuda::kVecSize<T>;
  const size_t row = blockIdx.x;
  T* x = logits + row * stride;
  const int target = targets[row];
  if (pad_row(x, rows + row, target, pad_id, V, compute_grad)) return;
  const int vectorized = cuda::vectorized_prefix(x, V);
  RowState state{-INFINITY, 0.0f, 0.0f, INT_MAX};
  for (int j0 = threadIdx.x * kVec; j0 < vectorized; j0 += blockDim.x * kVec) {
    float v[kVec];
    cuda::load_vec(x + j0, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) absorb(state, v[k], j0 + k);
  }
  for (int j = vectorized + threadIdx.x; j < V; j += blockDim.x) absorb(state, load(x, j), j);
  state = block_merge(state, merge_scratch);
  write_row_result(rows + row, state, load(x, target), target, on_target, off_target, constant);
  if (!compute_grad) return;
  __syncthreads();  // every thread has read x[target]
  write_gradient(x, x, state, V, vectorized, target, on_target, off_target, grad_scale);
}

// cross_entropy_kernel's sums in its order (the same bits) with the row
// kept in shared memory between the passes, so that it is read from memory
// once (MPIFORMER_KERNELS=loss=staged). Each thread has kDepth loads in
// flight: with ~100 KiB of a row per block, few blocks share an SM.
// logits: (N, V) rows `stride` apart; dynamic shared memory: the row (V)
template <typename T>
__global__ void cross_entropy_staged_kernel(T* logits, const int32_t* targets, RowResult* rows,
                                            int V, int stride, float on_target, float off_target,
                                            double constant, int pad_id, float grad_scale,
                                            bool compute_grad) {
  constexpr int kVec = cuda::kVecSize<T>, kDepth = 4;
  T* copy = reinterpret_cast<T*>(staged_row);
  const size_t row = blockIdx.x;
  T* x = logits + row * stride;
  const int target = targets[row];
  if (pad_row(x, rows + row, target, pad_id, V, compute_grad)) return;
  const int vectorized = cuda::vectorized_prefix(x, V), step = blockDim.x * kVec;
  RowState state{-INFINITY, 0.0f, 0.0f, INT_MAX};
  for (int j0 = threadIdx.x * kVec; j0 < vectorized; j0 += kDepth * step) {
    uint4 raw[kDepth];
#pragma unroll
    for (int u = 0; u < kDepth; ++u)
      if (j0 + u * step < vectorized) raw[u] = *reinterpret_cast<const uint4*>(x + j0 + u * step);
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int j = j0 + u * step;
      if (j >= vectorized) break;
      *reinterpret_cast<uint4*>(copy + j) = raw[u];
      float v[kVec];
      cuda::load_vec(reinterpret_cast<const T*>(&raw[u]), v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) absorb(state, v[k], j + k);
    }
  }
  for (int j = vectorized + threadIdx.x; j < V; j += blockDim.x) {
    copy[j] = x[j];
    absorb(state, load(copy, j), j);
  }
  state = block_merge(state, merge_scratch);  // its barriers also complete the copy
  write_row_result(rows + row, state, load(copy, target), target, on_target, off_target, constant);
  if (compute_grad)
    write_gradient(x, copy, state, V, vectorized, target, on_target, off_target, grad_scale);
}

}  // namespace mpiformer::cuda::cross_entropy
