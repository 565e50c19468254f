// AdamW over a ParameterSet: fp32 moments laid out like the parameters,
// decoupled weight decay on the tensors marked `decay` (matrices) unless
// decay_all, and global-norm gradient clipping. The norm, the clip and the
// update all run on the backend, so a step waits for nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/config.h"
#include "src/core/parameters.h"

namespace mpiformer {

class AdamW {
 public:
  AdamW(ParameterSet& params, const OptimConfig& config);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // Takes the global squared norm of the current gradients on the backend
  // (queued; nothing waits). step() clips with it.
  void measure_gradients();
  // sqrt of the measured squared norm, loss scale included; copied to the
  // host, so it waits for the device.
  double measured_norm();
  // One update with learning rate `lr`, after measure_gradients():
  // gradients are multiplied by inv_loss_scale (they carry the loss scale)
  // and clipped to config.clip_norm. Advances the step counter and refreshes
  // the weights' compute copy.
  void step(float lr, float inv_loss_scale = 1.0f);

  // The first of "params", "optimizer/m", "optimizer/v" holding a NaN or an
  // infinity; null when all are finite. Waits for the device.
  const char* non_finite_state();

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
  // Runs of neighbouring tensors with one weight decay: the update's ranges.
  std::vector<AdamWRange> host_ranges_;
  AdamWRange* ranges_ = nullptr;  // backend (host_ranges_.size())
  double* norm_sq_ = nullptr;     // backend (1)
  double* check_sq_ = nullptr;    // backend (1), non_finite_state's sums
};

}  // namespace mpiformer
