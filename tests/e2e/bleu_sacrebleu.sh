#!/usr/bin/env bash
# The library's BLEU (src/scoring/bleu.h, through tests/bleu_tool) against
# sacreBLEU itself on real text: the gettext English and German messages
# (data/extract-gettext-de.sh) as references, and hypotheses made from them
# with the faults of a translation and the cases 13a treats specially:
# dropped, repeated, swapped and shuffled words, punctuation, numbers (3.14,
# 1,000, 2-3), hyphens, quotes, HTML entities and <skipped>, non-ASCII
# letters, U+00A0 and other Unicode spaces, CRLF ends, empty lines, lines much
# shorter or longer than their reference. For every file pair: the corpus
# BLEU within 1e-9 of sacreBLEU's (both printed), the same counts and
# signature, the 13a tokenization of every line identical, and the score
# sacreBLEU's command line prints from the files. Skipped (exit 77) where
# sacrebleu is not installed.
#
# usage: bleu_sacrebleu.sh /path/to/mpiformer WORKDIR
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bin=${1:?usage: bleu_sacrebleu.sh /path/to/mpiformer WORKDIR}
work=${2:?usage: bleu_sacrebleu.sh /path/to/mpiformer WORKDIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tool=$(dirname "$bin")/tests/bleu_tool
[[ -x $tool ]] || {
  echo "FAIL: $tool is missing (it is built with the tests)" >&2
  exit 1
}
if ! python3 -c 'import sacrebleu' 2>/dev/null; then
  echo "SKIP: sacrebleu is not installed (python3 -m pip install sacrebleu)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0 out=$work/out.txt err=$work/err.txt
: >"$out"

"$repo/data/extract-gettext-de.sh" gettext.en gettext.de >/dev/null

# ---- hypothesis and reference files (NAME.hyp, NAME.ref), fixed seed ----
python3 - gettext.en gettext.de <<'PY'
import random
import sys

from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a


def read(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


def write(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))


en, de = read(sys.argv[1]), read(sys.argv[2])
if len(de) < 9600:
    sys.exit(f"only {len(de)} gettext pairs, 9600 needed: install gcc-12-locales (scripts/setup does)")
rng = random.Random(13)
EXTRAS = ["3.14", "1,000", "10.", ".5", "2-3", "1-", "v1.2.3", "0,5%", "&amp;", "&quot;Hallo&quot;",
          "&lt;b&gt;", "&amp;lt;", "&amp;quot;", "<skipped>", "Straße", "über", "Ünïcödé", "café.",
          "€5", "5,€", "東京。", "(x)", '"', "„Zitat“", "it's", "e-mail", "%s:", "--", "...",
          "a/b", "x_y", "C++", "#1", "@home", "{}", "[a]", "~", "`q`", "né,", "é.5", "ü-5"]
SPACES = ["\u00a0", "\u2003", "\u3000", "\u202f", "\u200b", "\t", "  ", "\u0085", "\u2028", "\x1c"]


def specials(line):
    """The line with special cases put between its words."""
    words = line.split(" ")
    for _ in range(rng.randint(1, 3)):
        words.insert(rng.randint(0, len(words)), rng.choice(EXTRAS))
    out = words[0]
    for w in words[1:]:
        out += (rng.choice(SPACES) if rng.random() < 0.15 else " ") + w
    return out


def perturb(line, other):
    words = line.split(" ")
    r = rng.random()
    if r < 0.02:
        return ""
    if r < 0.04:
        return " ".join(words[: rng.randint(1, 2)])  # much shorter
    if r < 0.06:
        return line + " " + other  # much longer
    if r < 0.08:
        rng.shuffle(words)
        return " ".join(words)
    for _ in range(rng.randint(0, 3)):
        i = rng.randrange(len(words))
        op = rng.randrange(8)
        if op == 0 and len(words) > 1:
            del words[i]
        elif op == 1:
            words.insert(i, words[i])
        elif op == 2 and i + 1 < len(words):
            words[i], words[i + 1] = words[i + 1], words[i]
        elif op == 3:
            words[i] = rng.choice(other.split(" "))
        elif op == 4 and i + 1 < len(words):
            words[i : i + 2] = [words[i] + "-" + words[i + 1]]
        elif op == 5:
            words[i] = rng.choice(["(", '"', "", "'"]) + words[i] + rng.choice([",", ".", "!", ")", ":", ""])
        elif op == 6:
            words[i] = words[i].upper() if rng.random() < 0.5 else words[i].lower()
        else:
            words.insert(i, rng.choice(EXTRAS))
    hyp = " ".join(words)
    if rng.random() < 0.1:
        hyp = hyp.replace(" ", rng.choice(SPACES), 1)
    if rng.random() < 0.05:
        hyp = rng.choice([" ", "\u00a0", "\t"]) + hyp + rng.choice(["  ", "\u00a0", "\r", " \u3000"])
    return hyp


def pairs(refs, others):
    return [perturb(ref, other) for ref, other in zip(refs, others)], refs


sets = {}
sets["de"] = pairs(de[:1500], de[1500:3000])
sets["en"] = pairs(en[3000:3800], en[3800:4600])
special_refs = [specials(line) if rng.random() < 0.7 else line for line in de[5000:5400]]
special_refs[::37] = [""] * len(special_refs[::37])  # empty references
sets["special"] = pairs(special_refs, de[6000:6400])
sets["cross"] = (en[7000:7300], de[7000:7300])  # other language: few matches
# The words backwards: bigrams match only by chance, so the higher orders
# have few matches or none (exp smoothing).
sets["reversed"] = ([" ".join(reversed(line.split(" "))) for line in de[8000:8200]], de[8000:8200])


def interleaved(line, k):
    """The line's 13a tokens with "~" after every k of them: no (k+1)-gram
    matches (but where the line has a "~")."""
    words = Tokenizer13a()(line).split(" ")
    return " ~ ".join(" ".join(words[i : i + k]) for i in range(0, len(words), k))


# Unigram matches only, then few or no trigram matches in the corpus:
# sacreBLEU's exp smoothing of the orders without a match.
sets["unigrams"] = ([interleaved(line, 1) for line in de[9000:9100]], de[9000:9100])
sets["bigrams"] = ([interleaved(line, 1 + i % 2) for i, line in enumerate(de[9100:9300])],
                   de[9100:9300])
# The first half of each line: a brevity penalty.
sets["short"] = ([" ".join(line.split(" ")[: (len(line.split(" ")) + 1) // 2]) for line in de[9300:9600]],
                 de[9300:9600])
for name, (hyps, refs) in sets.items():
    write(f"{name}.hyp", hyps)
    write(f"{name}.ref", refs)
write("same.hyp", de[:500])
write("same.ref", de[:500])
PY

# ---- sacreBLEU's view of a file pair, in bleu_tool's formats ----
# sacre.py tokens HYP REF: every line's 13a tokens (as bleu_tool --tokens).
# sacre.py compare HYP REF TOOL_OUTPUT: prints both scores; exit 1 when they
# differ by more than 1e-9 or a count or the signature differs.
cat >sacre.py <<'PY'
import sys

from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a


def read(path):  # split at "\n" only, as sacreBLEU's command line reads files
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


mode, hyps, refs = sys.argv[1], read(sys.argv[2]), read(sys.argv[3])
if mode == "tokens":
    tok = Tokenizer13a()
    sys.stdout.buffer.write("".join(tok(line) + "\n" for line in hyps + refs).encode("utf-8"))
    sys.exit(0)
bleu = BLEU()
score = bleu.corpus_score(hyps, [refs])
want = {
    "matches": " ".join(map(str, score.counts)),
    "totals": " ".join(map(str, score.totals)),
    "hyp_length": str(score.sys_len),
    "ref_length": str(score.ref_len),
    "signature": str(bleu.get_signature()),
}
got = dict(line.split(" ", 1) for line in open(sys.argv[4], encoding="utf-8").read().splitlines())
diff = abs(float(got["bleu"]) - score.score)
print(f"sacreBLEU {score.score!r}, C++ {got['bleu']}, |difference| {diff:.3g} "
      f"({len(hyps)} lines, {score.sys_len} hypothesis tokens)")
ok = diff <= 1e-9
for key, value in want.items():
    if got.get(key) != value:
        print(f"{key}: sacreBLEU '{value}', C++ '{got.get(key)}'")
        ok = False
sys.exit(0 if ok else 1)
PY

lines=0
for name in de en special cross reversed unigrams bigrams short same; do
  lines=$((lines + $(wc -l <"$name.hyp")))
  if ! "$tool" --full "$name.hyp" "$name.ref" >"$name.full" 2>"$err"; then
    fail "bleu_tool --full $name.hyp $name.ref"
    continue
  fi
  check "$name: the corpus BLEU, counts and signature of sacreBLEU" \
    python3 sacre.py compare "$name.hyp" "$name.ref" "$name.full"
  python3 sacre.py tokens "$name.hyp" "$name.ref" >"$name.sacre-tokens"
  "$tool" --tokens "$name.hyp" "$name.ref" | sed '$d' >"$name.tokens"
  same "$name.tokens" "$name.sacre-tokens" "$name: the 13a tokens of every line"
  # sacreBLEU's command line on the files: its signature, and the score it
  # prints (6 decimals) as bleu_tool prints it.
  cli=$(python3 -m sacrebleu "$name.ref" -i "$name.hyp" -m bleu -f text -w 6 2>/dev/null)
  cli_score=$(echo "$cli" | sed -n 's/^BLEU|[^ ]* = \([0-9.]*\) .*/\1/p')
  printed=$("$tool" "$name.hyp" "$name.ref")
  check "$name: sacrebleu's command line prints $cli_score, bleu_tool $printed" \
    test -n "$cli_score" -a "$cli_score" = "$printed"
  check "$name: the signature: ${cli%% = *}" \
    test "${cli%% = *}" = "BLEU|$(sed -n 's/^signature //p' "$name.full")"
done
check "identical files score 100 ($(sed -n 's/^bleu //p' same.full))" \
  awk -v s="$(sed -n 's/^bleu //p' same.full)" 'BEGIN { exit !(s != "" && s - 100 < 1e-9 && 100 - s < 1e-9) }'
check "at least 2000 lines compared ($lines)" test "$lines" -ge 2000

# ---- speed, reported (not asserted): the whole corpus, a line against the next
tail -n +2 gettext.de >next.de
head -n -1 gettext.de >this.de
start=$(date +%s.%N)
"$tool" this.de next.de >/dev/null
seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
echo "note: $(wc -l <this.de) sentences scored in $seconds s"

exit_on_failures
echo "bleu_sacrebleu: all checks passed"
