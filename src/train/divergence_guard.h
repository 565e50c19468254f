// What a training step does when its figures stop being numbers
// (docs/DESIGN.md section 7). Every step, after the gradient all-reduce, the
// trainer learns on every rank whether any rank's loss was not finite and
// whether the (global) gradient norm was not finite, and asks the guard:
//
//   both finite                          apply the update
//   fp16, the norm alone, scale above 1  an overflow: skip, the scaler halves
//   anything else                        divergence: --on-divergence stop ends the
//                                        run (kExitDiverged) before anything of the
//                                        step is saved; skip drops the step, and
//                                        kMaxSkippedInARow such steps in a row stop
//
// Learning this every step makes the host wait for the device each step. A
// GPU step in fp32 or bf16 with --on-divergence stop (the default) does not:
// there the loss sums and the norm are read at the progress line, and the
// state is checked before every checkpoint, so a divergence stops the run
// at the first of them (a few steps late, "by step S"), still before it is
// saved. fp16 (the scaler needs every step's verdict) and skip check each
// step, as the CPU backend always does.
//
// A loss that stays finite but climbs far above its best is only warned
// about (LossWatch): some runs recover, and the user decides.
#pragma once

#include <cstdint>
#include <string>

#include "src/core/config.h"

namespace mpiformer {

class DivergenceGuard {
 public:
  static constexpr int kMaxSkippedInARow = 20;
  enum class Action { kApply, kSkipOverflow, kSkipDiverged, kStop };

  explicit DivergenceGuard(OnDivergence policy) : policy_(policy) {}

  // loss_finite, norm_finite: agreed over ranks. can_lower_scale: fp16 with
  // a loss scale above its floor, where a non-finite norm is an overflow.
  Action judge(bool loss_finite, bool norm_finite, bool can_lower_scale);

  // Why the last judge() did not apply the step: "the loss is not finite".
  const std::string& reason() const { return reason_; }
  int skipped_in_a_row() const { return skipped_in_a_row_; }

 private:
  OnDivergence policy_;
  int skipped_in_a_row_ = 0;
  std::string reason_;
};

// Warns, once per excursion, when the loss of a progress window rises far
// above the lowest loss so far: above twice it and more than 1 nat over it.
// The lowest starts at ln(outcomes), the loss of a uniform guess over the
// vocabulary (a classifier: over its labels), which any sane model is
// below, so a run that starts (or resumes) diverging is caught at its first
// window. The warning comes back when the loss has come down below that line
// again and rises anew.
class LossWatch {
 public:
  // outcomes: the vocabulary size, or a classifier's number of labels,
  // named by `outcomes_name` in the warning ("the vocabulary", "the labels").
  explicit LossWatch(int outcomes = 2, std::string outcomes_name = "the vocabulary");
  // Returns the warning for this window ("" when none).
  std::string observe(int64_t step, double window_loss);

 private:
  std::string outcomes_name_;
  bool warned_ = false;
  double min_loss_;
  int64_t min_step_ = 0;  // 0: the uniform guess
};

}  // namespace mpiformer
