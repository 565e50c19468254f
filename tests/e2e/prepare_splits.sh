#!/usr/bin/env bash
# `mpiformer prepare` with held-out splits, under mpirun -np 2: --valid and
# --test files, or --valid-lines and --test-lines cut from the end of the
# input (the test lines last). Checks the size and order of every split, that
# seq2seq pairs stay aligned, that the tokenizer never saw a held-out line,
# that a capped split warns only when its flag was given, the shards' split
# and origin attributes, and the refusals (one line, exit 2).
#
# usage: prepare_splits.sh /path/to/mpiformer WORKDIR
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bin=${1:?usage: prepare_splits.sh /path/to/mpiformer WORKDIR}
work=${2:?usage: prepare_splits.sh /path/to/mpiformer WORKDIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
decoder=$(dirname "$bin")/tests/decode_shards
mpiexec=${MPIEXEC:-$(command -v mpirun)}
[[ -x $decoder ]] || {
  echo "FAIL: $decoder is missing (it is built with the tests)" >&2
  exit 1
}
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0 out=$work/out.txt err=$work/err.txt

# prepare ARGS...: prepare under mpirun -np 2 (a hang fails after 60 s);
# exit code in $rc, output in $out and $err.
prepare() {
  rc=0
  timeout 60 "$mpiexec" -q -n 2 "$bin" prepare "$@" >"$out" 2>"$err" || rc=$?
  [[ $rc -ne 124 ]] || fail "prepare $*: hung (killed after 60 s)"
}
# prepared WHAT SUMMARY: the last prepare succeeded, said SUMMARY, and
# printed nothing on stderr.
prepared() {
  if [[ $rc -ne 0 ]]; then
    fail "$1: exit code $rc"
  elif ! grep -qF -- "$2" "$out"; then
    fail "$1: the summary does not say '$2'"
  elif [[ -s $err ]]; then
    fail "$1: unexpected stderr"
  else
    echo "PASS: $1: $2"
  fi
}
nonblank() { grep -v '^[[:space:]]*$' "$@"; }

# ---- the texts ----
"$repo/data/extract-kjv.sh" kjv-all.txt >/dev/null
"$repo/data/extract-gettext-de.sh" gettext.en gettext.de >/dev/null
# lm: 1,000 verses and held-out files; the last verse and the first held-out
# one hold letters no other line has.
head -n 1000 kjv-all.txt | sed '$s/$/ жжж/' >lm.txt
sed -n '1001,1100p' kjv-all.txt | sed '1s/$/ ффф/' >lm-valid.txt
sed -n '1101,1140p' kjv-all.txt >lm-test.txt
# seq2seq: 2,000 pairs to train on, 100 to validate, 100 to test (one with a
# blank side, skipped, and one with a letter no training line has).
head -n 2000 gettext.en >src.txt
head -n 2000 gettext.de >tgt.txt
sed -n '2001,2100p' gettext.en >valid.en
sed -n '2001,2100p' gettext.de >valid.de
sed -n '2101,2200p' gettext.en | sed '7s/.*//; 9s/$/ жжж/' >test.en
sed -n '2101,2200p' gettext.de >test.de
head -n 6 lm.txt >six.txt

# ---- lm: --valid-lines and --test-lines cut the end of the input ----
prepare --input lm.txt --out lm-carved --shards 3 --vocab-size 1000 --valid-lines 60 \
  --test-lines 40
prepared "lm --valid-lines 60 --test-lines 40" \
  "900 training sequences in 3 shard(s), 60 validation, 40 test"
holds_only lm-carved tokenizer.model train-00000.h5 train-00001.h5 train-00002.h5 \
  valid-00000.h5 test-00000.h5
head -n 900 lm.txt >lm.train
sed -n '901,960p' lm.txt >lm.valid
tail -n 40 lm.txt >lm.test
for split in train valid test; do
  "$decoder" lm-carved --split $split >"lm-carved.$split.decoded"
  "$decoder" lm-carved --normalize "lm.$split" >"lm-carved.$split.expected"
  same "lm-carved.$split.decoded" "lm-carved.$split.expected" "lm: the $split split in order"
done
# The tokenizer learnt from the training lines alone: a letter only the last
# test line has is unknown to it.
if tail -n 1 lm-carved.test.decoded | grep -qF '⁇' && ! grep -qF 'жжж' lm-carved.test.decoded; then
  echo "PASS: the tokenizer never saw the test lines"
else
  fail "the tokenizer knows a letter only the test lines have: $(tail -n 1 lm-carved.test.decoded)"
fi

# ---- lm: --valid and --test files; the input all trains ----
prepare --input lm.txt --valid lm-valid.txt --test lm-test.txt --out lm-files --shards 2 \
  --vocab-size 1000
prepared "lm --valid FILE --test FILE" "1,000 training sequences in 2 shard(s), 100 validation, 40 test"
holds_only lm-files tokenizer.model train-00000.h5 train-00001.h5 valid-00000.h5 test-00000.h5
"$decoder" lm-files --split train >lm-files.train.decoded
"$decoder" lm-files --normalize lm.txt >lm-files.train.expected
same lm-files.train.decoded lm-files.train.expected "lm: every input line trains"
"$decoder" lm-files --split valid >lm-files.valid.decoded
"$decoder" lm-files --normalize lm-valid.txt >lm-files.valid.expected
same lm-files.valid.decoded lm-files.valid.expected "lm: the validation split is --valid's"
"$decoder" lm-files --split test >lm-files.test.decoded
"$decoder" lm-files --normalize lm-test.txt >lm-files.test.expected
same lm-files.test.decoded lm-files.test.expected "lm: the test split is --test's"
head -n 1 lm-files.valid.decoded | grep -qF '⁇' ||
  fail "the tokenizer knows a letter only --valid has"
# Where the letter is in a training line, the tokenizer knows it.
if tail -n 1 lm-files.train.decoded | grep -qF '⁇'; then
  fail "the last training line's letter is unknown to a tokenizer trained on it"
fi

# The shards say which split they are and where their lines came from.
if python3 -c 'import h5py' 2>/dev/null; then
  attrs=$(python3 - <<'EOF'
import h5py
for name in ("lm-carved/train-00000.h5", "lm-carved/valid-00000.h5", "lm-carved/test-00000.h5",
             "lm-files/test-00000.h5"):
    with h5py.File(name, "r") as f:
        get = lambda key: f.attrs[key].decode() if isinstance(f.attrs[key], bytes) else f.attrs[key]
        print(f"{name}: {get('split')} | {get('origin')}")
EOF
  )
  expected="lm-carved/train-00000.h5: train | lm.txt lines 1-300
lm-carved/valid-00000.h5: valid | lm.txt lines 901-960
lm-carved/test-00000.h5: test | lm.txt lines 961-1000
lm-files/test-00000.h5: test | lm-test.txt lines 1-40"
  if [[ $attrs == "$expected" ]]; then
    echo "PASS: split and origin attributes"
  else
    fail "split and origin attributes: got [$attrs], expected [$expected]"
  fi
else
  echo "SKIP: h5py is not installed; the split and origin attributes are not checked"
fi

# ---- seq2seq: files keep their pairs ----
prepare --kind seq2seq --input src.txt --target tgt.txt --valid valid.en,valid.de \
  --test test.en,test.de --out s2s-files --shards 2 --vocab-size 2000
prepared "seq2seq --valid SRC,TGT --test SRC,TGT" \
  "2,000 training sequences in 2 shard(s), 100 validation, 99 test"
holds_only s2s-files tokenizer.model train-00000.h5 train-00001.h5 valid-00000.h5 test-00000.h5
paste test.en test.de | awk -F'\t' '$1 ~ /[^ \t]/ && $2 ~ /[^ \t]/' >test.kept
cut -f1 test.kept >test.kept.en
cut -f2 test.kept >test.kept.de
for side in source target; do
  [[ $side == source ]] && kept=test.kept.en || kept=test.kept.de
  "$decoder" s2s-files $side --split test >"s2s-files.test.$side"
  "$decoder" s2s-files --normalize "$kept" >"s2s-files.test.$side.expected"
  same "s2s-files.test.$side" "s2s-files.test.$side.expected" "seq2seq: the test split's ${side}s, paired"
done
sed -n '8p' s2s-files.test.source | grep -qF '⁇' ||
  fail "seq2seq: the tokenizer knows a letter only --test has"

# ---- seq2seq: --valid-lines and --test-lines, with a blank pair in the test lines ----
sed -i '1990s/.*//' tgt.txt
prepare --kind seq2seq --input src.txt --target tgt.txt --valid-lines 50 --test-lines 30 \
  --out s2s-carved --shards 2 --vocab-size 2000
prepared "seq2seq --valid-lines 50 --test-lines 30" \
  "1,919 training sequences in 2 shard(s), 50 validation, 30 test"
paste src.txt tgt.txt | awk -F'\t' '$1 ~ /[^ \t]/ && $2 ~ /[^ \t]/' >pairs.kept
tail -n 30 pairs.kept >pairs.test
kept=$(wc -l <pairs.kept)
sed -n "$((kept - 79)),$((kept - 30))p" pairs.kept >pairs.valid
for split in valid test; do
  cut -f1 "pairs.$split" >"pairs.$split.en"
  cut -f2 "pairs.$split" >"pairs.$split.de"
  "$decoder" s2s-carved --normalize "pairs.$split.en" >expected.en
  "$decoder" s2s-carved --normalize "pairs.$split.de" >expected.de
  paste expected.en expected.de >"s2s-carved.$split.expected"
  "$decoder" s2s-carved source --split $split >decoded.en
  "$decoder" s2s-carved target --split $split >decoded.de
  paste decoded.en decoded.de >"s2s-carved.$split.decoded"
  same "s2s-carved.$split.decoded" "s2s-carved.$split.expected" "seq2seq: the $split split's pairs"
done

# ---- a capped split warns only when its flag asked for more ----
prepare --input lm.txt --out lm-default --shards 2 --vocab-size 1000
prepared "the default --valid-lines 1000, capped at 100, says nothing" "100 validation"
prepare --input lm.txt --out lm-capped --shards 2 --vocab-size 1000 --valid-lines 500 \
  --test-lines 300
if [[ $rc -eq 0 && $(wc -l <"$err") -eq 2 ]] &&
  grep -qF "warning: --valid-lines 500: holding out 100 lines, a tenth of the 1000 usable lines of lm.txt" "$err" &&
  grep -qF "warning: --test-lines 300: holding out 100 lines" "$err" &&
  grep -qF "800 training sequences in 2 shard(s), 100 validation, 100 test" "$out"; then
  echo "PASS: capped --valid-lines and --test-lines warn: $(head -n 1 "$err")"
else
  fail "capped --valid-lines 500 --test-lines 300 (exit $rc)"
fi

# ---- refusals: one line, exit 2, nothing written ----
printf '\n \n' >blank.txt
sed -n '1,50p' gettext.de >short.de
prepare --input lm.txt --valid lm-valid.txt --valid-lines 5 --out no1
refused "--valid with --valid-lines" 2 "--valid-lines: not with --valid"
prepare --input lm.txt --test lm-test.txt --test-lines 5 --out no2
refused "--test with --test-lines" 2 "--test-lines: not with --test"
prepare --input lm.txt --valid lm-valid.txt,lm-test.txt --out no3
refused "lm --valid A,B" 2 "--valid: --kind lm reads one file"
prepare --kind seq2seq --input src.txt --target tgt.txt --test test.en --out no4
refused "seq2seq --test SRC" 2 "--test: --kind seq2seq needs SOURCE,TARGET"
prepare --kind seq2seq --input src.txt --target tgt.txt --valid valid.en,short.de --out no5
refused "--valid pair of unequal lengths" 2 "--valid: short.de has 50 lines but valid.en has 100"
prepare --input lm.txt --test missing.txt --out no6
refused "--test of a missing file" 2 "--test: missing.txt: no such file"
prepare --input lm.txt --valid blank.txt --out no7
refused "--valid of blank lines" 2 "blank.txt: empty input"
prepare --input six.txt --valid lm-valid.txt --test-lines 1 --out no8 --vocab-size 100 --shards 1
refused "--test-lines on six lines" 2 \
  "--test-lines: six.txt has 6 usable lines; at least 10 are needed to hold one out for a test split"
prepare --input six.txt --out no9 --vocab-size 100 --shards 1
refused "six lines, the validation split carved" 2 "six.txt has 6 usable lines; at least 10"
prepare --input lm.txt --test-lines -1 --out no10
refused "--test-lines -1" 2 "--test-lines"
for n in 1 2 3 4 5 6 7 8 9 10; do
  [[ ! -e no$n ]] || fail "a refused prepare left no$n behind"
done

exit_on_failures
echo "prepare_splits: all checks passed"
