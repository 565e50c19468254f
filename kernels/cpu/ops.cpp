// CpuOps memory: host buffers, 64-byte aligned (a cache line, one AVX-512
// vector) and zero filled, with the running and peak byte counts; the fp32
// views of other precisions; the wall-clock op timer.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

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

void* CpuOps::allocate(size_t bytes) {
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

void CpuOps::upload(void* dst, const void* host_src, size_t bytes) {
  copy_to_device(dst, host_src, bytes);
}

void CpuOps::fill_zero(void* x, size_t bytes) {
  auto* p = static_cast<unsigned char*>(x);
  const size_t chunks = (bytes + kZeroChunk - 1) / kZeroChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c * kZeroChunk;
    std::memset(p + begin, 0, std::min(kZeroChunk, bytes - begin));
  }
}

std::unique_ptr<OpTimer> CpuOps::make_timer() {
  return std::make_unique<WallClockTimer>();
}

// ---- fp32 views -----------------------------------------------------------

CpuOps::Fp32::~Fp32() {
  for (const Stored& s : stores_) {
    for (size_t r = 0; r < s.rows; ++r) {
      narrow((s.dst + r * s.stride).data, s.dst.dtype, s.src + r * s.stride, s.width);
    }
  }
}

float* CpuOps::Fp32::slice(Act a, size_t rows, size_t stride, size_t width, bool read) {
  float* f = view(a, extent(rows, stride, width), read, false);
  if (f && a.dtype != DType::kF32) stores_.push_back({a, rows, stride, width, f});
  return f;
}

const float* CpuOps::Fp32::in(Act a, size_t n) {
  return view(a, n, true, false);
}

float* CpuOps::Fp32::temp(size_t n) {
  if (slots_used_ == ops_.widened_.size()) ops_.widened_.emplace_back();
  std::vector<float>& slot = ops_.widened_[slots_used_++];
  slot.assign(n, 0.0f);
  return slot.data();
}

float* CpuOps::Fp32::view(Act a, size_t n, bool read, bool write) {
  if (!a) return nullptr;
  if (a.dtype == DType::kF32) return static_cast<float*>(a.data);
  if (slots_used_ == ops_.widened_.size()) ops_.widened_.emplace_back();
  std::vector<float>& slot = ops_.widened_[slots_used_++];
  float* f = grow(slot, n);
  if (read) widen(f, a.data, a.dtype, n);
  if (write) stores_.push_back({a, 1, n, n, f});
  return f;
}

}  // namespace mpiformer
