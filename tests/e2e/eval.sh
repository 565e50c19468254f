#!/usr/bin/env bash
# `mpiformer eval`: a checkpoint on a shard set's validation split gives the
# figures the training run printed for the same batches, the same on 1 and
# on 2 ranks; faults are one line with the documented exit code.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
failures=0 out=$work/out.txt err=$work/err.txt

# A small English text every Debian system carries.
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >text.txt
"$bin" prepare --kind lm --input text.txt --out shards --shards 2 --vocab-size 300 \
  --valid-lines 100 >prepare.log
"$bin" prepare --kind lm --input text.txt --out other --shards 2 --vocab-size 280 \
  --valid-lines 100 >prepare-other.log
"$bin" train --model lm --data shards --out run --layers 1 --d-model 32 --heads 2 --d-ff 64 \
  --max-len 64 --max-tokens 512 --steps 30 --log-every 10 --eval-batches 4 --threads 1 >train.log
checkpoint=run/checkpoints/step_00000030.h5
figures() { sed -n 's/^\(final \)\{0,1\}eval | \(.*\)/\2/p' "$1" | tail -n 1; }
trained=$(figures train.log)

rc=0
"$bin" eval --checkpoint "$checkpoint" --data shards --batches 4 --threads 1 >"$out" 2>"$err" || rc=$?
one=$(figures "$out")
[[ $rc -eq 0 && -n $one && $one == "$trained" ]] ||
  fail "eval --batches 4 on 1 rank gives '$one' (exit $rc); training's final eval was '$trained'"
rc=0
"${mpirun[@]}" -np 2 "$bin" eval --checkpoint "$checkpoint" --data shards --batches 4 --threads 1 \
  >"$out" 2>"$err" || rc=$?
two=$(figures "$out")
[[ $rc -eq 0 && $two == "$trained" ]] || fail "eval on 2 ranks gives '$two' (exit $rc), expected '$trained'"
"$bin" eval --checkpoint "$checkpoint" --data shards --threads 1 >all-1.txt
"${mpirun[@]}" -np 2 "$bin" eval --checkpoint "$checkpoint" --data shards --threads 1 >all-2.txt
[[ -n $(figures all-1.txt) && $(figures all-1.txt) == "$(figures all-2.txt)" ]] ||
  fail "every validation batch: 1 rank '$(figures all-1.txt)', 2 ranks '$(figures all-2.txt)'"
# By default training evaluates the whole split too: the same figures as eval.
"$bin" train --model lm --data shards --out run-all --layers 1 --d-model 32 --heads 2 --d-ff 64 \
  --max-len 64 --max-tokens 512 --steps 10 --log-every 10 --threads 1 >train-all.log
"$bin" eval --checkpoint run-all/checkpoints/step_00000010.h5 --data shards --threads 1 >all-run.txt
[[ -n $(figures train-all.log) && $(figures train-all.log) == "$(figures all-run.txt)" ]] ||
  fail "the whole split: training '$(figures train-all.log)', eval '$(figures all-run.txt)'"
[[ $failures -eq 0 ]] && echo "PASS: eval repeats training's figures ($trained) on 1 and 2 ranks"

run_eval() {
  rc=0
  "$bin" eval "$@" >"$out" 2>"$err" || rc=$?
}
run_eval --checkpoint missing.h5 --data shards
expect_one_line_error "a missing checkpoint" 2 "--checkpoint" "missing.h5: no such file"
run_eval --checkpoint text.txt --data shards
expect_one_line_error "a file that is not a checkpoint" 1 "text.txt: not an HDF5 file"
run_eval --checkpoint "$checkpoint" --data other
expect_one_line_error "shards of another vocabulary" 2 "--data" "280 ids" "300 ids"
run_eval --checkpoint "$checkpoint"
expect_one_line_error "no --data" 2 "--data"
run_eval --checkpoint "$checkpoint" --data shards --batches -1
expect_one_line_error "negative --batches" 2 "--batches"

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "eval: all checks passed"
