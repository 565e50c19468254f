#include "src/data/make_source.h"

#include <filesystem>
#include <stdexcept>

#include "src/core/error.h"
#include "src/data/shard_source.h"
#include "src/data/synthetic.h"
#include "src/io/shard.h"

namespace mpiformer {

void resolve_data_config(TrainConfig* cfg) {
  if (cfg->data_dir.empty()) return;
  const std::string& dir = cfg->data_dir;
  if (!std::filesystem::is_directory(dir)) usage_error("--data", dir + " is not a directory");
  const std::vector<std::string> train = list_shards(dir, "train");
  if (train.empty()) usage_error("--data", dir + " holds no train-*.h5 shards");
  try {
    apply_shard_header(read_shard_header(train.front()), dir, &cfg->model);
  } catch (const ShardError& e) {
    usage_error("--data", e.what());
  } catch (const UsageError& e) {
    // The kind came from a preset, not from a --model the user wrote.
    const std::string what = e.what();
    if (cfg->arch.empty() || what.rfind("--model:", 0) != 0) throw;
    throw UsageError(what + " (--arch " + cfg->arch + " sets --model " +
                     to_string(cfg->model.kind) + "; choose a preset of the shards' kind)");
  }
}

std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& cfg, int rank, int world_size,
                                               const SplitChoice& splits) {
  if (cfg.synthetic != SyntheticTask::kNone)
    return std::make_unique<SyntheticSource>(cfg.synthetic, cfg.model, cfg.max_tokens,
                                             cfg.max_sentences, cfg.min_len, cfg.mlm_probability,
                                             cfg.seed);
  if (cfg.data_dir.empty()) usage_error("--data", "required: --data DIR or --synthetic TASK");
  try {
    return std::make_unique<ShardSource>(cfg, rank, world_size, splits);
  } catch (const ShardError& e) {
    // The user's data: a damaged or malformed shard is refused as --data's
    // fault (exit 2), not as a failure of this rank.
    usage_error("--data", e.what());
  }
}

}  // namespace mpiformer
