#!/usr/bin/env bash
# train --shard-optimizer true (ZeRO-1) against the unsharded run, on real
# shards (KJV for lm, mlm and a two-label classifier, gettext message pairs
# for seq2seq), the exact gradient sum, dropout 0, fp32 CPU:
#   - -np 1, 2, 3 and 4 sharded with one global batch (--accum-steps 12/W)
#     leave parameters and Adam moments bitwise equal to -np 1 unsharded
#     after 3 steps (with gradient clipping on, so the norm counts too);
#   - resume across layouts: 6 steps sharded on -np 3, 6 more sharded on
#     -np 2, 6 more unsharded on -np 1 equal 18 steps straight on -np 1;
#   - a model of fewer norm blocks than ranks (empty slices) works;
#   - bf16 and fp16 compute (fp32 masters, of the rank's slice only when
#     sharded; fp16's loss scale) sharded on -np 2 equal unsharded -np 2,
#     and bf16 resumes from sharded to unsharded and back; --on-divergence skip drops the same steps
#     sharded and unsharded (a NaN on the last rank), with equal results;
#   - a NaN that reaches a rank's slice (found before the checkpoint, as a
#     GPU step checks) stops every rank with exit 3 and writes nothing;
#   - the comparison would see a changed bit: a run with another --lr differs.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
compare=${COMPARE_PARAMS:-$(dirname "$bin")/tests/compare_params}
rm -rf "$work" && mkdir -p "$work"
mpirun() { "$MPIEXEC" -q -np "$@"; }

"$root/data/extract-kjv.sh" "$work/kjv-all.txt"
head -n 2000 "$work/kjv-all.txt" >"$work/kjv.txt"
"$root/data/extract-gettext-de.sh" "$work/messages-all.en" "$work/messages-all.de"
head -n 2000 "$work/messages-all.en" >"$work/messages.en"
head -n 2000 "$work/messages-all.de" >"$work/messages.de"
# The classifier's labels from the text itself: long or short verses, and
# whether one names the LORD.
awk '{ l = (length($0) > 120) ? "long" : "short"; if ($0 ~ /LORD/) l = l " lord"; print l }' \
  "$work/kjv.txt" >"$work/kjv.labels"
mpirun 2 "$bin" prepare --kind lm --input "$work/kjv.txt" --out "$work/kjv" --shards 2 \
  --vocab-size 400 --valid-lines 100 >"$work/prepare-kjv.log"
mpirun 2 "$bin" prepare --kind seq2seq --input "$work/messages.en" --target "$work/messages.de" \
  --out "$work/messages" --shards 2 --vocab-size 400 --valid-lines 100 >"$work/prepare-msg.log"
mpirun 2 "$bin" prepare --kind classify --input "$work/kjv.txt" --labels "$work/kjv.labels" \
  --out "$work/kjv-cls" --shards 2 --vocab-size 400 --valid-lines 100 >"$work/prepare-cls.log"

# train NAME RANKS ACCUM MODEL DATA STEPS [FLAGS...]: a checkpoint at the end.
# A constant LR of 1e-2 moves every parameter; --clip-norm 0.5 clips, so the
# global norm decides the updates; small buckets cross the slices' bounds.
# lr=X and dims="D H F" (d-model, heads, d-ff) before the call change those.
train() {
  local name=$1 ranks=$2 accum=$3 model=$4 data=$5 steps=$6
  shift 6
  local layers=(--layers 1) d=(${dims:-32 2 64})
  [[ $model == seq2seq ]] && layers=(--enc-layers 1 --dec-layers 1)
  [[ $model == classify ]] && layers+=(--loss zlpr)
  if ! mpirun "$ranks" "$bin" train --model "$model" --data "$data" --out "$work/$name" \
    "${layers[@]}" --d-model "${d[0]}" --heads "${d[1]}" --d-ff "${d[2]}" --max-len 64 \
    --max-tokens 256 --accum-steps "$accum" --steps "$steps" --lr "${lr:-1e-2}" --warmup 0 --schedule constant \
    --clip-norm 0.5 --dropout 0 --bucket-mb 0.02 --check-every 1 --log-every 3 \
    --eval-every 0 --eval-batches 1 --threads 1 --seed 5 "$@" >"$work/$name.log" 2>&1; then
    cat "$work/$name.log" >&2
    echo "FAIL: $name: mpiformer train exited non-zero" >&2
    exit 1
  fi
}

# same WHAT A B STEP: parameters and both moments of two runs' checkpoints, bitwise.
same() {
  local what=$1 a=$2 b=$3 step group
  step=$(printf '%08d' "$4")
  for group in params optimizer/m optimizer/v; do
    if ! "$compare" "$work/$a/checkpoints/step_$step.h5" "$work/$b/checkpoints/step_$step.h5" \
      --group "$group" --bitwise >"$work/compare.log" 2>&1; then
      cat "$work/compare.log" >&2
      echo "FAIL: $what ($group)" >&2
      exit 1
    fi
  done
  echo "PASS: $what: $(tail -n 1 "$work/compare.log")"
}

for model in lm mlm seq2seq classify; do
  data=$work/kjv
  [[ $model == seq2seq ]] && data=$work/messages
  [[ $model == classify ]] && data=$work/kjv-cls
  train "$model-np1" 1 12 "$model" "$data" 3
  for ranks in 1 2 3 4; do
    train "$model-zero-np$ranks" "$ranks" $((12 / ranks)) "$model" "$data" 3 --shard-optimizer true
    same "$model: sharded -np $ranks x $((12 / ranks)) vs unsharded -np 1 x 12" \
      "$model-zero-np$ranks" "$model-np1" 3
  done
done
grep -q "optimizer sharded (ZeRO-1)" "$work/lm-zero-np3.log" ||
  { echo "FAIL: the start line does not say the optimizer is sharded" >&2; exit 1; }

# A model of fewer norm blocks than ranks: some ranks own an empty slice.
dims="8 1 16" train lm-tiny-np1 1 12 lm "$work/kjv" 3
dims="8 1 16" train lm-tiny-zero-np4 4 3 lm "$work/kjv" 3 --shard-optimizer true
grep -q "slice, 0 to" "$work/lm-tiny-zero-np4.log" ||
  { echo "FAIL: the tiny model has no empty slice on 4 ranks" >&2; exit 1; }
same "lm tiny (empty slices): sharded -np 4 x 3 vs unsharded -np 1 x 12" lm-tiny-zero-np4 \
  lm-tiny-np1 3

# Half-precision compute keeps fp32 masters, sliced like fp32's moments;
# fp16 scales its loss (a scale that backs off on an overflow, all ranks alike).
for precision in bf16 fp16; do
  train "lm-$precision-np2" 2 6 lm "$work/kjv" 3 --precision "$precision"
  train "lm-$precision-zero-np2" 2 6 lm "$work/kjv" 3 --precision "$precision" \
    --shard-optimizer true
  same "lm $precision: sharded -np 2 vs unsharded -np 2" "lm-$precision-zero-np2" \
    "lm-$precision-np2" 3
done

grep -q "masters " "$work/lm-bf16-zero-np2.log" ||
  { echo "FAIL: the bf16 start line names no masters" >&2; exit 1; }
# bf16 keeps only its slice of the masters: a resume from sharded -np 3 to
# unsharded -np 2 reads the slices back and gathers the compute copy.
train lm-bf16-12 2 6 lm "$work/kjv" 12 --precision bf16
train lm-bf16-layouts 3 4 lm "$work/kjv" 6 --precision bf16 --shard-optimizer true
train lm-bf16-layouts 2 6 lm "$work/kjv" 12 --precision bf16 --resume auto
same "lm bf16: 6 steps sharded -np 3, 6 unsharded -np 2 vs 12 on -np 2" lm-bf16-layouts \
  lm-bf16-12 12
train lm-bf16-back 2 6 lm "$work/kjv" 6 --precision bf16
train lm-bf16-back 3 4 lm "$work/kjv" 12 --precision bf16 --shard-optimizer true --resume auto
same "lm bf16: 6 steps unsharded -np 2, 6 sharded -np 3 vs 12 on -np 2" lm-bf16-back lm-bf16-12 12

# --on-divergence skip: the NaN of steps 2 and 3 on the last rank drops both
# steps everywhere, sharded or not.
MPIFORMER_TEST_NAN_AT_STEP=2:2 train lm-skip-np1 1 12 lm "$work/kjv" 5 --on-divergence skip
MPIFORMER_TEST_NAN_AT_STEP=2:2 train lm-skip-zero-np3 3 4 lm "$work/kjv" 5 \
  --on-divergence skip --shard-optimizer true
grep -q "non-finite steps skipped 2" "$work/lm-skip-zero-np3.log" ||
  { echo "FAIL: sharded --on-divergence skip did not skip 2 steps" >&2; exit 1; }
same "lm --on-divergence skip: sharded -np 3 vs unsharded -np 1" lm-skip-zero-np3 lm-skip-np1 5

# A NaN in the state stops every rank before it reaches a checkpoint: the
# NaN gradient of step 3 is found in the updated slices at step 4's save.
rc=0
MPIFORMER_TEST_DEFERRED_DIVERGENCE_CHECK=1 MPIFORMER_TEST_NAN_AT_STEP=3 \
  mpirun 3 "$bin" train --model lm --data "$work/kjv" --out "$work/lm-nan-zero" --layers 1 \
  --d-model 32 --heads 2 --d-ff 64 --max-len 64 --max-tokens 256 --steps 8 \
  --checkpoint-every 2 --log-every 8 --eval-every 0 --threads 1 --shard-optimizer true \
  >"$work/lm-nan-zero.log" 2>&1 || rc=$?
if [[ $rc -ne 3 ]] ||
  ! grep -q "step 4 diverged: non-finite values in .* after the update" "$work/lm-nan-zero.log" ||
  [[ $(ls "$work/lm-nan-zero/checkpoints") != "$(printf 'latest\nstep_00000002.h5')" ]]; then
  cat "$work/lm-nan-zero.log" >&2
  echo "FAIL: a NaN in a sharded run: exit $rc, checkpoints: $(ls "$work/lm-nan-zero/checkpoints")" >&2
  exit 1
fi
echo "PASS: a NaN in a sharded run's slices: exit 3 at step 4's checkpoint, step 2 kept"

# Resume across layouts: sharded -np 3, sharded -np 2, unsharded -np 1.
train lm-18 1 12 lm "$work/kjv" 18
train lm-layouts 3 4 lm "$work/kjv" 6 --shard-optimizer true
train lm-layouts 2 6 lm "$work/kjv" 12 --shard-optimizer true --resume auto
train lm-layouts 1 12 lm "$work/kjv" 18 --resume auto
same "lm: 6 steps sharded -np 3, 6 sharded -np 2, 6 unsharded -np 1 vs 18 on -np 1" \
  lm-layouts lm-18 18

# The comparison sees a changed bit: the same run with another --lr differs.
lr=1.0001e-2 train lm-zero-np3-lr 3 4 lm "$work/kjv" 3 --shard-optimizer true
if "$compare" "$work/lm-zero-np3-lr/checkpoints/step_00000003.h5" \
  "$work/lm-np1/checkpoints/step_00000003.h5" --bitwise >"$work/compare.log" 2>&1; then
  echo "FAIL: a run with another --lr compares bitwise equal" >&2
  exit 1
fi
echo "PASS: a run with --lr 1.0001e-2 differs: $(tail -n 1 "$work/compare.log")"
