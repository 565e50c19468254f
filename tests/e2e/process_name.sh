#!/usr/bin/env bash
# A run keeps its name when it starts again for OpenBLAS's kernels
# (kernels/cpu/program_restart.h): /proc/PID/comm and `ps -o comm` read
# mpiformer (the binary's own name, cut to 15 characters), argv[0] is what
# the user typed, and the process executes the binary it was started from:
# - --blas-core with a family other than the one OpenBLAS loads here,
#   which always starts again: from the build path, through PATH, through
#   a symlink of another name, as a copy with a long name, on both ranks
#   under mpirun;
# - the binary replaced at its path before the new start: the running
#   binary starts again, still named mpiformer;
# - auto through a new start on any machine (MPIFORMER_BLAS_RESTART_ALWAYS=1,
#   as where OpenBLAS falls back to generic kernels), the default (a new
#   start only there) and OPENBLAS_CORETYPE=Haswell (never a new start).
# The srun case is in e2e.slurm.
source "$(dirname "$0")/common.sh"
bin=$(realpath "$1") work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out err=$work/err
# Each case sets what it needs.
unset OPENBLAS_CORETYPE MPIFORMER_BLAS_RESTART_ALWAYS

other=$(another_blas_core "$bin")
echo "--blas-core $other starts again here"

train=(train --model lm --synthetic copy --layers 1 --d-model 16 --heads 2 --d-ff 32
  --max-len 16 --max-tokens 64 --steps 1000000 --log-every 10 --eval-every 1000000
  --checkpoint-every 1000000 --threads 1)

# start_run NAME CMD...: starts CMD in the background (stdout $out, stderr
# $err) and waits for its first progress line; $started is its pid.
start_run() {
  local name=$1
  shift
  out=$work/$name.out err=$work/$name.err
  "$@" >"$out" 2>"$err" &
  started=$!
  wait_for_progress "$name"
}

# wait_for_progress NAME: the first progress line of the run $started.
wait_for_progress() {
  for _ in $(seq 600); do
    grep -q "^step [0-9]*/" "$out" && return 0
    kill -0 "$started" 2>/dev/null || break
    sleep 0.1
  done
  fail "$1: no progress line"
  return 1
}

# stop_run: SIGTERM to the run started (a checkpoint, exit 75), SIGKILL
# should it not end within 60 s.
stop_run() {
  kill -TERM "$started" 2>/dev/null || true
  for _ in $(seq 600); do
    kill -0 "$started" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$started" 2>/dev/null || true
  wait "$started" 2>/dev/null || true
}

# argv0 PID: the first argument the process holds, as typed.
argv0() { tr '\0' '\n' <"/proc/$1/cmdline" | sed -n 1p; }

# identity WHAT NAME ARGV0 BINARY PID...: each process is named NAME (by
# the kernel and by ps), holds ARGV0 and executes BINARY (unless "").
identity() {
  local what=$1 name=$2 typed=$3 binary=$4 pid
  shift 4
  # A failure shows what ps sees, not the run's output.
  local out=$work/ps.txt err=/dev/null
  ps -o pid=,comm=,args= -p "$(IFS=,; echo "${*:-1}")" >"$out" || true
  check "$what: $# process(es)" test "$#" -gt 0
  for pid in "$@"; do
    check "$what: /proc/$pid/comm is '$name' ($(process_names "$pid"))" \
      test "$(process_names "$pid")" == "$name"
    check "$what: ps -o comm shows '$name'" test "$(ps -o comm= -p "$pid")" == "$name"
    check "$what: argv[0] is '$typed' ($(argv0 "$pid"))" test "$(argv0 "$pid")" == "$typed"
    [[ -z $binary ]] || check "$what: it executes $binary" test "/proc/$pid/exe" -ef "$binary"
  done
}

# started_again WHAT: the start line names the family --blas-core asked
# for, which OpenBLAS loads only in a new start.
started_again() {
  check "$1: started again on $other kernels" \
    grep -q "^  BLAS: OpenBLAS [0-9.]*, $other kernels (--blas-core $other)" "$out"
}

# ---- a new start on every machine: --blas-core names another family
if start_run built "$bin" "${train[@]}" --out built --blas-core "$other"; then
  started_again "build path"
  identity "build path" mpiformer "$bin" "$bin" "$started"
fi
stop_run

if start_run path env PATH="$(dirname "$bin"):$PATH" mpiformer "${train[@]}" --out path \
  --blas-core "$other"; then
  started_again "through PATH"
  identity "through PATH" mpiformer mpiformer "$bin" "$started"
fi
stop_run

ln -s "$bin" lm-trainer
if start_run symlink ./lm-trainer "${train[@]}" --out symlink --blas-core "$other"; then
  started_again "through a symlink"
  identity "through a symlink named lm-trainer" mpiformer ./lm-trainer "$bin" "$started"
fi
stop_run

long=$work/mpiformer-with-a-long-name
cp "$bin" "$long"
if start_run long "$long" "${train[@]}" --out long --blas-core "$other"; then
  started_again "a long name"
  identity "a copy named ${long##*/}" mpiformer-with- "$long" "$long" "$started"
fi
stop_run

if start_run mpirun mpirun -np 2 "$bin" "${train[@]}" --out mpirun --blas-core "$other"; then
  started_again "mpirun -np 2"
  # mpirun's children are the ranks.
  ranks=$(executing "$bin" $(pgrep -P "$started"))
  check "mpirun -np 2: two ranks ($(echo $ranks))" test "$(echo "$ranks" | wc -w)" -eq 2
  identity "mpirun -np 2" mpiformer "$bin" "$bin" $ranks
fi
stop_run

# ---- the binary replaced before the new start (a rebuild while a job
# starts): the running binary starts again, not the file now at its path,
# and keeps its name. gdb stops the first start where it reads its own path.
doomed=$work/doomed/mpiformer
mkdir -p "$work/doomed" && cp "$bin" "$doomed"
out=$work/doomed.out err=$work/doomed.err
timeout 120 gdb -batch -nx \
  -ex 'set breakpoint pending on' -ex 'break readlink if $_streq((char*)$rdi, "/proc/self/exe")' \
  -ex run -ex "shell rm $doomed && cp $(command -v true) $doomed" -ex 'catch exec' \
  -ex continue -ex detach --args "$doomed" "${train[@]}" --out "$work/doomed-run" \
  --blas-core "$other" >"$out" 2>"$err" || true
# Detached, the run goes on writing to $out.
started=$(pgrep -f -- "--out $work/doomed-run " || true)
if grep -q "ptrace: Operation not permitted" "$out" "$err"; then
  echo "SKIP: the binary replaced before the new start: gdb may not trace here"
else
  what="the binary replaced before the new start"
  check "$what: the run goes on ($started)" test -n "$started"
  if [[ -n $started ]] && wait_for_progress "$what"; then
    identity "$what" mpiformer "$doomed" "" "$started"
    check "$what: it runs the binary that started, now removed, not the new file" \
      grep -q "^$doomed (deleted)\$" <(readlink "/proc/$started/exe")
  fi
fi
[[ -z $started ]] || stop_run

# ---- auto, as on a machine where OpenBLAS falls back: a new start that
# keeps the family (MPIFORMER_BLAS_RESTART_ALWAYS=1)
if start_run always env MPIFORMER_BLAS_RESTART_ALWAYS=1 "$bin" "${train[@]}" --out always; then
  check "MPIFORMER_BLAS_RESTART_ALWAYS=1: started again (OPENBLAS_CORETYPE set for it)" \
    grep -qz "^OPENBLAS_CORETYPE=" "/proc/$started/environ"
  identity "MPIFORMER_BLAS_RESTART_ALWAYS=1" mpiformer "$bin" "$bin" "$started"
fi
stop_run

# ---- with and without a new start, as this machine's OpenBLAS decides
if start_run auto "$bin" "${train[@]}" --out auto; then
  if grep -q "chosen by mpiformer" "$out"; then
    echo "auto: OpenBLAS fell back to its generic kernels here; mpiformer started again"
  else
    echo "auto: OpenBLAS's own choice; no new start"
  fi
  identity "auto" mpiformer "$bin" "$bin" "$started"
fi
stop_run

if start_run coretype env OPENBLAS_CORETYPE=Haswell "$bin" "${train[@]}" --out coretype; then
  check "OPENBLAS_CORETYPE=Haswell: kept" \
    grep -q "Haswell kernels (OPENBLAS_CORETYPE=Haswell)" "$out"
  identity "OPENBLAS_CORETYPE=Haswell" mpiformer "$bin" "$bin" "$started"
fi
stop_run
exit_on_failures
