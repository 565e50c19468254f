// Block-wide sums, maxima and minima for the row kernels (one block per
// row). Every thread of the block must call them; all get the result.
#pragma once

namespace mpiformer::cuda {

template <typename T>
__device__ inline T warp_sum(T x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <typename T>
__device__ inline T warp_max(T x) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x = fmax(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// shared: at least 32 elements of T.
template <typename T>
__device__ inline T block_sum(T x, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  x = warp_sum(x);
  __syncthreads();  // shared may still be read from the previous call
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : T(0);
  return warp_sum(x);
}

template <typename T>
__device__ inline T block_max(T x, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : shared[0];
  return warp_max(x);
}

}  // namespace mpiformer::cuda
