#!/usr/bin/env bash
# `mpiformer generate --data DIR --split test --references REF --output HYP`
# on a seq2seq set of the gettext pairs prepared with --test-lines: one
# hypothesis and one reference per sentence of the split, in order (the
# hypotheses equal those of --input with the split's own source lines, the
# references the split's targets), the same on stdout, and a sacreBLEU score
# on the two files. Faults are one line with exit code 2. Where sacrebleu is
# not installed, the score is skipped (exit 77) after every other check.
#
# usage: generate_bleu.sh /path/to/mpiformer WORKDIR
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bin=${1:?usage: generate_bleu.sh /path/to/mpiformer WORKDIR}
work=${2:?usage: generate_bleu.sh /path/to/mpiformer WORKDIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
decoder=$(dirname "$bin")/tests/decode_shards
[[ -x $decoder ]] || {
  echo "FAIL: $decoder is missing (it is built with the tests)" >&2
  exit 1
}
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0 out=$work/out.txt err=$work/err.txt

# ---- a small seq2seq set with a test split, and a model briefly trained on it ----
"$repo/data/extract-gettext-de.sh" gettext.en gettext.de >/dev/null
head -n 3000 gettext.en >src.txt
head -n 3000 gettext.de >tgt.txt
sed -i '2980s/.*//' tgt.txt # a blank pair among the test lines: skipped
"$bin" prepare --kind seq2seq --input src.txt --target tgt.txt --out s2s --shards 2 \
  --vocab-size 1000 --valid-lines 30 --test-lines 40 >prepare.log
grep -qF "30 validation, 40 test" prepare.log || fail "prepare: expected 30 validation, 40 test"
"$bin" prepare --kind seq2seq --input src.txt --target tgt.txt --out no-test --shards 2 \
  --tokenizer s2s/tokenizer.model --valid-lines 30 >/dev/null
"$bin" prepare --kind seq2seq --input src.txt --target tgt.txt --out other --shards 2 \
  --vocab-size 900 --valid-lines 30 --test-lines 40 >/dev/null
"$bin" train --model seq2seq --data s2s --out run --enc-layers 1 --dec-layers 1 --d-model 32 \
  --heads 2 --d-ff 64 --max-len 48 --max-tokens 2048 --steps 20 --log-every 10 --threads 1 \
  >train.log
checkpoint=run/checkpoints/step_00000020.h5
decode=(--checkpoint "$checkpoint" --max-new-tokens 24 --threads 1)

# ---- hypotheses and references, line-aligned ----
rc=0
"$bin" generate "${decode[@]}" --data s2s --split test --references ref.txt --output hyp.txt \
  >"$out" 2>"$err" || rc=$?
[[ $rc -eq 0 ]] || fail "generate --data s2s --split test: exit $rc"
"$decoder" s2s target --split test >test.targets
check "the references are the test split's targets ($(wc -l <ref.txt) lines)" cmp -s ref.txt test.targets
check "one hypothesis per test sentence ($(wc -l <hyp.txt))" test "$(wc -l <hyp.txt)" -eq 40
grep -qF "translating the 40 source sentence(s) of the test split of s2s (src.txt and tgt.txt lines" \
  "$err" || fail "generate --data does not say what it translates"
# The same sentences as text, from the input files: the same hypotheses, in order.
paste src.txt tgt.txt | awk -F'\t' '$1 ~ /[^ \t]/ && $2 ~ /[^ \t]/' | tail -n 40 | cut -f1 \
  >test.sources
"$bin" generate "${decode[@]}" --input test.sources --output hyp-input.txt 2>/dev/null
check "the hypotheses are those of --input with the split's source lines" \
  cmp -s hyp.txt hyp-input.txt
# To stdout: the same lines, and nothing else there.
rc=0
"$bin" generate "${decode[@]}" --data s2s --references ref-stdout.txt >hyp-stdout.txt 2>"$err" ||
  rc=$?
check "--split test is the default; stdout holds the hypotheses alone (exit $rc)" \
  cmp -s hyp.txt hyp-stdout.txt
check "--references beside stdout" cmp -s ref.txt ref-stdout.txt
check "a short run prints one line on stderr, no progress" test "$(wc -l <"$err")" -eq 1
"$bin" generate "${decode[@]}" --data s2s --split valid --references ref-valid.txt \
  --output hyp-valid.txt 2>/dev/null
"$decoder" s2s target --split valid >valid.targets
check "--split valid: its targets" cmp -s ref-valid.txt valid.targets
check "--split valid: one hypothesis each" test "$(wc -l <hyp-valid.txt)" -eq 30

# ---- sacreBLEU on the two files ----
if python3 -c 'import sacrebleu' 2>/dev/null; then
  bleu=$(python3 -m sacrebleu ref.txt -i hyp.txt -m bleu -f text -w 2)
  same=$(python3 -m sacrebleu ref.txt -i ref.txt -m bleu -f text -w 2)
  # BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0 = 1.23 20.1/...
  signed='^BLEU[|]nrefs:1[|].*tok:13a.* = [0-9]+[.][0-9]{2} '
  if [[ $bleu =~ $signed && $same == *" = 100.00 "* ]]; then
    echo "PASS: sacreBLEU scores the files: $bleu"
  else
    fail "sacreBLEU: '$bleu'; the references against themselves: '$same'"
  fi
else
  bleu_skipped=1
fi

# ---- faults: one line, exit 2 ----
"$bin" train --model lm --synthetic copy --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 16 \
  --max-tokens 128 --steps 2 --threads 1 --out lm >/dev/null
"$bin" train --model seq2seq --synthetic reverse --enc-layers 1 --dec-layers 1 --d-model 16 \
  --heads 2 --d-ff 32 --max-len 16 --max-tokens 128 --steps 2 --threads 1 --out synthetic >/dev/null
run_generate() {
  rc=0
  timeout 60 "$bin" generate "$@" >"$out" 2>"$err" || rc=$?
}
run_generate --checkpoint lm/checkpoints/step_00000002.h5 --data s2s
expect_one_line_error "an lm checkpoint with --data" 2 "--data:" "holds an lm" "eval --split"
run_generate --checkpoint synthetic/checkpoints/step_00000002.h5 --data s2s
expect_one_line_error "a synthetic checkpoint with --data" 2 "--data:" "synthetic task"
run_generate "${decode[@]}" --data no-test --references r.txt
expect_one_line_error "--split test of a set without one" 2 "--split: no-test has no test split" \
  "--test-lines"
run_generate "${decode[@]}" --data other
expect_one_line_error "shards of another tokenizer" 2 "--data: the shards of other have 900 ids"
run_generate "${decode[@]}" --data missing
expect_one_line_error "a missing --data" 2 "--data: missing: no such directory"
run_generate "${decode[@]}" --data s2s --input test.sources
expect_one_line_error "--data with --input" 2 "--input: give one of --prompt TEXT, --input FILE or --data DIR"
run_generate "${decode[@]}" --input test.sources --references r.txt
expect_one_line_error "--references without --data" 2 "--references: only with --data DIR"
run_generate "${decode[@]}" --input test.sources --split valid
expect_one_line_error "--split without --data" 2 "--split: only with --data DIR"
run_generate "${decode[@]}" --data s2s --references same.txt --output same.txt
expect_one_line_error "--references and --output the same file" 2 "--references: the same file as --output"
run_generate "${decode[@]}" --data s2s --split train
expect_one_line_error "--split train" 2 "--split: expected test or valid"
[[ ! -e r.txt ]] || fail "a refused generate wrote its references"

exit_on_failures
if [[ -n ${bleu_skipped:-} ]]; then
  echo "SKIP: sacrebleu is not installed (python3 -m pip install sacrebleu): no BLEU computed"
  exit 77
fi
echo "generate_bleu: all checks passed"
