#include "src/core/file_limit.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mpiformer {

std::string raise_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return "";  // nothing known: go on
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < static_cast<rlim_t>(kFilesWanted)) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY
                          ? kFilesWanted
                          : std::min(limit.rlim_max, static_cast<rlim_t>(kFilesWanted));
    if (raised.rlim_cur > limit.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      limit = raised;
    }
  }
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= static_cast<rlim_t>(kFilesNeeded)) {
    return "";
  }
  const std::string hard =
      limit.rlim_max == RLIM_INFINITY ? "unlimited" : std::to_string(limit.rlim_max);
  return "only " + std::to_string(limit.rlim_cur) +
         " files may be open (ulimit -n; the hard limit is " + hard + "); a run needs at least " +
         std::to_string(kFilesNeeded) + ": raise the limit (ulimit -n 1024) and start again";
}

}  // namespace mpiformer
