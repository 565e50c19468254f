#include "src/app/evaluation.h"

#include <algorithm>

namespace mpiformer {

LossSums allreduce(const Communicator& comm, const LossSums& local) {
  double v[3] = {local.loss, static_cast<double>(local.tokens), static_cast<double>(local.correct)};
  comm.allreduce_sum(v, 3);
  LossSums global;
  global.loss = v[0];
  global.tokens = static_cast<int64_t>(v[1]);
  global.correct = static_cast<int64_t>(v[2]);
  return global;
}

LossSummary evaluate(Model& model, BatchSource& source, uint64_t max_batches, float label_smoothing,
                     const Communicator& comm, Batch& batch) {
  const uint64_t available = source.eval_batch_count();
  if (max_batches == 0) max_batches = available > 0 ? available : kSyntheticEvalBatches;
  const uint64_t count = available > 0 ? std::min(available, max_batches) : max_batches;
  for (uint64_t i = comm.rank(); i < count; i += comm.size()) {
    source.make_batch(BatchSource::kEval, i, &batch);
    model.evaluate(batch, label_smoothing);
  }
  return summarize(allreduce(comm, model.take_eval_sums()));
}

}  // namespace mpiformer
