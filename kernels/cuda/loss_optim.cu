// Label-smoothed cross entropy fused with its gradient (one block per row;
// the probabilities are never stored), AdamW and the squared norm. Sums come
// back to the host per row or per block and are added there in order, so
// results do not depend on scheduling.
#include <cmath>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

constexpr int kThreads = 256;

struct RowResult {
  double loss;  // 0 on pad rows
  int counted;  // target is not pad
  int correct;  // argmax == target (first index among ties)
};

// loss = logsumexp(x) - (1-e) x_t - e/(V-1) (sum(x) - x_t) - constant; with
// compute_grad the row becomes (softmax(x) - q) * grad_scale (0 on pad rows).
// logits: (N, V), targets: (N), rows: (N)
__global__ void cross_entropy_kernel(float* logits, const int32_t* targets, RowResult* rows, int V,
                                     float on_target, float off_target, double constant,
                                     int pad_id, float grad_scale, bool compute_grad) {
  __shared__ float shared[32];
  __shared__ int first_max;
  const size_t row = blockIdx.x;
  float* x = logits + row * V;
  const int target = targets[row];
  if (target == pad_id) {
    if (compute_grad)
      for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = 0.0f;
    if (threadIdx.x == 0) rows[row] = RowResult{0.0, 0, 0};
    return;
  }
  float top = -INFINITY, sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    top = fmaxf(top, x[j]);
    sum += x[j];
  }
  top = cuda::block_max(top, shared);
  const float sum_logits = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) first_max = V - 1;
  __syncthreads();
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    if (x[j] == top) {
      atomicMin(&first_max, j);
      break;  // later j of this thread are larger
    }
  }
  float sum_exp = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum_exp += expf(x[j] - top);
  sum_exp = cuda::block_sum(sum_exp, shared);  // its barriers also publish first_max
  const float target_logit = x[target];
  if (threadIdx.x == 0) {
    const double log_sum_exp = top + log(static_cast<double>(sum_exp));
    rows[row] = RowResult{log_sum_exp - static_cast<double>(on_target) * target_logit -
                              static_cast<double>(off_target) * (sum_logits - target_logit) -
                              constant,
                          1, first_max == target ? 1 : 0};
  }
  if (compute_grad) {
    __syncthreads();  // every thread has read x[target]
    const float prob_scale = grad_scale / sum_exp;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float q = j == target ? on_target : off_target;
      x[j] = expf(x[j] - top) * prob_scale - q * grad_scale;
    }
  }
}

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, grad_scale, inv_bias1, inv_bias2;
};

// params, grads, m, v: (n)
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, size_t n,
                             AdamWStep s) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = grads[i] * s.grad_scale;
    const float m_i = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    const float v_i = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    m[i] = m_i;
    v[i] = v_i;
    const float m_hat = m_i * s.inv_bias1, v_hat = v_i * s.inv_bias2;
    params[i] -= s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + s.weight_decay * params[i]);
  }
}

// partial[block] = sum of x[i]^2 over the block's grid-stride share.  x: (n)
__global__ void sum_squares_kernel(double* partial, const float* x, size_t n) {
  __shared__ double shared[32];
  double sum = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    sum += static_cast<double>(x[i]) * x[i];
  sum = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

}  // namespace

LossSums CudaOps::cross_entropy(float* logits, const int32_t* targets, int N, int V,
                                float smoothing, int pad_id, float grad_scale, bool compute_grad) {
  LossSums sums;
  if (N == 0) return sums;
  const double off_target = V > 1 ? static_cast<double>(smoothing) / (V - 1) : 0.0;
  auto* rows = static_cast<RowResult*>(scratch(kReduce, sizeof(RowResult) * N));
  cross_entropy_kernel<<<N, kThreads, 0, stream_>>>(
      logits, targets, rows, V, 1.0f - smoothing, static_cast<float>(off_target),
      label_smoothing_constant(smoothing, V), pad_id, grad_scale, compute_grad);
  cuda::check(cudaGetLastError(), "cross_entropy");
  std::vector<RowResult> host(N);  // (N), summed in row order as on the CPU
  copy_to_host(host.data(), rows, sizeof(RowResult) * N);
  for (const RowResult& r : host) {
    sums.loss += r.loss;
    sums.tokens += r.counted;
    sums.correct += r.correct;
  }
  return sums;
}

void CudaOps::adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                           const AdamWConfig& cfg) {
  if (n == 0) return;
  const double t = static_cast<double>(cfg.step > 1 ? cfg.step : 1);
  const AdamWStep s{cfg.lr,
                    cfg.beta1,
                    cfg.beta2,
                    cfg.eps,
                    cfg.weight_decay,
                    cfg.grad_scale,
                    static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(cfg.beta1), t))),
                    static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(cfg.beta2), t)))};
  adamw_kernel<<<cuda::blocks_for(n), kThreads, 0, stream_>>>(params, grads, m, v, n, s);
  cuda::check(cudaGetLastError(), "adamw_update");
}

double CudaOps::sum_squares(const float* x, size_t n) {
  if (n == 0) return 0.0;
  // The grid depends on n only, so the sum's order does too.
  const unsigned blocks = std::min(cuda::blocks_for(n, kThreads), 1024u);
  auto* partial = static_cast<double*>(scratch(kReduce, sizeof(double) * blocks));
  sum_squares_kernel<<<blocks, kThreads, 0, stream_>>>(partial, x, n);
  cuda::check(cudaGetLastError(), "sum_squares");
  std::vector<double> host(blocks);  // (blocks)
  copy_to_host(host.data(), partial, sizeof(double) * blocks);
  double sum = 0.0;
  for (double p : host) sum += p;
  return sum;
}

}  // namespace mpiformer
