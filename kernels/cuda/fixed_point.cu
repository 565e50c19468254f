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

// fixed: (n) int64, grads: (n), out_of_range: (1)
__global__ void fixed_point_accumulate_kernel(int64_t* fixed, int64_t* out_of_range,
                                              const float* grads, size_t n, double scale,
                                              double limit) {
  __shared__ unsigned long long block_outside;
  if (threadIdx.x == 0) block_outside = 0;
  __syncthreads();
  unsigned long long outside = 0;
  MPIFORMER_FOR_EACH(i, n) {
    const double g = grads[i];
    if (fabs(g) < limit) {
      fixed[i] += __double2ll_rn(g * scale);
    } else {
      ++outside;  // also NaN
    }
  }
  if (outside) atomicAdd(&block_outside, outside);
  __syncthreads();
  if (threadIdx.x == 0 && block_outside)
    atomicAdd(reinterpret_cast<unsigned long long*>(out_of_range), block_outside);
}

// out: (n), fixed: (n), out_of_range: (1)
__global__ void fixed_point_to_float_kernel(float* out, const int64_t* fixed,
                                            const int64_t* out_of_range, size_t n, double scale) {
  const bool poisoned = *out_of_range > 0;
  MPIFORMER_FOR_EACH(i, n) {
    out[i] = poisoned ? __int_as_float(0x7fc00000)  // quiet NaN
                      : __double2float_rn(static_cast<double>(fixed[i]) * scale);
  }
}

unsigned grid_for(size_t n) {
  return std::max(1u, std::min(cuda::blocks_for(n, kThreads), 4096u));
}

}  // namespace

void CudaOps::fixed_point_accumulate(int64_t* fixed, int64_t* out_of_range, const float* grads,
                                     size_t n, int fraction_bits, int limit_bits) {
  if (n == 0) return;
  fixed_point_accumulate_kernel<<<grid_for(n), kThreads, 0, stream_>>>(
      fixed, out_of_range, grads, n, std::ldexp(1.0, fraction_bits), std::ldexp(1.0, limit_bits));
  cuda::check(cudaGetLastError(), "fixed_point_accumulate");
}

void CudaOps::fixed_point_to_float(float* out, const int64_t* fixed, const int64_t* out_of_range,
                                   size_t n, int fraction_bits) {
  if (n == 0) return;
  fixed_point_to_float_kernel<<<grid_for(n), kThreads, 0, stream_>>>(
      out, fixed, out_of_range, n, std::ldexp(1.0, -fraction_bits));
  cuda::check(cudaGetLastError(), "fixed_point_to_float");
}

}  // namespace mpiformer
