#include "src/core/error.h"

#include <cstdio>

namespace mpiformer {

void usage_error(const std::string& flag, const std::string& message) {
  throw UsageError(flag, message);
}

std::string format_bytes(double bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = bytes / 1024.0;
  int unit = 0;
  for (; unit < 3 && value >= 1024.0; ++unit) value /= 1024.0;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f %s", value, units[unit]);
  return buf;
}

}  // namespace mpiformer
