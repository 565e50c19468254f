// The exact gradient sum's conversions (Ops::fixed_point_accumulate,
// fixed_point_to_float, fixed_point_round and fixed_point_poison): element
// by element, so the bits do not depend on the thread count; the CPU
// reference of kernels/cuda/fixed_point.cu.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/ops.h"

namespace mpiformer {

namespace {

// grads[i] in units of 2^-fraction_bits, rounded to nearest even.
inline int64_t to_fixed(double g, double scale) {
  return static_cast<int64_t>(std::nearbyint(g * scale));
}

inline float from_fixed(int64_t fixed, int fraction_bits) {
  return static_cast<float>(std::ldexp(static_cast<double>(fixed), -fraction_bits));
}

// each(i, inside, value) for every element: inside when |grads[i]| <
// 2^limit_bits (never for NaN), value its fixed point then, else 0.
// Returns how many were not inside.
template <typename Each>
int64_t for_each_fixed(const float* grads, size_t n, int fraction_bits, int limit_bits, Each each) {
  const double scale = std::ldexp(1.0, fraction_bits);
  const double limit = std::ldexp(1.0, limit_bits);
  int64_t outside = 0;
#pragma omp parallel for schedule(static) reduction(+ : outside) if (cpu::worth_threading(n))
  for (size_t i = 0; i < n; ++i) {
    const double g = grads[i];
    const bool inside = std::fabs(g) < limit;
    each(i, inside, inside ? to_fixed(g, scale) : 0);
    outside += inside ? 0 : 1;
  }
  return outside;
}

}  // namespace

void CpuOps::fixed_point_accumulate(int64_t* fixed, int64_t* out_of_range, const float* grads,
                                    size_t n, int fraction_bits, int limit_bits, bool first) {
  *out_of_range += for_each_fixed(
      grads, n, fraction_bits, limit_bits,
      [&](size_t i, bool, int64_t part) { fixed[i] = first ? part : fixed[i] + part; });
}

void CpuOps::fixed_point_round(float* grads, int64_t* out_of_range, size_t n, int fraction_bits,
                               int limit_bits) {
  *out_of_range += for_each_fixed(grads, n, fraction_bits, limit_bits,
                                  [&](size_t i, bool inside, int64_t value) {
                                    if (inside) grads[i] = from_fixed(value, fraction_bits);
                                  });
}

void CpuOps::fixed_point_poison(float* x, const int64_t* out_of_range, size_t n) {
  if (*out_of_range > 0) std::fill(x, x + n, std::numeric_limits<float>::quiet_NaN());
}

void CpuOps::fixed_point_to_float(float* out, const int64_t* fixed, const int64_t* out_of_range,
                                  size_t n, int fraction_bits) {
  if (*out_of_range > 0) return fixed_point_poison(out, out_of_range, n);
#pragma omp parallel for schedule(static) if (cpu::worth_threading(n))
  for (size_t i = 0; i < n; ++i) out[i] = from_fixed(fixed[i], fraction_bits);
}

}  // namespace mpiformer
