#include "src/core/escape.h"

#include <cstdint>

namespace mpiformer {
namespace {

// Bytes of the valid UTF-8 sequence at p (lead byte c), or 0 when it is not
// one (malformed, overlong, a surrogate, past U+10FFFF).
int sequence_length(const unsigned char* p, const unsigned char* end, uint32_t* code) {
  const unsigned c = *p;
  const int extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : -1;
  if (extra < 0 || c > 0xf4 || end - p <= extra) return 0;
  *code = c & (0x3fu >> extra);
  for (int i = 1; i <= extra; ++i) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    *code = (*code << 6) | (p[i] & 0x3fu);
  }
  const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
  if (*code < least[extra] || *code > 0x10ffff || (*code >= 0xd800 && *code <= 0xdfff)) return 0;
  return extra + 1;
}

void append_hex(std::string* out, unsigned char byte) {
  constexpr char kDigits[] = "0123456789abcdef";
  *out += "\\x";
  *out += kDigits[byte >> 4];
  *out += kDigits[byte & 15];
}

}  // namespace

std::string escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned c = *p;
    if (c == '\n') {
      out += "\\n";
      ++p;
    } else if (c < 0x20 || c == 0x7f) {
      append_hex(&out, *p++);
    } else if (c < 0x80) {
      out += static_cast<char>(*p++);
    } else {
      uint32_t code = 0;
      const int n = sequence_length(p, end, &code);
      // A C1 control (U+009B is CSI on some terminals) is escaped as its bytes.
      if (n == 0 || code < 0xa0) {
        for (int i = 0; i < (n == 0 ? 1 : n); ++i) append_hex(&out, *p++);
      } else {
        out.append(reinterpret_cast<const char*>(p), n);
        p += n;
      }
    }
  }
  return out;
}

}  // namespace mpiformer
