#!/usr/bin/env bash
# A decoder-only lm learns to copy the first half of a sequence after a
# separator: >= 99% accuracy on the copied half of held-out data.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
run_logged "$work/train.log" "$bin" train --model lm --synthetic copy --out "$work/run" \
  --layers 2 --d-model 64 --heads 4 --d-ff 256 --vocab 24 --max-len 33 \
  --max-tokens 1024 --steps 2000 --lr 3e-3 --warmup 60 --schedule inverse-sqrt \
  --label-smoothing 0.1 --dropout 0 --log-every 100 --eval-batches 32 --seed 1 --threads 1
expect_at_least "lm copy accuracy (%)" "$(final_accuracy "$work/train.log")" 99
