// Shared by the CUDA kernels: element types of the compute precision,
// loads and stores that compute in fp32, grid-stride loops, and dispatch
// from an Act's DType to a kernel templated on the element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>

#include "kernels/dtype.h"

namespace mpiformer::cuda {

// Every kernel computes in fp32 and rounds what it stores (round to nearest
// even: the CPU backend's float_to_bf16 / float_to_f16).
__device__ __forceinline__ float load(const float* p, size_t i) {
  return p[i];
}
__device__ __forceinline__ float load(const __nv_bfloat16* p, size_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float load(const __half* p, size_t i) {
  return __half2float(p[i]);
}

__device__ __forceinline__ void store(float* p, size_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void store(__nv_bfloat16* p, size_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store(__half* p, size_t i, float v) {
  p[i] = __float2half_rn(v);
}

// 16 bytes of T in one load or store (8 bf16/fp16, 4 fp32), widened to
// and rounded from fp32. p must be 16-byte aligned.
template <typename T>
constexpr int kVecSize = 16 / sizeof(T);
template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVecSize<T>; ++k) out[k] = load(e, k);
}
template <typename T>
__device__ __forceinline__ void store_vec(T* p, const float* v) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVecSize<T>; ++k) store(e, k, v[k]);
  *reinterpret_cast<uint4*>(p) = raw;
}
__device__ __forceinline__ bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
// Elements [0, vectorized_prefix(p, n)) of p may go through load_vec and
// store_vec: all of them but a tail of fewer than a vector, or none when p
// is not 16-byte aligned.
template <typename T>
__device__ __forceinline__ int vectorized_prefix(const T* p, int n) {
  return aligned16(p) ? n / kVecSize<T> * kVecSize<T> : 0;
}

// Copies of 16 bytes from global into shared memory that run while the
// thread goes on (cp.async, sm_80 on): copy_async_16 starts one (both
// addresses 16-byte aligned), copy_async_commit closes this thread's group
// of those started, copy_async_wait<n> waits until at most n of its groups
// are still in flight. Other threads see the copies after a __syncthreads
// that follows the wait.
__device__ __forceinline__ void copy_async_16(void* shared_dst, const void* global_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  const size_t src = __cvta_generic_to_global(global_src);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
#else
  *static_cast<uint4*>(shared_dst) = *static_cast<const uint4*>(global_src);
#endif
}
// copy_async_16 of a tail: the first `bytes` (0 to 16) of the 16 at
// global_src, the rest of the 16 in shared memory zeroed (cp.async's zero
// fill), so that a row's last elements of fewer than a vector come with
// its vectors, without a read past them.
__device__ __forceinline__ void copy_async_16_zero_fill(void* shared_dst, const void* global_src,
                                                        int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  const size_t src = __cvta_generic_to_global(global_src);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
#else
  auto* d = static_cast<unsigned char*>(shared_dst);
  const auto* from = static_cast<const unsigned char*>(global_src);
  for (int i = 0; i < 16; ++i) d[i] = i < bytes ? from[i] : 0;
#endif
}
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// A hint that the 128-byte line at p be brought into L2 (it changes no
// value; callers pass an address in a line of their operands): a later
// load of it waits on L2, not on memory.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p)));
#endif
}

// 2^x on the SFU alone (ex2.approx.ftz: about 2 ulp, subnormal inputs
// and results flushed to 0), without the instructions exp2f adds to keep
// subnormals.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The element type of an Act, as a typed pointer.
template <typename T>
T* typed(Act a) {
  return static_cast<T*>(a.data);
}

// Calls fn(T{}) with T the element type of `dtype` (float, __nv_bfloat16 or
// __half), so a launcher picks the kernel instantiation at run time.
template <typename Fn>
void dispatch(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      fn(float{});
      return;
    case DType::kBF16:
      fn(__nv_bfloat16{});
      return;
    case DType::kF16:
      fn(__half{});
      return;
  }
  throw std::logic_error("unknown DType");
}

// Grid-stride loop over [0, n): any n with a bounded grid.
#define MPIFORMER_FOR_EACH(i, n)                                                       \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

// GELU, tanh approximation as in GPT-2 (the CPU backend's formula), and its
// derivative: d/dx 0.5 x (1 + tanh u), u = c (x + a x^3).
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluC * (x + kGeluA * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float t = tanhf(kGeluC * (x + kGeluA * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
}

}  // namespace mpiformer::cuda
