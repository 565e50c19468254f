#include "src/train/startup.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <utility>

#include "kernels/backend.h"
#include "kernels/cpu/blas_kernels.h"
#include "src/core/error.h"
#include "src/core/run_log.h"
#include "src/core/version.h"
#include "src/data/make_source.h"
#include "src/io/atomic_file.h"
#include "src/io/hdf5_file.h"
#include "src/io/label_names.h"
#include "src/io/shard.h"
#include "src/parallel/agreement.h"
#include "src/parallel/collective_checkpoint.h"
#include "src/parallel/data_parallel.h"
#include "src/parallel/rank_device.h"
#include "src/train/memory_budget.h"
#include "src/train/shard_config.h"
#include "src/train/start_lines.h"

namespace mpiformer {

namespace {

// Rank 0: the checkpoint against the flags of this run. The model's shape
// is checked when its tensors are unpacked.
Verdict check_resumable(const TrainConfig& cfg, const CheckpointState& state,
                        const std::string& tokenizer, const std::vector<std::string>& label_names,
                        int world_size) {
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
  // Likewise a classifier's labels: the same number renamed or reordered
  // fits every tensor and trains the wrong names.
  if (!cfg.data_dir.empty() && !state.label_names.empty()) {
    const std::string differ = label_set_difference(state.label_names, "the checkpoint",
                                                    label_names, "the shards of " + cfg.data_dir);
    if (!differ.empty()) {
      return {kExitUsage, "mpiformer train: --data: the label sets differ: " + differ +
                              "; resume on shards of the checkpoint's labels"};
    }
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
  comm.broadcast(&s.progress_window, 0);
}

// The run's description in metrics.h5.
RunAttributes run_attributes(const TrainConfig& cfg, const std::string& config_ini,
                             const std::string& run_id, const Ops& ops, int world_size,
                             int threads) {
  RunAttributes a;
  a.config = config_ini;
  a.run_id = run_id;
  a.model = to_string(cfg.model.kind);
  a.label_figures = cfg.model.kind == ModelKind::kClassify && cfg.model.loss == ClassifyLoss::kZlpr;
  a.valid_bleu = cfg.valid_bleu;
  a.world_size = world_size;
  a.devices = std::to_string(world_size) + " x " + ops.device().name() + " (" +
              std::to_string(threads) + " thread(s) each)";
  a.versions = std::string("mpiformer ") + MPIFORMER_VERSION + "; " +
               Communicator::library_version() + "; " + hdf5::library_version() + "; " +
               blas_version();
  a.git_commit = MPIFORMER_GIT_COMMIT;
  return a;
}

// 1. The shards decide what the flags left open. Every input is validated
// before training, and all ranks agree on it: a flag the shards contradict
// is a refusal (exit 2), before the run directory is touched.
int resolve_inputs(TrainingRun& run, const Communicator& comm) {
  return agree_on(
      comm,
      [&] {
        run.from_shards = resolve_data_config(&run.cfg);
        if (comm.is_root() && !run.cfg.data_dir.empty()) {
          const ShardHeader header =
              read_shard_header(list_shards(run.cfg.data_dir, "train").front());
          run.tokenizer = header.tokenizer;
          run.label_names = header.label_names;
        }
      },
      Speaker::kFirstRefusal, Blame::kByType, "train");
}

// 2. Rank 0 locks the run directory, then reads the checkpoint to resume
// from, if any; every rank learns the verdict and the start point.
int open_run_directory(TrainingRun& run, const Communicator& comm, StartNotes* notes) {
  TrainConfig& cfg = run.cfg;
  Verdict verdict;
  if (comm.is_root()) {
    // Open once; a second pass (a damaged checkpoint) only chooses again.
    if (!run.run_dir) {
      run.run_dir = std::make_unique<RunDirectory>(cfg.out_dir);
      verdict = run.run_dir->open();
    }
    if (verdict.code == 0)
      verdict = run.run_dir->choose_start(cfg.resume, cfg.resume_other_run, &run.start);
    if (verdict.code == 0 && run.start.resumed)
      verdict = check_resumable(cfg, run.start.state, run.tokenizer, run.label_names, comm.size());
  }
  if (const int code = agree(comm, verdict, Speaker::kRoot)) return code;
  broadcast_start(comm, &run.start);
  run.cursor.first_step = run.start.resumed ? run.start.state.step + 1 : 1;
  // A resumed run continues the checkpoint's random streams.
  notes->flag_seed = cfg.seed;
  if (run.start.resumed) cfg.seed = run.start.state.seed;
  return 0;
}

// Training data made mostly of reserved ids (all pad, all unk: a prepare
// gone wrong) teaches nothing while it seems to train: a warning when over
// half of the training ids are reserved, a refusal (exit 2) from 99% on.
int check_reserved_ids(const BatchSource& source, const Communicator& comm,
                       const std::string& data_dir) {
  constexpr double kWarnShare = 0.5, kRefuseShare = 0.99;
  const BatchSource::IdCounts mine = source.train_ids();
  int64_t counts[2] = {mine.ids, mine.reserved};
  // Under --sharding data every rank counts the same ids: the share is the same.
  comm.allreduce_sum(counts, 2);
  if (counts[0] == 0) return 0;
  const double share = static_cast<double>(counts[1]) / static_cast<double>(counts[0]);
  if (share <= kWarnShare || !comm.is_root()) return share >= kRefuseShare ? kExitUsage : 0;
  const std::string what = std::to_string(static_cast<int>(share * 100)) + "% of the " +
                           "training ids of " + data_dir +
                           " are reserved ids (pad, bos, eos, unk, mask or sep)";
  if (share >= kRefuseShare) {
    say(stderr, "mpiformer train: --data: %s; at least 1%% must be data symbols to train on\n",
        what.c_str());
    return kExitUsage;
  }
  say(stderr, "warning: %s: is this the data you meant to train on?\n", what.c_str());
  return 0;
}

// The data against the flags (--max-tokens, --too-long, --loss), then what
// its ids are made of: a refusal is exit 2, and start_run withdraws from the
// run directory.
int make_source(TrainingRun& run, const Communicator& comm) {
  if (const int code = agree_on(
          comm, [&] { run.source = make_batch_source(run.cfg, comm.rank(), comm.size()); },
          Speaker::kFirstRefusal, Blame::kByType, "train"))
    return code;
  return check_reserved_ids(*run.source, comm, run.cfg.data_dir);
}

// The memory estimate of the run (into notes->memory): exit 2 on every rank,
// naming the flags that size it (and those that would make it fit), when a
// rank cannot hold it.
int check_memory(const TrainingRun& run, const Communicator& comm, const ModelCapacity& capacity,
                 StartNotes* notes) {
  const TrainConfig& cfg = run.cfg;
  Ops& ops = *run.ops;
  const int world = comm.size();
  const DType compute = compute_dtype(cfg.precision);
  MemoryPlan plan;
  plan.training = true;
  plan.world = world;
  plan.shard_optimizer = cfg.shard_optimizer && world > 1;
  plan.reducer_exact_sum = cfg.grad_sum == GradSum::kExact;  // on one rank too
  // The MPI transport reads host memory: a GPU's gradients are staged.
  plan.reducer_staged =
      world > 1 && notes->transport == Transport::kMpi && !ops.device().host_accessible();
  std::string shortfall;
  if (agree_on(comm, [&] {
        notes->memory = estimate_memory(ops, cfg.model, capacity, compute, plan);
        shortfall = memory_shortfall(notes->memory, ops, comm.local_size(),
                                     "--max-tokens, --d-model, --d-ff, --layers or --max-len");
        // Where sharding or recomputation would make it fit, say which.
        if (!shortfall.empty()) {
          const std::string fits =
              fitting_flags(ops, cfg.model, capacity, compute, plan, comm.local_size());
          if (!fits.empty()) shortfall += ", or train with " + fits;
        }
      }) != 0)
    return kExitFailure;
  return refuse_on_shortfall(comm, shortfall, "mpiformer train: ");
}

// 3. Data, backend, model, optimizer, scaler, and the data cursor.
int build(TrainingRun& run, const Communicator& comm, const FaultInjection& faults,
          StartNotes* notes) {
  const TrainConfig& cfg = run.cfg;
  const int world = comm.size(), rank = comm.rank(), accum = cfg.accum_steps;
  if (const int code = make_source(run, comm)) return code;
  notes->threads = cfg.threads > 0 ? cfg.threads : comm.cores_per_local_rank();
  // A rank without the device it was given is an agreed failure, not a hang.
  if (agree_on(comm, [&] { run.ops = make_ops(cfg.device, notes->threads, comm, cfg.tf32); }) !=
      0) {
    return kExitFailure;
  }
  note_shared_gpus(cfg.device, comm);
  Ops& ops = *run.ops;
  ops.set_deterministic(cfg.deterministic);
  // --attention cudnn where cuDNN cannot run is refused before anything runs.
  if (agree_on(comm, [&] { ops.set_attention_path(cfg.attention); }) != 0) return kExitUsage;
  if (agree_on(comm, [&] { notes->transport = choose_transport(cfg.transport, ops, comm); }) != 0)
    return kExitFailure;

  // Memory: estimated from the flags, refused before anything big is
  // allocated when it cannot fit.
  const ModelCapacity capacity{cfg.max_tokens, cfg.model.max_len, run.source->max_batch_sequences(),
                               cfg.recompute};
  const DType compute = compute_dtype(cfg.precision);
  if (const int code = check_memory(run, comm, capacity, notes)) return code;
  run.model = std::make_unique<Model>(ops, cfg.model, capacity, compute);
  run.model->init_parameters(cfg.seed);

  // --lr-scaling: the LR follows the global token budget of a step.
  notes->step_budget = static_cast<int64_t>(cfg.max_tokens) * accum * world;
  notes->lr_factor = lr_scale_factor(cfg.lr_scaling, notes->step_budget, cfg.lr_reference_tokens);
  OptimConfig optim = cfg.optim;
  optim.lr = static_cast<float>(optim.lr * notes->lr_factor);
  optim.end_lr = static_cast<float>(optim.end_lr * notes->lr_factor);
  notes->lr = optim.lr;
  if (cfg.shard_optimizer)
    run.shards = std::make_unique<CollectiveShardLink>(
        comm, ops, plan_shards(run.model->parameters().count(), world));
  run.optimizer = std::make_unique<AdamW>(run.model->parameters(), optim, run.shards.get());
  run.schedule = std::make_unique<LrSchedule>(optim, cfg.steps);
  run.scaler = std::make_unique<LossScaler>(cfg.precision == Precision::kFp16, cfg.loss_scale,
                                            cfg.loss_scale_window);
  // With the model and optimizer placed, attention for every batch shape
  // of the run, so that no step waits for it.
  if (const int code = agree_on(
          comm,
          [&] {
            notes->attention =
                prepare_attention(ops, cfg.model, run.source->bucket_bounds(), compute, true,
                                  &notes->memory, "--max-tokens or --max-len");
          },
          Speaker::kFirstRefusal, Blame::kByType, "train"))
    return code;
  run.check_each_step = (ops.device().host_accessible() && !faults.deferred_divergence_check) ||
                        run.scaler->dynamic() || cfg.on_divergence == OnDivergence::kSkip;

  // The data cursor (DataCursor).
  const bool global_indices = run.source->global_indices();
  DataCursor& c = run.cursor;
  c.accum = accum;
  c.batches_per_step = global_indices ? static_cast<int64_t>(world) * accum : accum;
  c.cursor0 = run.start.resumed ? run.start.state.next_batch : 0;
  c.first = c.cursor0 + (global_indices ? rank : 0);
  c.stride = global_indices ? world : 1;
  return 0;
}

// restore's verdict when the data of a checkpoint --resume auto chose is
// damaged: start again from the one before.
constexpr int kRestoreDamaged = -1;

// 4. Parameters, moments and the update count from the checkpoint. A
// checkpoint of another model shape is a flag fault, found here. Rank 0
// checks the names and shapes; then every rank reads the parameters and
// its range of the moments (all of them: the optimizer is replicated)
// collectively. A damaged chunk or a non-finite value found there is
// kRestoreDamaged under --resume auto, exit 2 for --resume PATH.
int restore(TrainingRun& run, const Communicator& comm) {
  if (!run.start.resumed) return 0;
  ParameterSet& params = run.model->parameters();
  LoadedCheckpoint& c = run.start.checkpoint;
  Verdict verdict;
  if (comm.is_root()) {
    try {
      check_checkpoint_tensors(c.path, c.params, params);
    } catch (const CheckpointMismatch& e) {
      verdict = {kExitUsage, std::string("mpiformer train: --resume: ") + e.what() +
                                 "; resume with the flags it was trained with (its config "
                                 "attribute) or choose another --out"};
    }
  }
  if (const int code = agree(comm, verdict, Speaker::kRoot)) return code;
  // A sharded optimizer reads its slice of the moments (any layout resumes any).
  const size_t begin = run.optimizer->shard_begin(), end = run.optimizer->shard_end();
  comm.broadcast(&c.path, 0);
  // Sliced masters (sharded, bf16/fp16): only the slice of /params too.
  const size_t first = params.masters_begin(), last = params.masters_end();
  const std::string fault =
      read_checkpoint_collectively(comm, c.path, params, params.master_at(first), first, last,
                                   begin, end, run.optimizer->m(), run.optimizer->v());
  // One line, from the lowest rank that found a fault.
  const int speaker = comm.min_with_rank(fault.empty() ? 1 : 0).second;
  if (comm.any(!fault.empty())) {
    const bool retry = run.cfg.resume == "auto";
    Verdict mine{retry ? 0 : kExitUsage, ""};
    if (comm.rank() == speaker) {
      mine.message = retry ? "[rank " + std::to_string(comm.rank()) +
                                 "] skipping a damaged checkpoint: " + fault
                           : "mpiformer train: --resume: cannot resume: " + fault;
    }
    const int code = agree(comm, mine);
    if (retry && comm.is_root()) run.run_dir->skip_damaged(c.path);
    return retry ? kRestoreDamaged : code;
  }
  run.optimizer->set_steps_taken(run.start.state.optimizer_steps);
  run.scaler->restore(static_cast<float>(run.start.state.loss_scale),
                      run.start.state.loss_scale_good_steps);
  c.params = c.m = c.v = {};
  return 0;
}

// 6. Only now, with every check passed, does the run change its directory:
// a later branch moves aside, config.ini and metrics.h5 follow this run.
int claim_directory(TrainingRun& run, const Communicator& comm, const ConfigText& config_text,
                    const StartNotes& notes) {
  const TrainConfig& cfg = run.cfg;
  Verdict verdict;
  std::string branch_line;
  if (comm.is_root()) {
    const std::filesystem::path rundir(cfg.out_dir);
    try {
      const int removed = run.run_dir->remove_unfinished_writes();
      if (removed > 0) {
        say(stdout, "removed %d unfinished write(s) of an earlier job\n", removed);
      }
      branch_line = run.run_dir->make_head(run.start);
      // What ran is recorded beside the flags, as comments --config skips:
      // runs on other BLAS kernels differ in their last bits. The run id
      // (and where a run of another's checkpoint started) is the
      // directory's own, read back on resume.
      const RunDirectory& dir = *run.run_dir;
      write_file_atomically(
          (rundir / "config.ini").string(),
          config_text.write(cfg) + "\n# This run (a record; --config does not read it)\n" +
              "# run-id = " + dir.run_id() + "\n" +
              (dir.origin().empty() ? "" : "# started-from = " + dir.origin() + "\n") +
              "# devices = " + std::to_string(comm.size()) + " x " + run.ops->device().name() +
              "\n# blas = " + describe_blas_kernels() + "\n");
      // Rank 0's output, start-up lines first, appended over every start.
      attach_run_log((rundir / "train.log").string());
      run.metrics = std::make_unique<MetricsLog>(
          (rundir / "metrics.h5").string(),
          run_attributes(cfg, config_text.write(cfg), dir.run_id(), *run.ops, comm.size(),
                         notes.threads),
          cfg.resume == "none" ? -1 : (run.start.resumed ? run.start.state.step : 0));
      if (!run.metrics->note().empty()) say(stdout, "note: %s\n", run.metrics->note().c_str());
    } catch (const std::exception& e) {
      verdict = {kExitUsage, std::string("mpiformer train: --out: ") + e.what()};
    }
    if (!branch_line.empty()) say(stdout, "%s\n", branch_line.c_str());
  }
  return agree(comm, verdict, Speaker::kRoot);
}

}  // namespace

Started start_run(const TrainConfig& flags, const Communicator& comm, const ConfigText& config_text,
                  const FaultInjection& faults) {
  auto parts = std::make_unique<TrainingRun>();
  TrainingRun& run = *parts;
  run.cfg = flags;
  StartNotes notes;
  // A start that ends here leaves the run directory as it found it.
  const auto end = [&run](int code) {
    if (run.run_dir) run.run_dir->withdraw();
    return Started{nullptr, code};
  };
  if (const int code = resolve_inputs(run, comm)) return end(code);
  const TrainConfig resolved = run.cfg;
  for (;;) {
    if (const int code = open_run_directory(run, comm, &notes)) return end(code);
    if (run.start.resumed && run.start.state.step >= run.cfg.steps) {
      if (comm.is_root()) {
        say(stdout, "%s: the checkpoint of step %lld already reaches --steps %lld; nothing to do\n",
            run.start.checkpoint.path.c_str(), static_cast<long long>(run.start.state.step),
            static_cast<long long>(run.cfg.steps));
      }
      return end(0);
    }
    if (const int code = build(run, comm, faults, &notes)) return end(code);
    const int code = restore(run, comm);
    if (code == 0) break;
    if (code != kRestoreDamaged) return end(code);
    // The checkpoint before the damaged one sets the seed, the cursor and
    // the values: build again from it. Parts go in the reverse order of
    // their making (the model's memory is the backend's).
    run.scaler.reset();
    run.schedule.reset();
    run.optimizer.reset();
    run.shards.reset();  // holds the backend it was made with
    run.model.reset();
    run.ops.reset();
    run.source.reset();
    run.start = StartPoint{};
    run.cfg = resolved;
  }
  // 5. The gradient all-reduce: buckets of whole tensors, started during the
  // last backward pass of each step.
  if (agree_on(comm, [&] {
        run.reducer = make_reducer(run.model->parameters(), run.cfg.bucket_mb, run.cfg.overlap,
                                   run.cfg.grad_sum, notes.transport, comm);
      }) != 0)
    return end(kExitFailure);
  // Sharded: each bucket goes to the owners of its elements, and the updated
  // slices come back over the same transport.
  if (run.shards && run.reducer) {
    run.reducer->set_owners(run.shards->plan().bounds, comm.rank());
    run.shards->use_transport(run.reducer->transport(),
                              static_cast<int>(run.reducer->buckets().size()) + 1);
  }
  // The restored masters reach the compute copy; sliced masters (sharded,
  // bf16/fp16) then travel as the compute copy, over the transport above.
  if (run.start.resumed) run.optimizer->refresh_weights();
  if (const int code = claim_directory(run, comm, config_text, notes)) return end(code);
  print_start(run, comm, config_text, notes);
  return Started{std::move(parts), 0};
}

}  // namespace mpiformer
