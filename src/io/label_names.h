// A classifier's label names as shards and checkpoints store them: one name
// a line, in id order.
#pragma once

#include <string>
#include <vector>

namespace mpiformer {

std::string join_label_names(const std::vector<std::string>& names);
std::vector<std::string> split_label_names(const std::string& bytes);

// How label set `b` differs from `a` ("" when they are the same names in
// the same order), naming the first label that differs in both, e.g.
// "label 2 is 'gamma' in the checkpoint and 'delta' in the shards of DIR".
// A model trained on one set scores another's ids by the wrong names.
std::string label_set_difference(const std::vector<std::string>& a, const std::string& a_name,
                                 const std::vector<std::string>& b, const std::string& b_name);

}  // namespace mpiformer
