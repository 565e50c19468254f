#!/usr/bin/env bash
# The classifier (--model classify) against an independent float64 PyTorch
# forward pass (analysis/torch_reference.py --data): the encoder stack,
# pooling, the classifier head and both losses written again from their
# definitions, run over every example of the validation split read from the
# shards. `mpiformer eval` (2 ranks) must print the same loss, nll, accuracy
# and example count, and for zlpr the same micro and macro P/R/F1, as the
# reference (to its 4 printed decimals); the final eval that training wrote
# to metrics.h5 (full precision) must give the same loss and nll to 1e-6
# relative (measured: 5e-10 to 1.1e-8; a pixel scale of 1/128 instead of
# 1/127.5 moves the loss by 3e-6), and the same accuracy and label figures.
# Covered: text, softmax with label smoothing, --pool cls (BOS as the CLS
# token, long lines truncated), pre-LN, learned positions; text, zlpr with
# soft labels (NAME:0.3, :0.5, :0.7) and unlabelled lines, --pool mean,
# post-LN, sinusoidal positions, --too-long skip; images (2 x 2 patches of
# 8 x 8 x 3 pixels), softmax with --pool cls and zlpr with --pool mean and
# relu, one of them trained on 1 rank. The check can fail: the reference
# run as if the softmax model pooled by mean is reported.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
# Debian's PyTorch lives in the system's Python (scripts/setup installs it).
python=/usr/bin/python3
failures=0 out=$work/out.txt err=$work/err.txt
: >"$out" && : >"$err"

# Text with labels from its words: one hard label per line, and a
# multi-label set with soft weights (blank: no label); images whose label
# brightens one quadrant in one channel over uniform noise.
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >text.txt
"$python" - <<'PY'
import numpy as np

lines = open("text.txt").read().splitlines()
with open("hard.labels", "w") as hard, open("soft.labels", "w") as soft:
    for i, line in enumerate(lines):
        w = line.lower()
        hard.write(("lic" if "license" in w else "prog" if "program" in w
                    else "work" if "work" in w else "other") + "\n")
        labels = [name for name, word in (("the", " the "), ("lic", "license")) if word in w]
        if "program" in w:  # true at 0.5 (the truth is t >= 0.5)
            labels.append("prog:0.5" if i % 3 == 0 else "prog")
        if "you" in w:
            labels.append("you:0.3")
        if "work" in w:
            labels.append("work:0.7" if i % 2 else "work")
        soft.write(" ".join(labels) + "\n")

rng = np.random.RandomState(7)
labels = np.arange(400) % 4
rng.shuffle(labels)
images = rng.randint(0, 150, size=(400, 8, 8, 3))
for i, k in enumerate(labels):
    y, x = divmod(k, 2)
    images[i, 4 * y:4 * y + 4, 4 * x:4 * x + 4, k % 3] += 100
np.savez("images.npz", images=images.astype(np.uint8), labels=labels,
         label_names=np.array(["nw", "ne", "sw", "se"]))
PY
for set in hard soft; do
  "$bin" prepare --kind classify --input text.txt --labels "$set.labels" --out "$set" --shards 2 \
    --vocab-size 300 --valid-lines 50 >"prepare-$set.log"
done
"$bin" prepare --kind image --input images.npz --out images --shards 2 --valid-lines 40 \
  >prepare-images.log

# compare.py EVAL_LINE REFERENCE_LINE METRICS: eval's line against the
# reference at its printed precision; metrics.h5's last /eval row at 1e-6.
cat >compare.py <<'PY'
import math
import re
import sys

import h5py

line, reference, metrics = sys.argv[1:4]
ref = dict(zip(reference.split()[::2], reference.split()[1::2]))
ref = {k: int(v) if k == "examples" else float(v) for k, v in ref.items()}
ours = {}
m = re.search(r"loss ([-.\d]+) \| nll ([-.\d]+) \| acc ([.\d]+)%", line)
if m:
    ours.update(loss=float(m[1]), nll=float(m[2]), acc=float(m[3]))
m = re.search(r"\| (\d+) examples$", line)
if m:
    ours["examples"] = int(m[1])
m = re.search(r"micro P/R/F1 ([.\d]+) ([.\d]+) ([.\d]+) \| macro P/R/F1 ([.\d]+) ([.\d]+) ([.\d]+)",
              line)
if m:
    ours.update(zip(("micro_p", "micro_r", "micro_f1", "macro_p", "macro_r", "macro_f1"),
                    map(float, m.groups())))
bad = []
for key, want in ref.items():
    got = ours.get(key)
    # %.4f (%.2f for the percent), so half a unit of the last digit apart at most
    slack = 0 if key == "examples" else 0.005 if key == "acc" else 5e-5 + 1e-6 * abs(want)
    if got is None or abs(got - want) > slack:
        bad.append(f"eval {key} {got}, reference {want}")
if set(ours) != set(ref):
    bad.append(f"eval prints {sorted(ours)}, the reference {sorted(ref)}")
with h5py.File(metrics, "r") as f:
    row = {k: float(f["eval"][k][-1]) for k in f["eval"] if k != "step"}
# A single-label classifier's file has no label columns: they read as NaN.
label = lambda name: row.get(name, math.nan)
full = {"loss": row["loss"], "nll": row["nll"], "acc": 100 * row["accuracy"],
        "examples": row["tokens"], "micro_p": label("micro_precision"),
        "micro_r": label("micro_recall"), "micro_f1": label("micro_f1"),
        "macro_p": label("macro_precision"), "macro_r": label("macro_recall"),
        "macro_f1": label("macro_f1")}
for key, got in full.items():
    want = ref.get(key, math.nan)
    if math.isnan(want):
        if not math.isnan(got):
            bad.append(f"metrics.h5 {key} {got}, where the reference has none")
        continue
    slack = 1e-6 * abs(want) if key in ("loss", "nll") else 1e-9
    if not abs(got - want) <= slack:
        bad.append(f"metrics.h5 {key} {got!r}, reference {want!r}")
print("\n".join(bad) if bad else
      f"relative differences: loss {abs(full['loss'] - ref['loss']) / ref['loss']:.1e}, "
      f"nll {abs(full['nll'] - ref['nll']) / ref['nll']:.1e}")
sys.exit(1 if bad else 0)
PY

# check_classifier NAME RANKS DATA TRAIN_FLAGS...: trains, evaluates the
# last checkpoint on 2 ranks and compares with the reference.
common=(--model classify --layers 2 --d-model 32 --heads 2 --d-ff 64 --max-tokens 1024 --dropout 0
  --threads 1 --warmup 10)
check_classifier() {
  local name=$1 ranks=$2 data=$3 rc=0 line reference checkpoints
  shift 3
  "${mpirun[@]}" -np "$ranks" "$bin" train "${common[@]}" --data "$data" "$@" --out "run-$name" \
    >"train-$name.log" 2>&1 || rc=$?
  checkpoints=("run-$name"/checkpoints/step_*.h5)
  local checkpoint=${checkpoints[-1]}
  if [[ $rc -ne 0 || ! -f $checkpoint ]]; then
    cp "train-$name.log" "$err"
    fail "$name: training failed (exit $rc)"
    return
  fi
  "${mpirun[@]}" -np 2 "$bin" eval --checkpoint "$checkpoint" --data "$data" --threads 1 \
    >"$out" 2>"$err" || rc=$?
  line=$(grep '^eval |' "$out" || true)
  echo "$line" >"eval-$name.txt"
  reference=$("$python" "$src/analysis/torch_reference.py" "$checkpoint" --data "$data" 2>"$err") ||
    rc=$?
  echo "$name: mpiformer $line"
  echo "$name: PyTorch   $reference"
  if [[ $rc -eq 0 ]] &&
    "$python" compare.py "$line" "$reference" "run-$name/metrics.h5" >cmp.txt; then
    echo "PASS: $name: eval and metrics.h5 agree with float64 PyTorch ($(cat cmp.txt))"
  else
    fail "$name (exit $rc): $(cat cmp.txt 2>/dev/null)"
  fi
}

check_classifier text-softmax-cls 2 hard --loss softmax --pool cls --max-len 32 \
  --label-smoothing 0.1 --lr 3e-3 --steps 60 --log-every 30
# valid_dropped NAME WHAT: the validation lines of run NAME that were WHAT
# (truncated, skipped) for being longer than --max-len.
valid_dropped() { sed -n "s/^  valid: .*[(, ]\([0-9]*\) $2.*/\1/p" "train-$1.log"; }
[[ $(valid_dropped text-softmax-cls truncated) -gt 0 ]] ||
  fail "text-softmax-cls: no validation line truncated: $(grep valid: train-text-softmax-cls.log)"
check_classifier text-zlpr-mean 2 soft --loss zlpr --pool mean --norm post --positions sinusoidal \
  --max-len 40 --too-long skip --lr 3e-3 --schedule constant --steps 150 --log-every 50
[[ $(valid_dropped text-zlpr-mean skipped) -gt 0 ]] ||
  fail "text-zlpr-mean: no validation line skipped: $(grep valid: train-text-zlpr-mean.log)"
check_classifier image-softmax-cls 2 images --patch 2 --max-len 17 --loss softmax --pool cls \
  --lr 3e-3 --steps 30 --log-every 30
check_classifier image-zlpr-mean 1 images --patch 2 --max-len 16 --loss zlpr --pool mean \
  --activation relu --lr 3e-3 --steps 40 --log-every 40

# The check can fail: the softmax text model read as if it pooled by mean.
"$python" - run-text-softmax-cls/checkpoints/step_00000060.h5 wrong.h5 <<'PY'
import shutil
import sys

import h5py

shutil.copy(sys.argv[1], sys.argv[2])
with h5py.File(sys.argv[2], "r+") as f:
    config = f.attrs["config"]
    config = config.decode() if isinstance(config, bytes) else str(config)
    assert "pool = cls\n" in config
    f.attrs["config"] = config.replace("pool = cls\n", "pool = mean\n")
PY
rc=0
reference=$("$python" "$src/analysis/torch_reference.py" wrong.h5 --data hard 2>"$err") || rc=$?
"$python" compare.py "$(cat eval-text-softmax-cls.txt)" "$reference" \
  run-text-softmax-cls/metrics.h5 >cmp.txt 2>&1 || true
if [[ $rc -eq 0 ]] && grep -q '^eval loss ' cmp.txt && grep -q '^metrics.h5 loss ' cmp.txt; then
  echo "PASS: the reference of a wrongly pooled model is reported: $(head -n 1 cmp.txt)"
else
  fail "a reference that pools by mean (exit $rc) is not told apart: $(cat cmp.txt)"
fi

exit_on_failures
echo "PASS: the classifier matches an independent recomputation"
