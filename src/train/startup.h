// The start of `mpiformer train`: everything before the first step. Each
// phase is agreed by every rank (src/parallel/agreement.h), so a fault on
// any rank ends the run on all of them, with one exit code, before the run
// directory changes:
//
//   1. inputs     the shards decide what the flags left open
//   2. directory  rank 0 locks the run directory and chooses the start point
//                 (fresh, or a checkpoint it checks against the flags)
//   3. build      data, backend, the memory estimate, model, optimizer, scaler
//   4. restore    a checkpoint's tensors into every rank
//   5. reducer    the buckets of the gradient all-reduce
//   6. claim      rank 0 makes this run the head of the directory: a later
//                 branch moves aside, config.ini, train.log and metrics.h5
//
// and rank 0 prints the start lines. What the phases built comes back as a
// TrainingRun, the parts the loop (src/train/trainer.cpp) and the step
// (src/train/step.cpp) use.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "src/core/config.h"
#include "src/data/batch_source.h"
#include "src/io/metrics.h"
#include "src/model/model.h"
#include "src/optim/adamw.h"
#include "src/optim/loss_scaler.h"
#include "src/optim/schedule.h"
#include "src/parallel/communicator.h"
#include "src/parallel/gradient_reducer.h"
#include "src/parallel/optimizer_shards.h"
#include "src/train/fault_injection.h"
#include "src/train/run_directory.h"

namespace mpiformer {

// A run's flags as config.ini's text, and back: the train command's flag
// table knows both (src/app/options.h), so the command hands them down.
struct ConfigText {
  std::function<std::string(const TrainConfig&)> write;
  // Throws UsageError naming `source` for text that is not a run's config.
  std::function<TrainConfig(const std::string& ini, const std::string& source)> read;
};

// Which micro-batches a step reads. Global indexing: the step after
// micro-batch index `cursor` reads [cursor, cursor + W K), rank r the
// micro-batches cursor + r + k W. Per-rank indexing (--sharding file): this
// rank's [cursor, cursor + K). A resumed run on another world size
// continues the same sequence of micro-batches.
struct DataCursor {
  int64_t first_step = 1;        // the first step of this job
  int accum = 1;                 // K, micro-batches per rank and step
  int64_t batches_per_step = 0;  // W K (global indexing) or K (per rank)
  uint64_t cursor0 = 0;          // the first micro-batch index of first_step
  uint64_t first = 0;            // this rank reads first + stride * i, i = 0, 1, ...
  uint64_t stride = 1;

  // This rank's micro-batch k of `step`.
  uint64_t index(int64_t step, int k) const {
    return first + stride * static_cast<uint64_t>((step - first_step) * accum + k);
  }
  // The cursor once `step` is taken: the first micro-batch of the next.
  uint64_t next_batch_after(int64_t step) const {
    return cursor0 + static_cast<uint64_t>((step - first_step + 1) * batches_per_step);
  }
};

// What start-up built, for the loop. Declared in the order the parts must
// be released: the model before the backend it lives on, the lock last.
struct TrainingRun {
  TrainConfig cfg;  // the flags as the shards resolved them; a resumed run's seed
  // Rank 0: the shards' SentencePiece model and a classifier's label names,
  // kept in every checkpoint.
  std::string tokenizer;
  std::vector<std::string> label_names;
  // What the shards decided of the model where the flags left it open
  // ("vocab 8000, special ids"), for the start lines; "" without --data.
  std::string from_shards;

  std::unique_ptr<RunDirectory> run_dir;  // rank 0, holds the lock
  StartPoint start;
  DataCursor cursor;

  std::unique_ptr<BatchSource> source;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Model> model;
  // --shard-optimizer true: the ranks' slices; the optimizer holds only its own.
  std::unique_ptr<CollectiveShardLink> shards;
  std::unique_ptr<AdamW> optimizer;
  std::unique_ptr<LrSchedule> schedule;
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<GradientReducer> reducer;  // null: one rank with the float sum
  std::unique_ptr<MetricsLog> metrics;       // rank 0

  // Whether the guard looks at every step (the host reads the loss and the
  // norm each step), or a GPU step, which waits for nothing, is checked at
  // the progress line and before a checkpoint (src/train/divergence_guard.h).
  bool check_each_step = true;
};

// What start_run gives back: the run to train, or (run null) the exit code
// of a run that ends at start-up: a fault's, or 0 when the checkpoint to
// resume from already reaches --steps.
struct Started {
  std::unique_ptr<TrainingRun> run;
  int exit_code = 0;
};

// The six phases above, then the start lines. Collective.
Started start_run(const TrainConfig& flags, const Communicator& comm, const ConfigText& config_text,
                  const FaultInjection& faults);

}  // namespace mpiformer
