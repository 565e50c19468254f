// File descriptors: Open MPI's start (its sockets and shared-memory
// segments), HDF5 and the loader take some, and a shell's low limit made
// MPI_Init abort in some 36 lines of Open MPI's. Checked first thing in main.
#pragma once

#include <string>

namespace mpiformer {

// A run's need (one rank reading shards and writing checkpoints takes
// about 26), and what the soft limit is raised to where the hard limit allows.
constexpr long kFilesNeeded = 32;
constexpr long kFilesWanted = 4096;

// Raises the soft RLIMIT_NOFILE to the hard limit (at most kFilesWanted)
// when it is below kFilesWanted. Returns "" when at least kFilesNeeded may
// be open then, else the reason for one line: "only 20 files may be open
// (ulimit -n; the hard limit is 20); a run needs at least 32".
std::string raise_file_limit();

}  // namespace mpiformer
