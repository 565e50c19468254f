// Vectorisable math for the hot row loops of the CPU backend.
//
// The build does not use -march=native (binaries must travel), so each hot
// row function is compiled twice with MPIFORMER_HOT: an x86-64-v3 clone
// (AVX2 + FMA) picked at load time where the CPU has it, and a baseline one.
// The functions here are inlined into those clones and written so that GCC
// auto-vectorises them: no libm calls, no branches, only selects.
#pragma once

#include <bit>
#include <cstdint>

// (-DMPIFORMER_HOT= on the command line builds the baseline alone, to
// measure what the clones buy.)
#if !defined(MPIFORMER_HOT)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MPIFORMER_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MPIFORMER_HOT
#endif
#endif

namespace mpiformer::cpu {

// exp(x) in float to about 2 ulp, exactly 0 below ln(FLT_MIN) and clamped
// near the top of the float range (softmax arguments are <= 0 anyway).
// exp(x) = 2^n * exp(r) with n = round(x / ln 2) and |r| <= ln(2)/2, where
// exp(r) is its Taylor polynomial of degree 7 (truncation error < 1e-8).
__attribute__((always_inline)) inline float fast_exp(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693145751953125f;  // ln 2 split so n * kLn2Hi is exact
  const float kLn2Lo = 1.42860682030941723e-6f;
  const float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float clamped = x > 88.0f ? 88.0f : (x < -87.0f ? -87.0f : x);
  const float n = (clamped * kLog2e + kRoundMagic) - kRoundMagic;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t exponent_bits = (static_cast<int32_t>(n) + 127) << 23;
  const float result = p * std::bit_cast<float>(exponent_bits);
  return x < -87.0f ? 0.0f : result;
}

// tanh through exp: tanh(u) = 1 - 2 / (exp(2u) + 1); saturates to +-1.
__attribute__((always_inline)) inline float fast_tanh(float u) {
  return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f);
}

}  // namespace mpiformer::cpu
