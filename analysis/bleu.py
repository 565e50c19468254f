#!/usr/bin/env python3
"""Corpus BLEU as sacreBLEU computes it by default: 13a tokenisation, n-grams
up to 4, one reference, brevity penalty, 'exp' smoothing of zero n-gram
matches, case-sensitive. Prints sacreBLEU's line:

  BLEU = 23.45 56.7/30.1/18.2/11.0 (BP = 0.950 ratio = 0.951 hyp_len = 1234 ref_len = 1297)

usage: analysis/bleu.py HYPOTHESES REFERENCES   (line-aligned text files)
Standard library only.
"""

import math
import re
import sys
from collections import Counter

MAX_ORDER = 4

# 13a (mteval-v13a.pl): punctuation and symbols become tokens; period and
# comma only when not inside a number; a dash after a digit.
_TOKENIZE = [
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),
]


def tokenize_13a(line):
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = (line.replace("&quot;", '"').replace("&amp;", "&")
                .replace("&lt;", "<").replace("&gt;", ">"))
    line = f" {line} "
    for pattern, replacement in _TOKENIZE:
        line = pattern.sub(replacement, line)
    return line.split()


def ngrams(tokens, n):
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


class Score:
    """Corpus statistics and the BLEU they give (percentages, like sacreBLEU)."""

    def __init__(self, correct, total, hyp_len, ref_len):
        self.correct, self.total = correct, total
        self.hyp_len, self.ref_len = hyp_len, ref_len
        self.precisions = [0.0] * MAX_ORDER
        smooth = 1.0
        for n in range(MAX_ORDER):
            if total[n] == 0:
                break
            if correct[n] == 0:
                smooth *= 2  # 'exp': 1/2, 1/4, ... of a match for each empty order
                self.precisions[n] = 100.0 / (smooth * total[n])
            else:
                self.precisions[n] = 100.0 * correct[n] / total[n]
        if hyp_len < ref_len:
            self.bp = math.exp(1 - ref_len / hyp_len) if hyp_len > 0 else 0.0
        else:
            self.bp = 1.0
        if not any(correct):
            self.score = 0.0
        else:
            logs = [math.log(p) if p > 0 else -9999999999.0 for p in self.precisions]
            self.score = self.bp * math.exp(sum(logs) / MAX_ORDER)

    def __str__(self):
        ratio = self.hyp_len / self.ref_len if self.ref_len else 0.0
        precisions = "/".join(f"{p:.1f}" for p in self.precisions)
        return (f"BLEU = {self.score:.2f} {precisions} (BP = {self.bp:.3f} ratio = {ratio:.3f} "
                f"hyp_len = {self.hyp_len} ref_len = {self.ref_len})")


def corpus_bleu(hypotheses, references):
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    correct, total = [0] * MAX_ORDER, [0] * MAX_ORDER
    hyp_len = ref_len = 0
    for hyp, ref in zip(hypotheses, references):
        h, r = tokenize_13a(hyp), tokenize_13a(ref)
        hyp_len += len(h)
        ref_len += len(r)
        for n in range(1, MAX_ORDER + 1):
            hyp_counts, ref_counts = ngrams(h, n), ngrams(r, n)
            correct[n - 1] += sum(min(c, ref_counts[g]) for g, c in hyp_counts.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    return Score(correct, total, hyp_len, ref_len)


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def main(argv):
    if len(argv) != 2:
        print("usage: analysis/bleu.py HYPOTHESES REFERENCES", file=sys.stderr)
        return 2
    try:
        print(corpus_bleu(read_lines(argv[0]), read_lines(argv[1])))
    except (OSError, ValueError) as e:
        print(f"bleu.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
