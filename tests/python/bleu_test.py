"""The BLEU that scripts/demo prints: sacreBLEU's command line, with the
demo's flags, on line-aligned files. Checks that the installed sacreBLEU
takes those flags, prints the score with its signature, and scores as its
definition says (13a tokens, 4-grams, brevity penalty, 'exp' smoothing of
orders without a match), on values computed by hand. Skipped where sacrebleu
is not installed (scripts/setup installs it)."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# As scripts/demo runs it: one line, the signature and then the score.
FLAGS = ["-m", "bleu", "-f", "text", "-w", "2"]


def sacrebleu(hypotheses, references):
    """(exit code, stdout, stderr) of sacreBLEU on two lists of lines."""
    with tempfile.TemporaryDirectory() as d:
        hyp, ref = os.path.join(d, "hyp"), os.path.join(d, "ref")
        for path, lines in ((hyp, hypotheses), (ref, references)):
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in lines)
        run = subprocess.run([sys.executable, "-m", "sacrebleu", ref, "-i", hyp] + FLAGS,
                             capture_output=True, text=True)
        return run.returncode, run.stdout.strip(), run.stderr


@unittest.skipUnless(importlib.util.find_spec("sacrebleu"), "sacrebleu is not installed")
class SacreBleu(unittest.TestCase):
    def test_the_demo_uses_these_flags(self):
        with open(os.path.join(REPO, "scripts", "demo"), encoding="utf-8") as f:
            demo = f.read()
        self.assertIn("python3 -m sacrebleu", demo)
        self.assertIn(" ".join(FLAGS), demo)

    def test_signature_then_score(self):
        code, out, _ = sacrebleu(["the cat sat on the mat"], ["the cat is on the mat"])
        self.assertEqual(code, 0)
        signature, score = out.split(" = ", 1)
        fields = dict(f.split(":", 1) for f in signature.split("|")[1:])
        self.assertTrue(signature.startswith("BLEU|"), out)
        self.assertEqual(fields["nrefs"], "1")
        self.assertEqual(fields["case"], "mixed")
        self.assertEqual(fields["tok"], "13a")
        self.assertEqual(fields["smooth"], "exp")
        self.assertRegex(fields["version"], r"^\d+\.\d+")
        # 1-grams 5/6, 2-grams 3/5, 3-grams 1/4, 4-grams 0/3, which 'exp'
        # smoothing makes 1/(2*3); BP 1. BLEU = 100 * (5/6 * 3/5 * 1/4 * 1/6)^(1/4)
        # = 100 * 48^(-1/4) = 37.99.
        self.assertAlmostEqual(100 * 48 ** -0.25, 37.99, places=2)
        self.assertTrue(score.startswith("37.99 83.3/60.0/25.0/16.7 (BP = 1.000 ratio = 1.000 "
                                         "hyp_len = 6 ref_len = 6)"), out)

    def test_identical_corpus_scores_100(self):
        lines = ["Datei nicht gefunden: %s", "the cat sat on the mat .", "a b c d e"]
        code, out, _ = sacrebleu(lines, lines)
        self.assertEqual(code, 0)
        self.assertRegex(out, r" = 100\.00 100\.0/100\.0/100\.0/100\.0 ")

    def test_corpus_counts_and_brevity_penalty(self):
        # Counts add up over the corpus before any division: hypotheses of
        # 4 + 4 tokens, references of 6 + 4, every n-gram matched:
        # BLEU = 100 * exp(1 - 10/8) = 77.88.
        code, out, _ = sacrebleu(["a b c d", "w x y z"], ["a b c d e f", "w x y z"])
        self.assertEqual(code, 0)
        self.assertRegex(out, r" = 77\.88 .*BP = 0\.779 ratio = 0\.800 hyp_len = 8 ref_len = 10")

    def test_files_of_different_lengths_are_refused(self):
        code, out, err = sacrebleu(["one line"], ["one line", "and another"])
        self.assertNotEqual(code, 0)
        self.assertIn("different lengths", out + err)


if __name__ == "__main__":
    unittest.main()
