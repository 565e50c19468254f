#include "src/train/trainer.h"

#include <signal.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "kernels/backend.h"
#include "kernels/cpu/blas_kernels.h"
#include "src/core/error.h"
#include "src/core/run_log.h"
#include "src/core/version.h"
#include "src/data/make_source.h"
#include "src/io/atomic_file.h"
#include "src/io/hdf5_file.h"
#include "src/io/shard.h"
#include "src/loss/cross_entropy.h"
#include "src/parallel/checkpoint_broadcast.h"
#include "src/parallel/data_parallel.h"
#include "src/parallel/rank_device.h"
#include "src/parallel/replica_check.h"
#include "src/train/held_out.h"
#include "src/train/memory_budget.h"
#include "src/train/step.h"
#include "src/train/stop_signals.h"

namespace mpiformer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Rank 0: the checkpoint against the flags of this run. The model's shape
// is checked when its tensors are unpacked.
Verdict check_resumable(const TrainConfig& cfg, const CheckpointState& state,
                        const std::string& tokenizer, int world_size) {
  const std::string sharding = to_string(cfg.sharding);
  if (state.sharding != sharding) {
    return {kExitUsage, "mpiformer train: --sharding: the checkpoint was trained with --sharding " +
                            state.sharding + "; resume with the same"};
  }
  if (sharding == "file" && state.world_size != world_size) {
    return {kExitUsage,
            "mpiformer train: --sharding file ties each rank's batches to the world size: the "
            "checkpoint was written by " +
                std::to_string(state.world_size) + " rank(s), this run has " +
                std::to_string(world_size) + "; resume on " + std::to_string(state.world_size) +
                " rank(s)"};
  }
  // Another vocabulary size shows as a tensor shape; the same size with
  // other ids would train on garbage silently.
  if (!cfg.data_dir.empty() &&
      (state.special != cfg.model.special || state.tokenizer != tokenizer)) {
    return {kExitUsage,
            "mpiformer train: --data: the shards' tokenizer differs from the one the "
            "checkpoint was trained with; resume on the same shards"};
  }
  return {};
}

// The scalars every rank needs of rank 0's start point, as one flat record
// for one broadcast.
struct StartRecord {
  uint64_t resumed;
  int64_t step, world_size, optimizer_steps;
  uint64_t next_batch, epoch;
  int64_t batches_per_step;
  uint64_t seed;
  double loss_scale;
  int64_t loss_scale_good_steps;
};
static_assert(sizeof(StartRecord) % sizeof(uint64_t) == 0);

void broadcast_start(const Communicator& comm, StartPoint* start) {
  CheckpointState& s = start->state;
  StartRecord r{
      start->resumed ? 1u : 0u, s.step, s.world_size, s.optimizer_steps,      s.next_batch, s.epoch,
      s.batches_per_step,       s.seed, s.loss_scale, s.loss_scale_good_steps};
  comm.broadcast(reinterpret_cast<uint64_t*>(&r), sizeof r / sizeof(uint64_t), 0);
  start->resumed = r.resumed != 0;
  s.step = r.step;
  s.world_size = static_cast<int>(r.world_size);
  s.optimizer_steps = r.optimizer_steps;
  s.next_batch = r.next_batch;
  s.epoch = r.epoch;
  s.batches_per_step = r.batches_per_step;
  s.seed = r.seed;
  s.loss_scale = r.loss_scale;
  s.loss_scale_good_steps = r.loss_scale_good_steps;
}

// The batching flags of this run that differ from the checkpoint's run
// ("--max-tokens 512 (was 256)"), "" when none does or its config is unreadable.
std::string changed_batching(const TrainConfig& cfg, const ConfigText& config_text,
                             const std::string& checkpoint_ini) {
  TrainConfig old;
  try {
    old = config_text.read(checkpoint_ini, "the checkpoint's config");
  } catch (const std::exception&) {
    return "";
  }
  const auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int x : v) {
      if (!s.empty()) s += ',';
      s += std::to_string(x);
    }
    return s.empty() ? std::string("default") : s;
  };
  std::string changed;
  const auto note = [&](const char* flag, const std::string& now, const std::string& was) {
    if (now == was) return;
    changed += std::string(changed.empty() ? "" : ", ") + flag + " " + now + " (was " + was + ")";
  };
  note("--max-tokens", std::to_string(cfg.max_tokens), std::to_string(old.max_tokens));
  note("--max-sentences", std::to_string(cfg.max_sentences), std::to_string(old.max_sentences));
  note("--buckets", list(cfg.buckets), list(old.buckets));
  return changed;
}

// The run's description in metrics.h5.
RunAttributes run_attributes(const TrainConfig& cfg, const std::string& config_ini, const Ops& ops,
                             int world_size, int threads) {
  RunAttributes a;
  a.config = config_ini;
  a.model = to_string(cfg.model.kind);
  a.world_size = world_size;
  a.devices = std::to_string(world_size) + " x " + ops.name() + " (" + std::to_string(threads) +
              " thread(s) each)";
  a.versions = std::string("mpiformer ") + MPIFORMER_VERSION + "; " +
               Communicator::library_version() + "; " + hdf5::library_version() + "; " +
               blas_version();
  a.git_commit = MPIFORMER_GIT_COMMIT;
  return a;
}

}  // namespace

Trainer::Trainer(const TrainConfig& cfg, Communicator& comm, ConfigText config_text,
                 const FaultInjection& faults)
    : cfg_(cfg),
      config_text_(std::move(config_text)),
      comm_(comm),
      world_(comm.size()),
      rank_(comm.rank()),
      accum_(cfg.accum_steps),
      guard_(cfg.on_divergence),
      faults_(faults) {}

Trainer::~Trainer() = default;

// ------------------------------------------------------------ start-up

int Trainer::resolve_inputs() {
  // Every input is validated before training, and all ranks agree on it.
  if (!agreed(comm_, [&] {
        resolve_data_config(&cfg_);
        if (rank_ == 0 && !cfg_.data_dir.empty()) {
          const ShardHeader header = read_shard_header(list_shards(cfg_.data_dir, "train").front());
          tokenizer_ = header.tokenizer;
          label_names_ = header.label_names;
        }
      }))
    return kExitFailure;
  return 0;
}

int Trainer::open_run_directory() {
  // Rank 0 locks the run directory, then reads the checkpoint to resume
  // from, if any; every rank learns the verdict.
  Verdict verdict;
  if (comm_.is_root()) {
    run_dir_ = std::make_unique<RunDirectory>(cfg_.out_dir);
    verdict = run_dir_->open();
    if (verdict.code == 0) verdict = run_dir_->choose_start(cfg_.resume, &start_);
    if (verdict.code == 0 && start_.resumed)
      verdict = check_resumable(cfg_, start_.state, tokenizer_, world_);
  }
  if (const int code = agree_on(comm_, verdict)) return code;
  broadcast_start(comm_, &start_);
  first_step_ = start_.resumed ? start_.state.step + 1 : 1;
  // A resumed run continues the checkpoint's random streams.
  flag_seed_ = cfg_.seed;
  if (start_.resumed) cfg_.seed = start_.state.seed;
  return 0;
}

int Trainer::build() {
  if (!agreed(comm_, [&] { source_ = make_batch_source(cfg_, rank_, world_); }))
    return kExitFailure;
  threads_ = cfg_.threads > 0 ? cfg_.threads : comm_.cores_per_local_rank();
  ops_ = make_ops(cfg_.device, threads_, comm_, cfg_.tf32);
  ops_->set_deterministic(cfg_.deterministic);
  // --attention cudnn where cuDNN cannot run is refused before anything runs.
  if (!agreed(comm_, [&] { ops_->set_attention_path(cfg_.attention); })) return kExitUsage;
  if (!agreed(comm_, [&] { transport_ = choose_transport(cfg_.transport, *ops_, comm_); }))
    return kExitFailure;

  // Memory: estimated from the flags, refused before anything big is
  // allocated when it cannot fit.
  const ModelCapacity capacity{cfg_.max_tokens, cfg_.model.max_len};
  const DType compute = compute_dtype(cfg_.precision);
  const bool reducer_exact = cfg_.grad_sum == GradSum::kExact;
  // The MPI transport reads host memory: a GPU's gradients are staged.
  const bool reducer_staged =
      world_ > 1 && transport_ == Transport::kMpi && !ops_->host_accessible();
  std::string shortfall;
  if (!agreed(comm_, [&] {
        memory_ = estimate_memory(*ops_, cfg_.model, capacity, compute, true, reducer_exact,
                                  reducer_staged);
        shortfall = memory_shortfall(memory_, *ops_, comm_.local_size(),
                                     "--max-tokens, --d-model, --d-ff, --layers or --max-len");
      }))
    return kExitFailure;
  if (const int code = refuse_on_shortfall(comm_, shortfall, "mpiformer train: ")) return code;
  loss_watch_ = LossWatch(cfg_.model.vocab);  // the vocabulary is known now
  model_ = std::make_unique<Model>(*ops_, cfg_.model, capacity, compute);
  model_->init_parameters(cfg_.seed);

  // --lr-scaling: the LR follows the global token budget of a step.
  step_budget_ = static_cast<int64_t>(cfg_.max_tokens) * accum_ * world_;
  lr_factor_ = lr_scale_factor(cfg_.lr_scaling, step_budget_, cfg_.lr_reference_tokens);
  optim_ = cfg_.optim;
  optim_.lr = static_cast<float>(optim_.lr * lr_factor_);
  optim_.end_lr = static_cast<float>(optim_.end_lr * lr_factor_);
  optimizer_ = std::make_unique<AdamW>(model_->parameters(), optim_);
  schedule_ = std::make_unique<LrSchedule>(optim_, cfg_.steps);
  scaler_ = std::make_unique<LossScaler>(cfg_.precision == Precision::kFp16, cfg_.loss_scale,
                                         cfg_.loss_scale_window);
  check_each_step_ = (ops_->host_accessible() && !faults_.deferred_divergence_check) ||
                     scaler_->dynamic() || cfg_.on_divergence == OnDivergence::kSkip;

  // The data cursor. Global indexing: the step after micro-batch index
  // `cursor` reads [cursor, cursor + W K), rank r the micro-batches
  // cursor + r + k W. Per-rank indexing (--sharding file): this rank's
  // [cursor, cursor + K). A resumed run on another world size continues the
  // same sequence of micro-batches.
  const bool global_indices = source_->global_indices();
  batches_per_step_ = global_indices ? static_cast<int64_t>(world_) * accum_ : accum_;
  cursor0_ = start_.resumed ? start_.state.next_batch : 0;
  first_ = cursor0_ + (global_indices ? rank_ : 0);
  stride_ = global_indices ? world_ : 1;
  return 0;
}

int Trainer::restore() {
  if (!start_.resumed) return 0;
  // Parameters, moments and the update count from the checkpoint. A
  // checkpoint of another model shape is a flag fault, found here.
  ParameterSet& params = model_->parameters();
  Verdict verdict;
  if (comm_.is_root()) {
    try {
      std::vector<float> scratch(params.count());  // (params.count())
      unpack_checkpoint_tensors(start_.checkpoint.path, start_.checkpoint.params, params,
                                scratch.data());
    } catch (const CheckpointMismatch& e) {
      verdict = {kExitUsage, std::string("mpiformer train: --resume: ") + e.what() +
                                 "; resume with the flags it was trained with (its config "
                                 "attribute) or choose another --out"};
    }
  }
  if (const int code = agree_on(comm_, verdict)) return code;
  const LoadedCheckpoint& c = start_.checkpoint;
  broadcast_tensors(comm_, c.path, c.params, params, params.params());
  broadcast_tensors(comm_, c.path, c.m, params, optimizer_->m());
  broadcast_tensors(comm_, c.path, c.v, params, optimizer_->v());
  params.refresh_compute();
  optimizer_->set_steps_taken(start_.state.optimizer_steps);
  scaler_->restore(static_cast<float>(start_.state.loss_scale), start_.state.loss_scale_good_steps);
  // The host copy is no longer needed; its path is.
  start_.checkpoint.params = start_.checkpoint.m = start_.checkpoint.v = {};
  return 0;
}

int Trainer::claim_directory() {
  // Only now, with every check passed, does the run change its directory:
  // a later branch moves aside, config.ini and metrics.h5 follow this run.
  Verdict verdict;
  std::string branch_line;
  if (comm_.is_root()) {
    const std::filesystem::path rundir(cfg_.out_dir);
    try {
      const int removed = run_dir_->remove_unfinished_writes();
      if (removed > 0) {
        say(stdout, "removed %d unfinished checkpoint write(s) of an earlier job\n", removed);
      }
      branch_line = run_dir_->make_head(start_);
      // What ran is recorded beside the flags, as comments the reader skips:
      // runs on other BLAS kernels differ in their last bits.
      write_file_atomically((rundir / "config.ini").string(),
                            config_text_.write(cfg_) + "\n# This run (a record; not read back)\n" +
                                "# devices = " + std::to_string(world_) + " x " + ops_->name() +
                                "\n# blas = " + describe_blas_kernels() + "\n");
      // Rank 0's output, start-up lines first, appended over every start.
      attach_run_log((rundir / "train.log").string());
      metrics_ = std::make_unique<MetricsLog>(
          (rundir / "metrics.h5").string(),
          run_attributes(cfg_, config_text_.write(cfg_), *ops_, world_, threads_),
          cfg_.resume == "none" ? -1 : (start_.resumed ? start_.state.step : 0));
    } catch (const std::exception& e) {
      verdict = {kExitUsage, std::string("mpiformer train: --out: ") + e.what()};
    }
    if (!branch_line.empty()) say(stdout, "%s\n", branch_line.c_str());
  }
  return agree_on(comm_, verdict);
}

void Trainer::print_start() const {
  if (!comm_.is_root()) return;
  const TrainConfig& cfg = cfg_;
  say(stdout, "mpiformer train: %s on %s (%s), %d rank(s) x %d thread(s), %zu parameters\n",
      to_string(cfg.model.kind),
      cfg.data_dir.empty() ? to_string(cfg.synthetic) : cfg.data_dir.c_str(), ops_->name().c_str(),
      world_, threads_, model_->parameters().count());
  say(stdout,
      "  %d layer(s), d-model %d, %d heads, d-ff %d, vocab %d, max-len %d; "
      "max-tokens %d x %d micro-batch(es) x %d rank(s) per step\n",
      cfg.model.kind == ModelKind::kSeq2seq ? cfg.model.enc_layers + cfg.model.dec_layers
                                            : cfg.model.layers,
      cfg.model.d_model, cfg.model.heads, cfg.model.d_ff, cfg.model.vocab, cfg.model.max_len,
      cfg.max_tokens, accum_, world_);
  say(stdout, "  memory: about %s per rank\n", memory_.describe().c_str());
  if (cfg.device == DeviceKind::kCpu) say(stdout, "  BLAS: %s\n", describe_blas_kernels().c_str());
  if (cfg.device == DeviceKind::kCuda)
    say(stdout, "  attention: %s\n", ops_->attention_kernels().c_str());
  if (cfg.precision != Precision::kFp32)
    say(stdout,
        "  precision %s: activations and GEMM inputs; fp32 master weights, Adam state "
        "and loss%s\n",
        to_string(cfg.precision), scaler_->dynamic() ? ", with dynamic loss scaling" : "");
  if (cfg.lr_scaling != LrScaling::kNone)
    say(stdout, "  lr %.3e x %.4f (%s: %lld / %lld tokens per step) = %.3e\n", cfg.optim.lr,
        lr_factor_, to_string(cfg.lr_scaling), static_cast<long long>(step_budget_),
        static_cast<long long>(cfg.lr_reference_tokens), optim_.lr);
  if (reducer_)
    say(stdout, "  gradient sum: %s; %.1f MiB per step in %zu bucket(s) of >= %g MiB over %s, %s\n",
        to_string(cfg.grad_sum), reducer_->bytes_per_step() / double(1 << 20),
        reducer_->buckets().size(), bucket_mb_for(cfg.bucket_mb, transport_),
        reducer_->transport().name().c_str(),
        cfg.overlap ? "overlapped with backward" : "after backward");
  if (!cfg.deterministic) {
    say(stdout, "  --deterministic false: %s\n",
        ops_->host_accessible()
            ? "nothing changes on the CPU, whose results never depend on timing"
            : "cuDNN's attention backward may add with atomics; runs are not bitwise "
              "reproducible");
  }
  const std::string data_summary = source_->describe();
  if (!data_summary.empty()) say(stdout, "%s\n", data_summary.c_str());
  const CheckpointState& resumed = start_.state;
  if (start_.resumed) {
    say(stdout,
        "resumed from %s: step %lld, micro-batch %llu (epoch %llu), written by %d rank(s)\n",
        cfg.resume == "auto" ? (std::filesystem::path(cfg.out_dir) / "checkpoints").string().c_str()
                             : cfg.resume.c_str(),
        static_cast<long long>(resumed.step), static_cast<unsigned long long>(resumed.next_batch),
        static_cast<unsigned long long>(resumed.epoch), resumed.world_size);
    if (resumed.batches_per_step != batches_per_step_) {
      say(stdout,
          "  a step now reads %lld micro-batches (the checkpoint's run read %lld): the "
          "micro-batch sequence continues, the global batch size changes\n",
          static_cast<long long>(batches_per_step_),
          static_cast<long long>(resumed.batches_per_step));
    }
    const std::string changed = changed_batching(cfg, config_text_, resumed.config_ini);
    if (!changed.empty()) {
      say(stdout,
          "  note: %s: batches are cut anew, so the examples from here on come in another order "
          "than the checkpoint's run would have read them\n",
          changed.c_str());
    }
    if (flag_seed_ != cfg.seed) {
      say(stdout, "  seed %llu from the checkpoint (--seed %llu is for new runs)\n",
          static_cast<unsigned long long>(cfg.seed), static_cast<unsigned long long>(flag_seed_));
    }
  } else if (cfg.resume == "auto") {
    say(stdout, "no checkpoint in %s: starting at step 1\n",
        (std::filesystem::path(cfg.out_dir) / "checkpoints").string().c_str());
  }
  std::fflush(stdout);
}

// ------------------------------------------------------------ the loop

int Trainer::run() {
  job_start_ = Clock::now();
  if (!comm_.is_root()) detach_run_log();  // rank 0 keeps the run's log
  if (const int code = resolve_inputs()) return code;
  if (const int code = open_run_directory()) return code;
  if (start_.resumed && start_.state.step >= cfg_.steps) {
    if (comm_.is_root()) {
      say(stdout, "%s: the checkpoint of step %lld already reaches --steps %lld; nothing to do\n",
          start_.checkpoint.path.c_str(), static_cast<long long>(start_.state.step),
          static_cast<long long>(cfg_.steps));
    }
    return 0;
  }
  if (const int code = build()) return code;
  if (const int code = restore()) return code;
  // The gradient all-reduce: buckets of whole tensors, started during the
  // last backward pass of each step.
  if (!agreed(comm_, [&] {
        reducer_ = make_reducer(model_->parameters(), cfg_.bucket_mb, cfg_.overlap, cfg_.grad_sum,
                                transport_, comm_);
      }))
    return kExitFailure;
  if (const int code = claim_directory()) return code;
  print_start();
  if (metrics_) elapsed_before_ = metrics_->elapsed_before();
  window_.show_nll(cfg_.label_smoothing > 0.0f);
  loop_start_ = Clock::now();

  batches_.resize(accum_);
  const StopSignals stop_signals;
  source_->prefetch(first_, stride_);
  for (int64_t step = first_step_; step <= cfg_.steps; ++step) {
    if (const int code = train_step(step)) return code;

    // Replicas must still be identical.
    if (world_ > 1 && cfg_.check_every > 0 && step % cfg_.check_every == 0) {
      const Clock::time_point check_start = Clock::now();
      const ReplicaMismatch mismatch = check_replicas(model_->parameters(), comm_);
      if (mismatch.found()) {
        if (rank_ == mismatch.rank)
          std::fprintf(stderr,
                       "[rank %d] replica check at step %lld: parameter '%s' differs from rank "
                       "0's copy; the replicas have diverged\n",
                       rank_, static_cast<long long>(step), mismatch.tensor.c_str());
        std::fflush(stderr);
        return kExitFailure;
      }
      window_.add_other_time(seconds_since(check_start));
    }

    if (step % cfg_.log_every == 0 || step == cfg_.steps) {
      if (const int code = log_progress(step)) return code;
    }

    const Clock::time_point other_start = Clock::now();
    const bool checkpoint_due =
        (cfg_.checkpoint_every > 0 && step % cfg_.checkpoint_every == 0) || step == cfg_.steps;
    if (checkpoint_due) {
      if (const int code = save(step)) return code;
    }
    if (cfg_.eval_every > 0 && step % cfg_.eval_every == 0 && step != cfg_.steps) {
      if (const int code = evaluate_and_log(step, false)) return code;
    }
    window_.add_other_time(seconds_since(other_start));

    // A stop signal on any rank (the time limit is near, the job was
    // cancelled or preempted, Ctrl-C): every rank stops after this same
    // step, with a checkpoint, and exits kExitStopped for the job script
    // to requeue.
    if (step == faults_.signal_after_step && rank_ == world_ - 1) std::raise(SIGUSR1);
    if (const int signal = comm_.max(StopSignals::pending())) {
      if (step == cfg_.steps) break;  // finished anyway
      if (!checkpoint_due) {
        if (const int code = save(step)) return code;
      }
      if (comm_.is_root()) {
        say(stdout, "stopped by %s after step %lld; continue with --resume auto (exit code %d)\n",
            StopSignals::name(signal), static_cast<long long>(step), kExitStopped);
        std::fflush(stdout);
      }
      return kExitStopped;
    }
  }
  return evaluate_and_log(cfg_.steps, true);
}

int Trainer::train_step(int64_t step) {
  // 1. This rank's micro-batches of the step (any may be empty).
  for (int k = 0; k < accum_; ++k) {
    const uint64_t index =
        first_ + stride_ * static_cast<uint64_t>((step - first_step_) * accum_ + k);
    source_->make_batch(BatchSource::kTrain, index, &batches_[k]);
    window_.add_batch(batches_[k]);
  }

  // 2. The gradient of the mean loss over the step's target tokens on all
  //    ranks, times the loss scale: N all-reduced first, then
  //    backward, then the bucketed gradient all-reduce
  //    (src/train/step.h).
  const float loss_scale = scaler_->scale();
  const float pass_scale = faults_.pass_scale(step, loss_scale, rank_ == world_ - 1);
  const StepGradients gradients = step_gradients(
      *model_, batches_, cfg_.seed, step, cfg_.label_smoothing, comm_, reducer_.get(), pass_scale);
  last_lr_ = schedule_->lr(step);
  if (gradients.skipped) {  // no target tokens anywhere: nothing changes
    window_.count_empty_step();
    window_.add_step(model_->take_train_sums(), gradients.reduce);
    window_.add_label_counts(model_->take_label_counts(/*train=*/true));
    return 0;
  }

  // 3. The guard: the loss and the gradient norm must be numbers. The norm
  //    is of the summed gradients, the same on every rank; the loss is this
  //    rank's, so the ranks agree on it. Unless each step is checked, the
  //    update goes ahead and the check waits for the progress line.
  optimizer_->measure_gradients();
  measured_scale_ = loss_scale;
  if (!check_each_step_) {
    optimizer_->step(last_lr_, 1.0f / loss_scale);
    window_.add_step(LossSums{}, gradients.reduce);
    return 0;
  }
  const double norm = optimizer_->measured_norm();
  const LossSums local = model_->take_train_sums();
  window_.add_label_counts(model_->take_label_counts(/*train=*/true));
  const auto [loss_finite, norm_finite] = agree_finite(local.loss, norm);
  const bool can_lower_scale = scaler_->dynamic() && scaler_->scale() > LossScaler::kMinScale;
  switch (guard_.judge(loss_finite, norm_finite, can_lower_scale)) {
    case DivergenceGuard::Action::kApply:
      scaler_->update(true);
      // 4. Clip and update on the device.
      optimizer_->step(last_lr_, 1.0f / loss_scale);
      last_grad_norm_ = norm / loss_scale;
      window_.add_step(local, gradients.reduce);
      return 0;
    case DivergenceGuard::Action::kSkipOverflow:
      // fp16: the summed gradients overflowed; skip the step, halve the scale.
      scaler_->update(false);
      window_.count_overflow();
      window_.add_step(local, gradients.reduce);
      return 0;
    case DivergenceGuard::Action::kSkipDiverged:
      scaler_->update(false);
      window_.count_non_finite_skip();
      window_.add_step(LossSums{}, gradients.reduce);
      if (comm_.is_root()) {
        say(stderr, "warning: step %lld skipped: %s (--on-divergence skip, %d in a row)\n",
            static_cast<long long>(step), guard_.reason().c_str(), guard_.skipped_in_a_row());
        std::fflush(stderr);
      }
      return 0;
    case DivergenceGuard::Action::kStop:
      break;
  }
  std::string why = guard_.reason();
  if (guard_.skipped_in_a_row() >= DivergenceGuard::kMaxSkippedInARow)
    why += " for " + std::to_string(guard_.skipped_in_a_row()) + " steps in a row";
  return diverged(step, why);
}

std::pair<bool, bool> Trainer::agree_finite(double loss, double grad_norm) const {
  const int bad = comm_.max((std::isfinite(loss) ? 0 : 2) | (std::isfinite(grad_norm) ? 0 : 1));
  return {(bad & 2) == 0, (bad & 1) == 0};
}

int Trainer::diverged(int64_t step, const std::string& why) {
  if (comm_.is_root()) {
    const std::string latest = run_dir_->latest();
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

int Trainer::log_progress(int64_t step) {
  if (!check_each_step_) {
    window_.add_step_sums(model_->take_train_sums());
    window_.add_label_counts(model_->take_label_counts(/*train=*/true));
    if (measured_scale_ > 0.0f) last_grad_norm_ = optimizer_->measured_norm() / measured_scale_;
  }
  ProgressWindow::Position at;
  at.elapsed_s = elapsed_s();
  const int64_t done = step - first_step_ + 1;  // steps of this job
  if (step < cfg_.steps) at.eta_s = seconds_since(loop_start_) / done * (cfg_.steps - step);
  const uint64_t per_epoch = source_->batches_per_epoch();
  if (per_epoch > 0) {
    at.epoch = static_cast<double>(next_batch_after(step)) / static_cast<double>(per_epoch);
  }
  const ProgressWindow::Line line = window_.close(step, cfg_.steps, last_lr_, last_grad_norm_,
                                                  scaler_->scale(), scaler_->dynamic(), at, comm_);
  const bool ok = agreed(comm_, [&] {
    if (!comm_.is_root()) return;
    say(stdout, "%s\n", line.text.c_str());
    std::fflush(stdout);
    metrics_->append(line.row);
  });
  if (!ok) return kExitFailure;
  if (!check_each_step_) {
    // Found at the progress line: the step that diverged is one of the window's.
    const auto [loss_finite, norm_finite] = agree_finite(line.row.loss, last_grad_norm_);
    if (!loss_finite || !norm_finite) {
      return diverged(step, std::string(loss_finite ? "the gradient norm" : "the loss") +
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

uint64_t Trainer::next_batch_after(int64_t step) const {
  return cursor0_ + static_cast<uint64_t>((step - first_step_ + 1) * batches_per_step_);
}

double Trainer::elapsed_s() const {
  return elapsed_before_ + seconds_since(job_start_);
}

int Trainer::save(int64_t step) {
  // A state with a NaN or an infinity (a finite step can still overflow the
  // weights) never reaches a checkpoint.
  const char* bad = optimizer_->non_finite_state();
  if (comm_.any(bad != nullptr)) {
    return diverged(
        step, "non-finite values in " + std::string(bad ? bad : "the state") + " after the update");
  }
  // Rank 0 writes; every rank learns whether it could (a full disk is one
  // line and exit 1, the previous checkpoints and `latest` untouched).
  return agreed(comm_, [&] { write_checkpoint_on_root(step); }) ? 0 : kExitFailure;
}

void Trainer::write_checkpoint_on_root(int64_t step) {
  if (!comm_.is_root()) return;
  CheckpointState state;
  state.step = step;
  state.world_size = world_;
  state.config_ini = config_text_.write(cfg_);
  state.optimizer_steps = optimizer_->steps_taken();
  state.next_batch = next_batch_after(step);
  const uint64_t per_epoch = source_->batches_per_epoch();
  state.epoch = per_epoch > 0 ? state.next_batch / per_epoch : 0;
  state.batches_per_step = batches_per_step_;
  state.sharding = to_string(cfg_.sharding);
  state.seed = cfg_.seed;
  state.loss_scale = scaler_->scale();
  state.loss_scale_good_steps = scaler_->good_steps();
  state.vocab_size = cfg_.model.vocab;
  state.special = cfg_.model.special;
  state.tokenizer = tokenizer_;
  state.label_names = label_names_;
  const std::string path = save_checkpoint(cfg_.out_dir, model_->parameters(), optimizer_->m(),
                                           optimizer_->v(), state, cfg_.keep_checkpoints);
  say(stdout, "checkpoint step %lld: %s\n", static_cast<long long>(step), path.c_str());
  std::fflush(stdout);
}

int Trainer::evaluate_and_log(int64_t step, bool final_eval) {
  const LossSummary eval = evaluate(*model_, *source_, static_cast<uint64_t>(cfg_.eval_batches),
                                    cfg_.label_smoothing, comm_, eval_batch_);
  return agreed(comm_, [&] { log_eval_on_root(step, final_eval, eval); }) ? 0 : kExitFailure;
}

void Trainer::log_eval_on_root(int64_t step, bool final_eval, const LossSummary& eval) {
  if (!comm_.is_root()) return;
  const std::string figures = describe_eval(eval, cfg_.model.kind);
  if (final_eval) {
    say(stdout, "final eval | %s\n", figures.c_str());
    // Which kernels attention ran on, so no fallback passes unseen.
    if (cfg_.device == DeviceKind::kCuda) {
      say(stdout, "attention on rank 0: %s\n", attention_summary(ops_->attention_calls()).c_str());
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
  row.elapsed_s = elapsed_s();
  metrics_->append(row);
}

}  // namespace mpiformer
