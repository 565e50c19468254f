"""analysis/bleu.py against values computed by hand from sacreBLEU's
definition (13a tokens, 4-grams, brevity penalty, 'exp' smoothing)."""

import math
import os
import subprocess
import sys
import tempfile
import unittest

ANALYSIS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis")
sys.path.insert(0, ANALYSIS)
import bleu  # noqa: E402


class Tokenize13a(unittest.TestCase):
    def test_punctuation_numbers_and_entities(self):
        self.assertEqual(bleu.tokenize_13a("Hello, world! It costs $3.50 (or 3,000-4,000)."),
                         ["Hello", ",", "world", "!", "It", "costs", "$", "3.50", "(", "or",
                          "3,000", "-", "4,000", ")", "."])
        self.assertEqual(bleu.tokenize_13a("a &amp; b &lt;c&gt; &quot;d&quot;"),
                         ["a", "&", "b", "<", "c", ">", '"', "d", '"'])
        # 13a leaves the apostrophe (0x27) alone: it falls between the
        # ranges of symbols it splits off.
        self.assertEqual(bleu.tokenize_13a("Datei '%s' nicht gefunden: %d"),
                         ["Datei", "'", "%", "s'", "nicht", "gefunden", ":", "%", "d"])


class CorpusBleu(unittest.TestCase):
    def test_identical_corpus_scores_100(self):
        lines = ["the cat sat on the mat .", "Datei nicht gefunden", "a b c d e"]
        self.assertAlmostEqual(bleu.corpus_bleu(lines, lines).score, 100.0, places=9)

    def test_hand_computed_sentence(self):
        # hyp: the cat sat on the mat / ref: the cat is on the mat
        # 1-grams 5/6, 2-grams 3/5, 3-grams 1/4, 4-grams 0/3 -> exp smoothing
        # gives 1/(2*3); BP 1. BLEU = 100 * (5/6 * 3/5 * 1/4 * 1/6)^(1/4)
        #                          = 100 * 48^(-1/4) = 37.9918...
        s = bleu.corpus_bleu(["the cat sat on the mat"], ["the cat is on the mat"])
        self.assertAlmostEqual(s.score, 100 * 48 ** -0.25, places=9)
        self.assertEqual(str(s), "BLEU = 37.99 83.3/60.0/25.0/16.7 "
                                 "(BP = 1.000 ratio = 1.000 hyp_len = 6 ref_len = 6)")

    def test_brevity_penalty_and_corpus_sums(self):
        # Two lines: counts add up over the corpus before any division.
        # hyp tokens 4 + 4, ref 6 + 4: BP = exp(1 - 10/8).
        hyps = ["a b c d", "w x y z"]
        refs = ["a b c d e f", "w x y z"]
        s = bleu.corpus_bleu(hyps, refs)
        self.assertAlmostEqual(s.bp, math.exp(1 - 10 / 8), places=12)
        self.assertAlmostEqual(s.score, 100 * math.exp(1 - 10 / 8), places=9)

    def test_no_match_scores_zero_and_too_short_orders_count_as_zero(self):
        self.assertEqual(bleu.corpus_bleu(["x y z"], ["a b c"]).score, 0.0)
        # No 4-gram in a 3-token hypothesis: precision 0, BLEU 0 (sacreBLEU's
        # corpus score has no effective order).
        self.assertEqual(bleu.corpus_bleu(["a b c"], ["a b c"]).score, 0.0)

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as d:
            hyp, ref = os.path.join(d, "hyp"), os.path.join(d, "ref")
            with open(hyp, "w") as f:
                f.write("the cat sat on the mat\n")
            with open(ref, "w") as f:
                f.write("the cat is on the mat\n")
            out = subprocess.run([sys.executable, os.path.join(ANALYSIS, "bleu.py"), hyp, ref],
                                 capture_output=True, text=True, check=True).stdout
            self.assertTrue(out.startswith("BLEU = 37.99 "), out)
            with open(ref, "a") as f:
                f.write("one more line\n")
            bad = subprocess.run([sys.executable, os.path.join(ANALYSIS, "bleu.py"), hyp, ref],
                                 capture_output=True, text=True)
            self.assertEqual(bad.returncode, 2)
            self.assertIn("1 hypotheses but 2 references", bad.stderr)


if __name__ == "__main__":
    unittest.main()
