#include "kernels/dtype.h"

#include <stdexcept>

namespace mpiformer {

const char* to_string(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "fp16";
  }
  return "?";
}

float* Act::as_f32() const {
  if (dtype != DType::kF32) {
    throw std::logic_error(std::string("fp32 data expected, got ") + to_string(dtype));
  }
  return static_cast<float*>(data);
}

uint16_t float_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;                         // NaN (CUDA's canonical one)
  if (a >= 0x477ff000u) return sign | 0x7c00u;                 // 65520 and above: infinity
  if (a >= 0x38800000u) {                                      // 2^-14 and above: normal
    uint32_t h = (a >> 13) - (112u << 10);                     // rebias 127 -> 15
    const uint32_t rest = a & 0x1fffu;                         // the 13 bits dropped
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may reach the exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (a <= 0x33000000u) return sign;  // 2^-25 and below round to zero (a tie goes to even 0)
  // Subnormal: a multiple of 2^-24. value = mantissa * 2^(exponent - 150).
  const uint32_t exponent = a >> 23;
  const uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  uint32_t h = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float value = static_cast<float>(mantissa) * 0x1p-24f;  // zero or subnormal, exact
    return sign ? -value : value;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

void widen(float* dst, const void* src, DType t, size_t n) {
  if (t == DType::kF32) {
    if (dst != src) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
#pragma omp parallel for schedule(static) if (n >= (size_t{1} << 16))
  for (size_t i = 0; i < n; ++i) dst[i] = load_as_float(src, t, i);
}

void narrow(void* dst, DType t, const float* src, size_t n) {
  if (t == DType::kF32) {
    if (dst != src) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
#pragma omp parallel for schedule(static) if (n >= (size_t{1} << 16))
  for (size_t i = 0; i < n; ++i) store_from_float(dst, t, i, src[i]);
}

}  // namespace mpiformer
