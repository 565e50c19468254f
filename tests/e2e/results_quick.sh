#!/usr/bin/env bash
# scripts/results --quick: the reference-results pipeline end to end on
# slices of the demo corpora (extract, prepare, train and test-evaluate the
# five tasks on 2 ranks, translate and score with sacreBLEU, the debtags
# baseline) writes a RESULTS.md whose table has a figure for every task, the
# BLEU with its sacreBLEU signature, and the command lines with the binary
# as `mpiformer` and the output as $OUT, never their paths here. An --out
# that is not an earlier output is refused, and left as it was. Skipped
# (exit 77) without sacreBLEU.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt

if ! python3 -c "import sacrebleu" 2>/dev/null; then
  echo "SKIP: sacrebleu is not installed (python3 -m pip install sacrebleu)"
  exit 77
fi

try_seconds=300
try env MPIFORMER_BIN="$bin" "$src/scripts/results" --quick --no-setup --out "$work/results"
doc=$work/results/RESULTS.md
if [[ $rc -ne 0 ]]; then
  fail "scripts/results --quick: exit code $rc"
  exit_on_failures
fi
check "RESULTS.md written" test -s "$doc"
# One row per task, each with its headline figure in bold.
for task in "lm" "mlm" "seq2seq" "classify" "classify, multi-label"; do
  row=$(grep -F "| $task | " "$doc" | sed -n 1p || true)
  check "a row for $task with a figure" grep -Eq '\*\*[0-9]+(\.[0-9]+)?%?\*\*' <<<"$row"
done
check "BLEU with its sacreBLEU signature" grep -q '^| seq2seq |.*BLEU|nrefs:1|' "$doc"
check "the debtags baseline beside the micro-F1" grep -q 'the K commonest tags: micro-F1 [0-9.]* (top-' "$doc"
check "the hardware" grep -q "^- hardware: .*, $(nproc) cores" "$doc"
check "the commands: a train and an eval of each task" \
  test "$(grep -Ec '^mpirun -np 2 mpiformer (train|eval) ' "$doc")" -eq 10
check "the commands: the translation and its score" \
  grep -q '^mpirun -np 2 mpiformer generate .*--split test' "$doc"
check "the commands: sacreBLEU" grep -q '^python3 -m sacrebleu ' "$doc"
check "no path of the binary" not_in "$bin" "$doc"
check "the output directory only as \$OUT" \
  test "$(grep -cF "$work/results" "$doc")" -eq 2 # the OUT= line and the sentence naming it

# An --out that holds something else is refused and left alone.
mkdir -p other && echo keep >other/file
try env MPIFORMER_BIN="$bin" "$src/scripts/results" --quick --no-setup --out other
refused "--out of another directory" 2 "other exists and is not an earlier output of scripts/results"
check "and left as it was" test "$(cat other/file)" == keep

exit_on_failures
echo "results_quick: all checks passed"
