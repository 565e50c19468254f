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

// The pipelined kernel's dynamic shared memory: two rows of logits.
extern __shared__ uint4 staged_rows[];

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

// block_merge's and block_top_sum's scratch (at namespace scope, where the
// CPU emulation of the kernels also finds one per block).
static __shared__ RowState merge_scratch[32];
// The pipelined kernel's (row_state's) sum of exponentials' scratch.
static __shared__ float sum_scratch[32];

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
// in 16-byte vectors; shifted_exp(x) is exp(x - top), as the kernel took it
// for state.sum_exp.  x, from: (V)
template <typename T, typename ShiftedExp>
__device__ void write_gradient(T* x, const T* from, const RowState& state, int V, int vectorized,
                               int target, float on_target, float off_target, float grad_scale,
                               ShiftedExp shifted_exp) {
  constexpr int kVec = cuda::kVecSize<T>;
  const float prob_scale = grad_scale / state.sum_exp;
  const float off = off_target * grad_scale, on = on_target * grad_scale;
  for (int j0 = threadIdx.x * kVec; j0 < vectorized; j0 += blockDim.x * kVec) {
    float v[kVec];
    cuda::load_vec(from + j0, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      v[k] = shifted_exp(v[k]) * prob_scale - (j0 + k == target ? on : off);
    cuda::store_vec(x + j0, v);
  }
  for (int j = vectorized + threadIdx.x; j < V; j += blockDim.x)
    store(x, j, shifted_exp(load(from, j)) * prob_scale - (j == target ? on : off));
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
  const float top = state.top;
  write_gradient(x, x, state, V, vectorized, target, on_target, off_target, grad_scale,
                 [top](float v) { return expf(v - top); });
}

// The pipelined kernel's block (MPIFORMER_KERNELS=loss=pipelined).
constexpr int kPipelinedThreads = 1024;

// Starts copying row x into `buffer` (shared) with cp.async, as one group
// of this thread's copies: its 16-byte vectors, and the tail of fewer than
// a vector (the block's last thread, which has the fewest vectors) with
// the rest of its vector zeroed, so that no thread waits on a plain load.
// x and buffer are 16-byte aligned; buffer holds V rounded up to a vector.
// buffer, x: (V)
template <typename T>
__device__ void prefetch_row(T* buffer, const T* x, int V) {
  constexpr int kVec = cuda::kVecSize<T>;
  const int vectorized = V / kVec * kVec;
  for (int j0 = threadIdx.x * kVec; j0 < vectorized; j0 += blockDim.x * kVec)
    cuda::copy_async_16(buffer + j0, x + j0);
  if (vectorized < V && threadIdx.x == blockDim.x - 1)
    cuda::copy_async_16_zero_fill(buffer + vectorized, x + vectorized,
                                  static_cast<int>((V - vectorized) * sizeof(T)));
  cuda::copy_async_commit();
}

constexpr float kLog2e = 1.4426950408889634f;

// exp(x - top) as the pipelined kernel takes it: 2^(x log2(e) - shift),
// shift = top log2(e), with subnormal results flushed to 0 (exp2_ftz).
__device__ __forceinline__ float shifted_exp2(float x, float shift) {
  return cuda::exp2_ftz(fmaf(x, kLog2e, -shift));
}

// The largest of the block's `top`, the least `first` among the threads
// that hold it, and the sum of `sum`: merged as block_sum merges (the same
// tree, so the same bits for the sum), in one pair of barriers.  shared:
// 32 states
__device__ RowState block_top_sum(float top, int first, float sum, RowState* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  for (int round = 0; round < 2; ++round) {
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other_top = __shfl_xor_sync(0xffffffffu, top, offset);
      const int other_first = __shfl_xor_sync(0xffffffffu, first, offset);
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      first = top > other_top ? first : other_top > top ? other_first : min(first, other_first);
      top = fmaxf(top, other_top);
    }
    if (round == 1) break;
    __syncthreads();  // shared may still be read from an earlier call
    if (lane == 0) shared[warp] = RowState{top, 0.0f, sum, first};
    __syncthreads();
    const RowState s = lane < warps ? shared[lane] : RowState{-INFINITY, 0.0f, 0.0f, INT_MAX};
    top = s.top, first = s.first, sum = s.sum;
  }
  return RowState{top, 0.0f, sum, first};
}

// The pipelined kernel's figures of a row in shared memory: its largest
// logit, the first index holding it (each thread's own as it reads, its
// indices rising; NaN never counts, as in absorb) and its plain sum; then
// the sum of exp(x - top) (shifted_exp2). Each reduced over the block in a
// fixed tree.  row: (V)
template <typename T>
__device__ RowState row_state(const T* row, int V, RowState* top_scratch, float* sum_scratch) {
  constexpr int kVec = cuda::kVecSize<T>;
  const int vectorized = V / kVec * kVec;
  float mine = -INFINITY, sum = 0.0f;
  int first = INT_MAX;
  for (int j0 = threadIdx.x * kVec; j0 < vectorized; j0 += blockDim.x * kVec) {
    float v[kVec];
    cuda::load_vec(row + j0, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (v[k] > mine) mine = v[k], first = j0 + k;
      sum += v[k];
    }
  }
  for (int j = vectorized + threadIdx.x; j < V; j += blockDim.x) {
    const float v = load(row, j);
    if (v > mine) mine = v, first = j;
    sum += v;
  }
  RowState state = block_top_sum(mine, first, sum, top_scratch);
  const float shift = state.top * kLog2e;
  float sum_exp = 0.0f;
  for (int j0 = threadIdx.x * kVec; j0 < vectorized; j0 += blockDim.x * kVec) {
    float v[kVec];
    cuda::load_vec(row + j0, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum_exp += shifted_exp2(v[k], shift);
  }
  for (int j = vectorized + threadIdx.x; j < V; j += blockDim.x)
    sum_exp += shifted_exp2(load(row, j), shift);
  state.sum_exp = cuda::block_sum(sum_exp, sum_scratch);
  return state;
}

// cross_entropy_kernel's results and gradient, a block of kPipelinedThreads
// looping over rows blockIdx.x, + gridDim.x (a block per SM): each row is
// copied into shared memory while the block works on the row before, so
// it is read from memory once and the copy overlaps the arithmetic
// (MPIFORMER_KERNELS=loss=pipelined). Its own order of summing: other bits
// than cross_entropy_kernel's, the same every run. Rows start 16-byte
// aligned (cross_entropy.cu checks). logits: (N, V) rows `stride` apart,
// targets: (N), rows: (N); dynamic shared memory: two rows of `span`
// elements (V rounded up to a vector)
template <typename T>
__global__ void __launch_bounds__(kPipelinedThreads)
    cross_entropy_pipelined_kernel(T* logits, const int32_t* targets, RowResult* rows, int N, int V,
                                   int stride, int span, float on_target, float off_target,
                                   double constant, int pad_id, float grad_scale,
                                   bool compute_grad) {
  T* buffers = reinterpret_cast<T*>(staged_rows);
  // Each row's target is read with its copy, a row ahead.
  int target = 0;
  if (blockIdx.x < static_cast<unsigned>(N)) {
    prefetch_row(buffers, logits + static_cast<size_t>(blockIdx.x) * stride, V);
    target = targets[blockIdx.x];
  }
  int parity = 0;
  for (size_t r = blockIdx.x; r < static_cast<size_t>(N); r += gridDim.x, parity ^= 1) {
    const T* row = buffers + parity * span;
    const size_t next = r + gridDim.x;
    int next_target = 0;
    if (next < static_cast<size_t>(N)) {
      prefetch_row(buffers + (parity ^ 1) * span, logits + next * stride, V);
      next_target = targets[next];
      cuda::copy_async_wait<1>();  // all but the group just started: row r's
    } else {
      cuda::copy_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of row r have landed
    T* x = logits + r * stride;
    if (!pad_row(x, rows + r, target, pad_id, V, compute_grad)) {
      const RowState state = row_state(row, V, merge_scratch, sum_scratch);
      write_row_result(rows + r, state, load(row, target), target, on_target, off_target, constant);
      const float shift = state.top * kLog2e;
      if (compute_grad)
        write_gradient(x, row, state, V, V / cuda::kVecSize<T> * cuda::kVecSize<T>, target,
                       on_target, off_target, grad_scale,
                       [shift](float v) { return shifted_exp2(v, shift); });
    }
    __syncthreads();  // row r's buffer is free for the copy of row r + 2 gridDim.x
    target = next_target;
  }
}

}  // namespace mpiformer::cuda::cross_entropy
