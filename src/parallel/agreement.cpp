#include "src/parallel/agreement.h"

#include <cstdio>

#include "src/core/run_log.h"

namespace mpiformer {

namespace {

// Whether this rank's line is printed under `speaker`: a collective for the
// rules that look at other ranks.
bool speaks(const Communicator& comm, const Verdict& mine, Speaker speaker) {
  switch (speaker) {
    case Speaker::kEach:
      return true;
    case Speaker::kRoot:
      return comm.is_root();
    case Speaker::kFirst:
      return comm.min_with_rank(mine.code != 0 ? 0 : 1).second == comm.rank();
    case Speaker::kFirstRefusal: {
      const bool refused = mine.code == kExitUsage;
      const int first = comm.min_with_rank(refused ? 0 : 1).second;
      return !refused || first == comm.rank();
    }
  }
  return true;
}

}  // namespace

int agree(const Communicator& comm, Verdict mine, Speaker speaker) {
  if (!speaks(comm, mine, speaker)) {
    mine.message.clear();
    if (speaker == Speaker::kRoot) mine.code = 0;  // only rank 0's verdict counts
  }
  if (!mine.message.empty()) {
    say(stderr, "%s\n", mine.message.c_str());
    std::fflush(stderr);
  }
  return comm.max(mine.code);
}

}  // namespace mpiformer
