#include "src/train/held_out.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mpiformer {

LossSums allreduce(const Communicator& comm, const LossSums& local) {
  double v[4] = {local.loss, local.nll, static_cast<double>(local.tokens),
                 static_cast<double>(local.correct)};
  comm.allreduce_sum(v, 4);
  LossSums global;
  global.loss = v[0];
  global.nll = v[1];
  global.tokens = static_cast<int64_t>(v[2]);
  global.correct = static_cast<int64_t>(v[3]);
  return global;
}

std::vector<int64_t> allreduce(const Communicator& comm, std::vector<int64_t> local) {
  if (!local.empty()) comm.allreduce_sum(local.data(), static_cast<int>(local.size()));
  return local;
}

std::string describe_eval(const LossSummary& eval, ModelKind kind) {
  char buf[256];
  if (kind == ModelKind::kClassify) {
    std::snprintf(buf, sizeof buf, "loss %.4f | nll %.4f | acc %.2f%% | ", eval.loss, eval.nll,
                  100.0 * eval.accuracy);
    std::string text = buf;
    const LabelFigures& l = eval.labels;
    if (!std::isnan(l.micro_f1)) {
      std::snprintf(buf, sizeof buf, "micro P/R/F1 %.4f %.4f %.4f | macro P/R/F1 %.4f %.4f %.4f | ",
                    l.micro_precision, l.micro_recall, l.micro_f1, l.macro_precision,
                    l.macro_recall, l.macro_f1);
      text += buf;
    }
    return text + std::to_string(eval.tokens) + " examples";
  }
  std::snprintf(buf, sizeof buf, "loss %.4f | nll %.4f | ppl %.3f", eval.loss, eval.nll,
                eval.perplexity);
  std::string text = buf;
  if (kind == ModelKind::kLm) {
    std::snprintf(buf, sizeof buf, " | bits %.4f", eval.nll / std::log(2.0));
    text += buf;
  }
  std::snprintf(buf, sizeof buf, " | acc %.2f%% | %lld tokens", 100.0 * eval.accuracy,
                static_cast<long long>(eval.tokens));
  return text + buf;
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
  const LossSums sums = allreduce(comm, model.take_eval_sums());
  return summarize(sums, allreduce(comm, model.take_label_counts(/*train=*/false)));
}

}  // namespace mpiformer
