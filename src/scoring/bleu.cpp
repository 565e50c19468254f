#include "src/scoring/bleu.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mpiformer {
namespace {

// ASCII whitespace for Python: \t \n \v \f \r, the separators 0x1c..0x1f
// and the space.
bool is_ascii_whitespace(unsigned char c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20);
}

// The rest of Python's whitespace, UTF-8 encoded: the bytes before the
// last, and the range of the last byte.
struct MultibyteWhitespace {
  std::string_view lead;
  unsigned char first, last;
};
constexpr MultibyteWhitespace kMultibyteWhitespace[] = {
    {"\xc2", 0x85, 0x85},      // U+0085
    {"\xc2", 0xa0, 0xa0},      // U+00A0
    {"\xe1\x9a", 0x80, 0x80},  // U+1680
    {"\xe2\x80", 0x80, 0x8a},  // U+2000..U+200A
    {"\xe2\x80", 0xa8, 0xa9},  // U+2028, U+2029
    {"\xe2\x80", 0xaf, 0xaf},  // U+202F
    {"\xe2\x81", 0x9f, 0x9f},  // U+205F
    {"\xe3\x80", 0x80, 0x80},  // U+3000
};

// The bytes of the Python whitespace character starting at s[i] (what
// str.isspace accepts, so what str.split and str.rstrip remove), or 0.
// Multibyte ones begin with a lead byte, so a match never starts inside
// another character.
size_t whitespace_at(std::string_view s, size_t i) {
  if (is_ascii_whitespace(static_cast<unsigned char>(s[i]))) return 1;
  const std::string_view rest = s.substr(i);
  for (const MultibyteWhitespace& w : kMultibyteWhitespace) {
    const size_t n = w.lead.size() + 1;
    if (rest.size() < n || rest.substr(0, n - 1) != w.lead) continue;
    const unsigned char last = static_cast<unsigned char>(rest[n - 1]);
    if (last >= w.first && last <= w.last) return n;
  }
  return 0;
}

// Python's str.rstrip(): the line without its trailing whitespace.
std::string_view rstrip(std::string_view s) {
  for (;;) {
    size_t cut = 0;
    for (size_t k = 1; k <= 3 && k <= s.size(); ++k)
      if (whitespace_at(s, s.size() - k) == k) cut = k;
    if (cut == 0) return s;
    s.remove_suffix(cut);
  }
}

// Python's str.replace: every occurrence, left to right, in one pass (what
// a replacement forms is not replaced again).
std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
    out.append(s.substr(pos, hit - pos));
    out.append(to);
  }
  out.append(s.substr(pos));
  return out;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_period_or_comma(char c) {
  return c == '.' || c == ',';
}

// 13a's first regex class, [\{-\~\[-\` -\&\(-\+\:-\@\/]: ASCII symbols and
// the space, but not ' , - . (nor letters and digits).
bool is_split_symbol(char c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') ||
         (c >= '(' && c <= '+') || (c >= ':' && c <= '@') || c == '/';
}

// One sentence's tokens, in order: views into the tokenized line, whose
// tokens are joined by single spaces.
std::vector<std::string_view> split_tokens(std::string_view tokenized) {
  std::vector<std::string_view> tokens;
  size_t start = 0;
  while (start < tokenized.size()) {
    size_t end = tokenized.find(' ', start);
    if (end == std::string_view::npos) end = tokenized.size();
    tokens.push_back(tokenized.substr(start, end - start));
    start = end + 1;
  }
  return tokens;
}

// The n-grams of n tokens, sorted. Tokens hold no space and are joined by
// one, so an n-gram is the text from its first token to its last and equal
// n-grams are equal texts.
std::vector<std::string_view> sorted_ngrams(std::string_view tokenized,
                                            const std::vector<std::string_view>& tokens, size_t n) {
  std::vector<std::string_view> grams;
  if (tokens.size() < n) return grams;
  grams.reserve(tokens.size() - n + 1);
  for (size_t i = 0; i + n <= tokens.size(); ++i) {
    const size_t begin = static_cast<size_t>(tokens[i].data() - tokenized.data());
    const size_t end =
        static_cast<size_t>(tokens[i + n - 1].data() - tokenized.data()) + tokens[i + n - 1].size();
    grams.push_back(tokenized.substr(begin, end - begin));
  }
  std::sort(grams.begin(), grams.end());
  return grams;
}

// Sum over the distinct hypothesis n-grams of min(count in the hypothesis,
// count in the reference): both sorted, walked together.
int64_t clipped_matches(const std::vector<std::string_view>& hyp,
                        const std::vector<std::string_view>& ref) {
  int64_t matches = 0;
  size_t i = 0, j = 0;
  while (i < hyp.size() && j < ref.size()) {
    if (hyp[i] < ref[j]) {
      ++i;
    } else if (ref[j] < hyp[i]) {
      ++j;
    } else {
      const std::string_view gram = hyp[i];
      int64_t in_hyp = 0, in_ref = 0;
      for (; i < hyp.size() && hyp[i] == gram; ++i) ++in_hyp;
      for (; j < ref.size() && ref[j] == gram; ++j) ++in_ref;
      matches += std::min(in_hyp, in_ref);
    }
  }
  return matches;
}

}  // namespace

std::array<int64_t, kBleuCountFields> BleuCounts::fields() const {
  std::array<int64_t, kBleuCountFields> f{};
  for (int n = 0; n < kBleuMaxOrder; ++n) {
    f[n] = matches[n];
    f[kBleuMaxOrder + n] = totals[n];
  }
  f[2 * kBleuMaxOrder] = hyp_length;
  f[2 * kBleuMaxOrder + 1] = ref_length;
  return f;
}

BleuCounts BleuCounts::from_fields(const std::array<int64_t, kBleuCountFields>& f) {
  BleuCounts c;
  for (int n = 0; n < kBleuMaxOrder; ++n) {
    c.matches[n] = f[n];
    c.totals[n] = f[kBleuMaxOrder + n];
  }
  c.hyp_length = f[2 * kBleuMaxOrder];
  c.ref_length = f[2 * kBleuMaxOrder + 1];
  return c;
}

std::string tokenize_13a(std::string_view line) {
  // The language-independent part, in sacreBLEU's order.
  std::string s = replace_all(line, "<skipped>", "");
  s = replace_all(s, "-\n", "");
  s = replace_all(s, "\n", " ");
  if (s.find('&') != std::string::npos) {
    s = replace_all(s, "&quot;", "\"");
    s = replace_all(s, "&amp;", "&");
    s = replace_all(s, "&lt;", "<");
    s = replace_all(s, "&gt;", ">");
  }

  // The four regular expressions, each a pass of non-overlapping matches
  // from the left over the line padded with a space on each side (so a
  // period or comma at either end has a neighbour that is no digit).
  // Bytewise: their classes are ASCII, and [^0-9] on the byte next to '.'
  // or ',' is the whole neighbouring character's last or first byte, which
  // is copied through with the rest of it.
  const std::string padded = " " + s + " ";
  std::string a;  // ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> " \1 "
  a.reserve(3 * padded.size());
  for (const char c : padded) {
    if (is_split_symbol(c)) {
      a += ' ';
      a += c;
      a += ' ';
    } else {
      a += c;
    }
  }

  std::string b;  // ([^0-9])([\.,]) -> "\1 \2 ": period and comma unless after a digit
  b.reserve(2 * a.size());
  for (size_t i = 0; i < a.size();) {
    if (i + 1 < a.size() && !is_digit(a[i]) && is_period_or_comma(a[i + 1])) {
      b += a[i];
      b += ' ';
      b += a[i + 1];
      b += ' ';
      i += 2;
    } else {
      b += a[i++];
    }
  }

  std::string c;  // ([\.,])([^0-9]) -> " \1 \2": period and comma unless before a digit
  c.reserve(2 * b.size());
  for (size_t i = 0; i < b.size();) {
    if (i + 1 < b.size() && is_period_or_comma(b[i]) && !is_digit(b[i + 1])) {
      c += ' ';
      c += b[i];
      c += ' ';
      c += b[i + 1];
      i += 2;
    } else {
      c += b[i++];
    }
  }

  std::string d;  // ([0-9])(-) -> "\1 \2 ": a dash after a digit
  d.reserve(2 * c.size());
  for (size_t i = 0; i < c.size();) {
    if (i + 1 < c.size() && is_digit(c[i]) && c[i + 1] == '-') {
      d += c[i];
      d += " - ";
      i += 2;
    } else {
      d += c[i++];
    }
  }

  // ' '.join(line.split()): Python's whitespace, Unicode's included.
  std::string out;
  out.reserve(d.size());
  std::string_view rest(d);
  size_t i = 0;
  bool in_token = false;
  while (i < rest.size()) {
    const size_t space = whitespace_at(rest, i);
    if (space > 0) {
      in_token = false;
      i += space;
      continue;
    }
    if (!in_token && !out.empty()) out += ' ';
    in_token = true;
    out += rest[i++];
  }
  return out;
}

BleuCounts count_sentence(std::string_view hypothesis, std::string_view reference) {
  const std::string hyp = tokenize_13a(rstrip(hypothesis));
  const std::string ref = tokenize_13a(rstrip(reference));
  const std::vector<std::string_view> hyp_tokens = split_tokens(hyp);
  const std::vector<std::string_view> ref_tokens = split_tokens(ref);
  BleuCounts counts;
  counts.hyp_length = static_cast<int64_t>(hyp_tokens.size());
  counts.ref_length = static_cast<int64_t>(ref_tokens.size());
  for (size_t n = 1; n <= kBleuMaxOrder; ++n) {
    const std::vector<std::string_view> hyp_grams = sorted_ngrams(hyp, hyp_tokens, n);
    counts.totals[n - 1] = static_cast<int64_t>(hyp_grams.size());
    if (hyp_grams.empty()) continue;
    counts.matches[n - 1] = clipped_matches(hyp_grams, sorted_ngrams(ref, ref_tokens, n));
  }
  return counts;
}

double bleu_score(const BleuCounts& counts) {
  // sacreBLEU's compute_bleu, operation for operation, so that the double
  // comes out the same.
  double bp = 1.0;
  if (counts.hyp_length < counts.ref_length)
    bp = counts.hyp_length > 0 ? std::exp(1.0 - static_cast<double>(counts.ref_length) /
                                                    static_cast<double>(counts.hyp_length))
                               : 0.0;

  bool any_match = false;
  for (const int64_t m : counts.matches) any_match = any_match || m != 0;
  if (!any_match) return 0.0;

  // Percent; an order after one without any n-gram stays 0.
  double precisions[kBleuMaxOrder] = {};
  double smooth = 1.0;
  for (int n = 0; n < kBleuMaxOrder; ++n) {
    const double total = static_cast<double>(counts.totals[n]);
    if (counts.totals[n] == 0) break;
    if (counts.matches[n] == 0) {
      smooth *= 2.0;
      precisions[n] = 100.0 / (smooth * total);
    } else {
      precisions[n] = 100.0 * static_cast<double>(counts.matches[n]) / total;
    }
  }

  // log 0 is floored at -9999999999, which makes the score exp(-2.5e9) = 0.
  double log_sum = 0.0;
  for (const double p : precisions) log_sum += p == 0.0 ? -9999999999.0 : std::log(p);
  return bp * std::exp(log_sum / kBleuMaxOrder);
}

const char* bleu_signature() {
  return "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0";
}

}  // namespace mpiformer
