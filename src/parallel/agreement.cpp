#include "src/parallel/agreement.h"

#include <cstdio>

#include "src/core/run_log.h"

namespace mpiformer {

int agree(const Communicator& comm, const Verdict& mine) {
  if (!mine.message.empty()) {
    say(stderr, "%s\n", mine.message.c_str());
    std::fflush(stderr);
  }
  return comm.max(mine.code);
}

int agree_first(const Communicator& comm, Verdict mine) {
  const int speaker = comm.min_with_rank(mine.code != 0 ? 0 : 1).second;  // a collective
  if (comm.rank() != speaker) mine.message.clear();
  return agree(comm, mine);
}

int agree_on(const Communicator& comm, const Verdict& verdict) {
  return agree(comm, comm.is_root() ? verdict : Verdict{});
}

}  // namespace mpiformer
