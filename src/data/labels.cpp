#include "src/data/labels.h"

#include <algorithm>
#include <charconv>
#include <set>
#include <sstream>
#include <stdexcept>

#include "src/core/escape.h"

namespace mpiformer {

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_alnum(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// A plain decimal number: [+-] digits [. digits] [e [+-] digits], or the
// point first (.5). No hexadecimal, inf or nan, nothing after it.
bool is_decimal(const std::string& s) {
  size_t at = s[0] == '+' || s[0] == '-';
  size_t digits = 0;
  while (at < s.size() && is_digit(s[at])) ++at, ++digits;
  if (at < s.size() && s[at] == '.') {
    ++at;
    while (at < s.size() && is_digit(s[at])) ++at, ++digits;
  }
  if (digits == 0) return false;
  if (at < s.size() && (s[at] == 'e' || s[at] == 'E')) {
    ++at;
    if (at < s.size() && (s[at] == '+' || s[at] == '-')) ++at;
    const size_t exponent = at;
    while (at < s.size() && is_digit(s[at])) ++at;
    if (at == exponent) return false;
  }
  return at == s.size();
}

// Whether the text after a word's last ':' is meant as a weight: it is, unless
// it is a word of the name (python, c++, 3d), and inf or nan are weights a
// reader would take for numbers.
bool meant_as_weight(std::string tail) {
  if (tail.empty() || tail[0] == '+' || tail[0] == '-' || tail[0] == '.') return true;
  for (char& c : tail) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (tail == "inf" || tail == "infinity" || tail == "nan") return true;
  if (!is_digit(tail[0])) return false;
  // 3d, 3dmodel: a name; 0.5abc, 0x1p-1, 1e5: a weight.
  return tail.rfind("0x", 0) == 0 || !std::all_of(tail.begin(), tail.end(), is_alnum) ||
         is_decimal(tail);
}

// The weight after a label's ':', in [0, 1].
float parse_weight(const std::string& name, const std::string& tail) {
  if (tail.empty()) throw std::invalid_argument("'" + name + ":' has no weight after its ':'");
  if (!is_decimal(tail)) {
    throw std::invalid_argument("weight '" + escaped(tail) + "' of '" + name +
                                "' is not a decimal number (such as 0.25)");
  }
  const char* first = tail.data() + (tail[0] == '+');
  double weight = 0.0;
  const auto [end, ec] = std::from_chars(first, tail.data() + tail.size(), weight);
  if (ec == std::errc::result_out_of_range) {
    // Too small for a double is 0 as a float; too large is out of range.
    const size_t e = tail.find_first_of("eE");
    weight = e != std::string::npos && tail[e + 1] == '-' ? 0.0 : 2.0;
  }
  if (!(weight >= 0.0 && weight <= 1.0)) {
    throw std::invalid_argument("weight " + tail + " of '" + name + "' is not in [0, 1]");
  }
  return static_cast<float>(weight) + 0.0f;  // -0 becomes 0
}

}  // namespace

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
    if (colon != std::string::npos && meant_as_weight(tail)) {
      label.name = word.substr(0, colon);
      if (label.name.empty()) throw std::invalid_argument("'" + word + "' has no label name");
      label.weight = parse_weight(escaped(label.name), tail);
    } else {
      label.name = word;
    }
    const std::string fault = label_name_fault(label.name);
    if (!fault.empty()) {
      throw std::invalid_argument("label '" + escaped(label.name) + "' " + fault);
    }
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
