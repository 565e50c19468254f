// `mpiformer eval`: a checkpoint's global loss, perplexity and token accuracy
// on a held-out split of a data set (valid, or test), split over ranks like
// training.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/core/error.h"
#include "src/data/make_source.h"
#include "src/io/checkpoint.h"
#include "src/io/label_names.h"
#include "src/io/shard.h"
#include "src/model/model.h"
#include "src/parallel/agreement.h"
#include "src/parallel/checkpoint_broadcast.h"
#include "src/parallel/rank_device.h"
#include "src/train/held_out.h"
#include "src/train/memory_budget.h"
#include "src/train/shard_config.h"

namespace mpiformer {
namespace {

constexpr double kProgressSeconds = 5.0;

// The source evaluate() reads, passed through; rank 0 reports the batches it
// has taken every kProgressSeconds, so a long evaluation is not silent and
// a short one prints nothing. Each rank takes every W-th batch, so rank 0's
// share stands for the whole.
class ReportingSource : public BatchSource {
 public:
  ReportingSource(BatchSource& source, uint64_t count, const Communicator& comm)
      : source_(source),
        share_((count + comm.size() - 1) / comm.size()),
        world_(comm.size()),
        report_(comm.is_root()) {}

  void make_batch(uint64_t stream, uint64_t index, Batch* out) override {
    if (report_ && stream == kEval) report();
    source_.make_batch(stream, index, out);
  }
  uint64_t eval_batch_count() const override { return source_.eval_batch_count(); }

 private:
  void report() {
    using Clock = std::chrono::steady_clock;
    const auto now = Clock::now();
    // The batch asked for now is the next; those before it are done.
    const uint64_t done = taken_++;
    if (std::chrono::duration<double>(now - last_).count() < kProgressSeconds) return;
    last_ = now;
    std::fprintf(stderr, "eval: %llu/%llu batches%s (%.0f%%), %.1f s\n",
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(share_),
                 world_ > 1 ? " on rank 0" : "", 100.0 * static_cast<double>(done) / share_,
                 std::chrono::duration<double>(now - start_).count());
    std::fflush(stderr);
  }

  BatchSource& source_;
  uint64_t share_;  // batches rank 0 evaluates
  int world_;
  bool report_;
  uint64_t taken_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
};

// Rank 0: the split must be there, and its shards must speak the
// checkpoint's vocabulary: same ids, same tokenizer, a classifier's same
// labels in the same order. A checkpoint of a synthetic task has no
// tokenizer to match. A damaged shard is the user's input (exit 2).
Verdict check_split(const EvalConfig& cfg, const CheckpointState& state) {
  try {
    const std::vector<std::string> split = list_shards(cfg.data_dir, cfg.split);
    if (split.empty()) {
      return {kExitUsage, "mpiformer eval: --split: " + cfg.data_dir + " has no " + cfg.split +
                              " split (no " + cfg.split + "-NNNNN.h5)" +
                              (cfg.split == "test"
                                   ? "; `mpiformer prepare` writes one with --test or --test-lines"
                                   : "")};
    }
    const ShardHeader header = read_shard_header(split.front());
    if (header.vocab_size != state.vocab_size || header.special != state.special ||
        header.tokenizer != state.tokenizer) {
      return {kExitUsage, "mpiformer eval: --data: the shards of " + cfg.data_dir + " have " +
                              std::to_string(header.vocab_size) +
                              " ids and their own tokenizer; the checkpoint was trained on " +
                              std::to_string(state.vocab_size) +
                              (state.tokenizer.empty() ? " ids of a synthetic task"
                                                       : " ids with another tokenizer")};
    }
    if (state.label_names.empty()) return {};
    // A classifier's ids mean its labels: another set (renamed, reordered)
    // would be scored by the wrong names.
    const std::string differ = label_set_difference(
        state.label_names, "the checkpoint", header.label_names, "the shards of " + cfg.data_dir);
    if (differ.empty()) return {};
    return {kExitUsage, "mpiformer eval: --data: the label sets differ: " + differ +
                            "; evaluate on shards of the checkpoint's labels"};
  } catch (const ShardError& e) {
    return {kExitUsage, std::string("mpiformer eval: --data: ") + e.what()};
  } catch (const std::exception& e) {
    return {kExitFailure, std::string("[rank 0] ") + e.what()};
  }
}

// The model at this --max-tokens must fit beside the other ranks of the
// node: 0, or the exit code of the refusal.
int check_memory(const Communicator& comm, Ops& ops, const TrainConfig& run,
                 const ModelCapacity& capacity, DType compute) {
  std::string shortfall;
  if (agree_on(comm, [&] {
        shortfall = memory_shortfall(estimate_memory(ops, run.model, capacity, compute), ops,
                                     comm.local_size(),
                                     "--max-tokens (" + std::to_string(run.max_tokens) + ")");
      }) != 0)
    return kExitFailure;
  return refuse_on_shortfall(comm, shortfall, "mpiformer eval: --max-tokens: ");
}

}  // namespace

int run_eval(const EvalConfig& cfg, Communicator& comm) {
  const int W = comm.size(), rank = comm.rank();

  // 1. Rank 0 reads the checkpoint; every rank learns the run's flags.
  CheckpointState state;
  std::vector<CheckpointTensor> tensors;  // rank 0
  if (const int code = agree_on(
          comm,
          [&] {
            ModelCheckpoint model = read_model_checkpoint(
                cfg.checkpoint, "--checkpoint",
                [&](const std::string& ini) { train_config_from_ini(ini, cfg.checkpoint); });
            state = std::move(model.state);
            tensors = std::move(model.params);
          },
          Speaker::kRoot, Blame::kByType, "eval")) {
    return code;
  }
  std::string ini = state.config_ini;
  comm.broadcast(&ini, 0);
  TrainConfig run = train_config_from_ini(ini, cfg.checkpoint);  // checked on rank 0
  run.data_dir = cfg.data_dir;
  run.synthetic = SyntheticTask::kNone;
  run.sharding = Sharding::kData;
  if (cfg.max_tokens > 0) run.max_tokens = cfg.max_tokens;

  // 2. The split must be there, and its shards must speak the checkpoint's
  //    vocabulary.
  {
    Verdict verdict;
    if (comm.is_root()) verdict = check_split(cfg, state);
    if (const int code = agree(comm, verdict, Speaker::kRoot)) return code;
  }

  // The split against the checkpoint's flags and --max-tokens: a refusal is exit 2.
  std::unique_ptr<BatchSource> data;
  if (const int code = agree_on(
          comm,
          [&] {
            resolve_data_config(&run);
            // The split alone: the training sequences are never read.
            data = make_batch_source(run, rank, W, SplitChoice{cfg.split, false});
          },
          Speaker::kFirstRefusal, Blame::kByType, "eval"))
    return code;
  const int threads = cfg.threads > 0 ? cfg.threads : comm.cores_per_local_rank();
  // On a GPU in the run's precision and attention path, as train's own
  // evaluations; on the CPU in fp32.
  std::unique_ptr<Ops> ops;
  if (agree_on(comm, [&] { ops = make_ops(cfg.device, threads, comm, false, stderr); }) != 0)
    return kExitFailure;
  note_shared_gpus(cfg.device, comm, stderr);
  const bool on_gpu = cfg.device == DeviceKind::kCuda;
  const DType compute = on_gpu ? compute_dtype(run.precision) : DType::kF32;
  if (on_gpu && agree_on(comm, [&] { ops->set_attention_path(run.attention); }) != 0)
    return kExitUsage;
  const ModelCapacity capacity{run.max_tokens, run.model.max_len, data->max_batch_sequences()};
  if (const int code = check_memory(comm, *ops, run, capacity, compute)) return code;
  Model model(*ops, run.model, capacity, compute);
  model.init_parameters(run.seed);  // allocates; the checkpoint's values replace these
  ParameterSet& params = model.parameters();
  if (agree_on(comm, [&] {
        if (comm.is_root()) {
          std::vector<float> scratch(params.count());  // (params.count())
          unpack_checkpoint_tensors(cfg.checkpoint, tensors, params, scratch.data());
        }
      }) != 0)
    return kExitFailure;
  broadcast_tensors(comm, cfg.checkpoint, tensors, params, params.params());
  params.refresh_compute();  // the bf16/fp16 copy of the masters (none in fp32)

  // 3. Every batch of the split (or --batches), split over the ranks.
  const uint64_t count =
      cfg.batches > 0 ? static_cast<uint64_t>(cfg.batches) : data->eval_batch_count();
  Batch batch;
  ReportingSource reporting(*data, std::min(count, data->eval_batch_count()), comm);
  const LossSummary eval = evaluate(model, reporting, count, run.label_smoothing, comm, batch);
  if (comm.is_root()) {
    const std::string device = ops->device().name() +
                               (on_gpu ? ", " + std::string(to_string(run.precision)) : "") +
                               (cfg.device_choice.empty() ? "" : "; " + cfg.device_choice);
    std::printf(
        "mpiformer eval: %s (step %lld, %s) on %s (%s split): %llu batch(es) over %d "
        "rank(s) (%s)\n",
        cfg.checkpoint.c_str(), static_cast<long long>(state.step), to_string(run.model.kind),
        cfg.data_dir.c_str(), cfg.split.c_str(),
        static_cast<unsigned long long>(std::min(count, data->eval_batch_count())), W,
        device.c_str());
    std::printf("eval | %s\n", describe_eval(eval, run.model.kind).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace mpiformer
