// The squared gradient norm, and AdamW over every range of the flat buffers
// in one launch with the clip decided on the device (its kernels:
// adamw_kernels.cuh). The norm is reduced in a fixed order in device
// memory: no host copy, and the same result every run.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/adamw_kernels.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace mpiformer {

namespace {

using cuda::store;
using cuda::typed;

constexpr int kThreads = 256;

// partial[block] = sum of x[i]^2 over the block's grid-stride share.  x: (n)
__global__ void sum_squares_kernel(double* partial, const float* x, size_t n) {
  __shared__ double shared[32];
  double sum = 0.0;
  MPIFORMER_FOR_EACH(i, n) sum += static_cast<double>(x[i]) * x[i];
  sum = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// partial[block] = sum of x[i]^2 over norm block blockIdx.x (one CUDA block
// per kNormBlockFloats floats, so a block's order depends on its length only).
// x: (n), partial: (norm_blocks(n))
__global__ void sum_squares_blocks_kernel(double* partial, const float* x, size_t n) {
  __shared__ double shared[32];
  const size_t begin = static_cast<size_t>(blockIdx.x) * kNormBlockFloats;
  const size_t end = begin + kNormBlockFloats < n ? begin + kNormBlockFloats : n;
  double sum = 0.0;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    sum += static_cast<double>(x[i]) * x[i];
  sum = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// *out = sum of x[0 .. n) in a tree fixed by n.  One block.  x: (n)
__global__ void sum_doubles_kernel(double* out, const double* x, size_t n) {
  __shared__ double shared[32];
  double sum = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i];
  sum = cuda::block_sum(sum, shared);
  if (threadIdx.x == 0) *out = sum;
}

}  // namespace

void CudaOps::sum_squares(double* out, const float* x, size_t n) {
  // The grid depends on n only, so the sum's order does too.
  const unsigned blocks = std::min(cuda::blocks_for(n, kThreads), 1024u);
  auto* partial = static_cast<double*>(scratch(kReduce, sizeof(double) * blocks));
  if (n > 0)
    sum_squares_kernel<<<blocks, kThreads, 0, stream_>>>(partial, x, n);
  else
    cuda::check(cudaMemsetAsync(partial, 0, sizeof(double), stream_), "cudaMemsetAsync");
  sum_doubles_kernel<<<1, 1024, 0, stream_>>>(out, partial, n > 0 ? blocks : 1);
  cuda::check(cudaGetLastError(), "sum_squares");
}

void CudaOps::sum_squares_blocks(double* partial, const float* x, size_t n) {
  const size_t blocks = norm_blocks(n);
  if (blocks == 0) return;
  sum_squares_blocks_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream_>>>(partial, x, n);
  cuda::check(cudaGetLastError(), "sum_squares_blocks");
}

void CudaOps::sum_doubles(double* out, const double* x, size_t n) {
  sum_doubles_kernel<<<1, 1024, 0, stream_>>>(out, x, n);
  cuda::check(cudaGetLastError(), "sum_doubles");
}

void CudaOps::adamw_update(float* params, const float* grads, float* m, float* v, Act compute,
                           size_t n, const AdamWRange* ranges, int range_count,
                           const AdamWConfig& cfg, const double* grad_norm_sq) {
  if (n == 0 || range_count == 0) return;
  const double t = static_cast<double>(cfg.step > 1 ? cfg.step : 1);
  const cuda::adamw::Step s{
      cfg.lr,
      cfg.beta1,
      cfg.beta2,
      cfg.eps,
      static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(cfg.beta1), t))),
      static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(cfg.beta2), t))),
      cfg.inv_loss_scale,
      cfg.max_norm};
  const unsigned grid = static_cast<unsigned>(range_count);
  // The vector kernel reads element i of each buffer as part of a float4
  // when i is a multiple of 4: every buffer 16-byte aligned (a sharded
  // optimizer's slice may not be).
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vector = switches_.adamw == KernelSwitches::AdamW::kVector && aligned(params) &&
                      aligned(grads) && aligned(m) && aligned(v);
  if (switches_.adamw == KernelSwitches::AdamW::kVector)
    count_candidate(CandidateCalls::kAdamW, vector);
  auto launch = [&](auto* compute_data) {
    using T = std::remove_pointer_t<decltype(compute_data)>;
    auto kernel = vector ? cuda::adamw::vector_kernel<T> : cuda::adamw::ranged_kernel<T>;
    kernel<<<grid, kThreads, 0, stream_>>>(params, grads, m, v, compute_data, ranges, s,
                                           grad_norm_sq);
  };
  if (!compute)
    launch(static_cast<float*>(nullptr));
  else
    cuda::dispatch(compute.dtype, [&](auto tag) { launch(typed<decltype(tag)>(compute)); });
  cuda::check(cudaGetLastError(), "adamw_update");
}

}  // namespace mpiformer
