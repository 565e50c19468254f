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

// g in units of 1 / scale, rounded to nearest even as nearbyint does. Below
// 2^51 in magnitude (nearly always) without its call: adding 1.5 * 2^52
// leaves a double whose unit in the last place is 1, so the sum is rounded
// to an integer in the current mode (to nearest even), and taking the
// constant away again is exact.
inline int64_t to_fixed(double g, double scale) {
  const double x = g * scale;
  constexpr double kRounder = 0x1.8p52;
  if (std::fabs(x) < 0x1p51) return static_cast<int64_t>((x + kRounder) - kRounder);
  return static_cast<int64_t>(std::nearbyint(x));
}

// fixed * unit (2^-fraction_bits), rounded to float. A product with a
// power of two is exact in double, as ldexp is, and far faster than a call
// of it per element.
inline float from_fixed(int64_t fixed, double unit) {
  return static_cast<float>(static_cast<double>(fixed) * unit);
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
  const double unit = std::ldexp(1.0, -fraction_bits);
  *out_of_range += for_each_fixed(grads, n, fraction_bits, limit_bits,
                                  [&](size_t i, bool inside, int64_t value) {
                                    if (inside) grads[i] = from_fixed(value, unit);
                                  });
}

void CpuOps::fixed_point_poison(float* x, const int64_t* out_of_range, size_t n) {
  if (*out_of_range > 0) std::fill(x, x + n, std::numeric_limits<float>::quiet_NaN());
}

void CpuOps::fixed_point_to_float(float* out, const int64_t* fixed, const int64_t* out_of_range,
                                  size_t n, int fraction_bits) {
  if (*out_of_range > 0) return fixed_point_poison(out, out_of_range, n);
  const double unit = std::ldexp(1.0, -fraction_bits);
#pragma omp parallel for schedule(static) if (cpu::worth_threading(n))
  for (size_t i = 0; i < n; ++i) out[i] = from_fixed(fixed[i], unit);
}

}  // namespace mpiformer
