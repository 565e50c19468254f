#!/usr/bin/env bash
# The perplexity users compare with papers: `mpiformer eval` (2 ranks) on an
# lm checkpoint trained with label smoothing prints the true negative
# log-likelihood and ppl = exp(nll), not the smoothed loss. An independent
# float64 PyTorch forward pass over every validation sequence, read from the
# shards (analysis/torch_reference.py --data), gives the same ppl to 1e-4
# relative; training's final eval and metrics.h5 agree; an lm without
# --label-smoothing trains on its nll (the default smoothing is 0 for lm).
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
mpirun=("${MPIEXEC:-mpirun}" -q)
# Debian's PyTorch lives in the system's Python (scripts/setup installs it).
python=/usr/bin/python3
failures=0 out=$work/out.txt err=$work/err.txt

# field NAME LINE: the number after "NAME " in an "a 1 | b 2" or "a 1 b 2" line.
field() { sed -n "s/.*\\b$1 \\([-+.e0-9]*\\).*/\\1/p" <<<"$2"; }
# within A B TOL: |A - B| <= TOL * |B|
within() { awk -v a="$1" -v b="$2" -v t="$3" \
  'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(a != "" && d <= t * m) }'; }
# relative A B: |A - B| / |B|, for the PASS line.
relative() { awk -v a="$1" -v b="$2" \
  'BEGIN { d = a - b; printf "%.1e", (d < 0 ? -d : d) / (b < 0 ? -b : b) }'; }

grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >text.txt
"$bin" prepare --kind lm --input text.txt --out shards --shards 2 --vocab-size 300 \
  --valid-lines 50 >prepare.log
common=(--model lm --data shards --layers 2 --d-model 32 --heads 2 --d-ff 64 --max-len 128
  --max-tokens 1024 --dropout 0 --threads 1)
"${mpirun[@]}" -np 2 "$bin" train "${common[@]}" --steps 40 --log-every 20 --label-smoothing 0.1 \
  --out run >train.log
checkpoint=run/checkpoints/step_00000040.h5

rc=0
"${mpirun[@]}" -np 2 "$bin" eval --checkpoint "$checkpoint" --data shards --threads 1 \
  >"$out" 2>"$err" || rc=$?
line=$(grep '^eval |' "$out" || true)
"$python" "$src/analysis/torch_reference.py" "$checkpoint" --data shards | tee reference.txt
reference=$(cat reference.txt)
ppl=$(field ppl "$line") nll=$(field nll "$line") loss=$(field loss "$line")
if [[ $rc -eq 0 ]] && within "$ppl" "$(field ppl "$reference")" 1e-4 &&
  within "$nll" "$(field nll "$reference")" 2e-5 &&
  within "$(field bits "$line")" "$(field bits "$reference")" 2e-5 &&
  [[ $(sed -n 's/.*| \([0-9]*\) tokens$/\1/p' <<<"$line") == "$(field tokens "$reference")" ]]; then
  echo "PASS: eval prints ppl $ppl, nll $nll; PyTorch float64: $reference; relative" \
    "differences: ppl $(relative "$ppl" "$(field ppl "$reference")") (<= 1e-4)," \
    "nll $(relative "$nll" "$(field nll "$reference")") (<= 2e-5)," \
    "bits $(relative "$(field bits "$line")" "$(field bits "$reference")") (<= 2e-5)"
else
  fail "eval printed '$line' (exit $rc); the reference gives '$reference'"
fi
# The smoothed loss is a different figure: it must not be what ppl is made of.
within "$loss" "$nll" 1e-3 && fail "the smoothed loss $loss equals the nll $nll"

# Training's final eval (the whole split, by default) prints the same, and
# metrics.h5 keeps it with perplexity = exp(nll).
final=$(sed -n 's/^final eval | //p' train.log)
[[ $final == "${line#eval | }" ]] || fail "training's final eval '$final' differs from eval's '$line'"
"$python" - run/metrics.h5 "$(field nll "$reference")" <<'PY' || fail "metrics.h5 /eval"
import math, sys
import h5py
with h5py.File(sys.argv[1], "r") as f:
    nll, ppl = f["eval/nll"][-1], f["eval/perplexity"][-1]
    train_nll, train_loss = f["train/nll"][:], f["train/loss"][:]
reference = float(sys.argv[2])
assert abs(nll - reference) <= 1e-6 * reference, (nll, reference)
assert abs(ppl - math.exp(nll)) <= 1e-12 * ppl, (ppl, nll)
assert len(train_nll) == 2 and all(train_nll > train_loss), (train_nll, train_loss)
relative = abs(nll - reference) / reference
print(f"PASS: metrics.h5 /eval/nll {nll:.8f} (relative difference {relative:.1e} <= 1e-6), "
      "perplexity exp(nll); /train/nll beside the smoothed loss")
PY

# Without --label-smoothing an lm's objective is its nll.
"$bin" train "${common[@]}" --steps 10 --log-every 10 --out run-default >train-default.log
grep -qx 'label-smoothing = 0' run-default/config.ini ||
  fail "the lm default label smoothing is not 0: $(grep label-smoothing run-default/config.ini)"
final=$(sed -n 's/^final eval | //p' train-default.log)
[[ -n $final && $(field loss "$final") == "$(field nll "$final")" ]] ||
  fail "without smoothing the loss should be the nll: '$final'"

[[ $failures -eq 0 ]] || exit 1
echo "PASS: nll and perplexity match an independent recomputation"
