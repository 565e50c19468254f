#!/usr/bin/env bash
# analysis/plot_scaling.py on real `mpiformer bench` lines: two tiny shapes
# (lm and seq2seq) at 1 and 2 ranks, read from a file and from a pipe, give
# one series per shape with a row per rank count (efficiency 100% at 1 rank,
# the all-reduce wait and hidden share reported at 2) and a PNG of the
# expected size that is not blank; a file without a bench line is refused
# (one line, exit 2); analysis/scaling_model.py --plot draws the modelled
# efficiency against ranks.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
failures=0 out=$work/out.txt err=$work/err.txt

shape=(--layers 1 --d-model 32 --heads 2 --d-ff 64 --batch 4 --seq 16 --steps 5 --warmup-steps 1
  --threads 1)
for ranks in 1 2; do
  for model in lm seq2seq; do
    timeout 120 "${mpirun[@]}" -np "$ranks" "$bin" bench --model "$model" "${shape[@]}" >>bench.jsonl
  done
done
cat bench.jsonl

rc=0
python3 "$src/analysis/plot_scaling.py" bench.jsonl -o scaling.png >"$out" 2>"$err" || rc=$?
cat "$out"
check "plot_scaling.py on a file exits 0 (got $rc)" test "$rc" -eq 0
check "4 bench lines in 2 series" grep -q "wrote scaling.png (4 bench line(s), 2 series)" "$out"
for model in lm seq2seq; do
  check "a $model series" grep -q "^$model cpu fp32 [0-9,]* params batch 4 seq 16:$" "$out"
done
# ranks runs tokens/s per-rank efficiency step-ms wait hidden: one rank is
# the 100% reference and waits for nobody; two ranks report a hidden share.
check "1 rank: 100% and no wait, twice" \
  test "$(grep -cE '^ +1 +1 +[0-9.]+ +[0-9.]+ +100\.0% +[0-9.]+ +0\.000 +-$' "$out")" -eq 2
check "2 ranks: a row per series with a hidden share" \
  test "$(grep -cE '^ +2 +1 +[0-9.]+ +[0-9.]+ +[0-9.]+% +[0-9.]+ +[0-9.]+ +[0-9.]+%$' "$out")" -eq 2
if is_png scaling.png 1500 450; then
  echo "PASS: scaling.png is a 1500x450 PNG with ink"
else
  fail "scaling.png is not the expected plot"
fi

rc=0
grep -v seq2seq bench.jsonl | python3 "$src/analysis/plot_scaling.py" -o piped.png >"$out" 2>"$err" ||
  rc=$?
check "plot_scaling.py from a pipe exits 0 (got $rc)" test "$rc" -eq 0
check "the piped lm lines: 1 series" grep -q "wrote piped.png (2 bench line(s), 1 series)" "$out"
check "piped.png written" test -s piped.png

# The paper model's efficiency plot: 10 rank counts x 3 networks x 3
# gradient widths (fp32, bf16, the exact sum's int64).
rc=0
python3 "$src/analysis/scaling_model.py" --grad-bytes 4,2,8 --plot model.png >"$out" 2>"$err" ||
  rc=$?
check "scaling_model.py --plot exits 0 (got $rc)" test "$rc" -eq 0
check "90 modelled points" grep -q "wrote model.png (90 modelled points)" "$out"
check "the int64 rows of the table" grep -qE "^512 +NVL\+IB +int64 " "$out"
if is_png model.png 1200 450; then
  echo "PASS: model.png is a 1200x450 PNG with ink"
else
  fail "model.png is not the expected plot"
fi

echo "no json here" >empty.txt
rc=0
python3 "$src/analysis/plot_scaling.py" empty.txt -o bad.png >"$out" 2>"$err" || rc=$?
expect_one_line_error "a file without bench lines" 2 "plot_scaling.py: no \`mpiformer bench\` line in empty.txt"
check "a refused plot writes nothing" test ! -e bad.png

exit_on_failures
echo "plot_scaling: all checks passed"
