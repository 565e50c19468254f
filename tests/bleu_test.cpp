// Corpus BLEU and the 13a tokenizer (src/scoring/bleu.h). Expected tokens follow
// from 13a's rules, stated beside each case; expected scores are written as
// the formula on hand-counted n-grams, never taken from the code under test.
// tests/e2e/bleu_sacrebleu.sh compares with sacreBLEU itself on real text.
#include "src/scoring/bleu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace mpiformer {
namespace {

// ---- 13a tokenization ----

TEST(Tokenize13a, SplitsSymbolsButNotApostropheOrHyphen) {
  // ASCII symbols and punctuation become tokens of their own...
  EXPECT_EQ(tokenize_13a("Hello, world!"), "Hello , world !");
  EXPECT_EQ(tokenize_13a("(a) [b] {c}"), "( a ) [ b ] { c }");
  EXPECT_EQ(tokenize_13a("a/b+c=d;e:f?g@h"), "a / b + c = d ; e : f ? g @ h");
  EXPECT_EQ(tokenize_13a("$5 50% #1 x_y a|b ~`^\\"), "$ 5 50 % # 1 x _ y a | b ~ ` ^ \\");
  EXPECT_EQ(tokenize_13a("\"quoted\" <tag>"), "\" quoted \" < tag >");
  // ...but the apostrophe and a hyphen between letters stay inside the word.
  EXPECT_EQ(tokenize_13a("don't well-known"), "don't well-known");
}

TEST(Tokenize13a, PeriodAndCommaStayBetweenDigitsOnly) {
  EXPECT_EQ(tokenize_13a("pi is 3.14 and 1,000 is more"), "pi is 3.14 and 1,000 is more");
  EXPECT_EQ(tokenize_13a("The end."), "The end .");
  EXPECT_EQ(tokenize_13a("a.b,c"), "a . b , c");  // no digit on either side
  EXPECT_EQ(tokenize_13a("v1.2.3"), "v1.2.3");    // a digit on both sides of each
  // A digit on one side only: split (the line's ends count as non-digits).
  EXPECT_EQ(tokenize_13a("5."), "5 .");
  EXPECT_EQ(tokenize_13a(".5"), ". 5");
  EXPECT_EQ(tokenize_13a("a,5"), "a , 5");
  EXPECT_EQ(tokenize_13a("5,a"), "5 , a");
  EXPECT_EQ(tokenize_13a("Wait..."), "Wait . . .");
}

TEST(Tokenize13a, NonAsciiNeighboursOfPeriodAndCommaAreNotDigits) {
  // "é" and "€" are two and three bytes: the whole character is the
  // non-digit before or after the period or comma, and stays whole.
  EXPECT_EQ(tokenize_13a("café."), "café .");
  EXPECT_EQ(tokenize_13a("é,5"), "é , 5");
  EXPECT_EQ(tokenize_13a("5,€"), "5 , €");
  EXPECT_EQ(tokenize_13a(".über"), ". über");
}

TEST(Tokenize13a, DashAfterDigitIsSplit) {
  EXPECT_EQ(tokenize_13a("1-2"), "1 - 2");
  EXPECT_EQ(tokenize_13a("pages 10-20"), "pages 10 - 20");
  EXPECT_EQ(tokenize_13a("-5 a-5"), "-5 a-5");  // a dash before a digit stays
}

TEST(Tokenize13a, UnescapesEntitiesInOrderAndDropsSkipped) {
  EXPECT_EQ(tokenize_13a("&quot;a&quot; &amp; &lt;b&gt;"), "\" a \" & < b >");
  // &quot; is replaced before &amp;, &lt; after it: "&amp;quot;" becomes the
  // text "&quot;" (split at & and ;), "&amp;lt;" becomes "<".
  EXPECT_EQ(tokenize_13a("&amp;quot;"), "& quot ;");
  EXPECT_EQ(tokenize_13a("&amp;lt;"), "<");
  EXPECT_EQ(tokenize_13a("a <skipped> b"), "a b");
  EXPECT_EQ(tokenize_13a("<skip<skipped>ped>"), "< skipped >");  // one pass, as str.replace
}

TEST(Tokenize13a, JoinsHyphenatedLineBreaks) {
  EXPECT_EQ(tokenize_13a("co-\noperate"), "cooperate");
  EXPECT_EQ(tokenize_13a("two\nlines"), "two lines");
}

TEST(Tokenize13a, SplitsOnPythonWhitespace) {
  // Python's str.split: ASCII whitespace, the separators \x1c..\x1f, and
  // Unicode spaces such as U+00A0 (no-break), U+2003 (em) and U+3000
  // (ideographic); not U+200B (zero width), which is no whitespace.
  EXPECT_EQ(tokenize_13a("  a\tb\r\nc\x0b\x0c d\x1c"
                         "e  "),
            "a b c d e");
  EXPECT_EQ(tokenize_13a("a\u00a0b\u2003c\u3000d\u0085e\u2028f"), "a b c d e f");
  EXPECT_EQ(tokenize_13a("a\u200bb"), "a\u200bb");
  EXPECT_EQ(tokenize_13a(""), "");
  EXPECT_EQ(tokenize_13a(" \u00a0 "), "");
}

// ---- counts ----

TEST(BleuCounts, ClipsMatchesToTheReferenceCounts) {
  // hyp "the cat the cat", ref "the cat":
  //   1-grams: the x2, cat x2 (4)        ref the, cat   -> 1 + 1 = 2 match
  //   2-grams: "the cat" x2, "cat the"   ref "the cat"  -> 1 match of 3
  //   3-grams: 2, 4-grams: 1, none in the reference.
  const BleuCounts c = count_sentence("the cat the cat", "the cat");
  EXPECT_EQ(c.hyp_length, 4);
  EXPECT_EQ(c.ref_length, 2);
  const int64_t matches[4] = {2, 1, 0, 0}, totals[4] = {4, 3, 2, 1};
  for (int n = 0; n < 4; ++n) {
    EXPECT_EQ(c.matches[n], matches[n]) << "order " << n + 1;
    EXPECT_EQ(c.totals[n], totals[n]) << "order " << n + 1;
  }
}

TEST(BleuCounts, CaseSensitiveAndTokenized) {
  // "The" is not "the"; "mat." is the two tokens "mat" and ".".
  const BleuCounts c = count_sentence("The mat.", "the mat .");
  EXPECT_EQ(c.hyp_length, 3);
  EXPECT_EQ(c.ref_length, 3);
  EXPECT_EQ(c.matches[0], 2);  // mat, .
  EXPECT_EQ(c.matches[1], 1);  // "mat ."
  EXPECT_EQ(c.matches[2], 0);
}

TEST(BleuCounts, TrailingWhitespaceGoesBeforeTokenizing) {
  // sacreBLEU strips each segment first, so a final "-\n" is no line-break
  // hyphen: "foo-" keeps its dash (tokenize_13a alone would join it away).
  EXPECT_EQ(tokenize_13a("foo-\n"), "foo");
  const BleuCounts c = count_sentence("foo-\n", "foo-");
  EXPECT_EQ(c.hyp_length, 1);
  EXPECT_EQ(c.matches[0], 1);
  // U+00A0 separates tokens like a space.
  EXPECT_EQ(count_sentence("a\u00a0b c\u3000", "a b c"), count_sentence("a b c", "a b c"));
}

TEST(BleuCounts, FieldsRoundTrip) {
  const BleuCounts c = count_sentence("a b c d e f", "a b x d e");
  const std::array<int64_t, kBleuCountFields> f = c.fields();
  EXPECT_EQ(f[0], c.matches[0]);
  EXPECT_EQ(f[4], c.totals[0]);
  EXPECT_EQ(f[8], c.hyp_length);
  EXPECT_EQ(f[9], c.ref_length);
  EXPECT_EQ(BleuCounts::from_fields(f), c);
}

// ---- scores ----

TEST(BleuScore, IdenticalHypothesisIs100) {
  BleuCounts corpus;
  corpus += count_sentence("The cat sat on the mat.", "The cat sat on the mat.");
  corpus += count_sentence("Hello, world: 3.14 &amp; more", "Hello, world: 3.14 &amp; more");
  EXPECT_NEAR(bleu_score(corpus), 100.0, 1e-12);
}

TEST(BleuScore, ExpSmoothingHalvesEachMissingOrder) {
  // From ClipsMatchesToTheReferenceCounts: p1 = 100 * 2/4, p2 = 100 * 1/3;
  // orders 3 and 4 have no match: p3 = 100 / (2 * 2), p4 = 100 / (4 * 1).
  // hyp 4 >= ref 2 tokens: no brevity penalty.
  const double expected = std::pow(50.0 * (100.0 / 3.0) * 25.0 * 25.0, 0.25);
  EXPECT_NEAR(bleu_score(count_sentence("the cat the cat", "the cat")), expected, 1e-9);
}

TEST(BleuScore, BrevityPenalty) {
  // Every n-gram of the 4-token hypothesis is in the 8-token reference
  // (p_n = 100), and BP = exp(1 - 8/4).
  EXPECT_NEAR(bleu_score(count_sentence("a b c d", "a b c d e f g h")), 100.0 * std::exp(-1.0),
              1e-9);
  // A longer hypothesis has no penalty: p_n = 100 * (5-n)/(9-n) for n = 1..4.
  const double longer = std::pow(100.0 * 4 / 8 * 100.0 * 3 / 7 * 100.0 * 2 / 6 * 100.0 / 5, 0.25);
  EXPECT_NEAR(bleu_score(count_sentence("a b c d e f g h", "a b c d")), longer, 1e-9);
}

TEST(BleuScore, EmptyHypothesisIsZeroNotNaN) {
  EXPECT_EQ(bleu_score(count_sentence("", "a b c")), 0.0);
  EXPECT_EQ(bleu_score(count_sentence("", "")), 0.0);
  EXPECT_EQ(bleu_score(BleuCounts{}), 0.0);
  BleuCounts corpus;
  corpus += count_sentence("", "a b c d e");
  corpus += count_sentence("   ", "f g");
  EXPECT_EQ(bleu_score(corpus), 0.0);
}

TEST(BleuScore, NoMatchIsZero) {
  EXPECT_EQ(bleu_score(count_sentence("x y z w v", "a b c d e")), 0.0);
}

TEST(BleuScore, AnOrderWithoutNgramsIsZero) {
  // Three tokens have no 4-gram: sacreBLEU scores even a perfect match 0.
  EXPECT_EQ(bleu_score(count_sentence("a b c", "a b c")), 0.0);
  // In a corpus, one longer sentence gives the 4-grams.
  BleuCounts corpus = count_sentence("a b c", "a b c");
  corpus += count_sentence("d e f g", "d e f g");
  EXPECT_NEAR(bleu_score(corpus), 100.0, 1e-12);
}

TEST(BleuScore, RankSplitAndOrderDoNotChangeTheScore) {
  // Sentences of a small vocabulary, the hypotheses perturbed references.
  std::mt19937 rng(7);
  const char* words[] = {"the", "cat", "dog", "sat", "on", "mat", ",", ".", "3.14", "a-b"};
  std::vector<std::pair<std::string, std::string>> pairs;
  for (int s = 0; s < 60; ++s) {
    std::string hyp, ref;
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < len; ++k) {
      const std::string w = words[rng() % 10];
      ref += w + " ";
      if (rng() % 4 != 0) hyp += w + " ";
      if (rng() % 5 == 0) hyp += std::string(words[rng() % 10]) + " ";
    }
    pairs.emplace_back(hyp, ref);
  }
  std::vector<BleuCounts> sentences;
  BleuCounts in_order;
  for (const auto& [hyp, ref] : pairs) {
    sentences.push_back(count_sentence(hyp, ref));
    in_order += sentences.back();
  }
  const double score = bleu_score(in_order);
  EXPECT_GT(score, 1.0);
  EXPECT_LT(score, 99.0);

  // Three "ranks" holding every third sentence, their sums added in reverse.
  BleuCounts ranks[3];
  for (size_t i = 0; i < sentences.size(); ++i) ranks[i % 3] += sentences[i];
  BleuCounts reduced;
  for (int r = 2; r >= 0; --r) reduced += ranks[r];
  EXPECT_EQ(reduced, in_order);
  EXPECT_EQ(bleu_score(reduced), score);

  std::shuffle(sentences.begin(), sentences.end(), rng);
  BleuCounts shuffled;
  for (const BleuCounts& c : sentences) shuffled += c;
  EXPECT_EQ(shuffled, in_order);
  EXPECT_EQ(bleu_score(shuffled), score);
}

TEST(BleuScore, CorpusIsNotTheMeanOfSentences) {
  // Counts are pooled before the score: a perfect 4-token sentence and an
  // unmatched one score (p_n = 100 * (5-n) / (2 * (5-n)) = 50) 50, not the
  // mean of 100 and 0.
  BleuCounts corpus = count_sentence("a b c d", "a b c d");
  corpus += count_sentence("w x y z", "e f g h");
  EXPECT_NEAR(bleu_score(corpus), 50.0, 1e-9);
}

TEST(BleuSignature, SacreBleuDefaults) {
  EXPECT_STREQ(bleu_signature(), "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0");
}

}  // namespace
}  // namespace mpiformer
