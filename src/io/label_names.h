// A classifier's label names as shards and checkpoints store them: one name
// a line, in id order.
#pragma once

#include <string>
#include <vector>

namespace mpiformer {

std::string join_label_names(const std::vector<std::string>& names);
std::vector<std::string> split_label_names(const std::string& bytes);

}  // namespace mpiformer
