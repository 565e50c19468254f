// The start-up's reconciliation of the model the flags describe with the
// shard set it trains on. The shards decide what the flags leave open (a
// vocabulary, label count or image side of 0) and always the special ids;
// a flag that names another value is refused. The data layer only checks
// the result (src/data/shard_check.h).
#pragma once

#include <string>

#include "src/core/config.h"
#include "src/io/shard.h"

namespace mpiformer {

// Fills the fields of `model` that the shards in `dir` decide, then checks
// the whole model against them (UsageError naming the flag). Returns what
// the shards decided, for the start lines: "vocab 8000, special ids, 2
// labels" (the special ids always come from the shards).
std::string reconcile_with_shards(const ShardHeader& header, const std::string& dir,
                                  ModelConfig* model);

// With --data: reconciles cfg->model with the first train shard's header
// and returns what the shards decided; "" for synthetic tasks. Call before
// building the model. Throws UsageError (a std::runtime_error), --data's
// for a damaged shard.
std::string resolve_data_config(TrainConfig* cfg);

}  // namespace mpiformer
