#!/usr/bin/env bash
# --recompute layer through the command line: each layer keeps only its
# input and backward reruns its forward, so with dropout on
#   - lm (pre-LN) and seq2seq (post-LN) leave parameters and Adam moments
#     bitwise equal to --recompute none after 3 steps of 2 micro-batches;
#   - -np 2 (gradients reduced while backward runs) equals -np 1 x 2;
#   - bench allocates less with layer than with none, and says which ran.
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
train lm-layer 1 2 lm --layers 3 --recompute layer
same "lm --dropout 0.1: --recompute layer vs none" lm-layer lm-none
if ! grep -x 'recompute = layer' "$work/lm-layer/config.ini" >/dev/null; then
  echo "FAIL: config.ini does not record recompute = layer" >&2
  exit 1
fi

train s2s-none 1 2 seq2seq --enc-layers 2 --dec-layers 3 --norm post --recompute none
train s2s-layer 1 2 seq2seq --enc-layers 2 --dec-layers 3 --norm post --recompute layer
same "seq2seq --norm post --dropout 0.1: --recompute layer vs none" s2s-layer s2s-none

train lm-layer-np2 2 1 lm --layers 3 --recompute layer
same "lm --recompute layer: -np 2 x 1 (overlapped reduction) vs -np 1 x 2" lm-layer-np2 lm-none

# bench: the backend's own allocation (weights, AdamW, activations) shrinks.
bench() {
  "$bin" bench --model lm --layers 6 --d-model 64 --heads 4 --d-ff 256 --vocab 64 --batch 4 \
    --seq 64 --steps 1 --warmup-steps 1 --threads 1 --dropout 0.1 --recompute "$1" 2>/dev/null
}
bench none >"$work/bench-none.json"
bench layer >"$work/bench-layer.json"
allocated() { sed -n 's/.*"allocated_bytes": \([0-9]*\).*/\1/p' "$1"; }
none=$(allocated "$work/bench-none.json") layer=$(allocated "$work/bench-layer.json")
if ! grep '"recompute": "layer"' "$work/bench-layer.json" >/dev/null || [[ -z $none ]] ||
  [[ -z $layer ]] || ((layer >= none)); then
  cat "$work/bench-none.json" "$work/bench-layer.json" >&2
  echo "FAIL: bench --recompute layer should allocate less than none" >&2
  exit 1
fi
echo "PASS: bench allocates $layer bytes with --recompute layer, $none with none"
