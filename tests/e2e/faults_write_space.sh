#!/usr/bin/env bash
# A write that cannot finish never hangs a job, on 1, 2 or 3 ranks. Every
# rank ends within seconds, exit 1, with one line naming the file and the
# cause, and what was on disk stays as it was:
#   train into a full tmpfs (replicated and --shard-optimizer): the second
#     checkpoint fails, `latest` still names the first, which is intact, and
#     no temporary is left;
#   train under a file size limit (ulimit -f) with SIGXFSZ at its default:
#     no signal, "File too large", no checkpoint and no temporary;
#   train whose metrics.h5 fills the disk;
#   prepare and average into a full tmpfs: nothing left behind;
#   a device error (EIO) in the middle of a checkpoint's collective write on
#     a non-root rank, of metrics.h5, of a shard and of an average
#     (tests/eio_shim.cpp): the same.
# Before the collective writer set its disk aside first, two ranks waited on
# each other inside HDF5 for ever. Prints a table: case, exit code, seconds,
# first line of stderr, what is on disk afterwards.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
umount "$work/full" 2>/dev/null || true  # left by an interrupted run
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt
mpirun=("${MPIEXEC:-mpirun}" -q)
try_seconds=60
mkdir -p full
if ! mount -t tmpfs -o size=4m tmpfs full 2>/dev/null; then
  echo "SKIP: mounting a small tmpfs needs root"
  exit 77
fi
trap 'umount "$work/full" 2>/dev/null || true' EXIT

model=(--model lm --synthetic copy --layers 2 --heads 2 --d-ff 64 --max-len 32 --eval-batches 2
  --max-tokens 256 --threads 1)
table=()

# launcher N: sets $launch to what runs a command on N ranks (nothing for 1).
launcher() {
  launch=()
  [[ $1 == 1 ]] || launch=("${mpirun[@]}" -np "$1")
}

# timed CASE N CMD...: `try` of CMD on N ranks; adds a row to the table
# (the disk's state is added by the caller as $disk).
timed() {
  local name=$1 ranks=$2
  shift 2
  local start=$SECONDS
  launcher "$ranks"
  try "${launch[@]}" "$@"
  elapsed=$((SECONDS - start))
  row="$name | np $ranks | exit $rc | ${elapsed} s | $(sed -n 1p "$err")"
}

# reads_whole FILE: every dataset of the HDF5 FILE reads, its checksums verified.
reads_whole() {
  python3 - "$1" <<'PY'
import sys

import h5py

with h5py.File(sys.argv[1], "r") as f:
    f.visititems(lambda name, obj: obj[()] if isinstance(obj, h5py.Dataset) else None)
PY
}

# listing DIR: the names in DIR, one line.
listing() { { ls -A "$1" 2>/dev/null || true; } | tr '\n' ' '; }

# fresh SIZE: an empty tmpfs of SIZE at full/.
fresh() {
  umount full
  mount -t tmpfs -o "size=$1" tmpfs full
}

# ---- checkpoints: the first fits (d-model 128: about 1.6 MB), the second not
for ranks in 1 2 3; do
  for sharded in false true; do
    [[ $ranks == 1 && $sharded == true ]] && continue
    fresh 4m
    name="train, full disk, --shard-optimizer $sharded"
    timed "$name" "$ranks" "$bin" train "${model[@]}" --d-model 128 --steps 40 \
      --checkpoint-every 2 --shard-optimizer "$sharded" --out full/run
    refused "$name, np $ranks" 1 "full/run/checkpoints/step_00000004.h5: cannot write" \
      "(No space left on device)"
    check "$name, np $ranks: latest names step 2" \
      test "$(cat full/run/checkpoints/latest 2>/dev/null)" == step_00000002.h5
    check "$name, np $ranks: step 2 and latest, no temporary" \
      test "$(listing full/run/checkpoints)" == "latest step_00000002.h5 "
    check "$name, np $ranks: step 2 reads whole (checksums)" \
      reads_whole full/run/checkpoints/step_00000002.h5
    table+=("$row | $(listing full/run/checkpoints)")
  done
done

# ---- a file size limit, SIGXFSZ at its default (d-model 256: about 7 MB)
for ranks in 1 2 3; do
  rm -rf limited
  name="train, ulimit -f 4096"
  (
    ulimit -f 4096
    trap - XFSZ
    start=$SECONDS
    launcher "$ranks"
    try "${launch[@]}" "$bin" train "${model[@]}" --d-model 256 --steps 2 --out limited
    echo "$rc $((SECONDS - start))" >limited.rc
  )
  read -r rc elapsed <limited.rc
  refused "$name, np $ranks" 1 "limited/checkpoints/step_00000002.h5: cannot write" \
    "(File too large)"
  check "$name, np $ranks: no signal (exit $rc)" test "$rc" -lt 128
  check "$name, np $ranks: no checkpoint, no temporary" test -z "$(listing limited/checkpoints)"
  table+=("$name | np $ranks | exit $rc | ${elapsed} s | $(sed -n 1p "$err") | $(listing limited/checkpoints)")
done

# ---- metrics.h5 fills the disk (no checkpoint is due)
for ranks in 1 2 3; do
  fresh 40k
  name="train, metrics fill the disk"
  timed "$name" "$ranks" "$bin" train "${model[@]}" --d-model 32 --steps 3000 \
    --checkpoint-every 100000 --out full/run
  refused "$name, np $ranks" 1 "full/run/metrics" "(No space left on device)"
  table+=("$row | $(listing full/run)")
done

# ---- prepare: the shards do not fit
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >gpl.txt
for _ in 1 2 3 4 5; do cat gpl.txt; done >corpus.txt
for ranks in 1 2 3; do
  fresh 300k
  name="prepare, full disk"
  timed "$name" "$ranks" "$bin" prepare --input corpus.txt --out full/shards --vocab-size 200 \
    --shards 8
  refused "$name, np $ranks" 1 "full/shards/" "(No space left on device)"
  check "$name, np $ranks: nothing left" test -z "$(listing full)"
  table+=("$row | $(listing full)")
done

# ---- average: the averaged checkpoint does not fit
timeout 120 "$bin" train "${model[@]}" --d-model 128 --steps 4 --checkpoint-every 2 --out run \
  >"$out" 2>"$err" || fail "training the run to average"
for ranks in 1 2 3; do
  fresh 1m
  name="average, full disk"
  timed "$name" "$ranks" "$bin" average --run run --last 2 --out full/averaged.h5
  refused "$name, np $ranks" 1 "full/averaged.h5" "(No space left on device)"
  check "$name, np $ranks: nothing left" test -z "$(listing full)"
  table+=("$row | $(listing full)")
done

# ---- a device error (EIO) in the middle of a write, on a non-root rank
# where there are several (tests/eio_shim.cpp, preloaded): the collective
# checkpoint, metrics.h5, prepare's shards, average's output
shim=$(dirname "$bin")/tests/libeio_shim.so
[[ -f $shim ]] || fail "no $shim"
# eio MATCH AFTER RANK NAME N CMD...: `timed` with writes to files whose path
# holds MATCH failing with EIO after AFTER bytes on rank RANK.
eio() {
  local match=$1 after=$2 rank=$3
  shift 3
  MPIFORMER_EIO_MATCH=$match MPIFORMER_EIO_AFTER=$after MPIFORMER_EIO_RANK=$rank \
    LD_PRELOAD=$shim timed "$@"
}
for ranks in 1 2 3; do
  for sharded in false true; do
    [[ $ranks == 1 && $sharded == true ]] && continue
    rm -rf eio-run
    name="train, EIO in a checkpoint, --shard-optimizer $sharded"
    eio step_00000004.h5.tmp 100000 $((ranks - 1)) "$name" "$ranks" "$bin" train "${model[@]}" \
      --d-model 128 --steps 6 --checkpoint-every 2 --shard-optimizer "$sharded" --out eio-run
    refused "$name, np $ranks" 1 "eio-run/checkpoints/step_00000004.h5: cannot write" \
      "(Input/output error)"
    check "$name, np $ranks: step 2 and latest naming it, no temporary" \
      test "$(listing eio-run/checkpoints) $(cat eio-run/checkpoints/latest)" == \
      "latest step_00000002.h5  step_00000002.h5"
    check "$name, np $ranks: step 2 reads whole (checksums)" \
      reads_whole eio-run/checkpoints/step_00000002.h5
    table+=("$row | $(listing eio-run/checkpoints)")
  done
  rm -rf eio-run
  name="train, EIO in metrics.h5"
  eio eio-run/metrics.h5 60000 0 "$name" "$ranks" "$bin" train "${model[@]}" --d-model 32 \
    --steps 3000 --checkpoint-every 100000 --out eio-run
  refused "$name, np $ranks" 1 "eio-run/metrics.h5" "(Input/output error)"
  table+=("$row | $(listing eio-run)")
  rm -rf eio-shards
  name="prepare, EIO in a shard"
  eio eio-shards/train- 20000 $((ranks - 1)) "$name" "$ranks" "$bin" prepare --input corpus.txt \
    --out eio-shards --vocab-size 200 --shards 8
  refused "$name, np $ranks" 1 "eio-shards/" "(Input/output error)"
  check "$name, np $ranks: nothing left" test -z "$(listing eio-shards)"
  table+=("$row | $(listing eio-shards)")
  rm -f eio-averaged.h5
  name="average, EIO in its output"
  eio eio-averaged.h5 100000 0 "$name" "$ranks" "$bin" average --run run --last 2 \
    --out eio-averaged.h5
  refused "$name, np $ranks" 1 "eio-averaged.h5" "(Input/output error)"
  left=$(ls eio-averaged.h5* 2>/dev/null || true)
  check "$name, np $ranks: nothing left" test -z "$left"
  table+=("$row | $left")
done

# ---- an address-space limit (ulimit -v), from below what the libraries map
# to what a run needs: OpenBLAS's start never spins, and a run that starts
# writes its checkpoints (their buffers are in the estimate). Each ends with
# its checkpoints, or one line before training (127: the loader's own line).
# With two CPU threads the second maps its own BLAS buffer and malloc arena
# when it first multiplies, which the estimate sets aside: under a limit
# that leaves no room for them OpenBLAS would retry for ever, mid-step.
threaded=("${model[@]}")
threaded[${#threaded[@]} - 1]=2 # the last flag is --threads 1
limited_train() {
  local limit_mb=$1 threads=$2 name="train, ulimit -v $1 MiB"
  local -n flags=$3
  [[ $threads == 1 ]] || name+=", --threads $threads"
  rm -rf small
  (
    ulimit -v $((limit_mb * 1024))
    unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS
    start=$SECONDS
    try "$bin" train "${flags[@]}" --d-model 64 --steps 4 --checkpoint-every 2 --out small
    echo "$rc $((SECONDS - start))" >small.rc
  )
  read -r rc elapsed <small.rc
  if [[ $rc == 0 ]]; then
    check "$name: both checkpoints" test "$(listing small/checkpoints)" == \
      "latest step_00000002.h5 step_00000004.h5 "
  else
    refused "$name" nonzero ""
    check "$name: refused before training" not_in "step " "$out"
  fi
  table+=("$name | np 1 | exit $rc | ${elapsed} s | $(sed -n 1p "$err" | cut -c1-160) | $(listing small/checkpoints)")
}
for limit_mb in 1100 1200 1300 1400 1500 1600 1700 1800; do
  limited_train $limit_mb 1 model
done
for limit_mb in 1600 1700 1800 2000; do
  limited_train $limit_mb 2 threaded
done

echo "case | ranks | exit | time | first line | on disk afterwards"
printf '%s\n' "${table[@]}"
exit_on_failures
