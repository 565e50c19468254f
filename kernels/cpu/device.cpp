// CpuDevice (kernels/cpu/device.h): host buffers, each preceded by a header
// holding its size; the wall-clock op timer.
#include "kernels/cpu/device.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace mpiformer {
namespace {

constexpr size_t kAlignment = 64;
// Each buffer is preceded by one aligned header holding its size, so
// release() knows how many bytes leave the running count.
constexpr size_t kHeader = kAlignment;

// Bytes per task when zeroing large buffers in parallel (first touch then
// also spreads the pages over the threads that use them).
constexpr size_t kZeroChunk = size_t{1} << 20;

// Spans of ops timed by the wall clock: the CPU runs each op to completion.
class WallClockTimer final : public OpTimer {
 public:
  void begin() override { start_ = Clock::now(); }
  void end() override {
    spans_.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start_).count());
  }
  std::vector<double> span_milliseconds() override { return spans_; }
  void reset() override { spans_.clear(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
  std::vector<double> spans_;
};

}  // namespace

void* CpuDevice::allocate(size_t bytes) {
  const size_t padded = (bytes + kHeader + kAlignment - 1) / kAlignment * kAlignment;
  auto* base = static_cast<unsigned char*>(std::aligned_alloc(kAlignment, padded));
  if (base == nullptr) throw std::bad_alloc();
  std::memcpy(base, &bytes, sizeof(bytes));
  unsigned char* data = base + kHeader;
  fill_zero(data, bytes);
  current_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, current_bytes_);
  return data;
}

void CpuDevice::release(void* ptr) {
  if (ptr == nullptr) return;
  unsigned char* base = static_cast<unsigned char*>(ptr) - kHeader;
  size_t bytes = 0;
  std::memcpy(&bytes, base, sizeof(bytes));
  current_bytes_ -= bytes;
  std::free(base);
}

void CpuDevice::copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
}

void CpuDevice::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
}

void CpuDevice::upload(void* dst, const void* host_src, size_t bytes) {
  copy_to_device(dst, host_src, bytes);
}

void CpuDevice::fill_zero(void* x, size_t bytes) {
  auto* p = static_cast<unsigned char*>(x);
  const size_t chunks = (bytes + kZeroChunk - 1) / kZeroChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * kZeroChunk;
    std::memset(p + begin, 0, std::min(kZeroChunk, bytes - begin));
  }
}

std::unique_ptr<OpTimer> CpuDevice::make_timer() {
  return std::make_unique<WallClockTimer>();
}

}  // namespace mpiformer
