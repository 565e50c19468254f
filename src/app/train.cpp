// `mpiformer train`: the training loop, read top to bottom.
//
// One optimizer step on W ranks with K micro-batches each takes the global
// micro-batches [(s-1) W K, s W K); rank r takes every W-th of them, so the
// global batch does not depend on W. The loss of every micro-batch is divided
// by N, the step's global count of target tokens (MPI_Allreduce before any
// backward), and gradients are summed over ranks: the update is the gradient
// of the mean loss over every target token of the step (docs/DESIGN.md section 1).
//
// A run survives: --resume continues from a checkpoint exactly (the same
// parameters, moments, data cursor and random streams), and SIGTERM or
// SIGUSR1 make every rank stop at the next step boundary, write a
// checkpoint and exit with kExitStopped, which job scripts requeue.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/app/commands.h"
#include "src/app/device.h"
#include "src/app/evaluation.h"
#include "src/app/options.h"
#include "src/app/restore.h"
#include "src/core/error.h"
#include "src/core/version.h"
#include "src/data/make_source.h"
#include "src/dist/data_parallel.h"
#include "src/dist/replica_check.h"
#include "src/io/checkpoint.h"
#include "src/io/hdf5_file.h"
#include "src/io/metrics.h"
#include "src/io/shard.h"
#include "src/loss/cross_entropy.h"
#include "src/model/model.h"
#include "src/optim/adamw.h"
#include "src/optim/loss_scaler.h"
#include "src/optim/schedule.h"

namespace mpiformer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Writes `text` to `path` through a temporary name, so a reader never sees
// half a file.
void write_file_atomically(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out.flush()) throw std::runtime_error("cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

// ------------------------------------------------------------ stop signals

volatile std::sig_atomic_t stop_signal = 0;

extern "C" void note_stop_signal(int signal) {
  stop_signal = signal;
}

// SIGTERM (scancel, the end of a time limit) and SIGUSR1 (SLURM's warning
// before it, --signal=B:USR1@120) only raise a flag; the loop acts on it at
// the next step boundary. The previous handlers come back on destruction.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = note_stop_signal;
    action.sa_flags = SA_RESTART;  // MPI and file calls carry on; the loop looks at the flag
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, &saved_term_);
    sigaction(SIGUSR1, &action, &saved_usr1_);
  }
  ~StopSignals() {
    sigaction(SIGTERM, &saved_term_, nullptr);
    sigaction(SIGUSR1, &saved_usr1_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction saved_term_ {
  }, saved_usr1_{};
};

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

// ------------------------------------------------------------ resuming

// Where the run starts: a fresh run, or the state of a checkpoint (rank 0
// also holds its tensors until they are broadcast).
struct StartPoint {
  bool resumed = false;
  CheckpointState state;        // every rank (scalars only)
  LoadedCheckpoint checkpoint;  // rank 0
};

// Rank 0: the run directory and the checkpoint to resume from. Every fault
// is a line for the user; "[rank 0]" is added by the caller.
Verdict choose_start(const TrainConfig& cfg, StartPoint* start) {
  namespace fs = std::filesystem;
  const fs::path rundir(cfg.out_dir);
  std::error_code ec;
  fs::create_directories(rundir, ec);
  if (ec || !fs::is_directory(rundir)) {
    return {kExitUsage, "mpiformer train: --out: cannot use " + cfg.out_dir +
                            " as the run directory (" +
                            (ec ? ec.message() : std::string("not a directory")) + ")"};
  }
  const std::vector<std::string> found = list_checkpoints(cfg.out_dir);
  if (cfg.resume == "none") {
    if (!found.empty() || fs::exists(rundir / "metrics.h5")) {
      return {kExitUsage, "mpiformer train: --out: " + cfg.out_dir +
                              " already holds a run; continue it with --resume auto, or choose "
                              "another --out"};
    }
    return {};
  }
  const std::vector<std::string> candidates =
      cfg.resume == "auto" ? found : std::vector<std::string>{cfg.resume};
  for (const std::string& path : candidates) {
    try {
      start->checkpoint = read_checkpoint(path);
      start->state = start->checkpoint.state;
      start->resumed = true;
      return {};
    } catch (const CheckpointError& e) {
      if (cfg.resume != "auto") return {kExitFailure, std::string("cannot resume: ") + e.what()};
      // A newest checkpoint that is damaged: say so and take the one before.
      std::fprintf(stderr, "[rank 0] skipping a damaged checkpoint: %s\n", e.what());
      std::fflush(stderr);
    }
  }
  if (!candidates.empty()) {
    return {kExitFailure, "cannot resume: none of the " + std::to_string(candidates.size()) +
                              " checkpoint(s) in " + (rundir / "checkpoints").string() +
                              " is readable"};
  }
  return {};
}

// Rank 0: the checkpoint against the flags of this run. The model's shape
// is checked when its tensors are unpacked.
Verdict check_resumable(const TrainConfig& cfg, const CheckpointState& state,
                        const std::string& tokenizer, int world_size) {
  const std::string sharding = cfg.sharding == Sharding::kFile ? "file" : "data";
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

// Rank 0's checkpoint scalars to every rank.
void broadcast_state(const Communicator& comm, StartPoint* start) {
  CheckpointState& s = start->state;
  uint64_t loss_scale_bits = 0;
  std::memcpy(&loss_scale_bits, &s.loss_scale, sizeof loss_scale_bits);
  uint64_t v[10] = {start->resumed ? 1u : 0u,
                    static_cast<uint64_t>(s.step),
                    static_cast<uint64_t>(s.world_size),
                    static_cast<uint64_t>(s.optimizer_steps),
                    s.next_batch,
                    s.epoch,
                    static_cast<uint64_t>(s.batches_per_step),
                    s.seed,
                    loss_scale_bits,
                    static_cast<uint64_t>(s.loss_scale_good_steps)};
  comm.broadcast(v, 10, 0);
  start->resumed = v[0] != 0;
  s.step = static_cast<int64_t>(v[1]);
  s.world_size = static_cast<int>(v[2]);
  s.optimizer_steps = static_cast<int64_t>(v[3]);
  s.next_batch = v[4];
  s.epoch = v[5];
  s.batches_per_step = static_cast<int64_t>(v[6]);
  s.seed = v[7];
  std::memcpy(&s.loss_scale, &v[8], sizeof s.loss_scale);
  s.loss_scale_good_steps = static_cast<int64_t>(v[9]);
}

// Puts the checkpoint's parameters and moments (read by rank 0) into every
// rank's backend memory.
// params, adam_m, adam_v: backend (params.count())
void restore_tensors(const Communicator& comm, const LoadedCheckpoint& checkpoint,
                     ParameterSet& params, float* adam_m, float* adam_v) {
  broadcast_tensors(comm, checkpoint.path, checkpoint.params, params, params.params());
  broadcast_tensors(comm, checkpoint.path, checkpoint.m, params, adam_m);
  broadcast_tensors(comm, checkpoint.path, checkpoint.v, params, adam_v);
}

// The run's description in metrics.h5.
RunAttributes run_attributes(const TrainConfig& cfg, const Ops& ops, int world_size, int threads) {
  RunAttributes a;
  a.config = train_config_ini(cfg);
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

int run_train(const TrainConfig& requested, Communicator& comm) {
  // Every input is validated before training, and all ranks agree on it.
  // The shards decide what the flags left open (the vocabulary).
  TrainConfig cfg = requested;
  const int W = comm.size(), rank = comm.rank(), K = cfg.accum_steps;
  std::string tokenizer;  // rank 0: the shards' SentencePiece model, kept in checkpoints
  if (!agreed(comm, [&] {
        resolve_data_config(&cfg);
        if (rank == 0 && !cfg.data_dir.empty()) {
          tokenizer = read_shard_header(list_shards(cfg.data_dir, "train").front()).tokenizer;
        }
      }))
    return kExitFailure;

  // Where the run starts: rank 0 looks at the run directory and reads the
  // checkpoint to resume from, if any; every rank learns the verdict.
  StartPoint start;
  {
    Verdict verdict;
    if (comm.is_root()) {
      verdict = choose_start(cfg, &start);
      if (verdict.code == 0 && start.resumed) {
        verdict = check_resumable(cfg, start.state, tokenizer, W);
      }
    }
    if (const int code = agree_on(comm, verdict)) return code;
    broadcast_state(comm, &start);
  }
  const CheckpointState& resumed = start.state;
  const int64_t first_step = start.resumed ? resumed.step + 1 : 1;
  if (start.resumed && resumed.step >= cfg.steps) {
    if (comm.is_root()) {
      std::printf("%s: the checkpoint of step %lld already reaches --steps %lld; nothing to do\n",
                  start.checkpoint.path.c_str(), static_cast<long long>(resumed.step),
                  static_cast<long long>(cfg.steps));
    }
    return 0;
  }
  // A resumed run continues the checkpoint's random streams.
  const uint64_t flag_seed = cfg.seed;
  if (start.resumed) cfg.seed = resumed.seed;

  std::unique_ptr<BatchSource> data;
  if (!agreed(comm, [&] { data = make_batch_source(cfg, rank, W); })) return kExitFailure;
  BatchSource& source = *data;
  const int threads = cfg.threads > 0 ? cfg.threads : comm.cores_per_local_rank();
  std::unique_ptr<Ops> ops = make_ops(cfg.device, threads, comm, cfg.tf32);
  Model model(*ops, cfg.model, ModelCapacity{cfg.max_tokens, cfg.model.max_len},
              compute_dtype(cfg.precision));
  model.init_parameters(cfg.seed);
  ParameterSet& params = model.parameters();

  // --lr-scaling: the LR follows the global token budget of a step.
  const int64_t step_budget = static_cast<int64_t>(cfg.max_tokens) * K * W;
  const double lr_factor = lr_scale_factor(cfg.lr_scaling, step_budget, cfg.lr_reference_tokens);
  OptimConfig optim = cfg.optim;
  optim.lr = static_cast<float>(optim.lr * lr_factor);
  optim.end_lr = static_cast<float>(optim.end_lr * lr_factor);
  AdamW optimizer(params, optim);
  LrSchedule schedule(optim, cfg.steps);
  LossScaler scaler(cfg.precision == Precision::kFp16, cfg.loss_scale, cfg.loss_scale_window);

  // Resuming: parameters, moments and the update count from the checkpoint.
  // A checkpoint of another model shape is a flag fault, found here.
  if (start.resumed) {
    Verdict verdict;
    if (comm.is_root()) {
      try {
        std::vector<float> scratch(params.count());  // (params.count())
        unpack_checkpoint_tensors(start.checkpoint.path, start.checkpoint.params, params,
                                  scratch.data());
      } catch (const CheckpointMismatch& e) {
        verdict = {kExitUsage, std::string("mpiformer train: --resume: ") + e.what() +
                                   "; resume with the flags it was trained with (its config "
                                   "attribute) or choose another --out"};
      }
    }
    if (const int code = agree_on(comm, verdict)) return code;
    restore_tensors(comm, start.checkpoint, params, optimizer.m(), optimizer.v());
    params.refresh_compute();
    optimizer.set_steps_taken(resumed.optimizer_steps);
    scaler.restore(resumed.loss_scale, resumed.loss_scale_good_steps);
    start.checkpoint = LoadedCheckpoint{};  // the host copy is no longer needed
  }

  // The gradient all-reduce: buckets of whole tensors, started during the
  // last backward pass of each step.
  std::unique_ptr<GradientReducer> reducer =
      make_mpi_reducer(params, cfg.bucket_mb, cfg.overlap, cfg.grad_sum, comm);

  // The data cursor. Global indexing: the step after micro-batch index
  // `cursor` reads [cursor, cursor + W K), rank r the micro-batches
  // cursor + r + k W. Per-rank indexing (--sharding file): this rank's
  // [cursor, cursor + K). A resumed run on another world size continues the
  // same sequence of micro-batches.
  const bool global_indices = source.global_indices();
  const int64_t batches_per_step = global_indices ? static_cast<int64_t>(W) * K : K;
  const uint64_t cursor0 = start.resumed ? resumed.next_batch : 0;
  const uint64_t first = cursor0 + (global_indices ? rank : 0);
  const uint64_t stride = global_indices ? W : 1;

  // The run directory's files and the metrics log (rank 0).
  const std::filesystem::path rundir(cfg.out_dir);
  std::unique_ptr<MetricsLog> metrics;
  {
    Verdict verdict;
    if (comm.is_root()) {
      try {
        write_file_atomically(rundir / "config.ini", train_config_ini(cfg));
        metrics = std::make_unique<MetricsLog>(
            (rundir / "metrics.h5").string(), run_attributes(cfg, *ops, W, threads),
            cfg.resume == "none" ? -1 : (start.resumed ? resumed.step : 0));
      } catch (const std::exception& e) {
        verdict = {kExitUsage, std::string("mpiformer train: --out: ") + e.what()};
      }
    }
    if (const int code = agree_on(comm, verdict)) return code;
  }

  if (comm.is_root()) {
    std::printf("mpiformer train: %s on %s (%s), %d rank(s) x %d thread(s), %zu parameters\n",
                to_string(cfg.model.kind),
                cfg.data_dir.empty() ? to_string(cfg.synthetic) : cfg.data_dir.c_str(),
                ops->name().c_str(), W, threads, params.count());
    std::printf(
        "  %d layer(s), d-model %d, %d heads, d-ff %d, vocab %d, max-len %d; "
        "max-tokens %d x %d micro-batch(es) x %d rank(s) per step\n",
        cfg.model.kind == ModelKind::kSeq2seq ? cfg.model.enc_layers + cfg.model.dec_layers
                                              : cfg.model.layers,
        cfg.model.d_model, cfg.model.heads, cfg.model.d_ff, cfg.model.vocab, cfg.model.max_len,
        cfg.max_tokens, K, W);
    if (cfg.precision != Precision::kFp32)
      std::printf(
          "  precision %s: activations and GEMM inputs; fp32 master weights, Adam state "
          "and loss%s\n",
          to_string(cfg.precision), scaler.dynamic() ? ", with dynamic loss scaling" : "");
    if (cfg.lr_scaling != LrScaling::kNone)
      std::printf("  lr %.3e x %.4f (%s: %lld / %lld tokens per step) = %.3e\n", cfg.optim.lr,
                  lr_factor, to_string(cfg.lr_scaling), static_cast<long long>(step_budget),
                  static_cast<long long>(cfg.lr_reference_tokens), optim.lr);
    if (reducer)
      std::printf(
          "  gradient sum: %s; %.1f MiB per step in %zu bucket(s) of >= %g MiB over %s, %s\n",
          to_string(cfg.grad_sum), reducer->bytes_per_step() / double(1 << 20),
          reducer->buckets().size(), cfg.bucket_mb, reducer->transport().name().c_str(),
          cfg.overlap ? "overlapped with backward" : "after backward");
    const std::string data_summary = source.describe();
    if (!data_summary.empty()) std::printf("%s\n", data_summary.c_str());
    if (start.resumed) {
      std::printf(
          "resumed from %s: step %lld, micro-batch %llu (epoch %llu), written by %d rank(s)\n",
          cfg.resume == "auto" ? (rundir / "checkpoints").string().c_str() : cfg.resume.c_str(),
          static_cast<long long>(resumed.step), static_cast<unsigned long long>(resumed.next_batch),
          static_cast<unsigned long long>(resumed.epoch), resumed.world_size);
      if (resumed.batches_per_step != batches_per_step) {
        std::printf(
            "  a step now reads %lld micro-batches (the checkpoint's run read %lld): the "
            "micro-batch sequence continues, the global batch size changes\n",
            static_cast<long long>(batches_per_step),
            static_cast<long long>(resumed.batches_per_step));
      }
      if (flag_seed != cfg.seed) {
        std::printf("  seed %llu from the checkpoint (--seed %llu is for new runs)\n",
                    static_cast<unsigned long long>(cfg.seed),
                    static_cast<unsigned long long>(flag_seed));
      }
    } else if (cfg.resume == "auto") {
      std::printf("no checkpoint in %s: starting at step 1\n",
                  (rundir / "checkpoints").string().c_str());
    }
    std::fflush(stdout);
  }

  std::vector<Batch> batches(K);
  Batch eval_batch;
  // Loss sums since the last progress line stay on the backend (the model's
  // training sums) and are read there.
  ReduceTiming window_reduce;
  int64_t window_real_tokens = 0, window_padded_tokens = 0;
  // Time in the window spent on other things than steps (replica checks,
  // checkpoints, evaluation): step time is the rest. Steps are queued
  // asynchronously on a GPU, so only the window's end, after the device
  // has been waited for, says how long they took.
  double window_other_s = 0.0;
  int window_steps = 0, window_skipped = 0, window_overflows = 0;
  // The loss scale the last measured gradient norm carries (0: no norm yet).
  float measured_scale = 0.0f;
  Clock::time_point window_start = Clock::now();
  const StopSignals stop_signals;
  // For the stop tests only: the last rank signals itself after this step.
  const char* signal_step_text = std::getenv("MPIFORMER_TEST_SIGNAL_AFTER_STEP");
  const int64_t signal_step = signal_step_text ? std::atoll(signal_step_text) : 0;
  // For the loss-scaling tests only: the last rank's gradients overflow at this step.
  const char* overflow_step_text = std::getenv("MPIFORMER_TEST_OVERFLOW_AT_STEP");
  const int64_t overflow_step = overflow_step_text ? std::atoll(overflow_step_text) : 0;

  source.prefetch(first, stride);

  // Rank 0 writes for all: the replicas are identical.
  const auto save = [&](int64_t step) {
    if (!comm.is_root()) return;
    CheckpointState state;
    state.step = step;
    state.world_size = W;
    state.config_ini = train_config_ini(cfg);
    state.optimizer_steps = optimizer.steps_taken();
    state.next_batch = cursor0 + static_cast<uint64_t>((step - first_step + 1) * batches_per_step);
    const uint64_t per_epoch = source.batches_per_epoch();
    state.epoch = per_epoch > 0 ? state.next_batch / per_epoch : 0;
    state.batches_per_step = batches_per_step;
    state.sharding = cfg.sharding == Sharding::kFile ? "file" : "data";
    state.seed = cfg.seed;
    state.loss_scale = scaler.scale();
    state.loss_scale_good_steps = scaler.good_steps();
    state.vocab_size = cfg.model.vocab;
    state.special = cfg.model.special;
    state.tokenizer = tokenizer;
    const std::string path = save_checkpoint(cfg.out_dir, params, optimizer.m(), optimizer.v(),
                                             state, cfg.keep_checkpoints);
    std::printf("checkpoint step %lld: %s\n", static_cast<long long>(step), path.c_str());
    std::fflush(stdout);
  };

  for (int64_t step = first_step; step <= cfg.steps; ++step) {
    // 1. This rank's micro-batches of the step (any may be empty).
    for (int k = 0; k < K; ++k) {
      const uint64_t index = first + stride * static_cast<uint64_t>((step - first_step) * K + k);
      source.make_batch(BatchSource::kTrain, index, &batches[k]);
      window_real_tokens += batches[k].real_tokens();
      window_padded_tokens += batches[k].padded_tokens();
    }

    // 2. The gradient of the mean loss over the step's target tokens on all
    //    ranks, times the loss scale: N by MPI_Allreduce first, then
    //    backward, then the bucketed gradient all-reduce
    //    (src/dist/data_parallel.h).
    const float loss_scale = scaler.scale();
    const bool inject_overflow = step == overflow_step && rank == W - 1;
    const StepGradients gradients =
        step_gradients(model, batches, cfg.seed, step, cfg.label_smoothing, comm, reducer.get(),
                       inject_overflow ? INFINITY : loss_scale);
    window_reduce += gradients.reduce;

    // 3. Clip and update on the device; a step with no target tokens
    //    anywhere changes nothing. fp16: a step whose summed gradients
    //    overflowed (the same on every rank) is skipped and the scale halved.
    const float lr = schedule.lr(step);
    measured_scale = 0.0f;
    if (gradients.skipped) {
      ++window_skipped;
    } else {
      optimizer.measure_gradients();
      measured_scale = loss_scale;
      bool apply = true;
      if (scaler.dynamic()) {
        const bool finite = std::isfinite(optimizer.measured_norm());
        apply = scaler.update(!comm.any(!finite));
      }
      if (apply) {
        optimizer.step(lr, 1.0f / loss_scale);
      } else {
        ++window_overflows;
      }
    }
    ++window_steps;

    // 4. Replicas must still be identical.
    if (W > 1 && cfg.check_every > 0 && step % cfg.check_every == 0) {
      const Clock::time_point check_start = Clock::now();
      const ReplicaMismatch mismatch = check_replicas(params, comm);
      if (mismatch.found()) {
        if (comm.rank() == mismatch.rank)
          std::fprintf(stderr,
                       "[rank %d] replica check at step %lld: parameter '%s' differs from rank "
                       "0's copy; the replicas have diverged\n",
                       rank, static_cast<long long>(step), mismatch.tensor.c_str());
        std::fflush(stderr);
        return kExitFailure;
      }
      window_other_s += seconds_since(check_start);
    }

    // 5. Progress: global token-weighted figures, on stdout and in metrics.h5.
    if (step % cfg.log_every == 0 || step == cfg.steps) {
      const LossSummary train = summarize(allreduce(comm, model.take_train_sums()));
      const double grad_norm =
          measured_scale > 0.0f ? optimizer.measured_norm() / measured_scale : 0.0;
      const double seconds = seconds_since(window_start);
      const double real = static_cast<double>(comm.allreduce_sum(window_real_tokens));
      const double padded = static_cast<double>(comm.allreduce_sum(window_padded_tokens));
      double reduce_sums[3] = {window_reduce.wait_s, window_reduce.in_flight_s,
                               window_reduce.hidden_s};
      comm.allreduce_sum(reduce_sums, 3);
      if (comm.is_root()) {
        TrainRow row;
        row.step = step;
        row.loss = train.loss;
        row.accuracy = train.accuracy;
        row.tokens = train.tokens;
        row.lr = lr;
        row.grad_norm = grad_norm;
        row.tokens_per_s = real / seconds;
        row.step_ms = 1000.0 * std::max(0.0, seconds - window_other_s) / window_steps;
        row.padding_efficiency = padded > 0 ? real / padded : 1.0;
        row.loss_scale = scaler.scale();
        std::string comm_part;
        if (W > 1) {
          // Mean over ranks of the wait after backward, and the share of
          // all-reduce time that ran while backward did.
          char buf[96];
          std::snprintf(buf, sizeof buf, " | comm-wait %.1f ms | hidden %.0f%%",
                        1000.0 * reduce_sums[0] / (W * window_steps),
                        reduce_sums[1] > 0 ? 100.0 * reduce_sums[2] / reduce_sums[1] : 0.0);
          comm_part = buf;
        }
        if (window_skipped > 0) comm_part += " | skipped " + std::to_string(window_skipped);
        if (scaler.dynamic()) {
          char buf[96];
          std::snprintf(buf, sizeof buf, " | loss-scale %g", scaler.scale());
          comm_part += buf;
          if (window_overflows > 0)
            comm_part += " (" + std::to_string(window_overflows) + " overflow step(s) skipped)";
        }
        std::printf(
            "step %lld/%lld | loss %.4f | acc %.2f%% | lr %.3e | grad-norm %.3f | "
            "%.0f tok/s | pad-eff %.3f | %.1f ms/step%s\n",
            static_cast<long long>(step), static_cast<long long>(cfg.steps), row.loss,
            100.0 * row.accuracy, lr, grad_norm, row.tokens_per_s, row.padding_efficiency,
            row.step_ms, comm_part.c_str());
        std::fflush(stdout);
        metrics->append(row);
      }
      window_reduce = ReduceTiming{};
      window_real_tokens = window_padded_tokens = 0;
      window_other_s = 0.0;
      window_steps = window_skipped = window_overflows = 0;
      window_start = Clock::now();
    }

    // 6. Checkpoint.
    const bool checkpoint_due =
        (cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0) || step == cfg.steps;
    const Clock::time_point other_start = Clock::now();
    if (checkpoint_due) save(step);

    // 7. Evaluation on held-out data.
    if (cfg.eval_every > 0 && step % cfg.eval_every == 0 && step != cfg.steps) {
      const LossSummary eval = evaluate(model, source, static_cast<uint64_t>(cfg.eval_batches),
                                        cfg.label_smoothing, comm, eval_batch);
      if (comm.is_root()) {
        std::printf("eval step %lld | loss %.4f | ppl %.3f | acc %.2f%% | %lld tokens\n",
                    static_cast<long long>(step), eval.loss, eval.perplexity, 100.0 * eval.accuracy,
                    static_cast<long long>(eval.tokens));
        std::fflush(stdout);
        metrics->append(EvalRow{step, eval.loss, eval.perplexity, eval.accuracy, eval.tokens});
      }
    }
    window_other_s += seconds_since(other_start);

    // 8. A stop signal on any rank (the time limit is near, the job was
    //    cancelled or preempted): every rank stops after this same step, with
    //    a checkpoint, and exits kExitStopped for the job script to requeue.
    if (step == signal_step && rank == W - 1) std::raise(SIGUSR1);
    if (const int signal = comm.max(static_cast<int>(stop_signal))) {
      if (step == cfg.steps) break;  // finished anyway
      if (!checkpoint_due) save(step);
      if (comm.is_root()) {
        std::printf("stopped by %s after step %lld; continue with --resume auto (exit code %d)\n",
                    signal_name(signal), static_cast<long long>(step), kExitStopped);
        std::fflush(stdout);
      }
      return kExitStopped;
    }
  }

  const LossSummary final_eval = evaluate(model, source, static_cast<uint64_t>(cfg.eval_batches),
                                          cfg.label_smoothing, comm, eval_batch);
  if (comm.is_root()) {
    std::printf("final eval | loss %.4f | ppl %.3f | acc %.2f%% | %lld tokens\n", final_eval.loss,
                final_eval.perplexity, 100.0 * final_eval.accuracy,
                static_cast<long long>(final_eval.tokens));
    std::fflush(stdout);
    metrics->append(EvalRow{cfg.steps, final_eval.loss, final_eval.perplexity, final_eval.accuracy,
                            final_eval.tokens});
  }
  return 0;
}

}  // namespace mpiformer
