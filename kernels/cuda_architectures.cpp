#include "kernels/cuda_architectures.h"

#include <algorithm>
#include <sstream>

namespace mpiformer {

bool architectures_run_on(const std::string& architectures, int major, int minor) {
  const int capability = major * 10 + minor;
  std::string entries = architectures;  // ';' or ',' between entries
  std::replace(entries.begin(), entries.end(), ',', ';');
  std::stringstream list(entries);
  std::string entry;
  while (std::getline(list, entry, ';')) {
    if (entry == "all" || entry == "all-major" || entry == "native") return true;
    const size_t dash = entry.find('-');
    const std::string kind = dash == std::string::npos ? "" : entry.substr(dash + 1);
    int arch = 0;
    try {
      arch = std::stoi(entry.substr(0, dash));
    } catch (const std::exception&) {
      continue;
    }
    const bool machine_code = kind.empty() || kind == "real";
    const bool ptx = kind.empty() || kind == "virtual";
    if (machine_code && arch / 10 == major && arch <= capability) return true;
    if (ptx && arch <= capability) return true;
  }
  return false;
}

std::string architectures_problem(const std::string& architectures, int major, int minor,
                                  const std::string& gpu) {
  if (architectures_run_on(architectures, major, minor)) return "";
  const std::string capability = std::to_string(major) + std::to_string(minor);
  std::string shown = architectures;
  std::replace(shown.begin(), shown.end(), ',', ';');
  return gpu + " has compute capability " + std::to_string(major) + "." + std::to_string(minor) +
         ", and this build has kernels for CMAKE_CUDA_ARCHITECTURES " + shown +
         " only: configure a fresh build with -DCMAKE_CUDA_ARCHITECTURES=" + capability +
         " (or scripts/setup with MPIFORMER_NATIVE=1 on that machine)";
}

}  // namespace mpiformer
