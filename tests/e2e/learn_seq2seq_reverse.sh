#!/usr/bin/env bash
# seq2seq learns to reverse random sequences: >= 99% token accuracy on
# held-out synthetic data.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
run_logged "$work/train.log" "$bin" train --model seq2seq --synthetic reverse --out "$work/run" \
  --enc-layers 2 --dec-layers 2 --d-model 64 --heads 4 --d-ff 256 --vocab 24 --max-len 16 \
  --max-tokens 1024 --steps 1500 --lr 3e-3 --warmup 60 --schedule inverse-sqrt \
  --label-smoothing 0.1 --dropout 0 --log-every 100 --eval-batches 32 --seed 1 --threads 1
expect_at_least "seq2seq reverse accuracy (%)" "$(final_accuracy "$work/train.log")" 99
test -s "$work/run/config.ini"
