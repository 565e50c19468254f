// Stands in for kernels/cuda/common.cuh in the emulation tests (flash
// attention, warp layer norm, cross entropy, the GEMM search's digest),
// which put this directory first on their include path: the CUDA built-ins
// their kernels use, emulated on the CPU, so that the device code runs
// where no GPU is. A block's CUDA threads are std::threads; __syncthreads
// is a barrier of the block, __shfl_xor_sync an exchange through a buffer
// between two barriers of the warp, atomicAdd an atomic add. Shared memory
// is filled with NaN before each block, so a read before a write shows.
// fp32 and bf16 only.
#pragma once

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernels/dtype.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __launch_bounds__(...)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) {
  return float4{x, y, z, w};
}
inline int min(int a, int b) {
  return a < b ? a : b;
}

struct __nv_bfloat16 {
  uint16_t bits;
};

namespace emulated {

struct Index {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local Index thread_index, block_index;
inline dim3 block_dim, grid_dim;
inline std::barrier<>* block_barrier = nullptr;
inline bool copies_land_at_issue = false;  // cp.async (below)
// prefetch_l2's addresses, where a test collects them (from one thread,
// outside a launch); null: none kept.
inline std::vector<uintptr_t>* prefetched = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;  // one per warp
inline float shuffle_buffer[32][32];                                // [warp][lane]

// body() as every CUDA thread of every block of `grid`, a block at a time,
// on `threads` std::threads; shared: the kernels' dynamic shared memory.
template <typename Body>
void launch(dim3 grid, int threads, float* shared, size_t shared_floats, Body body) {
  grid_dim = grid;
  block_dim = dim3(threads);
  std::barrier<> block(threads);
  block_barrier = &block;
  warp_barriers.clear();
  for (int w = 0; w < (threads + 31) / 32; ++w)
    warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      thread_index = Index{static_cast<unsigned>(t), 0, 0};
      for (unsigned by = 0; by < grid.y; ++by) {
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          if (t == 0) {
            for (size_t i = 0; i < shared_floats; ++i) shared[i] = std::nanf("");
          }
          block_index = Index{bx, by, 0};
          block.arrive_and_wait();
          body();
          block.arrive_and_wait();
        }
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
}

// A test's values as the kernels store them (T: float or __nv_bfloat16,
// round to nearest even) and widened back.
template <typename T>
T stored(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return T{mpiformer::float_to_bf16(x)};
}
template <typename T>
float widened(T x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return mpiformer::bf16_to_float(x.bits);
}

}  // namespace emulated

#define threadIdx emulated::thread_index
#define blockIdx emulated::block_index
#define blockDim emulated::block_dim
#define gridDim emulated::grid_dim

inline void __syncthreads() {
  emulated::block_barrier->arrive_and_wait();
}

// Every lane of the warp takes part.
inline void __syncwarp() {
  emulated::warp_barriers[threadIdx.x / 32]->arrive_and_wait();
}

// Every lane of the warp takes part (the kernels' shuffles are all full).
inline float __shfl_xor_sync(unsigned mask, float x, int lanes) {
  if (mask != 0xffffffffu) std::abort();
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  emulated::shuffle_buffer[warp][lane] = x;
  emulated::warp_barriers[warp]->arrive_and_wait();
  const float other = emulated::shuffle_buffer[warp][lane ^ lanes];
  emulated::warp_barriers[warp]->arrive_and_wait();
  return other;
}
// 64-bit atomic add, as the digest kernel uses it (kernels/cuda/digest_kernels.cuh).
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}

inline int __shfl_xor_sync(unsigned mask, int x, int lanes) {
  float bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits = __shfl_xor_sync(mask, bits, lanes);
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

namespace mpiformer::cuda {

inline float load(const float* p, size_t i) {
  return p[i];
}
inline float load(const __nv_bfloat16* p, size_t i) {
  return bf16_to_float(p[i].bits);
}
inline void store(float* p, size_t i, float v) {
  p[i] = v;
}
inline void store(__nv_bfloat16* p, size_t i, float v) {
  p[i].bits = float_to_bf16(v);
}

// 16 bytes of T, element by element (the device loads them at once).
template <typename T>
constexpr int kVecSize = 16 / sizeof(T);
template <typename T>
inline void load_vec(const T* p, float* out) {
  for (int k = 0; k < kVecSize<T>; ++k) out[k] = load(p, k);
}
template <typename T>
inline void store_vec(T* p, const float* v) {
  for (int k = 0; k < kVecSize<T>; ++k) store(p, k, v[k]);
}
inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
template <typename T>
inline int vectorized_prefix(const T* p, int n) {
  return aligned16(p) ? n / kVecSize<T> * kVecSize<T> : 0;
}

// L2's prefetch: a hint, nothing to emulate; the addresses asked for are
// kept where a test collects them (emulated::prefetched).
inline void prefetch_l2(const void* p) {
  if (::emulated::prefetched) ::emulated::prefetched->push_back(reinterpret_cast<uintptr_t>(p));
}

// The SFU's 2^x, subnormal results flushed to 0 as the GPU's
// ex2.approx.ftz flushes them (its last bits are the GPU's own).
inline float exp2_ftz(float x) {
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}

// cp.async's copies into shared memory, each thread's held back in groups
// until a wait lets them land (the latest a GPU may make them), so that a
// read of a buffer before its wait sees what was there before; or, with
// emulated::copies_land_at_issue, at once (the earliest), so that a copy
// into a buffer that another thread still reads spoils what it reads.
// A copy of 16 bytes into shared memory, its first `bytes` from src and
// the rest zeroed (copy_async_16_zero_fill's tail).
struct PendingCopy {
  void* dst;
  const void* src;
  int bytes;
  void land() const {
    std::memcpy(dst, src, bytes);
    std::memset(static_cast<unsigned char*>(dst) + bytes, 0, 16 - bytes);
  }
};
inline thread_local std::vector<std::vector<PendingCopy>> pending_groups;
inline thread_local std::vector<PendingCopy> open_group;
inline void copy_async_16_zero_fill(void* shared_dst, const void* global_src, int bytes) {
  const PendingCopy copy{shared_dst, global_src, bytes};
  if (emulated::copies_land_at_issue)
    copy.land();
  else
    open_group.push_back(copy);
}
inline void copy_async_16(void* shared_dst, const void* global_src) {
  copy_async_16_zero_fill(shared_dst, global_src, 16);
}
inline void copy_async_commit() {
  pending_groups.push_back(std::move(open_group));
  open_group.clear();
}
template <int N>
inline void copy_async_wait() {
  while (pending_groups.size() > N) {
    for (const PendingCopy& c : pending_groups.front()) c.land();
    pending_groups.erase(pending_groups.begin());
  }
}

}  // namespace mpiformer::cuda
