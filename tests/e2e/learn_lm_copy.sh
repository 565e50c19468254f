#!/usr/bin/env bash
# A decoder-only lm learns to copy the first half of a sequence after a
# separator: >= 99% accuracy on the copied half of held-out data.
#
# A long warm-up and a rate that decays to 0 (cosine) make the run end on a
# settled model that copies everything. With --warmup 60 and inverse-sqrt
# the final accuracy moved over 98.70-99.91% across the 13 OpenBLAS kernel
# families (OPENBLAS_CORETYPE; their roundings send the run different ways;
# the generic Prescott kernels fell under the line) and seeds 1-20 over
# 95.8-99.9%. Now every kernel family gives 100.00% and all 4 prompts below,
# and seeds 1-20 give 99.76-100.00% and all 4.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
run_logged "$work/train.log" "$bin" train --model lm --synthetic copy --out "$work/run" \
  --layers 2 --d-model 64 --heads 4 --d-ff 256 --vocab 24 --max-len 33 \
  --max-tokens 1024 --steps 2000 --lr 3e-3 --warmup 300 --schedule cosine \
  --label-smoothing 0.1 --dropout 0 --log-every 100 --eval-batches 32 --seed 1 --threads 1
expect_at_least "lm copy accuracy (%)" "$(final_accuracy "$work/train.log")" 99

# Generation: after "x [SEP]" (SEP is id 5) the lm continues with x, greedily
# and by top-k sampling with k = 1; larger k samples the same way per seed.
checkpoint=$work/run/checkpoints/step_00002000.h5
copied=0
for prompt in "7 8 9 10" "23 6 12 12 19 8" "15 14 13 12 11 10 9 8" "20 6 6 21 7 22 9 23 11 16"; do
  greedy=$("$bin" generate --checkpoint "$checkpoint" --prompt "$prompt 5" --threads 1)
  top1=$("$bin" generate --checkpoint "$checkpoint" --prompt "$prompt 5" --top-k 1 --threads 1)
  [[ $greedy == "$top1" ]] || { echo "FAIL: --top-k 1 gave '$top1', greedy '$greedy'" >&2; exit 1; }
  [[ $greedy == "$prompt" ]] && copied=$((copied + 1))
done
expect_at_least "generate: prompts copied (of 4)" "$copied" 4
# At temperature 2 the end token is among the 5 and a draw may stop at
# once (printing nothing): so three seeds, each repeating itself, and not
# all of them empty.
sampled=() printed=0
for seed in 1 2 3; do
  a=$("$bin" generate --checkpoint "$checkpoint" --prompt "7 8 9 5" --top-k 5 --temperature 2 \
    --seed "$seed" --threads 1)
  b=$("$bin" generate --checkpoint "$checkpoint" --prompt "7 8 9 5" --top-k 5 --temperature 2 \
    --seed "$seed" --threads 1)
  [[ $a == "$b" ]] || { echo "FAIL: seed $seed sampled '$a' and then '$b'" >&2; exit 1; }
  sampled+=("'$a'")
  [[ -n $a ]] && printed=$((printed + 1))
done
((printed > 0)) || { echo "FAIL: top-k sampling printed nothing for seeds 1-3" >&2; exit 1; }
echo "PASS: top-k sampling repeats with its seed: seeds 1-3 gave ${sampled[*]}"
