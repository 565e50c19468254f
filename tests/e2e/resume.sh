#!/usr/bin/env bash
# Runs that survive (docs/DESIGN.md section 7): a run stopped by a signal and
# resumed, on the same or another world size, ends bitwise equal to a run
# that never stopped, with the same per-step figures in metrics.h5; a rank
# killed while a checkpoint is written leaves the previous one intact; a
# damaged newest checkpoint is skipped; faults of the run directory are one
# line and exit 2, and nothing already written is lost.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
tools=$(dirname "$bin")/tests
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
failures=0 out=$work/out.txt err=$work/err.txt

# A tiny lm with dropout and a warmup + decay schedule: every random stream
# and the schedule must continue across the stop. One thread per rank: the
# exact gradient sum is then bitwise reproducible for any world size.
model=(--model lm --synthetic copy --layers 2 --d-model 32 --heads 2 --d-ff 64 --max-len 32
  --max-tokens 256 --dropout 0.1 --warmup 4 --lr 3e-3 --threads 1 --eval-batches 2)
train=(train "${model[@]}" --steps 12 --log-every 1 --eval-every 5)

# run NAME RANKS ARGS...: trains into NAME, keeping stdout/stderr in
# NAME.out/NAME.err; the exit code is in $rc.
run() {
  local name=$1 ranks=$2
  shift 2
  rc=0
  if [[ $ranks == 1 ]]; then
    "$bin" "$@" --out "$name" >"$name.out" 2>"$name.err" || rc=$?
  else
    timeout 120 "${mpirun[@]}" -np "$ranks" "$bin" "$@" --out "$name" >"$name.out" 2>"$name.err" \
      || rc=$?
  fi
  cp "$name.out" "$out"
  cp "$name.err" "$err"
}

# same_tensors WHAT A B: params, Adam m and v bitwise equal.
same_tensors() {
  local what=$1 a=$2 b=$3 group
  for group in params optimizer/m optimizer/v; do
    if ! "$tools/compare_params" "$a" "$b" --group "$group" --bitwise >"$work/compare.txt" 2>&1; then
      echo "FAIL: $what: /$group differs: $(tail -n 3 "$work/compare.txt")" >&2
      failures=$((failures + 1))
      return 1
    fi
  done
  echo "PASS: $what: params, Adam m and v bitwise equal"
}

# train_rows RUNDIR: the /train rows of metrics.h5 without the timing
# columns (tokens_per_s, step_ms), values exact.
train_rows() {
  "$bin" inspect "$1/metrics.h5" | awk '/^\/train/ { on = 1; next } /^\/eval/ { on = 0 }
    on && $1 ~ /^[0-9]/ { print $1, $2, $3, $4, $5, $6, $9, $10 }'
}

# same_rows WHAT A B: the per-step training figures of two runs are equal.
same_rows() {
  local what=$1
  train_rows "$2" >"$work/rows-a.txt"
  train_rows "$3" >"$work/rows-b.txt"
  if [[ $(wc -l <"$work/rows-a.txt") -ne 12 ]]; then
    echo "FAIL: $what: $2 has $(wc -l <"$work/rows-a.txt") rows in /train, expected 12" >&2
    failures=$((failures + 1))
  elif ! diff "$work/rows-a.txt" "$work/rows-b.txt" >"$work/rows-diff.txt"; then
    echo "FAIL: $what: per-step figures differ:" >&2
    head -n 6 "$work/rows-diff.txt" >&2
    failures=$((failures + 1))
  else
    echo "PASS: $what: 12 rows of /train (step, loss, tokens, accuracy, lr, grad-norm) equal"
  fi
}

expect_in() {
  local what=$1 file=$2 needle=$3
  if grep -qF -- "$needle" "$file"; then
    echo "PASS: $what"
  else
    fail "$what: '$needle' not in $(basename "$file")"
  fi
}

# ---- the reference: 12 steps on 2 ranks without a stop
run straight 2 "${train[@]}" --checkpoint-every 4
[[ $rc -eq 0 ]] || fail "the reference run: exit code $rc"
ref=straight/checkpoints/step_00000012.h5

# ---- stop after step 6 (SIGUSR1 on the last rank only), resume, 6 more
MPIFORMER_TEST_SIGNAL_AFTER_STEP=6 run stopped 2 "${train[@]}"
if [[ $rc -ne 75 ]]; then
  fail "a stopped run exits 75, got $rc"
fi
expect_in "the stop is reported" stopped.out "stopped by SIGUSR1 after step 6"
expect_in "the stop writes a checkpoint" stopped.out "checkpoint step 6:"
run stopped 2 "${train[@]}" --resume auto
[[ $rc -eq 0 ]] || fail "resuming on 2 ranks: exit code $rc"
expect_in "the resume is reported" stopped.out "resumed from stopped/checkpoints: step 6"
same_tensors "stopped at 6 and resumed on 2 ranks vs straight" "$ref" \
  stopped/checkpoints/step_00000012.h5
same_rows "stopped at 6 and resumed on 2 ranks" straight stopped

# ---- the same stop, resumed on 1 rank with 2 micro-batches: the same global batch
MPIFORMER_TEST_SIGNAL_AFTER_STEP=6 run moved 2 "${train[@]}"
[[ $rc -eq 75 ]] || fail "the run to move: exit code $rc, expected 75"
run moved 1 "${train[@]}" --accum-steps 2 --resume auto
[[ $rc -eq 0 ]] || fail "resuming on 1 rank: exit code $rc"
expect_in "the resume names the old world size" moved.out "written by 2 rank(s)"
same_tensors "resumed on 1 rank x 2 micro-batches vs 2 ranks straight" "$ref" \
  moved/checkpoints/step_00000012.h5
same_rows "resumed on another world size" straight moved

# ---- a stop inside a progress window: lines every 4 steps, a stop after
# step 6. The checkpoint keeps the window's figures of steps 5-6, so the line
# of step 8 covers steps 5-8 as in a run that never stopped (no timing
# columns): bitwise on the same ranks; on another world size the counts
# (step, tokens, padding) are exact and the float sums close.
window=(train "${model[@]}" --steps 12 --log-every 4 --eval-every 5)
run window-straight 2 "${window[@]}"
[[ $rc -eq 0 ]] || fail "the reference run with lines every 4 steps: exit code $rc"
for case in window window-moved; do
  MPIFORMER_TEST_SIGNAL_AFTER_STEP=6 run "$case" 2 "${window[@]}"
  [[ $rc -eq 75 ]] || fail "$case: the stopped run exits $rc, expected 75"
  if [[ $case == window ]]; then
    run "$case" 2 "${window[@]}" --resume auto
  else
    run "$case" 1 "${window[@]}" --accum-steps 2 --resume auto
  fi
  [[ $rc -eq 0 ]] || fail "$case: resuming: exit code $rc"
  train_rows window-straight >"$work/rows-a.txt"
  train_rows "$case" >"$work/rows-b.txt"
  if [[ $(wc -l <"$work/rows-b.txt") -ne 3 ]]; then
    fail "$case: $(wc -l <"$work/rows-b.txt") rows in /train, expected 3 (steps 4, 8, 12)"
  elif [[ $case == window ]] && ! diff "$work/rows-a.txt" "$work/rows-b.txt" >"$work/rows-diff.txt"; then
    fail "stopped inside a window, resumed on 2 ranks: rows differ: $(head -n 4 "$work/rows-diff.txt")"
  elif [[ $case == window-moved ]] && ! awk 'NR == FNR { a[FNR] = $0; next }
      { split(a[FNR], x, " ")
        if (x[1] != $1 || x[3] != $3 || x[7] != $7) exit 1
        if ((x[2] - $2) ^ 2 > (1e-12 * x[2]) ^ 2) exit 1 }' "$work/rows-a.txt" "$work/rows-b.txt"; then
    fail "stopped inside a window, resumed on 1 rank: rows differ: $(paste -d '|' "$work/rows-a.txt" "$work/rows-b.txt")"
  else
    echo "PASS: $case: the 3 lines (steps 4, 8, 12) cover the steps of a run that never stopped"
  fi
done

# ---- rank 0 killed (SIGKILL) while it writes the checkpoint of step 8
MPIFORMER_TEST_KILL_IN_CHECKPOINT=8 run killed 2 "${train[@]}" --checkpoint-every 4
[[ $rc -ne 0 ]] || fail "the killed run exits non-zero"
[[ $(cat killed/checkpoints/latest) == step_00000004.h5 ]] ||
  fail "after the kill, latest names '$(cat killed/checkpoints/latest)', expected step_00000004.h5"
[[ ! -e killed/checkpoints/step_00000008.h5 ]] || fail "a half-written step_00000008.h5 exists"
same_tensors "the checkpoint before the kill is intact" straight/checkpoints/step_00000004.h5 \
  killed/checkpoints/step_00000004.h5
run killed 2 "${train[@]}" --checkpoint-every 4 --resume auto
[[ $rc -eq 0 ]] || fail "resuming after the kill: exit code $rc"
expect_in "the resume after the kill takes step 4" killed.out "resumed from killed/checkpoints: step 4"
same_tensors "killed at 8, resumed from 4" "$ref" killed/checkpoints/step_00000012.h5

# ---- a damaged newest checkpoint is reported and the one before is used
for damage in truncated corrupt; do
  cp -r straight "$damage"
  newest=$damage/checkpoints/step_00000012.h5
  if [[ $damage == truncated ]]; then
    truncate -s $(($(stat -c %s "$newest") / 2)) "$newest"
  else
    "$tools/make_bad_shard" --corrupt-chunk /optimizer/v/embed.tokens "$newest"
  fi
  run "$damage" 1 train "${model[@]}" --steps 14 --resume auto
  if [[ $rc -ne 0 ]]; then
    fail "$damage newest checkpoint: exit code $rc, expected 0"
  elif [[ $(wc -l <"$err") -ne 1 ]]; then
    fail "$damage newest checkpoint: expected one line on stderr"
  else
    expect_in "$damage newest checkpoint named" "$err" \
      "skipping a damaged checkpoint: $newest: truncated or corrupt"
    expect_in "$damage newest checkpoint: the one before is used" "$out" \
      "resumed from $damage/checkpoints: step 8"
  fi
done

# ---- faults of flags and of the run directory: one line, exit 2, nothing lost
before=$(cksum straight/metrics.h5 straight/checkpoints/*)
run straight 1 train "${model[@]}" --steps 20 --vocab 40 --resume auto
expect_one_line_error "shape mismatch" 2 "--resume" "embed.tokens" "has shape (32, 32)" "(40, 32)"
run straight 1 train "${model[@]}" --steps 20
expect_one_line_error "--resume none into a run" 2 "--out" "already holds a run" "--resume auto"
[[ $(cksum straight/metrics.h5 straight/checkpoints/*) == "$before" ]] ||
  fail "a refused run changed the files of the run it refused"
run straight 1 train "${model[@]}" --steps 12 --resume auto
[[ $rc -eq 0 ]] || fail "resuming a finished run: exit code $rc"
expect_in "resuming a finished run does nothing" "$out" "already reaches --steps 12; nothing to do"

echo "not a run directory" >a_file
rc=0
"$bin" train "${model[@]}" --steps 2 --out a_file/run >"$out" 2>"$err" || rc=$?
expect_one_line_error "--out under a file" 2 "--out" "a_file/run"
mkdir -p garbage && echo "not HDF5" >garbage/metrics.h5
run garbage 1 train "${model[@]}" --steps 2 --resume auto
expect_one_line_error "metrics.h5 not HDF5" 2 "garbage/metrics.h5: not an HDF5 file"
[[ $(cat garbage/metrics.h5) == "not HDF5" ]] || fail "the foreign metrics.h5 was changed"
mkdir -p dir/metrics.h5
run dir 1 train "${model[@]}" --steps 2 --resume auto
expect_one_line_error "metrics.h5 a directory" 2 "dir/metrics.h5: is a directory"

# ---- a real SIGTERM to one rank: every rank stops at the same step
train_long=(train "${model[@]}" --steps 100000 --log-every 10 --eval-every 0)
timeout 120 "${mpirun[@]}" -np 2 "$bin" "${train_long[@]}" --out term >term.out 2>term.err &
launcher=$!
for _ in $(seq 600); do
  grep -q "^step 50/" term.out 2>/dev/null && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
# metrics.h5 is readable while the run writes it (SWMR).
if "$bin" inspect term/metrics.h5 >live.txt 2>&1 && grep -q "^  50 " live.txt; then
  echo "PASS: metrics.h5 read while the run writes it"
else
  fail "metrics.h5 while the run writes it: $(head -c 300 live.txt)"
fi
# timeout -> mpirun -> the ranks
ranks=$(pgrep -P "$(pgrep -P "$launcher" | head -n 1)" || true)
if [[ -z $ranks ]]; then
  fail "SIGTERM: found no rank process"
else
  kill -TERM "$(echo "$ranks" | tail -n 1)"
fi
rc=0
wait "$launcher" || rc=$?
cp term.out "$out" && cp term.err "$err"
[[ $rc -eq 75 ]] || fail "SIGTERM to one rank: exit code $rc, expected 75"
expect_in "SIGTERM to one rank stops the job" term.out "stopped by SIGTERM after step"
step=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\);.*/\1/p' term.out)
[[ -n $step && -e term/checkpoints/$(printf 'step_%08d.h5' "$step") ]] ||
  fail "SIGTERM: no checkpoint of the step it stopped at ($step)"

exit_on_failures
echo "all resume checks passed"
