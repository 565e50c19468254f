// Dynamic loss scaling for fp16 (--precision fp16).
//
// fp16 keeps 10 mantissa bits down to 2^-14 (2^-24 with subnormals), so
// small activation gradients would vanish. The loss, hence every gradient,
// is multiplied by the scale S; the optimizer divides it out. A step whose
// gradients overflowed (inf or NaN, seen alike on every rank after the
// all-reduce) is skipped and S halved; after `window` good steps in a row S
// doubles. bf16 and fp32 keep S = 1 and never skip. S and the count of good
// steps are saved in checkpoints, so a resumed run scales as the straight
// run would.
#pragma once

#include <cstdint>

#include "src/core/config.h"

namespace mpiformer {

class LossScaler {
 public:
  // The scale stays within [1, 2^24] (src/core/config.h says why).
  static constexpr float kMinScale = kMinLossScale;
  static constexpr float kMaxScale = kMaxLossScale;

  // dynamic: fp16; otherwise the scale stays 1. window: good steps before doubling.
  LossScaler(bool dynamic, float initial_scale, int64_t window);

  bool dynamic() const { return dynamic_; }
  float scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }
  // A checkpoint's state.
  void restore(float scale, int64_t good_steps);

  // After the step's gradients are summed: whether they are all finite.
  // Returns whether to apply the step (false: skip it, the scale halves).
  // A fixed scale always applies the step: only fp16 runs ask.
  bool update(bool finite);

 private:
  bool dynamic_;
  float scale_;
  int64_t window_;
  int64_t good_steps_ = 0;
};

}  // namespace mpiformer
