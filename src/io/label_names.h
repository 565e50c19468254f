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

// What makes `name` unfit to store, "" when nothing: a name is one line of
// the stored list and one word of a labels file, and people read it, so it
// is non-empty UTF-8 without white space or control characters (NUL
// included). Says which byte is wrong: "holds control character 0x00 at
// byte 2".
std::string label_name_fault(const std::string& name);

}  // namespace mpiformer
