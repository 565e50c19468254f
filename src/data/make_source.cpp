#include "src/data/make_source.h"

#include <stdexcept>

#include "src/core/error.h"
#include "src/data/shard_source.h"
#include "src/data/synthetic.h"
#include "src/io/shard.h"

namespace mpiformer {

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
