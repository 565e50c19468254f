// Corpus BLEU (Papineni et al., 2002) exactly as sacreBLEU 2.6.0 computes it
// with its defaults: tokenizer '13a' (mteval-v13a, as WMT), case-sensitive,
// one reference per sentence, n-grams 1..4, smoothing 'exp' (NIST's, as
// mteval-v13a), no effective order.
// Same inputs, same counts and the same score: bit for bit where Python's
// sum() adds left to right (before 3.12; later ones compensate the sum of
// the four logs, which may move the last bit).
//
// Like the loss, a corpus is carried as integer sums: count_sentence gives one
// sentence's statistics, BleuCounts add exactly (each rank counts its own
// sentences, the sums are reduced in any order), and bleu_score turns the
// corpus sums into the score once, at the end.
//
// Text is UTF-8. 13a's rules only name ASCII characters, so it runs byte by
// byte; what Python calls whitespace (str.split, str.rstrip) includes
// non-ASCII code points such as U+00A0 and U+3000, which separate tokens here
// too.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace mpiformer {

constexpr int kBleuMaxOrder = 4;      // n-grams of 1..4 tokens
constexpr int kBleuCountFields = 10;  // the int64 fields of BleuCounts, for an allreduce

// The sufficient statistics of BLEU over some sentences (sums over them).
struct BleuCounts {
  int64_t matches[kBleuMaxOrder] = {};  // [n-1]: hypothesis n-grams found in the reference,
                                        // each counted at most as often as the reference has it
  int64_t totals[kBleuMaxOrder] = {};   // [n-1]: hypothesis n-grams
  int64_t hyp_length = 0;               // hypothesis tokens
  int64_t ref_length = 0;               // reference tokens

  BleuCounts& operator+=(const BleuCounts& o) {
    for (int n = 0; n < kBleuMaxOrder; ++n) matches[n] += o.matches[n], totals[n] += o.totals[n];
    hyp_length += o.hyp_length, ref_length += o.ref_length;
    return *this;
  }
  bool operator==(const BleuCounts& o) const { return fields() == o.fields(); }
  bool operator!=(const BleuCounts& o) const { return !(*this == o); }

  // [matches (4) | totals (4) | hyp_length | ref_length], and back: the
  // layout summed over ranks.
  std::array<int64_t, kBleuCountFields> fields() const;
  static BleuCounts from_fields(const std::array<int64_t, kBleuCountFields>& f);
};

// One sentence against its reference: both lose their trailing whitespace
// and are 13a-tokenized, as sacreBLEU prepares each segment.
BleuCounts count_sentence(std::string_view hypothesis, std::string_view reference);

// The corpus score, 0..100: BP * exp(mean of log p_n, n = 1..4), with the
// precisions in percent, p_n = 100 * matches / totals, and the brevity
// penalty BP = exp(1 - ref_length / hyp_length) when the hypotheses are
// shorter (else 1). 'exp' smoothing: the k-th order with no match so far has
// p_n = 100 / (2^k * totals). sacreBLEU's edge cases: no match of any order,
// or no hypothesis token, gives 0; so does an order with no n-gram at all
// (every hypothesis shorter than n tokens).
double bleu_score(const BleuCounts& counts);

// sacreBLEU's Tokenizer13a on one line: the tokens joined by single spaces.
std::string tokenize_13a(std::string_view line);

// sacreBLEU's signature of these settings, as it prints it after "BLEU|".
const char* bleu_signature();

}  // namespace mpiformer
