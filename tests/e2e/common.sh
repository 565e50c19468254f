# Shared by the end-to-end tests: run the trainer and read its final figures.
# Usage from a test: source common.sh; then `train_and_check ... `.
# Under pipefail a reader that stops early (head, grep -q) fails its pipeline
# whenever the writer is still writing (SIGPIPE): read to the end (sed -n 1p).
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# The suite's figures are the CPU's: --device auto, every command's default,
# finds no GPU (scripts/gpu-check checks the GPU). MPIFORMER_TEST_GPU=1
# leaves a GPU machine's GPUs visible.
[[ ${MPIFORMER_TEST_GPU:-0} == 1 ]] || export CUDA_VISIBLE_DEVICES=
# analysis/ for Python snippets that edit a checkpoint or shard and seal the
# edited datasets' CRC-32C (`from mpiformer_checksum import seal`).
export PYTHONPATH=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/analysis${PYTHONPATH:+:$PYTHONPATH}

# run_logged LOG CMD...: runs CMD, keeps its output in LOG and on stdout.
run_logged() {
  local log=$1
  shift
  echo "+ $*"
  "$@" 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}

# final_accuracy LOG: the accuracy (percent) of the "final eval" line.
final_accuracy() {
  sed -n 's/^final eval .*| acc \([0-9.]*\)%.*/\1/p' "$1" | tail -n 1
}

# expect_at_least NAME VALUE MIN
expect_at_least() {
  if awk -v v="$2" -v m="$3" 'BEGIN { exit !(v != "" && v + 0 >= m + 0) }'; then
    echo "PASS: $1 = $2 (>= $3)"
  else
    echo "FAIL: $1 = '$2', expected >= $3" >&2
    exit 1
  fi
}

# fail MESSAGE: records a failed check of a test that checks many cases and
# shows the output of the command it ran (files $out and $err); the test
# counts $failures and exits non-zero at the end.
fail() {
  echo "FAIL: $*" >&2
  echo "  stdout: $(head -c 2000 "$out")" >&2
  echo "  stderr: $(head -c 2000 "$err")" >&2
  failures=$((failures + 1))
}

# exit_on_failures: at the end of such a test, exits 1 with the count of
# failed checks when there was any.
exit_on_failures() {
  if [[ ${failures:-0} -gt 0 ]]; then
    echo "$failures check(s) failed" >&2
    exit 1
  fi
}

# check WHAT CMD...: CMD succeeds, or a failure is recorded.
check() {
  local what=$1
  shift
  if "$@"; then echo "PASS: $what"; else fail "$what"; fi
}

# expect_one_line_error WHAT EXPECTED NEEDLE...: the command just run (exit
# code in $rc, stderr in $err) failed with EXPECTED ("nonzero": any failure)
# and printed exactly one line on stderr holding every NEEDLE. Records a
# failure and returns 1 otherwise.
expect_one_line_error() {
  local what=$1 expected=$2
  shift 2
  if [[ $expected == nonzero && $rc -eq 0 ]] || [[ $expected != nonzero && $rc -ne $expected ]]; then
    fail "$what: exit code $rc, expected $expected"
    return 1
  fi
  local lines
  lines=$(wc -l <"$err")
  if [[ $lines -ne 1 ]]; then
    fail "$what: $lines lines on stderr, expected 1"
    return 1
  fi
  local needle
  for needle in "$@"; do
    if ! grep -qF -- "$needle" "$err"; then
      fail "$what: stderr does not say '$needle'"
      return 1
    fi
  done
}

# try CMD...: runs CMD under a time limit of $try_seconds (60 unless the
# test sets it) and, when the test sets $try_memory_kb, an address-space
# limit (a reader that believes a size fails fast instead of swapping);
# stdout and stderr in $out and $err, the exit code in $rc. A hang is a
# failure, never a wait.
# With FAULT_TABLE set, each call adds a line to that file: the command,
# exit code, seconds and first line of stderr (the table of a fault note).
try() {
  rc=0
  local started=$EPOCHREALTIME
  (
    if [[ -n ${try_memory_kb:-} ]]; then
      ulimit -v "$try_memory_kb"
      # What a process reserves grows with the cores the host shows: a 64 MB
      # malloc arena per contending thread, an OpenBLAS buffer per core at
      # load (and OpenBLAS spins forever when that load-time buffer is
      # refused). Pinned, the limit measures the program, not the host.
      export MALLOC_ARENA_MAX=2 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    fi
    # A program that ignores SIGTERM (it stops at a step's end) and hangs
    # mid-step is killed 10 s later: 137 after the whole limit.
    exec timeout -k 10 "${try_seconds:-60}" "$@"
  ) >"$out" 2>"$err" || rc=$?
  local whole=$(((${EPOCHREALTIME/./} - ${started/./}) / 1000000 >= ${try_seconds:-60}))
  if [[ $rc -eq 124 || ($rc -eq 137 && $whole -eq 1) ]]; then
    fail "$*: hung (killed after ${try_seconds:-60} s)"
  fi
  if [[ -n ${FAULT_TABLE:-} ]]; then
    local seconds
    seconds=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    printf '%s | %s | exit %s | %s s | %s\n' "$(basename "$0" .sh)" "$*" "$rc" "$seconds" \
      "$(sed -n 1p "$err" | cut -c1-200)" >>"$FAULT_TABLE"
  fi
}

# not_in NEEDLE FILE: FILE does not hold NEEDLE (a fixed string).
not_in() { ! grep -qF -- "$1" "$2"; }

# refused WHAT EXPECTED NEEDLE...: expect_one_line_error that goes on after a
# failure, so that one run of a test of many cases shows every case failing.
refused() { expect_one_line_error "$@" || true; }

# as_version_1 METRICS: turns a metrics.h5 into one of format version 1, as
# runs made before the nll, elapsed_s, epoch, comm_wait_ms and hidden_share
# columns left them.
as_version_1() {
  python3 - "$1" <<'PY'
import sys

import h5py

with h5py.File(sys.argv[1], "r+") as f:
    for name in ("train/nll", "train/elapsed_s", "train/epoch", "train/comm_wait_ms",
                 "train/hidden_share", "eval/nll", "eval/elapsed_s"):
        if name in f:
            del f[name]
    f.attrs["version"] = 1
PY
}

# without_label_columns RUNDIR: drops the six label figures of a multi-label
# classifier (micro/macro precision, recall, F1) from RUNDIR/metrics.h5 and
# RUNDIR/metrics.jsonl (where they are), as the metrics of a run that is not
# a multi-label classifier may come without them.
without_label_columns() {
  python3 - "$1" <<'PY'
import json
import os
import sys

import h5py

LABELS = ("micro_precision", "micro_recall", "micro_f1", "macro_precision", "macro_recall",
          "macro_f1")
with h5py.File(os.path.join(sys.argv[1], "metrics.h5"), "r+") as f:
    for group in ("train", "eval"):
        for name in LABELS:
            if name in f[group]:
                del f[f"{group}/{name}"]
path = os.path.join(sys.argv[1], "metrics.jsonl")
if os.path.exists(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    with open(path, "w") as out:
        for row in rows:
            out.write(json.dumps({k: v for k, v in row.items() if k not in LABELS}) + "\n")
PY
}

# is_png FILE WIDTH HEIGHT: FILE is a PNG of that size with ink (not blank).
is_png() {
  python3 - "$@" <<'PY'
import struct
import sys

import matplotlib.image as image

path, want = sys.argv[1], (int(sys.argv[2]), int(sys.argv[3]))
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
size = struct.unpack(">II", data[16:24])
assert size == want, f"{path}: size {size[0]}x{size[1]}, expected {want[0]}x{want[1]}"
pixels = image.imread(path)
assert pixels.std() > 0.05, f"{path}: nearly blank: pixel std {pixels.std():.3f}"
PY
}

# holds_only DIR NAMES...: DIR holds exactly these files (no temporaries);
# a failed check is counted by fail.
holds_only() {
  local dir=$1
  shift
  local want got
  want=$(printf '%s\n' "$@" | sort | tr '\n' ' ')
  got=$(find "$dir" -mindepth 1 -printf '%f\n' | sort | tr '\n' ' ')
  if [[ $got == "$want" ]]; then
    echo "PASS: $dir holds $got"
  else
    fail "$dir holds [$got], expected [$want]"
  fi
}

# same FILE1 FILE2 WHAT: equal files, or the first differences and a failure.
same() {
  if cmp -s "$1" "$2"; then
    echo "PASS: $3 ($(wc -l <"$1") lines)"
  else
    diff "$1" "$2" | sed -n 1,10p >&2 || true
    fail "$3: $1 and $2 differ"
  fi
}

# Finding a run's processes. Tests find them by their parents (pgrep -P:
# the launcher, mpirun, a slurmstepd) or by the file they execute, never by
# name alone: a new start for OpenBLAS's kernels (kernels/cpu/
# program_restart.h) keeps the pid and the binary, and must keep the name,
# which is what process_names checks.

# executing BIN PID...: those of the PIDs whose process executes BIN (the
# same file, through whatever path or name it was started).
executing() {
  local bin=$1 pid
  shift
  for pid in "$@"; do
    [[ /proc/$pid/exe -ef $bin ]] && echo "$pid"
  done
  return 0
}

# process_names PID...: each PID's name as the kernel holds it
# (/proc/PID/comm: what ps, top, pgrep and process accounting show), one
# line each.
process_names() {
  local pid
  for pid in "$@"; do
    cat "/proc/$pid/comm" 2>/dev/null || echo "(gone)"
  done
}

# another_blas_core BIN: a kernel family other than the one OpenBLAS loads
# here by itself, which every CPU of this kind runs: --blas-core with it
# always makes mpiformer start again.
another_blas_core() {
  local loaded
  loaded=$(env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2 "$1" --version 2>&1 |
    sed -n 's/^Core: //p' | sed -n 1p)
  if [[ ${loaded,,} == sandybridge ]]; then echo Haswell; else echo Sandybridge; fi
}
