#!/usr/bin/env bash
# Classification (--model classify) through the command line, on real data:
# Debian's package descriptions with their debtags (multi-label, ZLPR, with
# some labels made soft) and scikit-learn's 8x8 digits (single-label,
# softmax, a ViT patch embedding).
#   - world-size invariance: -np 1 --accum-steps 4, -np 2 x 2, -np 4 x 1 and
#     -np 3 x 1 against -np 1 x 3 leave bitwise-equal parameters and Adam
#     moments after 3 steps; the ranks' batches hold different numbers of
#     examples (length buckets under a token budget);
#   - learning: digits above 94% accuracy on the held-out images; the
#     debtags classifier's micro-F1 on held-out packages above the best
#     baseline that predicts the K most frequent tags (analysis/label_baseline.py);
#   - classify --input prints the top labels with their scores;
#   - prepare refuses a label weight outside [0, 1] naming the line.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
compare=${COMPARE_PARAMS:-$(dirname "$bin")/tests/compare_params}
rm -rf "$work" && mkdir -p "$work"
mpirun() { "$MPIEXEC" -q -np "$@"; }
failures=0

# ---- the corpora ----
"$root/data/extract-debtags.sh" --shuffle 1 "$work/debtags" 2>"$work/extract-debtags.log"
"$root/data/extract-digits.py" "$work/digits.npz" --h5 "$work/digits.h5" >/dev/null
# A CI-sized slice of the packages; one line in seven gets its first tag
# made soft (weight 0.7) to exercise soft targets.
head -n 8000 "$work/debtags/debtags.txt" >"$work/deb.txt"
head -n 8000 "$work/debtags/debtags.labels" |
  awk '{ if (NR % 7 == 0) $1 = $1 ":0.7"; print }' >"$work/deb.labels"
mpirun 2 "$bin" prepare --kind classify --input "$work/deb.txt" --labels "$work/deb.labels" \
  --out "$work/deb" --shards 2 --vocab-size 4000 --valid-lines 500 --test-lines 500 \
  >"$work/prepare-deb.log"
"$bin" prepare --kind image --input "$work/digits.npz" --out "$work/digits" --shards 2 \
  --valid-lines 180 --test-lines 180 >"$work/prepare-digits.log"
"$bin" prepare --kind image --input "$work/digits.h5" --out "$work/digits-h5" --shards 2 \
  --valid-lines 180 --test-lines 180 >"$work/prepare-digits-h5.log"
# The same images and labels whichever file held them.
if python3 - "$work/digits" "$work/digits-h5" <<'PY'; then
import sys, h5py, numpy as np
for name in ["train-00000.h5", "train-00001.h5", "valid-00000.h5", "test-00000.h5"]:
    a, b = (h5py.File(f"{d}/{name}", "r") for d in sys.argv[1:3])
    for key in ["images", "labels/ids", "labels/weights", "labels/offsets", "label_names"]:
        assert np.array_equal(a[key][:], b[key][:]), (name, key)
PY
  echo "PASS: prepare --kind image reads .npz and HDF5 alike: $(head -n 1 "$work/prepare-digits.log")"
else
  echo "FAIL: prepare --kind image: the .npz and HDF5 shards differ" >&2
  failures=$((failures + 1))
fi

deb_flags=(--model classify --loss zlpr --pool mean --data "$work/deb" --max-len 96
  --layers 2 --d-model 64 --heads 4 --d-ff 128)
digit_flags=(--model classify --loss softmax --patch 2 --max-len 17 --data "$work/digits"
  --layers 2 --d-model 64 --heads 4 --d-ff 128)

# ---- world-size invariance ----
# train NAME RANKS ACCUM FLAGS...: 3 steps at a constant LR that moves every
# parameter, dropout 0, small buckets for several all-reduces per step.
train() {
  local name=$1 ranks=$2 accum=$3
  shift 3
  if ! mpirun "$ranks" "$bin" train --out "$work/$name" --accum-steps "$accum" --steps 3 \
    --max-tokens 1024 --lr 1e-2 --warmup 0 --schedule constant --dropout 0 --bucket-mb 0.05 \
    --check-every 1 --log-every 1 --eval-batches 2 --seed 7 "$@" >"$work/$name.log" 2>&1; then
    cat "$work/$name.log" >&2
    echo "FAIL: $name: mpiformer train exited non-zero" >&2
    exit 1
  fi
}
same() {
  local what=$1 a=$2 b=$3
  shift 3
  if "$compare" "$work/$a/checkpoints/step_00000003.h5" "$work/$b/checkpoints/step_00000003.h5" \
    "$@" >"$work/compare.log" 2>&1; then
    echo "PASS: $what: $(tail -n 1 "$work/compare.log")"
  else
    cat "$work/compare.log" >&2
    echo "FAIL: $what" >&2
    failures=$((failures + 1))
  fi
}
for task in deb digit; do
  flags=("${deb_flags[@]}")
  [[ $task == digit ]] && flags=("${digit_flags[@]}" --pool cls)
  train "$task-np1" 1 4 "${flags[@]}"
  train "$task-np2" 2 2 "${flags[@]}"
  train "$task-np4" 4 1 "${flags[@]}"
  train "$task-np1x3" 1 3 "${flags[@]}"
  train "$task-np3" 3 1 "${flags[@]}"
  same "$task: -np 2 x 2 vs -np 1 x 4" "$task-np2" "$task-np1" --bitwise
  same "$task: -np 4 x 1 vs -np 1 x 4" "$task-np4" "$task-np1" --bitwise
  same "$task: -np 3 x 1 vs -np 1 x 3" "$task-np3" "$task-np1x3" --bitwise
  for moment in m v; do
    same "$task: Adam $moment, -np 4 x 1 vs -np 1 x 4" "$task-np4" "$task-np1" \
      --group "optimizer/$moment" --bitwise
  done
done
grep -q "micro-F1" "$work/deb-np2.log" ||
  { echo "FAIL: the zlpr progress line lacks micro-F1" >&2; failures=$((failures + 1)); }

# ---- learning ----
# Digits: a ViT of 2x2 patches, mean-pooled, on the 1,439 training images.
mpirun 2 "$bin" train "${digit_flags[@]}" --pool mean --max-tokens 544 --steps 1200 --lr 2e-3 \
  --warmup 30 --schedule cosine --dropout 0.1 --weight-decay 0.01 --log-every 200 \
  --out "$work/digits-run" >"$work/digits-run.log" 2>&1 ||
  { cat "$work/digits-run.log" >&2; echo "FAIL: digits training" >&2; exit 1; }
# Held out: the validation and the test images together (358; prepare keeps
# each split to a tenth of the set), so that one image weighs 0.28 points.
# The rounding of the BLAS kernels, which OpenBLAS picks per CPU
# (OPENBLAS_CORETYPE), sends the run different ways: over 13 kernel families
# the accuracy on the 358 spans 96.37-98.88% (sd 0.7; the 179 test images
# alone gave 95.53-98.88%, sd 1.0), seeds 1-12 96.09-98.88%. 94% stands 2.4
# points (8 images) under the worst kernel family.
digit_evals=()
for split in valid test; do
  mpirun 2 "$bin" eval --checkpoint "$work/digits-run/checkpoints/step_00001200.h5" \
    --data "$work/digits" --split "$split" >"$work/digits-$split.log" 2>&1
  line=$(grep "^eval |" "$work/digits-$split.log")
  digit_evals+=("$split: ${line#eval | }")
done
# Correct images: each split's accuracy times its examples.
held=$(printf '%s\n' "${digit_evals[@]}" |
  sed -n 's/.*| acc \([0-9.]*\)% | \([0-9]*\) examples$/\1 \2/p' |
  awk '{ c += int($1 * $2 / 100 + 0.5); n += $2 } END { if (n) printf "%.2f %d", 100 * c / n, n }')
acc=${held% *} held_out=${held#* }
if awk -v a="$acc" 'BEGIN { exit !(a != "" && a >= 94) }'; then
  echo "PASS: digits held out: accuracy $acc% of $held_out images (>= 94%):" \
    "${digit_evals[0]}; ${digit_evals[1]}"
else
  echo "FAIL: digits held-out accuracy '$acc'%, expected >= 94%: ${digit_evals[*]}" >&2
  failures=$((failures + 1))
fi

# Debtags: ZLPR over the kept tags, mean-pooled, 2 ranks.
mpirun 2 "$bin" train "${deb_flags[@]}" --max-tokens 2048 --steps 600 --lr 3e-3 --warmup 60 \
  --schedule cosine --dropout 0.1 --log-every 100 --out "$work/deb-run" \
  >"$work/deb-run.log" 2>&1 ||
  { cat "$work/deb-run.log" >&2; echo "FAIL: debtags training" >&2; exit 1; }
mpirun 2 "$bin" eval --checkpoint "$work/deb-run/checkpoints/step_00000600.h5" \
  --data "$work/deb" --split test >"$work/deb-test.log" 2>&1
line=$(grep "^eval |" "$work/deb-test.log")
f1=$(sed -n 's/.*micro P\/R\/F1 [0-9.]* [0-9.]* \([0-9.]*\) |.*/\1/p' <<<"$line")
"$root/analysis/label_baseline.py" "$work/deb" --split test >"$work/baseline.log"
baseline=$(sed -n 's/^best: top-[0-9]* micro-F1 \([0-9.]*\)/\1/p' "$work/baseline.log")
if [[ -n $f1 && -n $baseline ]] && awk -v a="$f1" -v b="$baseline" 'BEGIN { exit !(a > b) }'; then
  echo "PASS: debtags held out: micro-F1 $f1 > $(tail -n 1 "$work/baseline.log" | cut -c7-) baseline: $line"
else
  cat "$work/baseline.log" >&2
  echo "FAIL: debtags held-out micro-F1 '$f1' not above the baseline '$baseline': $line" >&2
  failures=$((failures + 1))
fi

# ---- classify ----
head -n 3 "$work/debtags/debtags.txt" | tail -n 2 >"$work/two.txt"
"$bin" classify --checkpoint "$work/deb-run/checkpoints/step_00000600.h5" \
  --input "$work/two.txt" --top 3 >"$work/classify.out" 2>"$work/classify.err"
if [[ $(wc -l <"$work/classify.out") -eq 2 ]] &&
  grep -Eq '^[^ ]+:-?[0-9]+\.[0-9]{4}( [^ ]+:-?[0-9]+\.[0-9]{4}){2}$' \
    "$work/classify.out"; then
  echo "PASS: classify --input: $(head -n 1 "$work/classify.out")"
else
  cat "$work/classify.out" "$work/classify.err" >&2
  echo "FAIL: classify --input does not print 3 labels with scores per line" >&2
  failures=$((failures + 1))
fi

# ---- refusals ----
printf 'one\ntwo\n' >"$work/bad.txt"
printf 'a\nb:1.5\n' >"$work/bad.labels"
rc=0
"$bin" prepare --kind classify --input "$work/bad.txt" --labels "$work/bad.labels" \
  --out "$work/bad" >/dev/null 2>"$work/bad.err" || rc=$?
if [[ $rc -eq 2 ]] && grep -q "bad.labels:2: weight 1.5 of 'b' is not in \[0, 1\]" "$work/bad.err"; then
  echo "PASS: a label weight of 1.5 is refused: $(cat "$work/bad.err")"
else
  cat "$work/bad.err" >&2
  echo "FAIL: a label weight of 1.5: exit $rc" >&2
  failures=$((failures + 1))
fi

exit_on_failures
