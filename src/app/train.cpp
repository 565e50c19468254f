// `mpiformer train`: the training loop, read top to bottom.
//
// One optimizer step on W ranks with K micro-batches each takes the global
// micro-batches [(s-1) W K, s W K); rank r takes every W-th of them, so the
// global batch does not depend on W. The loss of every micro-batch is divided
// by N, the step's global count of target tokens (MPI_Allreduce before any
// backward), and gradients are summed over ranks: the update is the gradient
// of the mean loss over every target token of the step (DESIGN.md section 1).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/core/error.h"
#include "src/data/make_source.h"
#include "src/dist/data_parallel.h"
#include "src/dist/replica_check.h"
#include "src/io/checkpoint.h"
#include "src/loss/cross_entropy.h"
#include "src/model/model.h"
#include "src/optim/adamw.h"
#include "src/optim/schedule.h"

namespace mpiformer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Global loss sums over ranks: sums travel, divisions happen once.
LossSums allreduce(const Communicator& comm, const LossSums& local) {
  double v[3] = {local.loss, static_cast<double>(local.tokens), static_cast<double>(local.correct)};
  comm.allreduce_sum(v, 3);
  LossSums global;
  global.loss = v[0];
  global.tokens = static_cast<int64_t>(v[1]);
  global.correct = static_cast<int64_t>(v[2]);
  return global;
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

// The evaluation batches are split over ranks like training batches.
// --eval-batches caps the count; a shard set's validation split may hold fewer.
LossSummary evaluate(Model& model, BatchSource& source, const TrainConfig& cfg,
                     const Communicator& comm, Batch& batch) {
  const uint64_t available = source.eval_batch_count();
  const uint64_t count = available > 0 ? std::min<uint64_t>(available, cfg.eval_batches)
                                       : static_cast<uint64_t>(cfg.eval_batches);
  LossSums local;
  for (uint64_t i = comm.rank(); i < count; i += comm.size()) {
    source.make_batch(BatchSource::kEval, i, &batch);
    local += model.evaluate(batch, cfg.label_smoothing);
  }
  return summarize(allreduce(comm, local));
}

}  // namespace

// Runs `what` on every rank and agrees on the outcome: a rank that failed
// prints "[rank r] message", and every rank learns that some rank failed, so
// nobody waits in a later collective for a rank that has given up.
template <class Fn>
bool agreed(const Communicator& comm, Fn&& what) {
  std::string failure;
  try {
    what();
  } catch (const std::exception& e) {
    failure = e.what();
    if (failure.empty()) failure = "unknown error";
  }
  if (!failure.empty()) {
    std::fprintf(stderr, "[rank %d] %s\n", comm.rank(), failure.c_str());
    std::fflush(stderr);
  }
  return !comm.any(!failure.empty());
}

int run_train(const TrainConfig& requested, Communicator& comm) {
  // Every input is validated before training, and all ranks agree on it.
  // The shards decide what the flags left open (the vocabulary).
  TrainConfig cfg = requested;
  const int W = comm.size(), rank = comm.rank(), K = cfg.accum_steps;
  std::unique_ptr<BatchSource> data;
  if (!agreed(comm, [&] {
        resolve_data_config(&cfg);
        data = make_batch_source(cfg, rank, W);
      }))
    return kExitFailure;
  BatchSource& source = *data;
  const int threads = cfg.threads > 0 ? cfg.threads : comm.cores_per_local_rank();
  std::unique_ptr<Ops> ops = make_cpu_ops(threads);
  Model model(*ops, cfg.model, ModelCapacity{cfg.max_tokens, cfg.model.max_len});
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

  // The gradient all-reduce: buckets of whole tensors, started during the
  // last backward pass of each step.
  std::unique_ptr<GradientReducer> reducer =
      make_mpi_reducer(params, cfg.bucket_mb, cfg.overlap, cfg.grad_sum, comm);

  const std::filesystem::path rundir(cfg.out_dir);
  if (comm.is_root()) {
    std::filesystem::create_directories(rundir);
    write_file_atomically(rundir / "config.ini", train_config_ini(cfg));
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
    std::fflush(stdout);
  }

  std::vector<Batch> batches(K);
  Batch eval_batch;
  LossSums window;  // local sums since the last progress line
  ReduceTiming window_reduce;
  int64_t window_real_tokens = 0, window_padded_tokens = 0;
  double window_compute_s = 0.0;
  int window_steps = 0, window_skipped = 0;
  Clock::time_point window_start = Clock::now();

  // Global indexing: step s, micro-batch k is global batch (s-1) W K + r + k W.
  // Per-rank indexing (--sharding file): this rank's batch (s-1) K + k.
  const uint64_t first = source.global_indices() ? rank : 0;
  const uint64_t stride = source.global_indices() ? W : 1;
  source.prefetch(first, stride);

  for (int64_t step = 1; step <= cfg.steps; ++step) {
    const Clock::time_point step_start = Clock::now();

    // 1. This rank's micro-batches of the step (any may be empty).
    for (int k = 0; k < K; ++k) {
      const uint64_t index = first + stride * static_cast<uint64_t>((step - 1) * K + k);
      source.make_batch(BatchSource::kTrain, index, &batches[k]);
      window_real_tokens += batches[k].real_tokens();
      window_padded_tokens += batches[k].padded_tokens();
    }

    // 2. The gradient of the mean loss over the step's target tokens on all
    //    ranks: N by MPI_Allreduce first, then backward, then the bucketed
    //    gradient all-reduce (src/dist/data_parallel.h).
    const StepGradients gradients =
        step_gradients(model, batches, cfg.seed, step, cfg.label_smoothing, comm, reducer.get());
    window += gradients.local;
    window_reduce += gradients.reduce;

    // 3. Clip and update; a step with no target tokens anywhere changes nothing.
    double grad_norm = 0.0;
    const float lr = schedule.lr(step);
    if (gradients.skipped) {
      ++window_skipped;
    } else {
      grad_norm = optimizer.grad_norm();
      optimizer.step(lr, clip_factor(grad_norm, cfg.optim.clip_norm));
    }
    window_compute_s += seconds_since(step_start);
    ++window_steps;

    // 4. Replicas must still be identical.
    if (W > 1 && cfg.check_every > 0 && step % cfg.check_every == 0) {
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
    }

    // 5. Progress: global token-weighted figures.
    if (step % cfg.log_every == 0 || step == cfg.steps) {
      const LossSummary train = summarize(allreduce(comm, window));
      const double seconds = seconds_since(window_start);
      const double real = static_cast<double>(comm.allreduce_sum(window_real_tokens));
      const double padded = static_cast<double>(comm.allreduce_sum(window_padded_tokens));
      double reduce_sums[3] = {window_reduce.wait_s, window_reduce.in_flight_s,
                               window_reduce.hidden_s};
      comm.allreduce_sum(reduce_sums, 3);
      if (comm.is_root()) {
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
        std::printf(
            "step %lld/%lld | loss %.4f | acc %.2f%% | lr %.3e | grad-norm %.3f | "
            "%.0f tok/s | pad-eff %.3f | %.1f ms/step%s\n",
            static_cast<long long>(step), static_cast<long long>(cfg.steps), train.loss,
            100.0 * train.accuracy, lr, grad_norm, real / seconds, padded > 0 ? real / padded : 1.0,
            1000.0 * window_compute_s / window_steps, comm_part.c_str());
        std::fflush(stdout);
      }
      window = LossSums{};
      window_reduce = ReduceTiming{};
      window_real_tokens = window_padded_tokens = 0;
      window_compute_s = 0.0;
      window_steps = window_skipped = 0;
      window_start = Clock::now();
    }

    // 6. Checkpoint: replicas are identical, so rank 0 writes for all.
    if ((cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0) || step == cfg.steps) {
      if (comm.is_root()) {
        CheckpointState state;
        state.step = step;
        state.world_size = W;
        state.config_ini = train_config_ini(cfg);
        state.vocab_size = cfg.model.vocab;
        state.special = cfg.model.special;
        const std::string path = save_checkpoint(cfg.out_dir, params, optimizer.m(), optimizer.v(),
                                                 state, cfg.keep_checkpoints);
        std::printf("checkpoint step %lld: %s\n", static_cast<long long>(step), path.c_str());
        std::fflush(stdout);
      }
    }

    // 7. Evaluation on held-out data.
    if (cfg.eval_every > 0 && step % cfg.eval_every == 0 && step != cfg.steps) {
      const LossSummary eval = evaluate(model, source, cfg, comm, eval_batch);
      if (comm.is_root()) {
        std::printf("eval step %lld | loss %.4f | ppl %.3f | acc %.2f%% | %lld tokens\n",
                    static_cast<long long>(step), eval.loss, eval.perplexity, 100.0 * eval.accuracy,
                    static_cast<long long>(eval.tokens));
        std::fflush(stdout);
      }
    }
  }

  const LossSummary final_eval = evaluate(model, source, cfg, comm, eval_batch);
  if (comm.is_root()) {
    std::printf("final eval | loss %.4f | ppl %.3f | acc %.2f%% | %lld tokens\n", final_eval.loss,
                final_eval.perplexity, 100.0 * final_eval.accuracy,
                static_cast<long long>(final_eval.tokens));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace mpiformer
