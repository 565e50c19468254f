#include "src/train/divergence_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

namespace mpiformer {

DivergenceGuard::Action DivergenceGuard::judge(bool loss_finite, bool norm_finite,
                                               bool can_lower_scale) {
  if (loss_finite && norm_finite) {
    skipped_in_a_row_ = 0;
    reason_.clear();
    return Action::kApply;
  }
  if (loss_finite && can_lower_scale) {
    reason_ = "the fp16 gradients overflowed";
    return Action::kSkipOverflow;
  }
  reason_ = loss_finite   ? "the gradient norm is not finite"
            : norm_finite ? "the loss is not finite"
                          : "the loss and the gradient norm are not finite";
  if (policy_ == OnDivergence::kSkip && ++skipped_in_a_row_ < kMaxSkippedInARow) {
    return Action::kSkipDiverged;
  }
  return Action::kStop;
}

LossWatch::LossWatch(int outcomes, std::string outcomes_name)
    : outcomes_name_(std::move(outcomes_name)),
      min_loss_(std::log(static_cast<double>(std::max(outcomes, 2)))) {}

std::string LossWatch::observe(int64_t step, double window_loss) {
  if (!std::isfinite(window_loss)) return "";  // the guard's business
  if (window_loss < min_loss_) {
    min_loss_ = window_loss;
    min_step_ = step;
  }
  const bool far_above = window_loss > 2.0 * min_loss_ && window_loss > min_loss_ + 1.0;
  if (!far_above) {
    warned_ = false;
    return "";
  }
  if (warned_) return "";
  warned_ = true;
  char lowest[96];
  if (min_step_ > 0) {
    std::snprintf(lowest, sizeof lowest, "its lowest, %.4g at step %lld", min_loss_,
                  static_cast<long long>(min_step_));
  } else {
    std::snprintf(lowest, sizeof lowest, "%.4g, the loss of a uniform guess over %s", min_loss_,
                  outcomes_name_.c_str());
  }
  char line[320];
  std::snprintf(line, sizeof line,
                "warning: step %lld: loss %.4g is far above %s; the run may be diverging (a "
                "lower --lr, more --warmup or --clip-norm may help)",
                static_cast<long long>(step), window_loss, lowest);
  return line;
}

}  // namespace mpiformer
