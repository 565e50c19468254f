// Backend-independent helpers declared in kernels/ops.h.
#include <cmath>

#include "kernels/ops.h"

namespace mpiformer {

size_t attention_probs_size(const Ragged& qs, const Ragged& ks, int heads) {
  size_t total = 0;
  for (int b = 0; b < qs.batch; ++b) {
    total += static_cast<size_t>(qs.length(b)) * static_cast<size_t>(ks.length(b));
  }
  return total * static_cast<size_t>(heads);
}

double label_smoothing_constant(float smoothing, int V) {
  // x ln x with the limit 0 ln 0 = 0.
  const auto x_log_y = [](double x, double y) { return x > 0.0 ? x * std::log(y) : 0.0; };
  const double e = smoothing;
  if (V < 2) return 0.0;  // one class: the target distribution is a point mass
  return -(x_log_y(1.0 - e, 1.0 - e) + x_log_y(e, e / (V - 1)));
}

}  // namespace mpiformer
