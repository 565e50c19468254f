// `mpiformer inspect FILE.h5`: a human summary of a file the project writes,
// told apart by the root attribute `format`: a shard (lm, seq2seq, classify:
// token lengths, labels; image: images, their size and channels, labels), a
// checkpoint or a metrics file (also while a run writes it).
#pragma once

#include <string>

#include "src/parallel/communicator.h"

namespace mpiformer {

// Rank 0 reads and validates the file and prints the summary to stdout.
// Returns 0; for a file it cannot read or describe (missing, a directory,
// not HDF5, damaged, of another kind) prints one line "mpiformer inspect:
// PATH: fault" to stderr and returns 2 (on every rank: the outcome is
// agreed, a collective). A damaged file is never waited on.
int run_inspect(const std::string& path, Communicator& comm);

}  // namespace mpiformer
