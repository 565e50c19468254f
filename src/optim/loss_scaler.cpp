#include "src/optim/loss_scaler.h"

#include <stdexcept>

namespace mpiformer {

LossScaler::LossScaler(bool dynamic, float initial_scale, int64_t window)
    : dynamic_(dynamic), scale_(dynamic ? initial_scale : 1.0f), window_(window) {
  if (dynamic && !(initial_scale >= kMinScale && initial_scale <= kMaxScale))
    throw std::invalid_argument("loss scale must be in [1, 2^24]");
  if (window < 1) throw std::invalid_argument("loss-scale window must be at least 1");
}

void LossScaler::restore(float scale, int64_t good_steps) {
  if (!dynamic_) return;  // fp32 and bf16 ignore a scale saved by an fp16 run
  scale_ = scale >= kMinScale && scale <= kMaxScale ? scale : kMinScale;
  good_steps_ = good_steps >= 0 ? good_steps : 0;
}

bool LossScaler::update(bool finite) {
  if (!dynamic_) return true;  // a fixed scale has nothing to learn from overflow
  if (!finite) {
    if (scale_ > kMinScale) scale_ *= 0.5f;
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ >= window_) {
    if (scale_ < kMaxScale) scale_ *= 2.0f;
    good_steps_ = 0;
  }
  return true;
}

}  // namespace mpiformer
