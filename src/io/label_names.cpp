#include "src/io/label_names.h"

#include <algorithm>

namespace mpiformer {

std::string join_label_names(const std::vector<std::string>& names) {
  std::string bytes;
  for (const std::string& n : names) bytes += n + "\n";
  return bytes;
}

std::vector<std::string> split_label_names(const std::string& bytes) {
  std::vector<std::string> names;
  for (size_t at = 0; at < bytes.size();) {
    const size_t end = std::min(bytes.find('\n', at), bytes.size());
    names.push_back(bytes.substr(at, end - at));
    at = end + 1;
  }
  return names;
}

}  // namespace mpiformer
