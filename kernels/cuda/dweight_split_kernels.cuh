// The weight gradient's split (kernels/dweight_split.h) on the device: the
// kernel that adds the parts' fp32 sums into dW, in their order. Also run
// on the CPU under emulation (tests/dweight_split_test.cpp).
#pragma once

#include <cstddef>

#include "kernels/cuda/common.cuh"
#include "kernels/dweight_split.h"

namespace mpiformer::cuda {

// dweight[i] = add_parts(dweight[i], ...) for i < count; partial: (parts, count).
__global__ void add_dweight_parts_kernel(float* dweight, const float* partial, size_t count,
                                         int parts) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    dweight[i] = dweight_split::add_parts(dweight[i], partial, count, parts, i);
}

}  // namespace mpiformer::cuda
