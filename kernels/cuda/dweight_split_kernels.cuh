// The weight gradient's split (kernels/dweight_split.h) on the device: the
// kernel that adds the parts' fp32 sums into dW (and the bias gradient's
// into dbias), in their order. Also run on the CPU under emulation
// (tests/dweight_split_test.cpp).
#pragma once

#include <cstddef>

#include "kernels/cuda/common.cuh"
#include "kernels/dweight_split.h"

namespace mpiformer::cuda {

// sum[i] = add_parts(sum[i], ...) for i < count; partial: (parts, stride),
// stride >= count.
__global__ void add_split_parts_kernel(float* sum, const float* partial, size_t count,
                                       size_t stride, int parts) {
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step)
    sum[i] = dweight_split::add_parts(sum[i], partial, stride, parts, i);
}

}  // namespace mpiformer::cuda
