// `mpiformer train`: the training loop, read top to bottom in trainer.cpp.
//
// One optimizer step on W ranks with K micro-batches each takes the global
// micro-batches [(s-1) W K, s W K); rank r takes every W-th of them, so the
// global batch does not depend on W. The loss of every micro-batch is divided
// by N, the step's global count of target tokens (all-reduced before any
// backward), and gradients are summed over ranks: the update is the gradient
// of the mean loss over every target token of the step (docs/DESIGN.md section 1).
//
// A run survives: --resume continues from a checkpoint exactly (the same
// parameters, moments, data cursor and random streams); a stop signal makes
// every rank stop at the next step boundary, write a checkpoint and exit
// kExitStopped; a step whose loss or gradient norm is not finite never
// reaches a checkpoint (src/train/divergence_guard.h); one run at a time
// writes a run directory (src/train/run_directory.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "src/core/config.h"
#include "src/data/batch.h"
#include "src/data/batch_source.h"
#include "src/io/metrics.h"
#include "src/loss/cross_entropy.h"
#include "src/model/model.h"
#include "src/optim/adamw.h"
#include "src/optim/loss_scaler.h"
#include "src/optim/schedule.h"
#include "src/parallel/communicator.h"
#include "src/parallel/gradient_reducer.h"
#include "src/train/divergence_guard.h"
#include "src/train/fault_injection.h"
#include "src/train/memory_budget.h"
#include "src/train/progress.h"
#include "src/train/run_directory.h"

namespace mpiformer {

// A run's flags as config.ini's text, and back: the train command's flag
// table knows both (src/app/options.h), so the command hands them down.
struct ConfigText {
  std::function<std::string(const TrainConfig&)> write;
  // Throws UsageError naming `source` for text that is not a run's config.
  std::function<TrainConfig(const std::string& ini, const std::string& source)> read;
};

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, Communicator& comm, ConfigText config_text,
          const FaultInjection& faults = {});
  ~Trainer();

  // The whole run; returns the exit code (0, kExitStopped, kExitDiverged, or
  // a fault's). Collective.
  int run();

 private:
  // Start-up, each step agreed by all ranks; a non-zero code ends the run.
  int resolve_inputs();      // the shards decide what the flags left open
  int open_run_directory();  // lock, start point, checks (rank 0 decides)
  int build();               // data, backend, model, optimizer
  int restore();             // the checkpoint's tensors into every rank
  int claim_directory();     // branch, config.ini, metrics.h5
  void print_start() const;

  // One step: the gradients, the guard, the update. Returns 0 to go on or
  // an exit code.
  int train_step(int64_t step);
  // The progress line and its metrics.h5 row. Returns 0 or an exit code
  // (metrics.h5 could not be written).
  int log_progress(int64_t step);
  // Rank 0 writes for all: the replicas are identical. Returns 0, or
  // kExitDiverged when the state holds a NaN or an infinity (nothing is
  // written), or kExitFailure when the write failed.
  int save(int64_t step);
  void write_checkpoint_on_root(int64_t step);
  // Held-out evaluation, printed and logged. Returns 0 or an exit code.
  int evaluate_and_log(int64_t step, bool final_eval);
  void log_eval_on_root(int64_t step, bool final_eval, const LossSummary& eval);
  // The data cursor once `step` is taken: the first micro-batch of the next.
  uint64_t next_batch_after(int64_t step) const;
  // Wall seconds since the run began, resumed jobs included (rank 0).
  double elapsed_s() const;
  // Collective: whether the loss and the gradient norm are finite on every rank.
  std::pair<bool, bool> agree_finite(double loss, double grad_norm) const;
  // The message and code of a diverged step, on every rank.
  int diverged(int64_t step, const std::string& why);

  TrainConfig cfg_;
  ConfigText config_text_;
  Communicator& comm_;
  const int world_, rank_, accum_;
  std::string tokenizer_;  // rank 0: the shards' SentencePiece model, kept in checkpoints
  std::vector<std::string> label_names_;  // rank 0: a classifier's labels, kept likewise
  uint64_t flag_seed_ = 0;

  std::unique_ptr<RunDirectory> run_dir_;  // rank 0
  StartPoint start_;
  int64_t first_step_ = 1;

  std::unique_ptr<BatchSource> source_;
  std::unique_ptr<Ops> ops_;
  int threads_ = 1;
  Transport transport_ = Transport::kMpi;  // what --transport resolved to
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<MetricsLog> metrics_;  // rank 0
  MemoryEstimate memory_;
  double lr_factor_ = 1.0;
  int64_t step_budget_ = 0;
  OptimConfig optim_;

  // The data cursor: the step after micro-batch index `cursor0_` reads
  // [cursor0_, cursor0_ + batches_per_step_); this rank reads first_ +
  // stride_ * i (src/train/trainer.cpp).
  int64_t batches_per_step_ = 0;
  uint64_t cursor0_ = 0, first_ = 0, stride_ = 1;

  std::vector<Batch> batches_;
  Batch eval_batch_;
  ProgressWindow window_;
  DivergenceGuard guard_;
  LossWatch loss_watch_;
  double last_grad_norm_ = 0.0;  // unscaled, of the last step that measured one
  // Whether the guard looks at every step (the host reads the loss and the
  // norm each step), or a GPU step, which waits for nothing, is checked at
  // the progress line and before a checkpoint (src/train/divergence_guard.h).
  bool check_each_step_ = true;
  float measured_scale_ = 0.0f;  // the loss scale of the last measured norm
  float last_lr_ = 0.0f;
  // Clocks of the progress line: the job's start, the first step's start.
  std::chrono::steady_clock::time_point job_start_, loop_start_;
  double elapsed_before_ = 0.0;  // elapsed_s when this job resumed the run

  FaultInjection faults_;  // the end-to-end tests' (src/app/train.cpp)
};

}  // namespace mpiformer
