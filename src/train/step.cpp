#include "src/train/step.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "src/core/error.h"
#include "src/core/run_log.h"

namespace mpiformer {

int64_t count_targets(const std::vector<Batch>& micro, int32_t pad) {
  int64_t n = 0;
  for (const Batch& b : micro) n += b.target_tokens(pad);
  return n;
}

StepGradients step_gradients(Model& model, const std::vector<Batch>& micro, uint64_t seed,
                             int64_t step, float label_smoothing, const Communicator& comm,
                             GradientReducer* reducer, float loss_scale) {
  const int W = comm.size(), K = static_cast<int>(micro.size());
  if (W > 1 && reducer == nullptr)
    throw std::logic_error("step_gradients: more than one rank needs a gradient reducer");
  StepGradients out;

  // 2. N, the step's target tokens on every rank, all-reduced before any
  //    backward: each micro-batch's loss is divided by it, so the summed
  //    gradient is that of the mean over the global step's tokens.
  out.global_targets = comm.allreduce_sum(count_targets(micro, model.config().special.pad));
  if (out.global_targets == 0) {  // every rank sees the same N: all skip together
    out.skipped = true;
    return out;
  }
  const float grad_scale = loss_scale / static_cast<float>(out.global_targets);

  // 3. Forward and backward of each micro-batch; gradients add up in
  //    params.grads().
  ParameterSet& params = model.parameters();
  params.zero_grads();
  if (reducer) reducer->begin_step(loss_scale, K);
  for (int k = 0; k < K; ++k) {
    // The exact sum takes each micro-batch's gradient on its own.
    if (k > 0 && reducer && reducer->absorb_micro_batch()) params.zero_grads();
    // Only the last backward pass finishes gradients; it reports them to the
    // reducer as it goes.
    const bool last = k == K - 1;
    const PassId pass{seed, step, comm.rank() + k * W};
    model.forward_backward(micro[k], label_smoothing, grad_scale, pass, last ? reducer : nullptr);
  }

  // 4. The buckets still in flight, summed over ranks: every rank holds the
  //    same gradient.
  if (reducer) out.reduce = reducer->finish();
  return out;
}

int train_step(TrainingRun& run, int64_t step, const FaultInjection& faults,
               const Communicator& comm, StepState* state) {
  const TrainConfig& cfg = run.cfg;
  Model& model = *run.model;
  AdamW& optimizer = *run.optimizer;
  LossScaler& scaler = *run.scaler;
  ProgressWindow& window = state->window;
  DivergenceGuard& guard = state->guard;

  // 1. This rank's micro-batches of the step (any may be empty).
  std::vector<Batch>& batches = state->batches;
  batches.resize(run.cursor.accum);
  for (int k = 0; k < run.cursor.accum; ++k) {
    run.source->make_batch(BatchSource::kTrain, run.cursor.index(step, k), &batches[k]);
    window.add_batch(batches[k]);
  }

  // 2-4. The gradient of the mean loss over the step's target tokens on all
  //    ranks, times the loss scale: N all-reduced first, then backward,
  //    then the bucketed gradient all-reduce (step_gradients, above).
  const float loss_scale = scaler.scale();
  const float pass_scale = faults.pass_scale(step, loss_scale, comm.rank() == comm.size() - 1);
  const StepGradients gradients = step_gradients(
      model, batches, cfg.seed, step, cfg.label_smoothing, comm, run.reducer.get(), pass_scale);
  state->lr = run.schedule->lr(step);
  if (gradients.skipped) {  // no target tokens anywhere: nothing changes
    window.count_empty_step();
    window.add_step(model.take_train_sums(), gradients.reduce);
    window.add_label_counts(model.take_label_counts(/*train=*/true));
    return 0;
  }

  // 5. The guard: the loss and the gradient norm must be numbers. The norm
  //    is of the summed gradients, the same on every rank; the loss is this
  //    rank's, so the ranks agree on it. Unless each step is checked, the
  //    update goes ahead and the check waits for the progress line.
  optimizer.measure_gradients();
  state->measured_scale = loss_scale;
  if (!run.check_each_step) {
    optimizer.step(state->lr, 1.0f / loss_scale);
    optimizer.await_weights();  // sharded: every rank's weights whole again
    window.add_step(LossSums{}, gradients.reduce);
    return 0;
  }
  const double norm = optimizer.measured_norm();
  const LossSums local = model.take_train_sums();
  window.add_label_counts(model.take_label_counts(/*train=*/true));
  const auto [loss_finite, norm_finite] = agree_finite(comm, local.loss, norm);
  const bool can_lower_scale = scaler.dynamic() && scaler.scale() > LossScaler::kMinScale;
  switch (guard.judge(loss_finite, norm_finite, can_lower_scale)) {
    case DivergenceGuard::Action::kApply:
      scaler.update(true);
      // 6. Clip and update on the device.
      optimizer.step(state->lr, 1.0f / loss_scale);
      optimizer.await_weights();  // sharded: every rank's weights whole again
      state->grad_norm = norm / loss_scale;
      window.add_step(local, gradients.reduce);
      return 0;
    case DivergenceGuard::Action::kSkipOverflow:
      // fp16: the summed gradients overflowed; skip the step, halve the scale.
      scaler.update(false);
      window.count_overflow();
      window.add_step(local, gradients.reduce);
      return 0;
    case DivergenceGuard::Action::kSkipDiverged:
      scaler.update(false);
      window.count_non_finite_skip();
      window.add_step(LossSums{}, gradients.reduce);
      if (comm.is_root()) {
        say(stderr, "warning: step %lld skipped: %s (--on-divergence skip, %d in a row)\n",
            static_cast<long long>(step), guard.reason().c_str(), guard.skipped_in_a_row());
        std::fflush(stderr);
      }
      return 0;
    case DivergenceGuard::Action::kStop:
      break;
  }
  std::string why = guard.reason();
  if (guard.skipped_in_a_row() >= DivergenceGuard::kMaxSkippedInARow)
    why += " for " + std::to_string(guard.skipped_in_a_row()) + " steps in a row";
  return diverged(comm, run.run_dir.get(), step, why);
}

std::pair<bool, bool> agree_finite(const Communicator& comm, double loss, double grad_norm) {
  const int bad = comm.max((std::isfinite(loss) ? 0 : 2) | (std::isfinite(grad_norm) ? 0 : 1));
  return {(bad & 2) == 0, (bad & 1) == 0};
}

int diverged(const Communicator& comm, const RunDirectory* run_dir, int64_t step,
             const std::string& why) {
  if (comm.is_root()) {
    const std::string latest = run_dir->latest();
    std::fprintf(stderr,
                 "[rank 0] step %lld diverged: %s; stopped without saving it (exit code %d). %s; "
                 "resuming as is would diverge again: lower --lr (or raise --warmup) and resume "
                 "with --resume auto\n",
                 static_cast<long long>(step), why.c_str(), kExitDiverged,
                 latest.empty() ? "No checkpoint was written before it"
                                : ("The last good checkpoint is " + latest + " (latest)").c_str());
    std::fflush(stderr);
  }
  return kExitDiverged;
}

}  // namespace mpiformer
