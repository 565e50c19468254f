#include "src/core/error.h"

namespace mpiformer {

void usage_error(const std::string& flag, const std::string& message) {
  throw UsageError(flag, message);
}

}  // namespace mpiformer
