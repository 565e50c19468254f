// The GEMMs' timed search's digest on the device (kernels/gemm_search.h):
// each thread sums the terms of the 16-bit units it strides over and adds
// its sum to the total with one atomic add, which modulo 2^64 gives the
// same total in any order. Also run on the CPU under emulation
// (tests/gemm_search_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/gemm_search.h"

namespace mpiformer::cuda {

constexpr int kDigestThreads = 256;
constexpr int kDigestMaxBlocks = 1024;

// *total += the digest of units[0, n), numbered from first_index.
__global__ void __launch_bounds__(kDigestThreads)
    bits_digest_kernel(const uint16_t* units, size_t n, uint64_t first_index,
                       unsigned long long* total) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  uint64_t sum = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    sum += gemm_search::digest_term(first_index + i, units[i]);
  atomicAdd(total, static_cast<unsigned long long>(sum));
}

// The blocks for n units: enough to cover them once, at most kDigestMaxBlocks.
inline int digest_blocks(size_t n) {
  const size_t blocks = (n + kDigestThreads - 1) / kDigestThreads;
  return static_cast<int>(blocks < kDigestMaxBlocks ? (blocks > 0 ? blocks : 1) : kDigestMaxBlocks);
}

}  // namespace mpiformer::cuda
