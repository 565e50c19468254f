#include "src/train/step.h"

#include <stdexcept>

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
  if (reducer) reducer->begin_step(loss_scale);
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

}  // namespace mpiformer
