#!/usr/bin/env bash
# OpenBLAS's kernel family is never a silent fallback: bench and train name
# the family that ran and why; --blas-core picks one (the program starts
# again with OPENBLAS_CORETYPE set, on every rank under mpirun); the user's
# OPENBLAS_CORETYPE is kept; a name OpenBLAS does not load is exit 2; on a
# machine where OpenBLAS falls back to generic kernels on a CPU with AVX2 or
# AVX-512, auto replaces them.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out err=$work/err
unset OPENBLAS_CORETYPE

shape=(--model lm --layers 1 --d-model 32 --heads 2 --d-ff 64 --vocab 64 --batch 2 --seq 16
  --steps 1 --warmup-steps 0 --threads 1)
# bench ARGS...: runs bench (stdout $out, stderr $err, exit code $rc) and
# sets $core to the family its JSON line names.
bench() {
  rc=0
  "$bin" bench "${shape[@]}" "$@" >"$out" 2>"$err" || rc=$?
  core=$(sed -n 's/.*"blas_core": "\([^"]*\)".*/\1/p' "$out")
}

# What OpenBLAS loads by itself here (inspect never starts again).
own=$(OPENBLAS_VERBOSE=2 "$bin" --version 2>&1 | sed -n 's/^Core: //p' | sed -n 1p)
echo "OpenBLAS's own choice here: ${own:-unknown}"

bench
auto_core=$core
check "bench runs (exit $rc)" test "$rc" -eq 0
check "bench's start line names the family ($core)" grep -q "BLAS: OpenBLAS [0-9.]*, $core kernels (" "$err"
generic=0
# The generic families, as is_generic_blas_core (kernels/cpu/blas_kernels.cpp) lists them.
case ${own,,} in
  prescott | core2 | penryn | dunnington | katmai | coppermine | northwood | banias | unknown)
    generic=1
    ;;
esac
# What the CPU runs, as kernels/cpu/blas_kernels.cpp reads it.
flags=" $(grep -m 1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
wide="" best=""
if has avx512f avx512cd avx512bw avx512dq avx512vl avx2 fma; then
  wide=AVX-512 best=SkylakeX
elif has avx2 fma; then
  wide=AVX2 best=Haswell
fi
if [[ $generic == 1 && -n $wide ]]; then
  check "auto replaces the generic $own kernels on a CPU with $wide ($core)" test "$core" == "$best"
  check "the start line says why" grep -q "chosen by mpiformer: OpenBLAS took its generic $own" "$err"
else
  check "auto keeps OpenBLAS's choice $own ($core)" test "${core,,}" == "${own,,}"
  check "the start line says whose choice" grep -q "(OpenBLAS's choice for this CPU)" "$err"
fi

# --blas-core NAME, on the command line and from --config, on one and two ranks.
bench --blas-core Sandybridge
check "--blas-core Sandybridge runs it ($core)" test "$core" == Sandybridge
check "  and says so" grep -q "Sandybridge kernels (--blas-core Sandybridge)" "$err"
printf 'blas-core = Haswell\n' >blas.ini
bench --config blas.ini
check "--config's blas-core = Haswell runs it ($core)" test "$core" == Haswell
bench --config blas.ini --blas-core=Sandybridge
check "--blas-core on the command line wins over --config ($core)" test "$core" == Sandybridge
rc=0
mpirun -np 2 "$bin" bench "${shape[@]}" --blas-core Haswell >"$out" 2>"$err" || rc=$?
check "mpirun -np 2 --blas-core Haswell (exit $rc)" grep -q '"ranks": 2, .*"blas_core": "Haswell"' "$out"

# Ranks on other kernel families (nodes of another CPU model) say so.
rc=0
mpirun -np 2 sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then export OPENBLAS_CORETYPE=Sandybridge; fi
  exec "$0" "$@"' "$bin" bench "${shape[@]}" >"$out" 2>"$err" || rc=$?
check "ranks on two kernel families run (exit $rc)" test "$rc" -eq 0
check "  and the one that differs says so" \
  grep -q "^\[rank 1\] .*: BLAS Sandybridge kernels, rank 0 runs $auto_core" "$err"

# The user's OPENBLAS_CORETYPE is theirs to set.
OPENBLAS_CORETYPE=Sandybridge bench
check "OPENBLAS_CORETYPE=Sandybridge is kept ($core)" test "$core" == Sandybridge
check "  and named" grep -q "Sandybridge kernels (OPENBLAS_CORETYPE=Sandybridge)" "$err"

# Names OpenBLAS does not load are refused before anything runs.
bench --blas-core NoSuchKernels
refused "--blas-core NoSuchKernels" 2 "--blas-core" "not 'NoSuchKernels'" "OPENBLAS_VERBOSE=2"
rc=0
"$bin" train --model lm --synthetic copy --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 16 \
  --steps 1 --threads 1 --out "$work/refused" --blas-core NoSuchKernels >"$out" 2>"$err" || rc=$?
refused "train --blas-core NoSuchKernels" 2 "--blas-core"
check "  and leaves no run directory" test ! -e "$work/refused"

# train: the start line and config.ini record the kernels.
rc=0
"$bin" train --model lm --synthetic copy --layers 1 --d-model 16 --heads 2 --d-ff 32 --max-len 16 \
  --max-tokens 128 --steps 2 --threads 1 --out "$work/run" --blas-core Haswell >"$out" 2>"$err" || rc=$?
check "train --blas-core Haswell (exit $rc)" test "$rc" -eq 0
check "train's start line names the kernels" grep -q "^  BLAS: OpenBLAS [0-9.]*, Haswell kernels (--blas-core Haswell)" "$out"
check "config.ini records them" grep -q "^# blas = OpenBLAS [0-9.]*, Haswell kernels" "$work/run/config.ini"
check "config.ini keeps the flag" grep -q "^blas-core = Haswell$" "$work/run/config.ini"
rc=0
"$bin" train --config "$work/run/config.ini" --steps 3 --resume auto >"$out" 2>"$err" || rc=$?
check "config.ini reads back, its record skipped (exit $rc)" test "$rc" -eq 0
exit_on_failures
