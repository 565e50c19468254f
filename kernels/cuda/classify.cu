// The classifier's ops on the GPU: pooling a sequence's rows into one
// vector, and the multi-label ZLPR loss fused with its gradient (one block
// per row, in double like the CPU reference). Plain kernels: next to the
// encoder they are small. The loss sums are reduced in a fixed order on the
// device; the per-label counts are integer atomics, the same in any order.
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

// out[b] = the first row of sequence b, or the mean of its rows; 0 for an
// empty sequence. Rows are added in order and divided once, as on the CPU.
// out: (B, C), x: (N, C), offsets: (B+1)
template <typename T>
__global__ void pool_forward_kernel(T* out, const T* x, const int32_t* offsets, int B, int C,
                                    bool mean) {
  MPIFORMER_FOR_EACH(i, static_cast<size_t>(B) * C) {
    const size_t b = i / C, c = i % C;
    const size_t first = offsets[b];
    const int length = offsets[b + 1] - offsets[b];
    float value = 0.0f;
    if (length > 0 && !mean) {
      value = load(x, first * C + c);
    } else if (length > 0) {
      for (int r = 0; r < length; ++r) value += load(x, (first + r) * C + c);
      value /= static_cast<float>(length);
    }
    store(out, i, value);
  }
}

// One block per sequence: its rows of dx get dout[b] on the first row (cls,
// 0 elsewhere) or dout[b] / length on every row (mean).
// dx: (N, C), dout: (B, C), offsets: (B+1)
template <typename T>
__global__ void pool_backward_kernel(T* dx, const T* dout, const int32_t* offsets, int C,
                                     bool mean) {
  const size_t b = blockIdx.x;
  const size_t first = offsets[b];
  const int length = offsets[b + 1] - offsets[b];
  const float count = static_cast<float>(length);
  for (size_t j = threadIdx.x; j < static_cast<size_t>(length) * C; j += blockDim.x) {
    const size_t r = j / C, c = j % C;
    const float d = load(dout, b * C + c);
    const float value = mean ? d / count : (r == 0 ? d : 0.0f);
    store(dx, (first + r) * C + c, value);
  }
}

struct ZlprRowResult {
  double loss;
  int correct;  // predicted set == true set
};

// The weighted exponents of label i: s + log(1 - t) (the positive part, A)
// and -s + log t (the negative part, B); -inf where the weight is 0.
__device__ __forceinline__ double positive_term(float s, float t) {
  return t < 1.0f ? static_cast<double>(s) + log1p(-static_cast<double>(t)) : -INFINITY;
}
__device__ __forceinline__ double negative_term(float s, float t) {
  return t > 0.0f ? -static_cast<double>(s) + log(static_cast<double>(t)) : -INFINITY;
}

// One block per row: loss = A + B, A = log(1 + sum e^{positive terms}),
// B = log(1 + sum e^{negative terms}), each a log-sum-exp whose max is at
// least 0. With compute_grad the row becomes
// (e^{positive - A} - e^{negative - B}) * grad_scale. Each thread reads and
// writes only its own labels, so the gradient may overwrite the scores.
// logits: (B, K) rows `stride` apart, targets: (B, K), rows: (B),
// label_counts: (3 K) true positives, false positives, false negatives
template <typename T>
__global__ void zlpr_kernel(T* logits, const float* targets, ZlprRowResult* rows,
                            unsigned long long* label_counts, int K, int stride, float grad_scale,
                            bool compute_grad) {
  __shared__ double shared[32];
  __shared__ int shared_count[32];
  const size_t row = blockIdx.x;
  T* s = logits + row * stride;        // (K)
  const float* t = targets + row * K;  // (K)
  double top_pos = 0.0, top_neg = 0.0;
  int wrong = 0;
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const float si = load(s, i), ti = t[i];
    top_pos = fmax(top_pos, positive_term(si, ti));
    top_neg = fmax(top_neg, negative_term(si, ti));
    const bool predicted = si > 0.0f, truth = ti >= 0.5f;
    wrong += predicted != truth ? 1 : 0;
    if (predicted && truth) atomicAdd(&label_counts[i], 1ull);
    if (predicted && !truth) atomicAdd(&label_counts[K + i], 1ull);
    if (!predicted && truth) atomicAdd(&label_counts[2 * K + i], 1ull);
  }
  top_pos = cuda::block_max(top_pos, shared);
  top_neg = cuda::block_max(top_neg, shared);
  wrong = cuda::block_sum(wrong, shared_count);
  double sum_pos = 0.0, sum_neg = 0.0;
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const float si = load(s, i), ti = t[i];
    sum_pos += exp(positive_term(si, ti) - top_pos);  // exp(-inf) = 0: label left out
    sum_neg += exp(negative_term(si, ti) - top_neg);
  }
  sum_pos = cuda::block_sum(sum_pos, shared);
  sum_neg = cuda::block_sum(sum_neg, shared);
  // The 1 of each log(1 + ...) is e^{0 - top}.
  const double A = top_pos + log(exp(-top_pos) + sum_pos);
  const double B = top_neg + log(exp(-top_neg) + sum_neg);
  if (threadIdx.x == 0) rows[row] = ZlprRowResult{A + B, wrong == 0 ? 1 : 0};
  if (compute_grad) {
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
      const float si = load(s, i), ti = t[i];
      const double g = exp(positive_term(si, ti) - A) - exp(negative_term(si, ti) - B);
      store(s, i, static_cast<float>(g * grad_scale));
    }
  }
}

// *sums += the rows' results; one block, each thread a fixed stride of
// rows, then a fixed tree: the same order every run.  rows: (B)
__global__ void add_zlpr_rows_kernel(LossSums* sums, const ZlprRowResult* rows, int B) {
  __shared__ double shared_loss[32];
  __shared__ long long shared_count[32];
  double loss = 0.0;
  long long correct = 0;
  for (int r = threadIdx.x; r < B; r += blockDim.x) {
    loss += rows[r].loss;
    correct += rows[r].correct;
  }
  loss = cuda::block_sum(loss, shared_loss);
  correct = cuda::block_sum(correct, shared_count);
  if (threadIdx.x == 0) {
    sums->loss += loss;
    sums->nll += loss;  // not smoothed: the loss is its own nll
    sums->tokens += B;
    sums->correct += correct;
  }
}

}  // namespace

void CudaOps::pool_forward(Act out, Act x, const Ragged& rows, int C, PoolKind kind) {
  const int B = rows.batch;
  if (B == 0 || C == 0) return;
  cuda::dispatch(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    pool_forward_kernel<<<cuda::blocks_for(static_cast<size_t>(B) * C, kThreads), kThreads, 0,
                          stream_>>>(typed<T>(out), typed<T>(x), rows.device_offsets, B, C,
                                     kind == PoolKind::kMean);
  });
  cuda::check(cudaGetLastError(), "pool_forward");
}

void CudaOps::pool_backward(Act dx, Act dout, const Ragged& rows, int C, PoolKind kind) {
  const int B = rows.batch;
  if (B == 0 || rows.total == 0 || C == 0) return;
  cuda::dispatch(dx.dtype, [&](auto tag) {
    using T = decltype(tag);
    pool_backward_kernel<<<B, kThreads, 0, stream_>>>(
        typed<T>(dx), typed<T>(dout), rows.device_offsets, C, kind == PoolKind::kMean);
  });
  cuda::check(cudaGetLastError(), "pool_backward");
}

void CudaOps::zlpr_loss(Act logits, const float* targets, int B, int K, float grad_scale,
                        bool compute_grad, LossSums* sums, int64_t* label_counts, int stride) {
  if (B == 0 || K == 0) return;
  auto* rows = static_cast<ZlprRowResult*>(scratch(kRowResults, sizeof(ZlprRowResult) * B));
  // Counts only grow by 1: the unsigned atomics add the same bits as int64.
  auto* counts = reinterpret_cast<unsigned long long*>(label_counts);
  cuda::dispatch(logits.dtype, [&](auto tag) {
    using T = decltype(tag);
    zlpr_kernel<<<B, kThreads, 0, stream_>>>(typed<T>(logits), targets, rows, counts, K,
                                             stride > 0 ? stride : K, grad_scale, compute_grad);
  });
  add_zlpr_rows_kernel<<<1, 1024, 0, stream_>>>(sums, rows, B);
  cuda::check(cudaGetLastError(), "zlpr_loss");
}

}  // namespace mpiformer
