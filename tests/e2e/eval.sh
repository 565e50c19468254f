#!/usr/bin/env bash
# `mpiformer eval`: a checkpoint on a shard set's validation split gives the
# figures the training run printed for the same batches, the same on 1 and
# on 2 ranks; --split test evaluates the test split (the same figures as a
# set whose validation split holds those lines); faults are one line with the
# documented exit code.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
failures=0 out=$work/out.txt err=$work/err.txt

# A small English text every Debian system carries.
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >text.txt
"$bin" prepare --kind lm --input text.txt --out shards --shards 2 --vocab-size 300 \
  --valid-lines 50 >prepare.log
"$bin" prepare --kind lm --input text.txt --out other --shards 2 --vocab-size 280 \
  --valid-lines 50 >prepare-other.log
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

# --split test: a set with a test split cut from the end of the text, and a
# set whose validation split is that same text, both in the checkpoint's
# vocabulary. Quick evaluations print no progress.
lines=$(wc -l <text.txt)
"$bin" prepare --kind lm --input text.txt --out split --shards 2 --tokenizer shards/tokenizer.model \
  --valid-lines 50 --test-lines 50 >prepare-split.log
tail -n 50 text.txt >test-lines.txt
head -n $((lines - 50)) text.txt >train-lines.txt
"$bin" prepare --kind lm --input train-lines.txt --valid test-lines.txt --out as-valid --shards 2 \
  --tokenizer shards/tokenizer.model >prepare-as-valid.log
run_eval --checkpoint "$checkpoint" --data split --split test --threads 1
test_figures=$(figures "$out")
[[ $rc -eq 0 && -n $test_figures && ! -s $err ]] ||
  fail "eval --split test: exit $rc, figures '$test_figures', or something on stderr"
grep -qF "on split (test split)" "$out" || fail "eval --split test does not name the split"
run_eval --checkpoint "$checkpoint" --data as-valid --split valid --threads 1
[[ $rc -eq 0 && $(figures "$out") == "$test_figures" ]] ||
  fail "the test split gives '$test_figures', the same lines as a validation split '$(figures "$out")'"
run_eval --checkpoint "$checkpoint" --data split --threads 1
[[ $rc -eq 0 && -n $(figures "$out") && $(figures "$out") != "$test_figures" ]] ||
  fail "eval (--split valid by default) gives the test split's figures '$(figures "$out")'"
rc=0
"${mpirun[@]}" -np 2 "$bin" eval --checkpoint "$checkpoint" --data split --split test --threads 1 \
  >"$out" 2>"$err" || rc=$?
[[ $rc -eq 0 && $(figures "$out") == "$test_figures" ]] ||
  fail "eval --split test on 2 ranks gives '$(figures "$out")', expected '$test_figures'"
[[ $failures -eq 0 ]] && echo "PASS: eval --split test ($test_figures) on 1 and 2 ranks"
run_eval --checkpoint "$checkpoint" --data shards --split test
expect_one_line_error "--split test of a set without one" 2 "--split" "has no test split" \
  "--test-lines"
run_eval --checkpoint "$checkpoint" --data shards --split train
expect_one_line_error "--split train" 2 "--split: expected valid or test"
run_eval --checkpoint missing.h5 --data shards
expect_one_line_error "a missing checkpoint" 2 "--checkpoint" "missing.h5: no such file"
run_eval --checkpoint text.txt --data shards
expect_one_line_error "a file that is not a checkpoint" 2 "--checkpoint: text.txt: not an HDF5 file"
run_eval --checkpoint "$checkpoint" --data other
expect_one_line_error "shards of another vocabulary" 2 "--data" "280 ids" "300 ids"
run_eval --checkpoint "$checkpoint"
expect_one_line_error "no --data" 2 "--data"
run_eval --checkpoint "$checkpoint" --data shards --batches -1
expect_one_line_error "negative --batches" 2 "--batches"

# --device: auto is the CPU here (no GPU), with training's figures and the
# reason on its first line; cuda without a GPU is one line, exit 2.
rc=0
"$bin" eval --checkpoint "$checkpoint" --data shards --batches 4 --threads 1 --device auto \
  >"$out" 2>"$err" || rc=$?
[[ $rc -eq 0 && $(figures "$out") == "$trained" ]] ||
  fail "eval --device auto gives '$(figures "$out")' (exit $rc), expected '$trained'"
grep -q "(cpu; auto: " "$out" || fail "eval --device auto does not say why: $(sed -n 1p "$out")"
if ! nvidia-smi -L >/dev/null 2>&1; then
  run_eval --checkpoint "$checkpoint" --data shards --device cuda
  expect_one_line_error "--device cuda without a GPU" 2 "--device: cuda"
fi

exit_on_failures
echo "eval: all checks passed"
