#!/usr/bin/env bash
# Runs a user can trust (docs/DESIGN.md section 7), one fault at a time:
# divergence never reaches a checkpoint and ends with exit 3; one job per run
# directory; rolling back starts a branch and moves the later checkpoints
# aside; SIGINT and SIGTERM, to a rank or to mpirun, stop at a step boundary
# with a checkpoint; a full disk is one line and exit 1 with the previous
# state intact; a model that cannot fit in memory is refused before it is
# allocated; hand-edited checkpoint attributes are refused.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src_root=$(cd "$(dirname "$0")/../.." && pwd)
umount "$work/full" 2>/dev/null || true  # left by an interrupted run
rm -rf "$work"
mkdir -p "$work"
cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
failures=0 out=$work/out.txt err=$work/err.txt

base=(--model lm --synthetic copy --layers 2 --heads 2 --d-ff 64 --max-len 32 --eval-batches 2)
model=("${base[@]}" --d-model 32 --max-tokens 256 --threads 1)

# run NAME RANKS ARGS...: trains into NAME (stdout/stderr in $out/$err, also
# kept as NAME.out/NAME.err); the exit code is in $rc.
run() {
  local name=$1 ranks=$2
  shift 2
  rc=0
  if [[ $ranks == 1 ]]; then
    timeout 120 "$bin" train "${model[@]}" "$@" --out "$name" >"$out" 2>"$err" || rc=$?
  else
    timeout 120 "${mpirun[@]}" -np "$ranks" "$bin" train "${model[@]}" "$@" --out "$name" \
      >"$out" 2>"$err" || rc=$?
  fi
  cp "$out" "${name//\//-}.out"
  cp "$err" "${name//\//-}.err"
}

says() { grep -qF -- "$2" "$1"; }
# state DIR: a fingerprint of every file of a run directory but the lock.
state() { (cd "$1" && find . -type f ! -name .lock -print0 | sort -z | xargs -0 cksum); }
# finite CHECKPOINT: generate reads it, and refuses NaN and inf.
finite() { "$bin" generate --checkpoint "$1" --prompt "3 4" >/dev/null 2>&1; }
# Background jobs end with the test, however it ends.
cleanup() {
  local pids
  pids=$(jobs -p)
  [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
  umount "$work/full" 2>/dev/null || true
}
trap cleanup EXIT

# A good checkpoint for the tests that read or edit one.
run good 1 --steps 8 --log-every 8
[[ $rc -eq 0 ]] || fail "the good run: exit code $rc"
good=good/checkpoints/step_00000008.h5

# ---- divergence: --lr 1e9 after 20 good steps never reaches a checkpoint
run div 1 --steps 20 --log-every 5 --checkpoint-every 5 --keep-checkpoints 2
[[ $rc -eq 0 ]] || fail "the good run: exit code $rc"
before=$(state div)
run div 1 --steps 40 --log-every 5 --checkpoint-every 5 --keep-checkpoints 2 --resume auto --lr 1e9
check "divergence exits 3 (got $rc)" test "$rc" -eq 3
check "divergence names the step and the last good checkpoint" \
  grep -qE "^\[rank 0\] step [0-9]+ diverged: .* not finite; stopped without saving it \(exit code 3\)\. The last good checkpoint is div/checkpoints/step_00000020.h5 \(latest\)" "$err"
# (the run's logs, metrics.h5, metrics.jsonl, train.log and config.ini, go on)
logs='metrics\.h5|metrics\.jsonl|train\.log|config\.ini'
check "divergence keeps every good checkpoint and latest" \
  test "$(state div | grep -Ev "$logs")" == "$(echo "$before" | grep -Ev "$logs")"
check "after divergence latest is step 20" test "$(cat div/checkpoints/latest)" == step_00000020.h5

# a NaN at step 3 (the last of 2 ranks) on a fresh run: nothing is written
MPIFORMER_TEST_NAN_AT_STEP=3 run nan 2 --steps 10 --checkpoint-every 2
check "a NaN gradient on one rank stops both with 3 (got $rc)" test "$rc" -eq 3
check "the stop says no checkpoint was written before it" says "$err" "step 3 diverged: the gradient norm is not finite"
check "only the checkpoint of step 2 exists" test "$(ls nan/checkpoints)" == "$(printf 'latest\nstep_00000002.h5')"
check "step 2 is finite" finite nan/checkpoints/step_00000002.h5

# A GPU step in fp32 or bf16 is checked at the progress line and before each
# checkpoint, not every step (here forced on the CPU): the NaN of step 3
# is found at the checkpoint of step 4, or at the progress line of step 5
MPIFORMER_TEST_DEFERRED_DIVERGENCE_CHECK=1 MPIFORMER_TEST_NAN_AT_STEP=3 \
  run late 2 --steps 20 --log-every 5 --checkpoint-every 2
check "found before the next checkpoint: exit 3 (got $rc)" test "$rc" -eq 3
check "and said so" says "$err" "step 4 diverged: non-finite values in params after the update"
check "only the checkpoint of step 2 exists" test "$(ls late/checkpoints)" == "$(printf 'latest\nstep_00000002.h5')"
rm -rf late
MPIFORMER_TEST_DEFERRED_DIVERGENCE_CHECK=1 MPIFORMER_TEST_NAN_AT_STEP=3 \
  run late 2 --steps 20 --log-every 5 --checkpoint-every 10
check "found at the progress line: exit 3 (got $rc)" test "$rc" -eq 3
check "and said so" says "$err" "step 5 diverged: the loss is not finite (checked at each progress line"
check "no checkpoint" test ! -e late/checkpoints/latest

# --on-divergence skip: two bad steps are dropped and the run finishes
MPIFORMER_TEST_NAN_AT_STEP=4:2 run skip 2 --steps 8 --log-every 8 --on-divergence skip
check "skip finishes (got $rc)" test "$rc" -eq 0
check "skip warns for each dropped step" test "$(grep -c '^warning: step [45] skipped: the gradient norm is not finite' "$err")" -eq 2
check "skip counts them in the progress line" says "$out" "non-finite steps skipped 2"
check "the final checkpoint is finite" finite skip/checkpoints/step_00000008.h5
# ... but not for ever
MPIFORMER_TEST_NAN_AT_STEP=2:1000 run skipall 1 --steps 100 --on-divergence skip
check "skip stops after 20 in a row with 3 (got $rc)" test "$rc" -eq 3
check "and says so" says "$err" "step 21 diverged: the gradient norm is not finite for 20 steps in a row"

# the loss far above its best is a warning
run warn 1 --steps 20 --log-every 5 --lr 3 --warmup 5
check "a loss far above a uniform guess is warned about" \
  grep -q "^warning: step 5: loss .* is far above 3.466, the loss of a uniform guess" "$err"

# eval and generate refuse a checkpoint with non-finite parameters
cp "$good" poisoned.h5
python3 - <<'EOF'
import h5py, numpy as np
from mpiformer_checksum import seal
with h5py.File("poisoned.h5", "r+") as f:
    d = f["params/output.bias"]
    a = d[...]
    a[1] = np.nan
    d[...] = a
    seal(d)  # a NaN written and summed: the values are the fault
EOF
rc=0
"$bin" generate --checkpoint poisoned.h5 --prompt "3 4 5" >"$out" 2>"$err" || rc=$?
refused "generate with a NaN parameter" 2 "--checkpoint: poisoned.h5: params tensor 'output.bias' holds non-finite values (nan)"
rc=0
"$bin" train "${model[@]}" --steps 10 --resume poisoned.h5 --out fromnan >"$out" 2>"$err" || rc=$?
refused "resuming from a NaN checkpoint" 2 "--resume: cannot resume: poisoned.h5: params tensor 'output.bias'"

# ---- one job per run directory
"$bin" train "${model[@]}" --steps 100000 --log-every 10 --eval-every 0 --out busy \
  >busy.out 2>busy.err &
holder=$!
for _ in $(seq 300); do
  grep -q "^step 10/" busy.out 2>/dev/null && break
  sleep 0.1
done
rc=0
"$bin" train "${model[@]}" --steps 10 --resume auto --out busy >"$out" 2>"$err" || rc=$?
refused "a second job in a run directory" 2 "--out: busy is in use by another process (host $(hostname), pid $holder"
kill -USR1 "$holder"
rc=0
wait "$holder" || rc=$?
check "the first job is not disturbed: it stops with 75 (got $rc)" test "$rc" -eq 75
# a lock file whose holder was killed is no lock
"$bin" train "${model[@]}" --steps 100000 --log-every 10 --eval-every 0 \
  --resume auto --out busy >busy2.out 2>&1 &
victim=$!
for _ in $(seq 300); do
  grep -q "^step .*0/100000" busy2.out 2>/dev/null && break
  sleep 0.1
done
kill -KILL "$victim"
wait "$victim" 2>/dev/null || true
check "a killed job leaves its lock file" test -e busy/.lock
run busy 1 --steps 5 --resume auto
check "a stale lock does not block the resume (exit $rc)" test "$rc" -eq 0
# held by another program (flock(1)), named by the file's line; nothing changes
before=$(state busy)
echo "otherhost 4242" >busy/.lock
rc=0
flock busy/.lock "$bin" train "${model[@]}" --steps 5 --resume auto --out busy >"$out" 2>"$err" ||
  rc=$?
refused "a lock held elsewhere" 2 "busy is in use by another process (host otherhost, pid 4242"
check "the refused job changed nothing" test "$(state busy)" == "$before"

# ---- branches: roll back to step 40 of 60, then --resume auto follows the branch
run br 1 --steps 60 --log-every 10 --checkpoint-every 10 --keep-checkpoints 3
run br 1 --steps 45 --log-every 5 --checkpoint-every 10 --keep-checkpoints 3 \
  --resume br/checkpoints/step_00000040.h5
check "the rollback trains (exit $rc)" test "$rc" -eq 0
check "the rollback reports the branch" grep -q "^a new branch from step 40: 2 later checkpoint(s) (steps 50 to 60) and a copy of metrics.h5 moved to br/abandoned/" "$out"
check "later checkpoints moved, not deleted" test "$(ls br/abandoned/*/ | tr '\n' ' ')" == "config.ini metrics.h5 step_00000050.h5 step_00000060.h5 "
check "latest follows the branch" test "$(cat br/checkpoints/latest)" == step_00000045.h5
check "metrics.h5 follows the branch" test "$("$bin" inspect br/metrics.h5 | awk '/^\/train/{on=1;next} /^\/eval/{on=0} on && $1 ~ /^[0-9]/ {print $1}' | tail -n 1)" == 45
run br 1 --steps 50 --log-every 5 --resume auto
check "--resume auto continues the branch" says "$out" "resumed from br/checkpoints: step 45"

# ---- stop signals
long=(--steps 100000 --log-every 10 --eval-every 0)
# wait_for_step LOG: until a progress line shows (or 30 s)
wait_for_step() {
  for _ in $(seq 300); do
    grep -q "^step [1-9][0-9]*0/" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
}
# stopped WHAT NAME SIGNAL: the ranks' stop line and its checkpoint
stopped() {
  local what=$1 name=$2 signal=$3 step
  step=$(sed -n "s/^stopped by $signal after step \([0-9]*\);.*(exit code 75)$/\1/p" "$name.out")
  if [[ -n $step && -e $name/checkpoints/$(printf 'step_%08d.h5' "$step") ]]; then
    echo "PASS: $what: stopped by $signal after step $step with its checkpoint"
  else
    fail "$what: no stop line or checkpoint ($(tail -n 2 "$name.out" | tr '\n' ' '))"
  fi
}
# signal_run NAME SIGNAL WHOM CMD...: starts CMD (output in NAME.out and
# NAME.err), sends SIGNAL at its first progress line to the process started
# (WHOM = it) or to its last child (WHOM = rank, one rank under mpirun), and
# waits; the exit code is in $rc.
signal_run() {
  local name=$1 signal=$2 whom=$3 started
  shift 3
  "$@" >"$name.out" 2>"$name.err" &
  started=$!
  wait_for_step "$name.out"
  if [[ $whom == rank ]]; then
    kill -"$signal" "$(pgrep -P "$started" | tail -n 1)"
  else
    kill -"$signal" "$started"
  fi
  rc=0
  wait "$started" || rc=$?
}
# SIGINT (Ctrl-C) and SIGTERM to one process of one rank
for signal in INT TERM; do
  signal_run "one-$signal" "$signal" it "$bin" train "${model[@]}" "${long[@]}" --out "one-$signal"
  check "SIG$signal to a single rank exits 75 (got $rc)" test "$rc" -eq 75
  stopped "SIG$signal to a single rank" "one-$signal" "SIG$signal"
done
# SIGINT to one rank of two: both stop at the same step
signal_run two-int INT rank "${mpirun[@]}" -np 2 "$bin" train "${model[@]}" "${long[@]}" --out two-int
check "SIGINT to one rank of two exits 75 (got $rc)" test "$rc" -eq 75
stopped "SIGINT to one rank of two" two-int SIGINT
# SIGTERM and SIGINT to mpirun: it stops forwarding output, passes SIGTERM
# to the ranks after odls_base_sigkill_timeout and kills them after as long
# again; the ranks stop and write their checkpoint inside that window (their
# stop line is lost with mpirun's output). mpirun exits 1.
for signal in TERM INT; do
  name=mpirun-$signal
  signal_run "$name" "$signal" it env OMPI_MCA_odls_base_sigkill_timeout=3 "${mpirun[@]}" -np 2 \
    "$bin" train "${model[@]}" "${long[@]}" --out "$name"
  check "SIG$signal to mpirun: mpirun's own exit code 1 (got $rc)" test "$rc" -eq 1
  latest=$(cat "$name/checkpoints/latest" 2>/dev/null || true)
  if [[ -n $latest && -e $name/checkpoints/$latest ]]; then
    echo "PASS: SIG$signal to mpirun: the ranks stopped with a checkpoint ($latest)"
    run "$name" 1 --resume auto --steps "$((10#${latest//[^0-9]/} + 1))"
    check "SIG$signal to mpirun: it resumes" says "$out" "resumed from $name/checkpoints"
  else
    fail "SIG$signal to mpirun: no checkpoint was written"
  fi
done
# slurm/run-step.sh with mpirun as the launcher: TERM to the job script
# becomes USR1 for mpirun, and the step ends with 75 (no SLURM needed)
MPIFORMER_LAUNCH="${mpirun[*]} -np 2" MPIFORMER_BIN=$bin \
  bash -c 'source "$0"; mpiformer_run "$@"' "$src_root/slurm/run-step.sh" step \
  "${base[@]}" --d-model 32 --max-tokens 256 "${long[@]}" >step.out 2>&1 &
script=$!
wait_for_step step.out
kill -TERM "$script"
rc=0
wait "$script" || rc=$?
check "run-step.sh under TERM with mpirun ends with 75 (got $rc)" test "$rc" -eq 75
check "run-step.sh says so" says step.out "==> stopped with a checkpoint (exit 75); run again to resume"

# ---- a full disk or a file size limit: one line, exit 1, no signal, the
# previous state intact. A checkpoint is about 470 KB at --d-model 32 and
# 900 KB at 64; its writer first sets aside about 840 KB and 1.2 MB.
# after_write_fault WHAT DIR REASON: the run in DIR has step 2's checkpoint
# (state in $before) and its next one just failed.
after_write_fault() {
  local what=$1 dir=$2 reason=$3
  refused "$what: the next checkpoint" 1 \
    "$dir/checkpoints/step_00000004.h5: cannot write" "($reason)"
  check "$what: no signal (exit $rc)" test "$rc" -lt 128
  check "$what: latest still names step 2" test "$(cat "$dir/checkpoints/latest")" == step_00000002.h5
  check "$what: step 2 intact, nothing else left" \
    test "$(state "$dir" | grep checkpoints/)" == "$(echo "$before" | grep checkpoints/)"
}
if mkdir -p full && mount -t tmpfs -o size=1100k tmpfs full 2>/dev/null; then
  rc=0
  "$bin" train "${base[@]}" --d-model 64 --max-tokens 256 --threads 1 --steps 2 --out full/fresh \
    >"$out" 2>"$err" ||
    rc=$?
  refused "a full disk: the first checkpoint" 1 \
    "full/fresh/checkpoints/step_00000002.h5: cannot write" "(No space left on device)"
  check "a full disk: no temporary file is left" test -z "$(ls full/fresh/checkpoints)"
  rm -rf full/fresh
  grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >gpl.txt
  rc=0
  "$bin" prepare --input gpl.txt --out full/shards --vocab-size 200 --shards 8 >"$out" 2>"$err" ||
    rc=$?
  refused "a full disk: prepare" 1 "full/shards/" "(No space left on device)"
  check "a full disk: prepare leaves nothing" test ! -e full/shards
  run full/run 1 --steps 2
  before=$(state full/run)
  run full/run 1 --steps 6 --checkpoint-every 2 --resume auto
  after_write_fault "a full disk" full/run "No space left on device"
  umount full
else
  echo "SKIP: a full tmpfs needs root to mount; the file size limit below takes the same path"
fi
# A file size limit (ulimit -f, SIGXFSZ ignored): writes fail with EFBIG.
# 4 MiB leaves MPI its shared-memory files; a checkpoint at --d-model 256
# is about 7 MB.
model=("${base[@]}" --d-model 256 --max-tokens 256 --threads 1)
run limited 1 --steps 2
before=$(state limited)
(
  failures=0
  trap '' XFSZ
  ulimit -f 4096
  run limited 1 --steps 6 --checkpoint-every 2 --resume auto
  after_write_fault "a file size limit" limited "File too large"
  exit "$failures"
) || failures=$((failures + $?))
model=("${base[@]}" --d-model 32 --max-tokens 256 --threads 1)

# ---- memory: refused from the flags before anything is allocated
rc=0
"$bin" train "${base[@]}" --d-model 32 --threads 1 --steps 2 --max-tokens 100000000 --out huge \
  >"$out" 2>"$err" || rc=$?
refused "train --max-tokens 1e8" 2 "mpiformer train: the model needs about" \
  "of host memory available to each of 1 rank(s) on this node; lower --max-tokens"
check "the refused run left no run directory files" test -z "$(ls -A huge 2>/dev/null)"
rc=0
"$bin" train "${base[@]}" --d-model 100000 --max-tokens 256 --threads 1 --steps 2 --out huge \
  >"$out" 2>"$err" || rc=$?
refused "train --d-model 100000" 2 "parameters: weights" "lower --max-tokens, --d-model"
rc=0
"$bin" train --model lm --synthetic copy --layers 2 --heads 2 --d-ff 64 --d-model 32 \
  --max-len 1000000 --max-tokens 1000000 --threads 1 --steps 2 --out huge >"$out" 2>"$err" || rc=$?
refused "train --max-len 1e6 (its attention scores)" 2 "attention scratch" "lower --max-tokens"
check "a run prints its estimate" grep -q "^  memory: about .* per rank$" div.out
rc=0
"$bin" generate --checkpoint "$good" --prompt "3 4" --beam 60000000 \
  >"$out" 2>"$err" || rc=$?
refused "generate --beam 6e7" 2 "mpiformer generate: --beam: decoding needs about" "lower --beam"
rc=0
"$bin" generate --checkpoint "$good" --prompt "3 4" --beam 100000000 \
  >"$out" 2>"$err" || rc=$?
refused "generate --beam 1e8" 2 "--beam: 100000000 beams of max-len 32 are 3200000000 tokens"

# ---- hand-edited checkpoint attributes are refused
for edit in "optimizer_steps:-1" "data_next_batch:1152921504606846976" "loss_scale:nan"; do
  name=${edit%%:*} value=${edit#*:}
  rm -rf edited && mkdir -p edited/checkpoints
  cp "$good" good/checkpoints/latest edited/checkpoints/
  python3 - "$name" "$value" <<'EOF'
import sys, h5py, numpy as np
name, value = sys.argv[1], sys.argv[2]
with h5py.File("edited/checkpoints/step_00000008.h5", "r+") as f:
    old = f.attrs[name]
    f.attrs.modify(name, np.array(float(value) if name == "loss_scale" else int(value), dtype=old.dtype))
EOF
  rc=0
  "$bin" train "${model[@]}" --steps 10 --resume edited/checkpoints/step_00000008.h5 --out edited \
    >"$out" 2>"$err" || rc=$?
  refused "$name = $value" 2 "attribute '$name' = "
done

# ---- resuming with another --max-tokens says the order changes
model=("${base[@]}" --d-model 32 --max-tokens 384 --threads 1)
run good 1 --steps 10 --resume auto
check "another --max-tokens on resume is noted" says "$out" "note: --max-tokens 384 (was 256)"

exit_on_failures
echo "all fault checks passed"
