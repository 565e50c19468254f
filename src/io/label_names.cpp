#include "src/io/label_names.h"

#include <algorithm>
#include <string>
#include <vector>

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

std::string label_set_difference(const std::vector<std::string>& a, const std::string& a_name,
                                 const std::vector<std::string>& b, const std::string& b_name) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) {
      return "label " + std::to_string(i) + " is '" + a[i] + "' in " + a_name + " and '" + b[i] +
             "' in " + b_name;
    }
  }
  if (a.size() == b.size()) return "";
  const bool a_longer = a.size() > b.size();
  return std::to_string(a.size()) + " label(s) in " + a_name + ", " + std::to_string(b.size()) +
         " in " + b_name + " (label " + std::to_string(n) + " is '" + (a_longer ? a : b)[n] +
         "' in " + (a_longer ? a_name : b_name) + " alone)";
}

}  // namespace mpiformer
