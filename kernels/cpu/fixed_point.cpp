// The exact gradient sum's conversions (Ops::fixed_point_accumulate and
// fixed_point_to_float): element by element, so the bits do not depend on
// the thread count; the CPU reference of kernels/cuda/fixed_point.cu.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/ops.h"

namespace mpiformer {

void CpuOps::fixed_point_accumulate(int64_t* fixed, int64_t* out_of_range, const float* grads,
                                    size_t n, int fraction_bits, int limit_bits) {
  const double scale = std::ldexp(1.0, fraction_bits);
  const double limit = std::ldexp(1.0, limit_bits);
  int64_t outside = 0;
#pragma omp parallel for schedule(static) reduction(+ : outside) if (cpu::worth_threading(n))
  for (size_t i = 0; i < n; ++i) {
    const double g = grads[i];
    if (std::fabs(g) < limit) {
      fixed[i] += static_cast<int64_t>(std::nearbyint(g * scale));
    } else {
      ++outside;  // also NaN: the comparison is false
    }
  }
  *out_of_range += outside;
}

void CpuOps::fixed_point_to_float(float* out, const int64_t* fixed, const int64_t* out_of_range,
                                  size_t n, int fraction_bits) {
  if (*out_of_range > 0) {
    std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
#pragma omp parallel for schedule(static) if (cpu::worth_threading(n))
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(std::ldexp(static_cast<double>(fixed[i]), -fraction_bits));
}

}  // namespace mpiformer
