#!/usr/bin/env bash
# The invariant through the command line, on real shards (KJV for lm and
# mlm, gettext message pairs for seq2seq), dropout 0, fp32 CPU:
#   - world-size invariance: -np 1 --accum-steps 4, -np 2 --accum-steps 2 and
#     -np 4 --accum-steps 1, each with its default --threads (the node's
#     cores shared by its ranks), and -np 1 with --threads 3, leave
#     bitwise-equal parameters and Adam moments after 3 steps with the exact
#     gradient sum (the default); with --grad-sum float, the step's
#     gradient (Adam's first moment after step 1) agrees to 1e-5 relative
#     per tensor; the same world size twice is bitwise equal either way;
#   - a rank with no data (--sharding file, fewer shards than ranks) joins
#     every step with zero tokens: -np 3 on 2 shards equals -np 2;
#   - --lr-scaling applies the factor the global token budget asks for;
#   - a corrupt shard that only rank 1 reads ends every rank within 60 s with
#     rank 1's message, a refusal of --data (exit 2).
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
compare=${COMPARE_PARAMS:-$(dirname "$bin")/tests/compare_params}
make_bad=${MAKE_BAD_SHARD:-$(dirname "$bin")/tests/make_bad_shard}
rm -rf "$work" && mkdir -p "$work"
mpirun() { "$MPIEXEC" -q -np "$@"; }

# A slice of each corpus keeps prepare quick; the shards are real text.
"$root/data/extract-kjv.sh" "$work/kjv-all.txt"
head -n 4000 "$work/kjv-all.txt" >"$work/kjv.txt"
"$root/data/extract-gettext-de.sh" "$work/messages-all.en" "$work/messages-all.de"
head -n 4000 "$work/messages-all.en" >"$work/messages.en"
head -n 4000 "$work/messages-all.de" >"$work/messages.de"
mpirun 2 "$bin" prepare --kind lm --input "$work/kjv.txt" --out "$work/kjv" --shards 2 \
  --vocab-size 600 --valid-lines 100 >"$work/prepare-kjv.log"
mpirun 2 "$bin" prepare --kind seq2seq --input "$work/messages.en" --target "$work/messages.de" \
  --out "$work/messages" --shards 2 --vocab-size 600 --valid-lines 100 >"$work/prepare-msg.log"

# train NAME RANKS ACCUM MODEL DATA STEPS [FLAGS...]: a checkpoint at the end.
# A constant LR of 1e-2 from step 1 moves every parameter, so a wrong
# gradient shows; small buckets make several all-reduces per step. --threads
# is left to its default unless FLAGS give it.
train() {
  local name=$1 ranks=$2 accum=$3 model=$4 data=$5 steps=$6
  shift 6
  local layers=(--layers 2)
  [[ $model == seq2seq ]] && layers=(--enc-layers 1 --dec-layers 2)
  if ! mpirun "$ranks" "$bin" train --model "$model" --data "$data" --out "$work/$name" \
    "${layers[@]}" --d-model 64 --heads 4 --d-ff 128 --max-len 64 --max-tokens 512 \
    --accum-steps "$accum" --steps "$steps" --lr 1e-2 --warmup 0 --schedule constant \
    --dropout 0 --bucket-mb 0.05 --check-every 1 --log-every 1 --eval-batches 2 \
    --seed 5 "$@" >"$work/$name.log" 2>&1; then
    cat "$work/$name.log" >&2
    echo "FAIL: $name: mpiformer train exited non-zero" >&2
    exit 1
  fi
}

# same WHAT A B STEP [compare_params flags]: compares two runs' checkpoints.
same() {
  local what=$1 a=$2 b=$3 step
  step=$(printf '%08d' "$4")
  shift 4
  if "$compare" "$work/$a/checkpoints/step_$step.h5" "$work/$b/checkpoints/step_$step.h5" "$@" \
    >"$work/compare.log" 2>&1; then
    echo "PASS: $what: $(tail -n 1 "$work/compare.log")"
  else
    cat "$work/compare.log" >&2
    echo "FAIL: $what" >&2
    exit 1
  fi
}

for model in lm mlm seq2seq; do
  data=$work/kjv
  [[ $model == seq2seq ]] && data=$work/messages
  train "$model-np1" 1 4 "$model" "$data" 3
  train "$model-np2" 2 2 "$model" "$data" 3
  train "$model-np4" 4 1 "$model" "$data" 3
  train "$model-np1-t3" 1 4 "$model" "$data" 3 --threads 3
  same "$model exact: -np 2 x 2 vs -np 1 x 4" "$model-np2" "$model-np1" 3 --bitwise
  same "$model exact: -np 4 x 1 vs -np 1 x 4" "$model-np4" "$model-np1" 3 --bitwise
  same "$model exact: -np 1 x 4 --threads 3 vs default threads" "$model-np1-t3" "$model-np1" 3 \
    --bitwise
  for moment in m v; do
    same "$model exact: Adam $moment, -np 4 x 1 vs -np 1 x 4" "$model-np4" "$model-np1" 3 \
      --group "optimizer/$moment" --bitwise
    same "$model exact: Adam $moment, -np 2 x 2 vs -np 1 x 4 --threads 3" "$model-np2" \
      "$model-np1-t3" 3 --group "optimizer/$moment" --bitwise
  done
  grep -q "hidden [0-9]*%" "$work/$model-np2.log" ||
    { echo "FAIL: $model: the progress line does not report the hidden share" >&2; exit 1; }

  # The float sum: same gradient to rounding; bitwise for the same world size.
  train "$model-float-np1" 1 4 "$model" "$data" 1 --grad-sum float
  train "$model-float-np4" 4 1 "$model" "$data" 1 --grad-sum float
  train "$model-float-np2" 2 2 "$model" "$data" 3 --grad-sum float
  train "$model-float-np2-again" 2 2 "$model" "$data" 3 --grad-sum float
  same "$model float: -np 4 x 1 vs -np 1 x 4, step-1 gradient" "$model-float-np4" \
    "$model-float-np1" 1 --group optimizer/m --max-rel 1e-5
  same "$model float: -np 2 x 2 twice" "$model-float-np2" "$model-float-np2-again" 3 --bitwise
done

# A rank without data: 2 train shards, 3 ranks, --sharding file.
train lm-file-np2 2 1 lm "$work/kjv" 3 --sharding file
train lm-file-np3 3 1 lm "$work/kjv" 3 --sharding file
grep -q "rank 2 has no train shard" "$work/lm-file-np3.log" ||
  { echo "FAIL: -np 3 on 2 shards does not say rank 2 has none" >&2; exit 1; }
same "lm --sharding file: -np 3 (rank 2 idle) vs -np 2" lm-file-np3 lm-file-np2 3 --bitwise

# --lr-scaling: the budget is max-tokens 512 x accum 1 x 2 ranks = 1024.
train lm-scaled 2 1 lm "$work/kjv" 3 --lr-scaling sqrt --lr-reference-tokens 256
grep -qF "lr 1.000e-02 x 2.0000 (sqrt: 1024 / 256 tokens per step) = 2.000e-02" \
  "$work/lm-scaled.log" || { echo "FAIL: --lr-scaling sqrt line missing" >&2; exit 1; }
grep -q "^step 1/3 .* lr 2.000e-02" "$work/lm-scaled.log" ||
  { echo "FAIL: --lr-scaling sqrt: step 1 does not run at lr 2e-2" >&2; exit 1; }
echo "PASS: --lr-scaling sqrt doubles the LR for 4x the reference budget"

# A corrupt shard that only rank 1 reads (--sharding file: rank 1 reads
# train-00001): its checksum fails when rank 1 loads it.
bad=$work/kjv-bad-rank1
cp -r "$work/kjv" "$bad"
"$make_bad" --corrupt-chunk /tokens "$bad/train-00001.h5"
rc=0
start=$SECONDS
timeout 60 "$MPIEXEC" -q -np 2 "$bin" train --model lm --data "$bad" --out "$work/bad-run" \
  --layers 1 --d-model 32 --heads 2 --d-ff 64 --max-len 64 --max-tokens 512 --steps 2 \
  --sharding file --threads 1 >"$work/bad.out" 2>"$work/bad.err" || rc=$?
if [[ $rc -eq 0 || $rc -eq 124 || $rc -eq 137 ]]; then
  cat "$work/bad.err" >&2
  echo "FAIL: rank 1's corrupt shard: exit code $rc (0: ran; 124/137: hung)" >&2
  exit 1
fi
if [[ $rc -ne 2 ]] ||
  ! grep -q "^mpiformer train: --data: .*train-00001.h5: truncated or corrupt" "$work/bad.err"; then
  cat "$work/bad.err" >&2
  echo "FAIL: rank 1's message is missing, or exit $rc is not 2" >&2
  exit 1
fi
echo "PASS: corrupt shard on rank 1 only: exit $rc after $((SECONDS - start)) s: $(grep -m 1 'train-00001.h5' "$work/bad.err")"
