// The exact gradient sum's conversions on the device (CPU reference:
// kernels/cpu/fixed_point.cpp). Element by element, rounding to nearest
// even as the CPU's nearbyint does; the out-of-range count is an integer
// atomic, whose result does not depend on the order of the adds.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace mpiformer {
namespace {

constexpr int kThreads = 256;

// Adds a block's count of elements out of range to *out_of_range.
__device__ void count_outside(int64_t* out_of_range, unsigned long long outside) {
  __shared__ unsigned long long block_outside;
  if (threadIdx.x == 0) block_outside = 0;
  __syncthreads();
  if (outside) atomicAdd(&block_outside, outside);
  __syncthreads();
  if (threadIdx.x == 0 && block_outside)
    atomicAdd(reinterpret_cast<unsigned long long*>(out_of_range), block_outside);
}

// fixed: (n) int64, grads: (n), out_of_range: (1). kFirst: fixed is
// written, never read.
template <bool kFirst>
__global__ void fixed_point_accumulate_kernel(int64_t* fixed, int64_t* out_of_range,
                                              const float* grads, size_t n, double scale,
                                              double limit) {
  unsigned long long outside = 0;
  MPIFORMER_FOR_EACH(i, n) {
    const double g = grads[i];
    const bool inside = fabs(g) < limit;  // false for NaN too
    const long long part = inside ? __double2ll_rn(g * scale) : 0;
    if (kFirst) {
      fixed[i] = part;
    } else {
      fixed[i] += part;
    }
    outside += inside ? 0 : 1;
  }
  count_outside(out_of_range, outside);
}

// grads: (n) in place, out_of_range: (1)
__global__ void fixed_point_round_kernel(float* grads, int64_t* out_of_range, size_t n,
                                         double scale, double unit, double limit) {
  unsigned long long outside = 0;
  MPIFORMER_FOR_EACH(i, n) {
    const double g = grads[i];
    if (fabs(g) < limit) {
      grads[i] = __double2float_rn(static_cast<double>(__double2ll_rn(g * scale)) * unit);
    } else {
      ++outside;
    }
  }
  count_outside(out_of_range, outside);
}

// out: (n), fixed: (n), out_of_range: (1)
__global__ void fixed_point_to_float_kernel(float* out, const int64_t* fixed,
                                            const int64_t* out_of_range, size_t n, double unit) {
  const bool poisoned = *out_of_range > 0;
  MPIFORMER_FOR_EACH(i, n) {
    out[i] = poisoned ? __int_as_float(0x7fc00000)  // quiet NaN
                      : __double2float_rn(static_cast<double>(fixed[i]) * unit);
  }
}

// x: (n), out_of_range: (1). Every block returns at once when nothing was
// out of range, the usual case.
__global__ void fixed_point_poison_kernel(float* x, const int64_t* out_of_range, size_t n) {
  if (*out_of_range == 0) return;
  MPIFORMER_FOR_EACH(i, n) x[i] = __int_as_float(0x7fc00000);
}

unsigned grid_for(size_t n) {
  return std::max(1u, std::min(cuda::blocks_for(n, kThreads), 4096u));
}

}  // namespace

void CudaOps::fixed_point_accumulate(int64_t* fixed, int64_t* out_of_range, const float* grads,
                                     size_t n, int fraction_bits, int limit_bits, bool first) {
  if (n == 0) return;
  const double scale = std::ldexp(1.0, fraction_bits), limit = std::ldexp(1.0, limit_bits);
  auto kernel = first ? fixed_point_accumulate_kernel<true> : fixed_point_accumulate_kernel<false>;
  kernel<<<grid_for(n), kThreads, 0, stream_>>>(fixed, out_of_range, grads, n, scale, limit);
  cuda::check(cudaGetLastError(), "fixed_point_accumulate");
}

void CudaOps::fixed_point_to_float(float* out, const int64_t* fixed, const int64_t* out_of_range,
                                   size_t n, int fraction_bits) {
  if (n == 0) return;
  fixed_point_to_float_kernel<<<grid_for(n), kThreads, 0, stream_>>>(
      out, fixed, out_of_range, n, std::ldexp(1.0, -fraction_bits));
  cuda::check(cudaGetLastError(), "fixed_point_to_float");
}

void CudaOps::fixed_point_round(float* grads, int64_t* out_of_range, size_t n, int fraction_bits,
                                int limit_bits) {
  if (n == 0) return;
  fixed_point_round_kernel<<<grid_for(n), kThreads, 0, stream_>>>(
      grads, out_of_range, n, std::ldexp(1.0, fraction_bits), std::ldexp(1.0, -fraction_bits),
      std::ldexp(1.0, limit_bits));
  cuda::check(cudaGetLastError(), "fixed_point_round");
}

void CudaOps::fixed_point_poison(float* x, const int64_t* out_of_range, size_t n) {
  if (n == 0) return;
  fixed_point_poison_kernel<<<grid_for(n), kThreads, 0, stream_>>>(x, out_of_range, n);
  cuda::check(cudaGetLastError(), "fixed_point_poison");
}

}  // namespace mpiformer
