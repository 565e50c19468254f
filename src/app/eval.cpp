// `mpiformer eval`: a checkpoint's global loss, perplexity and token accuracy
// on the validation shards of a data set, split over ranks like training.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/app/commands.h"
#include "src/app/evaluation.h"
#include "src/app/memory_budget.h"
#include "src/app/options.h"
#include "src/app/restore.h"
#include "src/core/error.h"
#include "src/data/make_source.h"
#include "src/io/checkpoint.h"
#include "src/io/shard.h"
#include "src/model/model.h"

namespace mpiformer {

int run_eval(const EvalConfig& cfg, Communicator& comm) {
  const int W = comm.size(), rank = comm.rank();

  // 1. Rank 0 reads the checkpoint; every rank learns the run's flags.
  CheckpointState state;
  std::vector<CheckpointTensor> tensors;  // rank 0
  {
    Verdict verdict;
    if (comm.is_root()) {
      try {
        state = read_checkpoint_state(cfg.checkpoint);
        tensors = read_checkpoint_tensors(cfg.checkpoint, "params");
        require_finite(cfg.checkpoint, tensors, "params");
      } catch (const CheckpointError& e) {
        verdict = {kExitFailure, std::string("[rank 0] ") + e.what()};
      }
    }
    if (const int code = agree_on(comm, verdict)) return code;
  }
  std::string ini = state.config_ini;
  comm.broadcast(&ini, 0);
  TrainConfig run = train_config_from_ini(ini, cfg.checkpoint + " (its config attribute)");
  run.data_dir = cfg.data_dir;
  run.synthetic = SyntheticTask::kNone;
  run.sharding = Sharding::kData;
  if (cfg.max_tokens > 0) run.max_tokens = cfg.max_tokens;

  // 2. The shards must speak the checkpoint's vocabulary: same ids, same
  //    tokenizer. A checkpoint of a synthetic task has no tokenizer to match.
  {
    Verdict verdict;
    if (comm.is_root()) {
      try {
        const std::vector<std::string> valid = list_shards(cfg.data_dir, "valid");
        if (valid.empty()) {
          verdict = {kExitUsage, "mpiformer eval: --data: " + cfg.data_dir +
                                     " has no validation shards (valid-NNNNN.h5)"};
        } else {
          const ShardHeader header = read_shard_header(valid.front());
          if (header.vocab_size != state.vocab_size || header.special != state.special ||
              header.tokenizer != state.tokenizer) {
            verdict = {kExitUsage,
                       "mpiformer eval: --data: the shards of " + cfg.data_dir + " have " +
                           std::to_string(header.vocab_size) +
                           " ids and their own tokenizer; the checkpoint was trained on " +
                           std::to_string(state.vocab_size) +
                           (state.tokenizer.empty() ? " ids of a synthetic task"
                                                    : " ids with another tokenizer")};
          }
        }
      } catch (const std::exception& e) {
        verdict = {kExitFailure, std::string("[rank 0] ") + e.what()};
      }
    }
    if (const int code = agree_on(comm, verdict)) return code;
  }

  std::unique_ptr<BatchSource> data;
  if (!agreed(comm, [&] {
        resolve_data_config(&run);
        data = make_batch_source(run, rank, W);
      }))
    return kExitFailure;
  const int threads = cfg.threads > 0 ? cfg.threads : comm.cores_per_local_rank();
  std::unique_ptr<Ops> ops = make_cpu_ops(threads);
  const ModelCapacity capacity{run.max_tokens, run.model.max_len};
  {
    // The model at this --max-tokens must fit beside the other ranks of the node.
    std::string shortfall;
    if (!agreed(comm, [&] {
          shortfall = memory_shortfall(
              estimate_memory(*ops, run.model, capacity, DType::kF32, false), *ops,
              comm.local_size(), "--max-tokens (" + std::to_string(run.max_tokens) + ")");
        }))
      return kExitFailure;
    if (const int code = refuse_on_shortfall(comm, shortfall, "mpiformer eval: --max-tokens: "))
      return code;
  }
  Model model(*ops, run.model, capacity);
  model.init_parameters(run.seed);  // allocates; the checkpoint's values replace these
  ParameterSet& params = model.parameters();
  if (!agreed(comm, [&] {
        if (comm.is_root()) {
          std::vector<float> scratch(params.count());  // (params.count())
          unpack_checkpoint_tensors(cfg.checkpoint, tensors, params, scratch.data());
        }
      }))
    return kExitFailure;
  broadcast_tensors(comm, cfg.checkpoint, tensors, params, params.params());

  // 3. Every validation batch (or --batches), split over the ranks.
  const uint64_t count =
      cfg.batches > 0 ? static_cast<uint64_t>(cfg.batches) : data->eval_batch_count();
  Batch batch;
  const LossSummary eval = evaluate(model, *data, count, run.label_smoothing, comm, batch);
  if (comm.is_root()) {
    std::printf("mpiformer eval: %s (step %lld, %s) on %s: %llu batch(es) over %d rank(s)\n",
                cfg.checkpoint.c_str(), static_cast<long long>(state.step),
                to_string(run.model.kind), cfg.data_dir.c_str(),
                static_cast<unsigned long long>(std::min(count, data->eval_batch_count())), W);
    std::printf("eval | loss %.4f | ppl %.3f | acc %.2f%% | %lld tokens\n", eval.loss,
                eval.perplexity, 100.0 * eval.accuracy, static_cast<long long>(eval.tokens));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace mpiformer
