#include "src/train/trainer.h"

#include <signal.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "src/core/error.h"
#include "src/core/run_log.h"
#include "src/io/checkpoint.h"
#include "src/parallel/agreement.h"
#include "src/parallel/collective_checkpoint.h"
#include "src/parallel/replica_check.h"
#include "src/scoring/bleu.h"
#include "src/scoring/loss_figures.h"
#include "src/train/divergence_guard.h"
#include "src/train/final_average.h"
#include "src/train/held_out.h"
#include "src/train/model_choice.h"
#include "src/train/step.h"
#include "src/train/stop_signals.h"
#include "src/train/valid_bleu.h"

namespace mpiformer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The loop over a started run's steps, and what it does between them.
class Trainer {
 public:
  Trainer(TrainingRun& run, const Communicator& comm, const ConfigText& config_text,
          const FaultInjection& faults, StepState state, Clock::time_point job_start)
      : run_(run),
        comm_(comm),
        config_text_(config_text),
        faults_(faults),
        state_(std::move(state)),
        loss_watch_(run.cfg.model.kind == ModelKind::kClassify
                        ? LossWatch(run.cfg.model.num_labels, "the labels")
                        : LossWatch(run.cfg.model.vocab, "the vocabulary")),
        job_start_(job_start) {}

  // The steps from the start point to --steps. Returns the exit code.
  int run();

 private:
  // Before the first step: the time of earlier jobs, the progress window
  // of a resumed run, and the model choice and BLEU evaluator the flags ask
  // for. Returns 0 or an exit code. Collective.
  int prepare();
  int restore_progress_window();
  int make_model_choice();
  int make_validation_bleu();
  // Whether the flags ask for a replica check, a progress line, a
  // checkpoint or an evaluation after `step`.
  bool replica_check_due(int64_t step) const;
  bool progress_due(int64_t step) const;
  bool checkpoint_due(int64_t step) const;
  bool eval_due(int64_t step) const;
  // Replicas must still be identical. Returns 0 or kExitFailure (a replica
  // has diverged).
  int verify_replicas(int64_t step);
  // evaluate_and_log, then choose_model. Returns 0 or an exit code.
  int evaluate_and_choose(int64_t step, bool final_eval, int64_t* saved_at, bool* stop);
  // The stop signal pending on any rank after `step` (0: none). Collective.
  int agreed_stop_signal(int64_t step);
  // Every rank stops after `step` (before --steps), with a checkpoint (unless
  // saved_at is `step`). Returns kExitStopped or the checkpoint's exit code.
  int stop_for_signal(int signal, int64_t step, int64_t saved_at);
  // The progress line and its metrics.h5 row. Returns 0 or an exit code
  // (metrics.h5 could not be written).
  int log_progress(int64_t step);
  // A GPU step leaves its loss sums on the device: into the window now.
  void take_device_sums();
  // Every rank writes its part of the checkpoint (collectively). Returns 0,
  // or kExitDiverged when the state holds a NaN or an infinity (nothing is
  // written), or kExitFailure when the write failed on any rank.
  int save(int64_t step);
  // What the checkpoint of `step` records besides the tensors (the strings
  // are rank 0's).
  CheckpointState checkpoint_state(int64_t step) const;
  // Held-out evaluation, printed and logged; *metric: the validation metric
  // (--valid-bleu: BLEU, else the nll). Returns 0 or an exit code.
  int evaluate_and_log(int64_t step, bool final_eval, double* metric);
  void log_eval_on_root(int64_t step, bool final_eval, const LossSummary& eval, double bleu);
  // --keep-best and --early-stop after the evaluation of `step`: a
  // checkpoint when the evaluation is among the kept best and `step` has
  // none yet (saved_at: the step of the last checkpoint). *stop: no better
  // metric in --early-stop evaluations. Returns 0 or an exit code.
  int choose_model(int64_t step, double metric, int64_t* saved_at, bool* stop);
  // Wall seconds since the run began, resumed jobs included (rank 0).
  double elapsed_s() const { return elapsed_before_ + seconds_since(job_start_); }

  TrainingRun& run_;
  const Communicator& comm_;
  const ConfigText& config_text_;
  const FaultInjection& faults_;
  StepState state_;
  LossWatch loss_watch_;
  // On a GPU, the attention calls at the last progress line: each line
  // counts its window's fallbacks to the plain kernels.
  AttentionCalls attention_at_line_;
  std::string attention_window();
  Batch eval_batch_;
  std::unique_ptr<ModelChoice> choice_;   // rank 0, with --keep-best or --early-stop
  std::unique_ptr<ValidationBleu> bleu_;  // --valid-bleu
  // Clocks of the progress line: the job's start, the first step's start.
  Clock::time_point job_start_, loop_start_;
  double elapsed_before_ = 0.0;  // elapsed_s when this job resumed the run
};

int Trainer::run() {
  const TrainConfig& cfg = run_.cfg;
  if (const int code = prepare()) return code;
  int64_t saved_at = run_.start.resumed ? run_.start.state.step : -1;  // the last checkpoint
  loop_start_ = Clock::now();
  state_.window.start_clock();

  const StopSignals stop_signals;
  run_.source->prefetch(run_.cursor.first, run_.cursor.stride);
  for (int64_t step = run_.cursor.first_step; step <= cfg.steps; ++step) {
    if (const int code = train_step(run_, step, faults_, comm_, &state_)) return code;
    if (replica_check_due(step)) {
      if (const int code = verify_replicas(step)) return code;
    }
    if (progress_due(step)) {
      if (const int code = log_progress(step)) return code;
    }

    const Clock::time_point other_start = Clock::now();
    if (checkpoint_due(step)) {
      if (const int code = save(step)) return code;
      saved_at = step;
    }
    if (eval_due(step)) {
      bool stop = false;  // --early-stop
      if (const int code = evaluate_and_choose(step, false, &saved_at, &stop)) return code;
      if (stop) return 0;
    }
    state_.window.add_other_time(seconds_since(other_start));

    // A stop signal on any rank (the time limit is near, the job was
    // cancelled or preempted, Ctrl-C): every rank stops after this same
    // step, with a checkpoint, and exits kExitStopped for the job script
    // to requeue.
    if (const int signal = agreed_stop_signal(step)) {
      if (step == cfg.steps) break;  // finished anyway
      return stop_for_signal(signal, step, saved_at);
    }
  }
  // The final evaluation, which --keep-best weighs too.
  bool stop = false;
  return evaluate_and_choose(cfg.steps, true, &saved_at, &stop);
}

int Trainer::prepare() {
  if (run_.metrics) elapsed_before_ = run_.metrics->elapsed_before();
  state_.window.show_nll(run_.cfg.label_smoothing > 0.0f);
  if (const int code = restore_progress_window()) return code;
  if (const int code = make_model_choice()) return code;
  return make_validation_bleu();
}

// The steps since the last progress line before a stop are in the
// checkpoint: the next line covers them as if the run had not stopped.
int Trainer::restore_progress_window() {
  if (!run_.start.resumed) return 0;
  const std::string& file = run_.start.checkpoint.path;  // rank 0's, who speaks
  return agree_on(
      comm_,
      [&] {
        try {
          state_.window.restore(run_.start.state.progress_window, comm_);
        } catch (const UsageError& e) {
          throw UsageError(file.empty() ? e.what() : file + ": " + e.what());
        }
      },
      Speaker::kFirstRefusal, Blame::kByType, "train");
}

int Trainer::make_model_choice() {
  const TrainConfig& cfg = run_.cfg;
  if (cfg.keep_best <= 0 && cfg.early_stop <= 0) return 0;
  const bool made = agree_on(comm_, [&] {
                      if (!comm_.is_root()) return;
                      choice_ = std::make_unique<ModelChoice>(
                          cfg.out_dir, cfg.valid_bleu ? "bleu" : "nll", cfg.keep_best,
                          run_.start.resumed ? run_.start.state.step : 0);
                    }) == 0;
  return made ? 0 : kExitFailure;
}

int Trainer::make_validation_bleu() {
  const TrainConfig& cfg = run_.cfg;
  if (!cfg.valid_bleu) return 0;
  std::string tokenizer = comm_.is_root() ? run_.tokenizer : "";
  comm_.broadcast(&tokenizer, 0);
  const bool made = agree_on(comm_, [&] {
                      bleu_ = std::make_unique<ValidationBleu>(cfg, tokenizer, comm_);
                    }) == 0;
  return made ? 0 : kExitFailure;
}

bool Trainer::replica_check_due(int64_t step) const {
  const TrainConfig& cfg = run_.cfg;
  return comm_.size() > 1 && cfg.check_every > 0 && step % cfg.check_every == 0;
}

bool Trainer::progress_due(int64_t step) const {
  return step % run_.cfg.log_every == 0 || step == run_.cfg.steps;
}

bool Trainer::checkpoint_due(int64_t step) const {
  const TrainConfig& cfg = run_.cfg;
  return (cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0) || step == cfg.steps;
}

// The last step has the final evaluation instead.
bool Trainer::eval_due(int64_t step) const {
  const TrainConfig& cfg = run_.cfg;
  return cfg.eval_every > 0 && step % cfg.eval_every == 0 && step != cfg.steps;
}

int Trainer::verify_replicas(int64_t step) {
  const int rank = comm_.rank();
  const Clock::time_point check_start = Clock::now();
  const ReplicaMismatch mismatch = check_replicas(run_.model->parameters(), comm_);
  if (mismatch.found()) {
    if (rank == mismatch.rank)
      std::fprintf(stderr,
                   "[rank %d] replica check at step %lld: parameter '%s' differs from rank "
                   "0's copy; the replicas have diverged\n",
                   rank, static_cast<long long>(step), mismatch.tensor.c_str());
    std::fflush(stderr);
    return kExitFailure;
  }
  state_.window.add_other_time(seconds_since(check_start));
  return 0;
}

int Trainer::evaluate_and_choose(int64_t step, bool final_eval, int64_t* saved_at, bool* stop) {
  double metric = 0;
  if (const int code = evaluate_and_log(step, final_eval, &metric)) return code;
  return choose_model(step, metric, saved_at, stop);
}

int Trainer::agreed_stop_signal(int64_t step) {
  // The fault injection's signal: on the last rank, as if only it were told.
  if (step == faults_.signal_after_step && comm_.rank() == comm_.size() - 1) std::raise(SIGUSR1);
  return comm_.max(StopSignals::pending());
}

int Trainer::stop_for_signal(int signal, int64_t step, int64_t saved_at) {
  if (saved_at != step) {
    if (const int code = save(step)) return code;
  }
  if (comm_.is_root()) {
    say(stdout, "stopped by %s after step %lld; continue with --resume auto (exit code %d)\n",
        StopSignals::name(signal), static_cast<long long>(step), kExitStopped);
    std::fflush(stdout);
  }
  return kExitStopped;
}

int Trainer::choose_model(int64_t step, double metric, int64_t* saved_at, bool* stop) {
  if (run_.cfg.keep_best <= 0 && run_.cfg.early_stop <= 0) return 0;
  const bool keep = comm_.max(comm_.is_root() && choice_->would_keep(metric) ? 1 : 0) != 0;
  if (keep && *saved_at != step) {
    if (const int code = save(step)) return code;
    *saved_at = step;
  }
  int stop_flag = 0;
  const bool ok =
      agree_on(comm_, [&] {
        if (!comm_.is_root()) return;
        const std::string checkpoint =
            *saved_at == step ? checkpoint_path_for(run_.cfg.out_dir, step) : "";
        choice_->record(step, metric, checkpoint);
        if (keep) {
          say(stdout, "kept among the %d best: %s (the best: %s, checkpoints/best.h5)\n",
              run_.cfg.keep_best, choice_->describe({step, metric}).c_str(),
              choice_->describe(choice_->best()).c_str());
        }
        const int since = choice_->evaluations_since_best();
        if (run_.cfg.early_stop > 0 && since >= run_.cfg.early_stop && step < run_.cfg.steps) {
          stop_flag = 1;
          say(stdout,
              "early stop after step %lld: no better validation %s in %d evaluation(s) since the "
              "best, %s%s\n",
              static_cast<long long>(step), choice_->metric() == "bleu" ? "BLEU" : "nll", since,
              choice_->describe(choice_->best()).c_str(),
              run_.cfg.keep_best > 0 ? " (checkpoints/best.h5)" : "");
        }
        std::fflush(stdout);
      }) == 0;
  if (!ok) return kExitFailure;
  *stop = comm_.max(stop_flag) != 0;
  if (*stop && *saved_at != step) {
    // The last state is kept too: --resume auto can go on from it.
    if (const int code = save(step)) return code;
    *saved_at = step;
  }
  return 0;
}

void Trainer::take_device_sums() {
  if (run_.check_each_step) return;
  state_.window.add_step_sums(run_.model->take_train_sums());
  state_.window.add_label_counts(run_.model->take_label_counts(/*train=*/true));
}

int Trainer::log_progress(int64_t step) {
  take_device_sums();
  if (!run_.check_each_step && state_.measured_scale > 0.0f)
    state_.grad_norm = run_.optimizer->measured_norm() / state_.measured_scale;
  ProgressWindow::Position at;
  at.elapsed_s = elapsed_s();
  const int64_t done = step - run_.cursor.first_step + 1;  // steps of this job
  if (step < run_.cfg.steps) at.eta_s = seconds_since(loop_start_) / done * (run_.cfg.steps - step);
  const uint64_t per_epoch = run_.source->batches_per_epoch();
  if (per_epoch > 0) {
    at.epoch =
        static_cast<double>(run_.cursor.next_batch_after(step)) / static_cast<double>(per_epoch);
  }
  const ProgressWindow::Line line =
      state_.window.close(step, run_.cfg.steps, state_.lr, state_.grad_norm, run_.scaler->scale(),
                          run_.scaler->dynamic(), at, comm_);
  const std::string attention = attention_window();
  const bool ok = agree_on(comm_, [&] {
                    if (!comm_.is_root()) return;
                    say(stdout, "%s%s\n", line.text.c_str(), attention.c_str());
                    std::fflush(stdout);
                    run_.metrics->append(line.row);
                  }) == 0;
  if (!ok) return kExitFailure;
  if (!run_.check_each_step) {
    // Found at the progress line: the step that diverged is one of the window's.
    const auto [loss_finite, norm_finite] = agree_finite(comm_, line.row.loss, state_.grad_norm);
    if (!loss_finite || !norm_finite) {
      return diverged(comm_, run_.run_dir.get(), step,
                      std::string(loss_finite ? "the gradient norm" : "the loss") +
                          " is not finite (checked at each progress line on this device)");
    }
  }
  const std::string warning = loss_watch_.observe(step, line.row.loss);
  if (!warning.empty() && comm_.is_root()) {
    say(stderr, "%s\n", warning.c_str());
    std::fflush(stderr);
  }
  return 0;
}

// " | attention fallbacks N" on a GPU: rank 0's calls that cuDNN was asked
// and did not take since the last line (0 when all ran where they should).
std::string Trainer::attention_window() {
  if (run_.cfg.device != DeviceKind::kCuda) return "";
  const AttentionCalls now = run_.ops->attention_calls();
  const AttentionCalls window = calls_since(now, attention_at_line_);
  attention_at_line_ = now;
  return " | attention fallbacks " + std::to_string(window.fallbacks);
}

int Trainer::save(int64_t step) {
  // A state with a NaN or an infinity (a finite step can still overflow the
  // weights) never reaches a checkpoint.
  const char* bad = run_.optimizer->non_finite_state();
  if (comm_.any(bad != nullptr)) {
    return diverged(
        comm_, run_.run_dir.get(), step,
        "non-finite values in " + std::string(bad ? bad : "the state") + " after the update");
  }
  // Every rank writes its part of the file through MPI-IO: a sharded
  // optimizer its own slice (the only moments it holds), else an even share.
  // A fault anywhere (a full disk) is one line and exit 1 on every rank, the
  // previous checkpoints and `latest` untouched.
  const ParameterSet& params = run_.model->parameters();
  CheckpointSlice slice;
  if (run_.shards) {
    slice.begin = run_.optimizer->shard_begin();
    slice.end = run_.optimizer->shard_end();
    slice.m = run_.optimizer->m();  // (end - begin): the slice alone
    slice.v = run_.optimizer->v();
  } else {
    std::tie(slice.begin, slice.end) = even_share(params.count(), comm_.rank(), comm_.size());
    slice.m = run_.optimizer->m() + slice.begin;
    slice.v = run_.optimizer->v() + slice.begin;
  }
  slice.params = params.master_at(slice.begin);  // sliced masters: exactly the slice
  CheckpointState state = checkpoint_state(step);
  take_device_sums();
  state.progress_window = state_.window.save(comm_);
  const SavedCheckpoint saved = save_checkpoint_collectively(
      comm_, run_.cfg.out_dir, params, slice, state, run_.cfg.keep_checkpoints,
      CheckpointWriteFault{faults_.fail_in_checkpoint_step, faults_.fail_in_checkpoint_rank,
                           faults_.kill_in_checkpoint_step});
  if (saved.code) return saved.code;
  if (comm_.is_root()) {
    const double mib = static_cast<double>(saved.bytes) / (1 << 20);
    char size[32];
    if (mib >= 1024.0) {
      std::snprintf(size, sizeof size, "%.2f GiB", mib / 1024.0);
    } else {
      std::snprintf(size, sizeof size, "%.1f MiB", mib);
    }
    say(stdout, "checkpoint step %lld: %s (%.2f s, %s)\n", static_cast<long long>(step),
        saved.path.c_str(), saved.seconds, size);
    std::fflush(stdout);
  }
  return 0;
}

CheckpointState Trainer::checkpoint_state(int64_t step) const {
  CheckpointState state;
  state.step = step;
  state.world_size = comm_.size();
  state.config_ini = config_text_.write(run_.cfg);
  state.optimizer_steps = run_.optimizer->steps_taken();
  state.next_batch = run_.cursor.next_batch_after(step);
  const uint64_t per_epoch = run_.source->batches_per_epoch();
  state.epoch = per_epoch > 0 ? state.next_batch / per_epoch : 0;
  state.batches_per_step = run_.cursor.batches_per_step;
  state.sharding = to_string(run_.cfg.sharding);
  state.seed = run_.cfg.seed;
  state.loss_scale = run_.scaler->scale();
  state.loss_scale_good_steps = run_.scaler->good_steps();
  state.vocab_size = run_.cfg.model.vocab;
  state.special = run_.cfg.model.special;
  // Rank 0's: it read the shards and holds the run directory.
  state.tokenizer = run_.tokenizer;
  state.label_names = run_.label_names;
  if (run_.run_dir) state.run_id = run_.run_dir->run_id();
  return state;
}

int Trainer::evaluate_and_log(int64_t step, bool final_eval, double* metric) {
  const LossSummary eval =
      evaluate(*run_.model, *run_.source, static_cast<uint64_t>(run_.cfg.eval_batches),
               run_.cfg.label_smoothing, comm_, eval_batch_);
  *metric = eval.nll;
  double bleu = std::nan("");
  if (bleu_) {
    const Clock::time_point start = Clock::now();
    BleuCounts local;
    if (agree_on(comm_, [&] { local = bleu_->translate(*run_.model, *run_.ops); }) != 0)
      return kExitFailure;
    bleu = ValidationBleu::score(local, comm_);
    *metric = bleu;
    if (comm_.is_root() && final_eval) {
      say(stdout, "valid BLEU: %zu sentences translated (greedy) in %.1f s; %s\n",
          bleu_->sentences(), seconds_since(start), bleu_signature());
    }
  }
  return agree_on(comm_, [&] { log_eval_on_root(step, final_eval, eval, bleu); }) == 0
             ? 0
             : kExitFailure;
}

void Trainer::log_eval_on_root(int64_t step, bool final_eval, const LossSummary& eval,
                               double bleu) {
  if (!comm_.is_root()) return;
  std::string figures = describe_eval(eval, run_.cfg.model.kind);
  if (!std::isnan(bleu)) {
    char text[32];
    std::snprintf(text, sizeof text, " | BLEU %.2f", bleu);
    figures += text;
  }
  if (final_eval) {
    say(stdout, "final eval | %s\n", figures.c_str());
    // Which kernels attention ran on, so no fallback passes unseen.
    if (run_.cfg.device == DeviceKind::kCuda) {
      say(stdout, "attention on rank 0: %s\n",
          attention_summary(run_.ops->attention_calls()).c_str());
    }
  } else {
    say(stdout, "eval step %lld | %s\n", static_cast<long long>(step), figures.c_str());
  }
  std::fflush(stdout);
  EvalRow row;
  row.step = step;
  row.loss = eval.loss;
  row.nll = eval.nll;
  row.perplexity = eval.perplexity;
  row.accuracy = eval.accuracy;
  row.tokens = eval.tokens;
  row.labels = eval.labels;
  row.bleu = bleu;
  row.elapsed_s = elapsed_s();
  run_.metrics->append(row);
}

}  // namespace

int train(const TrainConfig& flags, const Communicator& comm, const ConfigText& config_text,
          const FaultInjection& faults) {
  const Clock::time_point job_start = Clock::now();  // elapsed_s counts the start-up
  StepState state(flags.on_divergence);
  if (!comm.is_root()) detach_run_log();  // rank 0 keeps the run's log
  const Started started = start_run(flags, comm, config_text, faults);
  if (!started.run) return started.exit_code;
  Trainer trainer(*started.run, comm, config_text, faults, std::move(state), job_start);
  const int code = trainer.run();
  if (code != 0 || flags.average_checkpoints == 0) return code;
  return write_final_average(flags, comm, config_text);  // the run's last line
}

}  // namespace mpiformer
