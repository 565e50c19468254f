// Labels of classification data (`prepare --kind classify --labels FILE`):
// line i of FILE holds the labels of line i of the text, space-separated,
// each NAME (a hard label, weight 1) or NAME:WEIGHT (a soft label, weight in
// [0, 1]). A blank line is an example with no label (every label negative).
//
// The last ':' of a word splits off the weight, a plain decimal number
// (`1`, `0.25`, `.5`, `5e-1`; `-0` reads as 0). What follows it belongs to
// the name when it is a word (`devel::lang:python`, `interface::3d`:
// letters and digits, not starting with a sign or a point). Anything else
// there is a weight that cannot be read and is refused: nothing (`a:`),
// `0.5abc`, `0x1p-1`, `inf`, `nan`, and a number outside [0, 1] (`1e400`).
// A name is UTF-8 without control characters (label_name_fault).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "src/io/label_names.h"

namespace mpiformer {

struct LabelWeight {
  std::string name;
  float weight = 1.0f;
};

// The labels of one line, in the order given. Throws std::invalid_argument
// saying what is wrong ("weight 1.5 of 'x' is not in [0, 1]", "label 'a'
// given twice", "weight '0.5abc' of 'a' is not a decimal number").
std::vector<LabelWeight> parse_label_line(const std::string& line);

// The label vocabulary of a data set: the names seen in the training lines,
// most frequent first (ties by name), so id 0 is the commonest label.
class LabelVocabulary {
 public:
  void count(const std::vector<LabelWeight>& labels);  // one training example's labels
  void finish();                                       // fixes the ids
  const std::vector<std::string>& names() const { return names_; }
  // -1 for a name the training lines never had.
  int id(const std::string& name) const;

 private:
  std::map<std::string, int64_t> counts_;
  std::map<std::string, int> ids_;
  std::vector<std::string> names_;
};

}  // namespace mpiformer
