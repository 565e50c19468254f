#include "src/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace mpiformer {

double lr_scale_factor(LrScaling rule, int64_t budget_tokens, int64_t reference_tokens) {
  if (rule == LrScaling::kNone) return 1.0;
  if (budget_tokens <= 0 || reference_tokens <= 0)
    throw std::invalid_argument("lr_scale_factor: token budgets must be positive");
  const double ratio = static_cast<double>(budget_tokens) / static_cast<double>(reference_tokens);
  return rule == LrScaling::kLinear ? ratio : std::sqrt(ratio);
}

LrSchedule::LrSchedule(const OptimConfig& config, int64_t total_steps)
    : config_(config), total_steps_(total_steps) {}

float LrSchedule::lr(int64_t step) const {
  const double peak = config_.lr;
  const double end = config_.end_lr;
  const int64_t warmup = std::max<int64_t>(config_.warmup, 0);
  // Steps are 1-based; clamping keeps inverse-sqrt finite if asked for step 0.
  const double s = static_cast<double>(std::max<int64_t>(step, 1));

  if (warmup > 0 && s <= warmup) return static_cast<float>(peak * s / warmup);

  // Fraction of the decay phase done, for the schedules that end at end_lr;
  // a run no longer than its warmup has no decay phase and sits at the end.
  auto progress = [&] {
    const int64_t span = total_steps_ - warmup;
    if (span <= 0) return 1.0;
    return std::clamp((s - warmup) / static_cast<double>(span), 0.0, 1.0);
  };

  double lr = peak;
  switch (config_.schedule) {
    case ScheduleKind::kConstant:
      lr = peak;
      break;
    case ScheduleKind::kPolynomial:
      lr = end + (peak - end) * std::pow(1.0 - progress(), config_.poly_power);
      break;
    case ScheduleKind::kInverseSqrt:
      lr = warmup > 0 ? peak * std::sqrt(warmup / s) : peak / std::sqrt(s);
      break;
    case ScheduleKind::kCosine:
      lr = end + (peak - end) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress()));
      break;
  }
  return static_cast<float>(lr);
}

}  // namespace mpiformer
