// The progress window: figures of the steps since the last progress line,
// made global (token-weighted over ranks) when the line is due, printed by
// rank 0 and appended to metrics.h5.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "src/data/batch.h"
#include "src/io/metrics.h"
#include "src/parallel/communicator.h"
#include "src/parallel/gradient_reducer.h"

namespace mpiformer {

class ProgressWindow {
 public:
  ProgressWindow() { restart(); }

  // This rank's micro-batch of a step.
  void add_batch(const Batch& batch);
  // A step taken or skipped: this rank's loss sums and all-reduce timing.
  void add_step(const LossSums& local, const ReduceTiming& reduce);
  // Loss sums of the window's steps taken at once (a GPU step leaves them
  // on the device until the line is due).
  void add_step_sums(const LossSums& local) { sums_ += local; }
  // A multi-label classifier's per-label counts (3 K), taken with the sums.
  void add_label_counts(const std::vector<int64_t>& local);
  // Whether the loss is label-smoothed (the line then shows the nll too).
  void show_nll(bool on) { show_nll_ = on; }
  void count_empty_step() { ++empty_steps_; }      // no targets on any rank
  void count_overflow() { ++overflows_; }          // fp16: skipped, scale halved
  void count_non_finite_skip() { ++non_finite_; }  // --on-divergence skip
  // Time spent on other things than steps (replica checks, checkpoints,
  // evaluation): the step time is the rest of the window's wall time, over
  // which tok/s and ms/step are taken.
  void add_other_time(double seconds) { other_s_ += seconds; }
  int steps() const { return steps_; }
  // The window's clock starts now: the training loop calls it before its
  // first step, so start-up (reading shards, building the model, restoring a
  // checkpoint) is no step's time.
  void start_clock() { start_ = Clock::now(); }

  // Collective: every rank's figures of the window so far, as the text a
  // checkpoint keeps (its attribute progress_window). A run resumed from it
  // with restore() prints and logs at its next line what a run that never
  // stopped prints: the same steps, tokens and sums, bit for bit on the same
  // number of ranks (on another, rank 0 takes the window's global sums, so
  // the counts are exact and the float sums are added in another order).
  std::string save(const Communicator& comm) const;
  // Restores save()'s text ("" leaves the window empty). Throws
  // std::runtime_error for a text it cannot read.
  void restore(const std::string& text, const Communicator& comm);

  struct Line {
    TrainRow row;      // global figures (every rank)
    std::string text;  // the progress line (rank 0)
  };
  // Where the run is when the line is due (rank 0's clock).
  struct Position {
    double elapsed_s = 0;  // since the run began, over every resume
    double eta_s = -1;     // to the last step (< 0: not known yet)
    double epoch = -1;     // epochs of data consumed (< 0: not counted, synthetic)
  };
  // Collective: the window's global figures at `step`, then a new window.
  // grad_norm: unscaled, of the last step (0: none measured).
  Line close(int64_t step, int64_t total_steps, float lr, double grad_norm, float loss_scale,
             bool dynamic_scaling, const Position& at, const Communicator& comm);

 private:
  using Clock = std::chrono::steady_clock;
  void restart();

  Clock::time_point start_;
  double carried_s_ = 0.0;  // wall seconds of the window before a resume
  LossSums sums_;
  std::vector<int64_t> label_counts_;  // (3 K) zlpr classifiers; empty otherwise
  ReduceTiming reduce_;
  int64_t real_tokens_ = 0, padded_tokens_ = 0;
  double other_s_ = 0.0;
  int steps_ = 0, empty_steps_ = 0, overflows_ = 0, non_finite_ = 0;
  bool show_nll_ = false;
};

// "1:02:03" (hours, minutes, seconds), "4:05" under an hour.
std::string format_duration(double seconds);

}  // namespace mpiformer
