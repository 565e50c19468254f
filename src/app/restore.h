// Decisions rank 0 takes for every rank at start-up, and checkpoint tensors
// read by rank 0 put into every rank's memory (`train --resume`, `eval`).
#pragma once

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "src/core/run_log.h"
#include "src/io/checkpoint.h"
#include "src/model/parameters.h"
#include "src/parallel/communicator.h"

namespace mpiformer {

// An exit code (0: go on) and the line that explains it.
struct Verdict {
  int code = 0;
  std::string message;
};

// Every rank learns rank 0's verdict; rank 0 prints its line on stderr.
int agree_on(const Communicator& comm, const Verdict& verdict);

// Runs `what` on every rank and agrees on the outcome: a rank that failed
// prints "[rank r] message", and every rank learns that some rank failed, so
// nobody waits in a later collective for a rank that has given up.
template <class Fn>
bool agreed(const Communicator& comm, Fn&& what) {
  std::string failure;
  try {
    what();
  } catch (const std::exception& e) {
    failure = e.what();
    if (failure.empty()) failure = "unknown error";
  }
  if (!failure.empty()) {
    say(stderr, "[rank %d] %s\n", comm.rank(), failure.c_str());
    std::fflush(stderr);
  }
  return !comm.any(!failure.empty());
}

// Copies one group of a checkpoint, held by rank 0 (`tensors`; ignored
// elsewhere), into `dest` on every rank. Rank 0 throws CheckpointMismatch
// when the names or shapes differ from params (check first with
// unpack_checkpoint_tensors to agree on it).
// dest: backend (params.count()), laid out like params.params()
void broadcast_tensors(const Communicator& comm, const std::string& path,
                       const std::vector<CheckpointTensor>& tensors, const ParameterSet& params,
                       float* dest);

}  // namespace mpiformer
