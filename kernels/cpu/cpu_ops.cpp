// CpuOps memory: host buffers, 64-byte aligned (a cache line, one AVX-512
// vector) and zero filled, with the running and peak byte counts.
#include "kernels/cpu/cpu_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace mpiformer {
namespace {

constexpr size_t kAlignment = 64;
// Each buffer is preceded by one aligned header holding its size, so
// release() knows how many bytes leave the running count.
constexpr size_t kHeader = kAlignment;

// Elements per task when zeroing large buffers in parallel (first touch
// then also spreads the pages over the threads that use them).
constexpr size_t kZeroChunk = size_t{1} << 18;

}  // namespace

void* CpuOps::allocate(size_t bytes) {
  const size_t padded = (bytes + kHeader + kAlignment - 1) / kAlignment * kAlignment;
  auto* base = static_cast<unsigned char*>(std::aligned_alloc(kAlignment, padded));
  if (base == nullptr) throw std::bad_alloc();
  std::memcpy(base, &bytes, sizeof(bytes));
  unsigned char* data = base + kHeader;
  fill_zero(reinterpret_cast<float*>(data), bytes / sizeof(float));
  std::memset(data + bytes / sizeof(float) * sizeof(float), 0, bytes % sizeof(float));
  current_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, current_bytes_);
  return data;
}

void CpuOps::release(void* ptr) {
  if (ptr == nullptr) return;
  unsigned char* base = static_cast<unsigned char*>(ptr) - kHeader;
  size_t bytes = 0;
  std::memcpy(&bytes, base, sizeof(bytes));
  current_bytes_ -= bytes;
  std::free(base);
}

void CpuOps::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
}

void CpuOps::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
}

void CpuOps::fill_zero(float* x, size_t n) {
  const size_t chunks = (n + kZeroChunk - 1) / kZeroChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * kZeroChunk;
    std::memset(x + begin, 0, std::min(kZeroChunk, n - begin) * sizeof(float));
  }
}

}  // namespace mpiformer
