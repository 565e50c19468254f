// One optimizer step's gradient on W ranks, read top to bottom in step.cpp
// (docs/DESIGN.md section 1):
//
//   N    = sum over ranks and micro-batches of target tokens   (all-reduced, before any backward)
//   grad = sum over ranks of grad(sum of this rank's losses / N)  (the bucketed all-reduce)
//
// so every rank ends with the gradient of the mean loss over every target
// token of the global step, however the tokens fall across ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "src/data/batch.h"
#include "src/model/model.h"
#include "src/parallel/communicator.h"
#include "src/parallel/gradient_reducer.h"

namespace mpiformer {

// Target tokens (weight-1 positions) of this rank's micro-batches.
int64_t count_targets(const std::vector<Batch>& micro, int32_t pad);

struct StepGradients {
  int64_t global_targets = 0;  // N: target tokens of the step on all ranks
  bool skipped = false;        // N == 0: every rank skips the step, gradients untouched
  ReduceTiming reduce;         // empty on one rank
};

// Leaves in params.grads() the step's global mean-loss gradient,
// times loss_scale, identical on every rank; this rank's loss sums are added
// to the model's training sums (Model::take_train_sums). micro: this rank's
// K micro-batches (any of them may be empty); micro-batch k of rank r is the
// step's global micro-batch r + k W, which picks its dropout masks.
// reducer: required when W > 1 (null: the float sum on one rank). Collective.
StepGradients step_gradients(Model& model, const std::vector<Batch>& micro, uint64_t seed,
                             int64_t step, float label_smoothing, const Communicator& comm,
                             GradientReducer* reducer, float loss_scale = 1.0f);

}  // namespace mpiformer
