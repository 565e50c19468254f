#!/usr/bin/env bash
# Bad flags and values through the real binary: exit code 2, one line on
# stderr naming the flag, nothing written. Help exits 0 and shows defaults.
#
# usage: cli_errors.sh /path/to/mpiformer WORKDIR
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bin=${1:?usage: cli_errors.sh /path/to/mpiformer WORKDIR}
work=${2:?usage: cli_errors.sh /path/to/mpiformer WORKDIR}

rm -rf "$work"
mkdir -p "$work"
out=$work/stdout
err=$work/stderr
run_dir=$work/run  # every train command below names it; none may create it
failures=0

# Runs the binary; sets $rc without tripping set -e.
run() {
  rc=0
  "$bin" "$@" >"$out" 2>"$err" || rc=$?
}

# expect_usage_error FLAG ARGS...: exit 2, stderr exactly one line that names
# FLAG, stdout empty.
expect_usage_error() {
  local flag=$1
  shift
  run "$@"
  local what="mpiformer $*"
  expect_one_line_error "$what" 2 "$flag" || return 0
  if [[ -s $out ]]; then
    fail "$what: unexpected stdout"
  fi
  if [[ -e $run_dir ]]; then
    fail "$what: created $run_dir before failing"
    rm -rf "$run_dir"
  fi
}

# expect_help ARGS...: exit 0, help on stdout with flags and their defaults.
expect_help() {
  run "$@"
  local what="mpiformer $*"
  if [[ $rc -ne 0 ]]; then
    fail "$what: exit code $rc, expected 0"
    return
  fi
  for needle in "${expected_in_help[@]}"; do
    if ! grep -qF -- "$needle" "$out"; then
      fail "$what: help lacks '$needle'"
    fi
  done
}

train=(train --model seq2seq --synthetic reverse --out "$run_dir")

# ---- bad values: each names its flag ----
expect_usage_error --heads "${train[@]}" --d-model 256 --heads 3
expect_usage_error --model train --model gpt --synthetic copy --out "$run_dir"
expect_usage_error --label-smoothing "${train[@]}" --label-smoothing 1.5
expect_usage_error --label-smoothing "${train[@]}" --label-smoothing -0.1
expect_usage_error --layers "${train[@]}" --layers -2
expect_usage_error --layers "${train[@]}" --layers two
expect_usage_error --d-model "${train[@]}" --d-model 0
expect_usage_error --dropout "${train[@]}" --dropout 1
expect_usage_error --vocab "${train[@]}" --vocab 3
expect_usage_error --max-len "${train[@]}" --max-len 2
expect_usage_error --max-tokens "${train[@]}" --max-tokens 8
expect_usage_error --min-len "${train[@]}" --min-len 1000
expect_usage_error --lr "${train[@]}" --lr -1
expect_usage_error --seed "${train[@]}" --seed -5
expect_usage_error --schedule "${train[@]}" --schedule linear
# bf16 and fp16 run on the CPU too (tests/e2e/precision.sh); --tf32 is for
# cuda fp32 GEMMs only; the loss scale is finite and >= 1, its window >= 1.
expect_usage_error --precision "${train[@]}" --device cpu --precision fp8
expect_usage_error --tf32 "${train[@]}" --device cpu --tf32
expect_usage_error --tf32 "${train[@]}" --device cpu --precision bf16 --tf32
expect_usage_error --tf32 bench --tf32
expect_usage_error --tf32 bench --precision fp16 --tf32
# NCCL carries device buffers: refused on the CPU backend, train and bench.
expect_usage_error --transport "${train[@]}" --device cpu --transport nccl
expect_usage_error --transport bench --transport nccl
expect_usage_error --transport "${train[@]}" --transport tcp
expect_usage_error --deterministic "${train[@]}" --deterministic maybe
# cuDNN's attention: a GPU's, bf16 or fp16; without one it is refused at once.
expect_usage_error --attention "${train[@]}" --device cpu --attention cudnn
expect_usage_error --attention bench --attention cudnn
expect_usage_error --attention "${train[@]}" --attention flash
if ! command -v nvidia-smi >/dev/null; then
  expect_usage_error --device bench --device cuda --precision bf16 --attention cudnn
  # Every command that scores or decodes on a GPU refuses one it has not.
  expect_usage_error --device classify --checkpoint "$0" --text "a b" --device cuda
  expect_usage_error --device generate --checkpoint "$0" --prompt "a b" --device cuda \
    --precision bf16
fi
expect_usage_error --precision generate --checkpoint "$0" --prompt "a b" --precision fp8
expect_usage_error --min-new-tokens generate --checkpoint "$0" --prompt "a b" \
  --max-new-tokens 4 --min-new-tokens 5
# OpenBLAS kernels that do not load (tests/e2e/blas_kernels.sh has the rest).
expect_usage_error --blas-core "${train[@]}" --blas-core NoSuchKernels
expect_usage_error --blas-core eval --checkpoint "$0" --data "$work" --blas-core NoSuchKernels
expect_usage_error --loss-scale "${train[@]}" --precision fp16 --loss-scale 0
expect_usage_error --loss-scale "${train[@]}" --precision fp16 --loss-scale 0.5
expect_usage_error --loss-scale "${train[@]}" --precision fp16 --loss-scale inf
expect_usage_error --loss-scale "${train[@]}" --precision fp16 --loss-scale nan
expect_usage_error --loss-scale-window "${train[@]}" --precision fp16 --loss-scale-window 0
expect_usage_error --loss-scale-window "${train[@]}" --precision fp16 --loss-scale-window -2
expect_usage_error --device "${train[@]}" --device tpu
expect_usage_error --tied-embeddings "${train[@]}" --tied-embeddings maybe
expect_usage_error --no-such-flag "${train[@]}" --no-such-flag 1
expect_usage_error --steps "${train[@]}" --steps
expect_usage_error --steps "${train[@]}" --steps 10 --steps 20
expect_usage_error --resume "${train[@]}" --resume "$work/no-such-checkpoint.h5"
expect_usage_error --data train --model lm --synthetic copy --data "$work" --out "$run_dir"
expect_usage_error --data train --model lm --out "$run_dir"
expect_usage_error --out train --model lm --synthetic copy
expect_usage_error stray "${train[@]}" stray
expect_usage_error --batch bench --batch 0
expect_usage_error --seq bench --max-len 64 --seq 128
expect_usage_error --out bench --out "$run_dir"

# --config: unknown keys, bad values (naming the file), unreadable files.
printf 'd-model = 128\nwidth = 3\n' >"$work/unknown.ini"
expect_usage_error width "${train[@]}" --config "$work/unknown.ini"
printf 'heads = 5\n' >"$work/heads.ini"
expect_usage_error --heads "${train[@]}" --config "$work/heads.ini"
printf 'd-model = wide\n' >"$work/bad_value.ini"
expect_usage_error "$work/bad_value.ini" "${train[@]}" --config "$work/bad_value.ini"
expect_usage_error --config "${train[@]}" --config "$work/missing.ini"

# ---- commands ----
expect_usage_error frobnicate frobnicate
expect_usage_error --checkpoint eval --checkpoint x.h5 --data "$work"
expect_usage_error --checkpoint generate --checkpoint x.h5 --prompt "a b"
expect_usage_error command # no command at all

# ---- help: exit 0, flags with their defaults ----
expected_in_help=(train bench)
expect_help --help
expected_in_help=(--model --synthetic --out --config --d-model "(=64)" --heads "(=4)" --lr
                  "(=0.001)" --schedule inverse-sqrt --max-tokens "(=4096)" --label-smoothing
                  --device --precision --tf32 --loss-scale --loss-scale-window --resume
                  --decay-all --transport "(=auto)" --deterministic)
expect_help train --help
expect_help train --model gpt --help  # help wins over bad values
expected_in_help=(--batch --seq --peak-tflops --steps --d-model "(=64)" --precision --tf32)
expect_help bench --help

# A task of srun that finds itself alone in its MPI world (srun and MPI did
# not meet): one line, exit 2, before any work.
rc=0
SLURM_NTASKS=4 SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=2 "$bin" "${train[@]}" >"$out" 2>"$err" || rc=$?
expect_one_line_error "srun world smaller than SLURM_NTASKS" 2 "[task 2]" "srun started 4 task(s)" \
  "world of 1 rank(s)" "--mpi=pmix"
[[ ! -e $run_dir ]] || fail "the srun fault created the run directory"

# Under mpirun every rank fails alike; only rank 0 speaks.
if [[ -n ${MPIEXEC:-} ]] && command -v "$MPIEXEC" >/dev/null; then
  rc=0
  "$MPIEXEC" -n 2 "$bin" "${train[@]}" --heads 3 >"$out" 2>"$err" || rc=$?
  if [[ $rc -ne 2 ]]; then
    fail "mpirun -n 2: exit code $rc, expected 2"
  fi
  if [[ $(grep -c 'mpiformer train: --heads' "$err") -ne 1 ]]; then
    fail "mpirun -n 2: expected the message once"
  fi
fi

exit_on_failures
echo "cli_errors: all checks passed"
