// The batch source a training run reads: synthetic tasks or HDF5 shards.
#pragma once

#include <memory>

#include "src/core/config.h"
#include "src/data/batch_source.h"
#include "src/data/shard_source.h"

namespace mpiformer {

// Validates the data against the configuration (every fault names its file)
// and builds the source for this rank; `splits` chooses the shards' splits
// (synthetic tasks have none). A shard that is damaged, malformed or holds
// values out of range is the user's input: UsageError "--data: PATH: what".
std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& cfg, int rank, int world_size,
                                               const SplitChoice& splits = {});

}  // namespace mpiformer
