// AdamW over a ParameterSet: fp32 moments laid out like the parameters,
// decoupled weight decay on the tensors marked `decay` (matrices) unless
// decay_all, and global-norm gradient clipping.
#pragma once

#include <cstdint>

#include "src/core/config.h"
#include "src/model/parameters.h"

namespace mpiformer {

// Factor that brings a gradient of norm `norm` to at most `max_norm`
// (1 when max_norm <= 0 or the norm is already within it).
float clip_factor(double norm, float max_norm);

class AdamW {
 public:
  AdamW(ParameterSet& params, const OptimConfig& config);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // sqrt of the sum of squares of every gradient.
  double grad_norm();
  // One update with learning rate `lr`; gradients are multiplied by
  // grad_scale first (the clip factor). Advances the step counter.
  void step(float lr, float grad_scale);

  int64_t steps_taken() const { return step_; }
  // Resuming: the moments come from a checkpoint (through m() and v()) and
  // the step counter with them, for the bias correction.
  void set_steps_taken(int64_t steps) { step_ = steps; }
  float* m() { return m_; }  // (params.count())
  float* v() { return v_; }  // (params.count())

 private:
  ParameterSet& params_;
  OptimConfig config_;
  int64_t step_ = 0;
  float* m_ = nullptr;
  float* v_ = nullptr;
};

}  // namespace mpiformer
