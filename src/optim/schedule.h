// Learning-rate schedules: linear warmup from 0 to the peak over `warmup`
// steps, then one of
//   constant:     peak
//   polynomial:   end + (peak - end) * (1 - p)^power,  p = (s - warmup) / (steps - warmup)
//   inverse-sqrt: peak * sqrt(warmup / s)   (the official Transformer's decay)
//   cosine:       end + (peak - end) * (1 + cos(pi p)) / 2
// Steps are 1-based: step 1 is the first update.
#pragma once

#include <cstdint>

#include "src/core/config.h"

namespace mpiformer {

// Factor on the learning rate for a global token budget per step of
// `budget_tokens` when it was tuned for `reference_tokens`: 1 (none),
// budget / reference (linear, Goyal et al.), or its square root (sqrt, for
// Adam-like optimisers).
double lr_scale_factor(LrScaling rule, int64_t budget_tokens, int64_t reference_tokens);

class LrSchedule {
 public:
  LrSchedule(const OptimConfig& config, int64_t total_steps);
  float lr(int64_t step) const;

 private:
  OptimConfig config_;
  int64_t total_steps_;
};

}  // namespace mpiformer
