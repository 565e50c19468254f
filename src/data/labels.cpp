#include "src/data/labels.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

namespace mpiformer {

std::vector<LabelWeight> parse_label_line(const std::string& line) {
  std::vector<LabelWeight> labels;
  std::set<std::string> seen;
  std::istringstream words(line);
  std::string word;
  while (words >> word) {
    LabelWeight label;
    // The last colon splits: a name may hold colons of its own
    // ("devel::lang:python"), a weight never does.
    const size_t colon = word.rfind(':');
    const std::string tail = colon == std::string::npos ? "" : word.substr(colon + 1);
    float weight = 0.0f;
    const auto [end, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), weight);
    const bool is_weight = !tail.empty() && ec == std::errc() && end == tail.data() + tail.size();
    if (is_weight) {
      label.name = word.substr(0, colon);
      label.weight = weight;
      if (!(weight >= 0.0f && weight <= 1.0f) || !std::isfinite(weight)) {
        throw std::invalid_argument("weight " + tail + " of '" + label.name + "' is not in [0, 1]");
      }
    } else {
      label.name = word;
    }
    if (label.name.empty()) throw std::invalid_argument("'" + word + "' has no label name");
    if (!seen.insert(label.name).second) {
      throw std::invalid_argument("label '" + label.name + "' given twice");
    }
    labels.push_back(label);
  }
  return labels;
}

void LabelVocabulary::count(const std::vector<LabelWeight>& labels) {
  for (const LabelWeight& l : labels) ++counts_[l.name];
}

void LabelVocabulary::finish() {
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [name, n] : counts_) order.emplace_back(-n, name);
  std::sort(order.begin(), order.end());
  names_.clear();
  ids_.clear();
  for (const auto& [minus_count, name] : order) {
    ids_[name] = static_cast<int>(names_.size());
    names_.push_back(name);
  }
}

int LabelVocabulary::id(const std::string& name) const {
  const auto it = ids_.find(name);
  return it == ids_.end() ? -1 : it->second;
}

}  // namespace mpiformer
