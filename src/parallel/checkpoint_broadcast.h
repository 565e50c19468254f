// Checkpoint tensors read by rank 0 put into every rank's memory (`eval`;
// `train --resume` reads collectively, src/parallel/collective_checkpoint.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/core/parameters.h"
#include "src/io/checkpoint.h"
#include "src/parallel/communicator.h"

namespace mpiformer {

// Copies one group of a checkpoint, held by rank 0 (`tensors`; ignored
// elsewhere), into `dest` on every rank. Rank 0 throws CheckpointMismatch
// when the names or shapes differ from params (check first with
// unpack_checkpoint_tensors to agree on it).
// Only elements [begin, end) of the flat layout land in dest (a sharded
// optimizer's slice of the moments); all of them by default.
// dest: backend (end - begin), laid out like params.params() + begin
void broadcast_tensors(const Communicator& comm, const std::string& path,
                       const std::vector<CheckpointTensor>& tensors, const ParameterSet& params,
                       float* dest, size_t begin = 0, size_t end = SIZE_MAX);

}  // namespace mpiformer
