// Faults the end-to-end tests inject into a training run (tests/e2e/faults.sh,
// faults_checkpoint.sh, resume.sh, precision.sh), so that the stop, loss-scaling and divergence
// paths run on a CPU with ordinary data. The train command reads them from
// the environment once (src/app/train.cpp) and hands them down; the trainer
// sees only this struct. All zero, the default: no fault.
#pragma once

#include <cmath>
#include <cstdint>

namespace mpiformer {

struct FaultInjection {
  // The last rank signals itself (SIGUSR1) after this step.
  int64_t signal_after_step = 0;
  // The last rank's gradients overflow (are infinite) at this step.
  int64_t overflow_at_step = 0;
  // The last rank's gradients are NaN at the nan_steps steps from this one.
  int64_t nan_at_step = 0, nan_steps = 0;
  // The divergence guard checks as a GPU step in fp32 or bf16 does: at the
  // progress line and before a checkpoint (src/train/divergence_guard.h).
  bool deferred_divergence_check = false;
  // This rank fails in the middle of the collective write of this step's
  // checkpoint (after its part of /params), and keeps making the collective
  // calls with nothing to write.
  int64_t fail_in_checkpoint_step = 0;
  int fail_in_checkpoint_rank = -1;
  // Rank 0 kills itself (SIGKILL) in the middle of the write of this step's
  // checkpoint, after /params is on disk (-1: never).
  int64_t kill_in_checkpoint_step = -1;

  // The loss scale this rank's backward passes of `step` use: `scale`, or on
  // the last rank an infinity or a NaN where a fault is due.
  float pass_scale(int64_t step, float scale, bool last_rank) const {
    if (!last_rank) return scale;
    if (nan_at_step > 0 && step >= nan_at_step && step < nan_at_step + nan_steps) return NAN;
    if (step == overflow_at_step) return INFINITY;
    return scale;
  }
};

}  // namespace mpiformer
