#!/usr/bin/env bash
# --recompute through the command line. layer: each layer keeps only its
# input and backward reruns its forward; activation: each MLP keeps its
# pre-activation alone and backward makes its activation again, and a
# pre-LN sub-layer's input norm (in fp32, the CPU's precision here, the
# same bits). With dropout on, for both
#   - lm (pre-LN) and seq2seq (post-LN) leave parameters and Adam moments
#     bitwise equal to --recompute none after 3 steps of 2 micro-batches;
#   - -np 2 (gradients reduced while backward runs) equals -np 1 x 2;
#   - bench allocates less than with none, and says which ran.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
compare=${COMPARE_PARAMS:-$(dirname "$bin")/tests/compare_params}
rm -rf "$work" && mkdir -p "$work"
mpirun() { "$MPIEXEC" -q -np "$@"; }

# train NAME RANKS ACCUM MODEL [FLAGS...]: 3 steps, a checkpoint at the end.
train() {
  local name=$1 ranks=$2 accum=$3 model=$4
  shift 4
  if ! mpirun "$ranks" "$bin" train --model "$model" --synthetic reverse --out "$work/$name" \
    --d-model 32 --heads 4 --d-ff 64 --max-len 24 --max-tokens 256 --accum-steps "$accum" \
    --steps 3 --lr 1e-2 --warmup 0 --schedule constant --dropout 0.1 --bucket-mb 0.01 \
    --log-every 1 --eval-batches 1 --threads 1 --seed 7 "$@" >"$work/$name.log" 2>&1; then
    cat "$work/$name.log" >&2
    echo "FAIL: $name: mpiformer train exited non-zero" >&2
    exit 1
  fi
}

# same WHAT A B: the two runs' step-3 checkpoints hold the same bytes.
same() {
  local what=$1 a=$2 b=$3 group
  for group in params optimizer/m optimizer/v; do
    if ! "$compare" "$work/$a/checkpoints/step_00000003.h5" \
      "$work/$b/checkpoints/step_00000003.h5" --group "$group" --bitwise >"$work/compare.log" 2>&1; then
      cat "$work/compare.log" >&2
      echo "FAIL: $what ($group)" >&2
      exit 1
    fi
  done
  echo "PASS: $what: $(tail -n 1 "$work/compare.log")"
}

train lm-none 1 2 lm --layers 3 --recompute none
train s2s-none 1 2 seq2seq --enc-layers 2 --dec-layers 3 --norm post --recompute none
for mode in layer activation; do
  train "lm-$mode" 1 2 lm --layers 3 --recompute "$mode"
  same "lm --dropout 0.1: --recompute $mode vs none" "lm-$mode" lm-none
  if ! grep -x "recompute = $mode" "$work/lm-$mode/config.ini" >/dev/null; then
    echo "FAIL: config.ini does not record recompute = $mode" >&2
    exit 1
  fi
  train "s2s-$mode" 1 2 seq2seq --enc-layers 2 --dec-layers 3 --norm post --recompute "$mode"
  same "seq2seq --norm post --dropout 0.1: --recompute $mode vs none" "s2s-$mode" s2s-none
  train "lm-$mode-np2" 2 1 lm --layers 3 --recompute "$mode"
  same "lm --recompute $mode: -np 2 x 1 (overlapped reduction) vs -np 1 x 2" "lm-$mode-np2" lm-none
done

# bench: the backend's own allocation (weights, AdamW, activations) shrinks.
bench() {
  "$bin" bench --model lm --layers 6 --d-model 64 --heads 4 --d-ff 256 --vocab 64 --batch 4 \
    --seq 64 --steps 1 --warmup-steps 1 --threads 1 --dropout 0.1 --recompute "$1" 2>/dev/null
}
allocated() { sed -n 's/.*"allocated_bytes": \([0-9]*\).*/\1/p' "$1"; }
bench none >"$work/bench-none.json"
none=$(allocated "$work/bench-none.json")
for mode in activation layer; do
  bench "$mode" >"$work/bench-$mode.json"
  bytes=$(allocated "$work/bench-$mode.json")
  if ! grep "\"recompute\": \"$mode\"" "$work/bench-$mode.json" >/dev/null || [[ -z $none ]] ||
    [[ -z $bytes ]] || ((bytes >= none)); then
    cat "$work/bench-none.json" "$work/bench-$mode.json" >&2
    echo "FAIL: bench --recompute $mode should allocate less than none" >&2
    exit 1
  fi
  echo "PASS: bench allocates $bytes bytes with --recompute $mode, $none with none"
done
