// Held-out evaluation shared by `train` (every --eval-every steps and at the
// end) and `eval`: batches split over ranks like training batches, loss sums
// all-reduced, divided once.
#pragma once

#include <string>
#include <vector>

#include "src/core/config.h"
#include "src/data/batch.h"
#include "src/data/batch_source.h"
#include "src/model/model.h"
#include "src/parallel/communicator.h"
#include "src/scoring/loss_figures.h"

namespace mpiformer {

// Global loss sums over ranks: sums travel, divisions happen once.
LossSums allreduce(const Communicator& comm, const LossSums& local);
// Per-label counts (3 K) of a multi-label classifier; every rank passes the
// same length (empty for other models).
std::vector<int64_t> allreduce(const Communicator& comm, std::vector<int64_t> local);

constexpr uint64_t kSyntheticEvalBatches = 8;

// The figures of an eval line, one format for `train` and `eval`:
// "loss L | nll N | ppl P | acc A% | T tokens" (an lm also gets bits per
// token: "bits B", nll / ln 2). A classifier: "loss L | nll N | acc A% |
// E examples", with micro and macro precision, recall and F1 before the
// count for --loss zlpr (acc: the share whose predicted set is exact).
std::string describe_eval(const LossSummary& eval, ModelKind kind);

// The first `max_batches` evaluation batches of `source` (a shard set's
// validation split may hold fewer; 0: all of them, or
// kSyntheticEvalBatches of a source without a split), rank r taking r, r + W, ...
// batch: scratch, reused
LossSummary evaluate(Model& model, BatchSource& source, uint64_t max_batches, float label_smoothing,
                     const Communicator& comm, Batch& batch);

}  // namespace mpiformer
