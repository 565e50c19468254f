#include "src/io/label_names.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "src/core/escape.h"

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

namespace {

std::string hex_byte(unsigned char c) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02x", c);
  return text;
}

}  // namespace

std::string label_name_fault(const std::string& name) {
  if (name.empty()) return "is empty";
  const auto* begin = reinterpret_cast<const unsigned char*>(name.data());
  const auto* end = begin + name.size();
  for (const unsigned char* p = begin; p < end;) {
    const std::string at = " at byte " + std::to_string(p - begin + 1);
    const unsigned c = *p;
    if (c < 0x80) {
      if (c == ' ') return "holds white space" + at;
      if (c < 0x20 || c == 0x7f) return "holds control character " + hex_byte(*p) + at;
      ++p;
      continue;
    }
    // A sequence of 1 + extra bytes; overlong forms and surrogates are not UTF-8.
    const int extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : -1;
    const std::string broken = "is not UTF-8 (byte " + hex_byte(*p) + at + ")";
    if (extra < 0 || c > 0xf4 || end - p <= extra) return broken;
    uint32_t code = c & (0x3fu >> extra);
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xc0) != 0x80) return broken;
      code = (code << 6) | (p[i] & 0x3fu);
    }
    const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (code < least[extra] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return broken;
    }
    // The C1 controls, U+0080 to U+009F, are control characters too.
    if (code < 0xa0) return "holds control character U+00" + hex_byte(code).substr(2) + at;
    p += extra + 1;
  }
  return "";
}

std::string label_set_difference(const std::vector<std::string>& a, const std::string& a_name,
                                 const std::vector<std::string>& b, const std::string& b_name) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) {
      return "label " + std::to_string(i) + " is '" + escaped(a[i]) + "' in " + a_name + " and '" +
             escaped(b[i]) + "' in " + b_name;
    }
  }
  if (a.size() == b.size()) return "";
  const bool a_longer = a.size() > b.size();
  return std::to_string(a.size()) + " label(s) in " + a_name + ", " + std::to_string(b.size()) +
         " in " + b_name + " (label " + std::to_string(n) + " is '" +
         escaped((a_longer ? a : b)[n]) + "' in " + (a_longer ? a_name : b_name) + " alone)";
}

}  // namespace mpiformer
