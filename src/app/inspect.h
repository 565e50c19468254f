// `mpiformer inspect FILE.h5`: a human summary of a file the project writes.
// Shards and checkpoints (told apart by the root attribute `format`); metrics
// files are answered "not an mpiformer shard" until their reader exists.
#pragma once

#include <string>

#include "src/parallel/communicator.h"

namespace mpiformer {

// Rank 0 reads and validates the file and prints the summary to stdout.
// Returns 0; on a fault prints one line "mpiformer inspect: PATH: fault" to
// stderr and returns 1 (on every rank: the outcome is agreed, a collective).
int run_inspect(const std::string& path, Communicator& comm);

}  // namespace mpiformer
