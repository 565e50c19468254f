// The batch source a training run reads: synthetic tasks or HDF5 shards.
#pragma once

#include <memory>

#include "src/core/config.h"
#include "src/data/batch_source.h"

namespace mpiformer {

// Validates the data against the configuration (every fault names its file)
// and builds the source for this rank. Throws std::runtime_error.
std::unique_ptr<BatchSource> make_batch_source(const TrainConfig& cfg, int rank, int world_size);

}  // namespace mpiformer
