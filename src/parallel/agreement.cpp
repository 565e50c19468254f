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

int agree_on(const Communicator& comm, const Verdict& verdict) {
  return agree(comm, comm.is_root() ? verdict : Verdict{});
}

}  // namespace mpiformer
