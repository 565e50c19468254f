#!/usr/bin/env bash
# The demo corpora end to end, on two ranks: extract them from the Debian
# packages, prepare shards, then for lm, mlm and seq2seq check that
#   - default buckets batch them with padding efficiency >= 0.90, and
#   - a short run lowers the held-out (validation) loss.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
mpirun=("$MPIEXEC" -q -np 2)

# The extract scripts make their output folder (corpora/ on a fresh checkout).
"$root/data/extract-kjv.sh" "$work/corpora/kjv.txt"
"$root/data/extract-gettext-de.sh" "$work/corpora/messages.en" "$work/corpora/messages.de"
"${mpirun[@]}" "$bin" prepare --kind lm --input "$work/corpora/kjv.txt" --out "$work/kjv" \
  --shards 4 --vocab-size 2000 --valid-lines 300
"${mpirun[@]}" "$bin" prepare --kind seq2seq --input "$work/corpora/messages.en" \
  --target "$work/corpora/messages.de" --out "$work/messages" --shards 4 --vocab-size 2000 \
  --valid-lines 300

# eval_losses LOG: every held-out loss the run printed, in order.
eval_losses() { sed -n 's/^\(eval step [0-9]*\|final eval\) | loss \([0-9.]*\).*/\2/p' "$1"; }
# padding_efficiency LOG: the epoch's figure from the data summary.
padding_efficiency() { sed -n 's/.*padding efficiency \([0-9.]*\).*/\1/p' "$1" | sed -n 1p; }

check_run() {
  local name=$1 data=$2
  shift 2
  run_logged "$work/$name.log" "${mpirun[@]}" "$bin" train --model "$name" --data "$data" \
    --out "$work/run-$name" --threads 1 --d-model 64 --heads 4 --d-ff 256 --max-tokens 4096 \
    --lr 2e-3 --warmup 20 --schedule inverse-sqrt --label-smoothing 0.1 --dropout 0 \
    --log-every 20 --eval-every 20 --eval-batches 1000 --seed 1 "$@"
  expect_at_least "$name padding efficiency" "$(padding_efficiency "$work/$name.log")" 0.90
  local first last
  first=$(eval_losses "$work/$name.log" | sed -n 1p)
  last=$(eval_losses "$work/$name.log" | tail -n 1)
  if awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b != "" && b + 0 < a - 0.2) }'; then
    echo "PASS: $name validation loss falls: $first -> $last" \
      "(by $(awk -v a="$first" -v b="$last" 'BEGIN { printf "%.4f", a - b }'), at least 0.2)"
  else
    echo "FAIL: $name validation loss did not fall by 0.2: '$first' -> '$last'" >&2
    exit 1
  fi
}

check_run lm "$work/kjv" --layers 2 --max-len 128 --steps 60
check_run mlm "$work/kjv" --layers 2 --max-len 128 --steps 60
check_run seq2seq "$work/messages" --enc-layers 1 --dec-layers 1 --max-len 64 --steps 60
