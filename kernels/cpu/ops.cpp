// CpuOps's fp32 views of other precisions (kernels/cpu/ops.h).
#include "kernels/cpu/ops.h"

#include <vector>

namespace mpiformer {

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
