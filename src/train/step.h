// One optimizer step of data-parallel training, read top to bottom in
// step.cpp (docs/DESIGN.md section 1):
//
//   1. this rank's K micro-batches of the step (any may be empty)
//   2. N = sum over ranks and micro-batches of target tokens   (all-reduced, before any backward)
//   3. forward and backward of each micro-batch, its loss divided by N; the
//      last backward pass starts the bucketed gradient all-reduce as it goes
//   4. the reducer finishes: grad = sum over ranks of grad(this rank's losses / N)
//   5. the divergence guard: the loss and the gradient norm must be finite
//      on every rank (fp16: an overflow skips the step, the scaler halves)
//   6. clip and update
//
// so every rank applies the gradient of the mean loss over every target
// token of the global step, however the tokens fall across ranks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "src/data/batch.h"
#include "src/model/model.h"
#include "src/parallel/communicator.h"
#include "src/parallel/gradient_reducer.h"
#include "src/train/divergence_guard.h"
#include "src/train/fault_injection.h"
#include "src/train/progress.h"
#include "src/train/run_directory.h"
#include "src/train/startup.h"

namespace mpiformer {

// Target tokens (weight-1 positions) of this rank's micro-batches.
int64_t count_targets(const std::vector<Batch>& micro, int32_t pad);

struct StepGradients {
  int64_t global_targets = 0;  // N: target tokens of the step on all ranks
  bool skipped = false;        // N == 0: every rank skips the step, gradients untouched
  ReduceTiming reduce;         // empty on one rank
};

// Steps 2-4: leaves in params.grads() the step's global mean-loss gradient,
// times loss_scale, identical on every rank; this rank's loss sums are added
// to the model's training sums (Model::take_train_sums). micro: this rank's
// K micro-batches (any of them may be empty); micro-batch k of rank r is the
// step's global micro-batch r + k W, which picks its dropout masks.
// reducer: required when W > 1 (null: the float sum on one rank). Collective.
StepGradients step_gradients(Model& model, const std::vector<Batch>& micro, uint64_t seed,
                             int64_t step, float label_smoothing, const Communicator& comm,
                             GradientReducer* reducer, float loss_scale = 1.0f);

// What the loop carries from one step to the next.
struct StepState {
  explicit StepState(OnDivergence policy) : guard(policy) {}

  std::vector<Batch> batches;  // this rank's K micro-batches of the step
  ProgressWindow window;       // the figures since the last progress line
  DivergenceGuard guard;
  float lr = 0.0f;              // of the last step
  double grad_norm = 0.0;       // unscaled, of the last step that measured one
  float measured_scale = 0.0f;  // the loss scale of the last measured norm
};

// Steps 1-6 of `step` on run's parts. Returns 0 to go on or an exit code
// (kExitDiverged). Collective.
int train_step(TrainingRun& run, int64_t step, const FaultInjection& faults,
               const Communicator& comm, StepState* state);

// Collective: whether the loss and the gradient norm are finite on every rank.
std::pair<bool, bool> agree_finite(const Communicator& comm, double loss, double grad_norm);

// The message (rank 0) and the exit code of a diverged step, on every rank.
// run_dir: rank 0's, which names the last good checkpoint.
int diverged(const Communicator& comm, const RunDirectory* run_dir, int64_t step,
             const std::string& why);

}  // namespace mpiformer
