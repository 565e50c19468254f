#!/usr/bin/env bash
# An encoder-only mlm learns to fill masks on the copy task (each masked
# token has its twin in the other half): accuracy far above chance, which is
# 1 / (vocab - 6 reserved ids) = 5.6% here.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
run_logged "$work/train.log" "$bin" train --model mlm --synthetic copy --out "$work/run" \
  --layers 2 --d-model 128 --heads 4 --d-ff 512 --vocab 24 --max-len 33 \
  --max-tokens 2048 --steps 1500 --lr 2e-3 --warmup 100 --schedule cosine \
  --label-smoothing 0 --dropout 0 --log-every 100 --eval-batches 32 --seed 1 --threads 1
expect_at_least "mlm copy accuracy (%)" "$(final_accuracy "$work/train.log")" 50
