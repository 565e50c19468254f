// Element types of the compute precision (--precision) and the typed
// pointer the op interface passes them in.
//
// Master weights, their gradients and the Adam moments are always fp32
// (float*). Activations, their gradients and the compute copy of the weights
// are stored in the run's precision: fp32, bf16 or fp16. Every op computes
// in fp32 and rounds what it stores, so the CPU backend, which widens its
// inputs, runs the fp32 reference kernels and rounds its outputs, stores the
// same bits a GPU would up to the order of its sums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/dropout_mask.h"  // MPIFORMER_HOST_DEVICE

namespace mpiformer {

enum class DType : uint8_t { kF32, kBF16, kF16 };

MPIFORMER_HOST_DEVICE inline size_t dtype_bytes(DType t) {
  return t == DType::kF32 ? 4 : 2;
}
const char* to_string(DType t);

// Data in the compute precision: activations, their gradients and the
// compute copy of the weights. Plain pointer semantics; `+ n` moves by n
// elements. The shape is written beside every use, as for float*.
struct Act {
  void* data = nullptr;
  DType dtype = DType::kF32;

  Act() = default;
  Act(void* p, DType t) : data(p), dtype(t) {}
  // fp32 data (the float* of an fp32 run, or of a test).
  static Act f32(const float* p) { return Act(const_cast<float*>(p), DType::kF32); }

  explicit operator bool() const { return data != nullptr; }
  Act operator+(size_t n) const {
    return Act(data ? static_cast<char*>(data) + n * dtype_bytes(dtype) : nullptr, dtype);
  }
  // The float* of fp32 data; throws std::logic_error for another type.
  float* as_f32() const;
};

// ---- host conversions ---------------------------------------------------
// Round to nearest, ties to even, as CUDA's __float2bfloat16 and
// __float2half: the CPU backend then stores the bits a GPU stores.

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN (CUDA's canonical one)
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; subnormals
// below 2^-14; values of 65520 and above round to infinity.
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);

// One element of type `t` at p[i], widened.
inline float load_as_float(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return f16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}
// p[i] = round(value) in type `t`.
inline void store_from_float(void* p, DType t, size_t i, float value) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = value;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(value);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = float_to_f16(value);
      return;
  }
}

// dst (n) = src (n) widened / rounded.  Host memory.
void widen(float* dst, const void* src, DType t, size_t n);
void narrow(void* dst, DType t, const float* src, size_t n);

}  // namespace mpiformer
