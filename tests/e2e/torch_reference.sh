#!/usr/bin/env bash
# An independent reference: the lm and the seq2seq model of a checkpoint,
# written again in PyTorch from the textbook definitions
# (analysis/torch_reference.py, float64), give the loss and every parameter
# gradient that the CPU backend computed on the same ragged batch with
# padding (tests/dump_step), to 1e-5 relative.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
# Debian's PyTorch lives in the system's Python (scripts/setup installs it).
python=/usr/bin/python3

"$bin" train --model lm --synthetic copy --layers 2 --d-model 32 --heads 4 --d-ff 64 --max-len 32 \
  --max-tokens 256 --steps 30 --dropout 0 --label-smoothing 0.1 --threads 1 --out run \
  --log-every 10 >train.log
"$(dirname "$bin")/tests/dump_step" run/checkpoints/step_00000030.h5 step.h5
"$python" "$src/analysis/torch_reference.py" run/checkpoints/step_00000030.h5 step.h5 \
  --tolerance 1e-5
echo "PASS: lm: PyTorch and the CPU backend agree on the loss and every gradient"

"$bin" train --model seq2seq --synthetic reverse --enc-layers 2 --dec-layers 2 --d-model 32 \
  --heads 4 --d-ff 64 --max-len 32 --max-tokens 256 --steps 30 --dropout 0 --threads 1 \
  --out s2s --log-every 10 >train-s2s.log
"$(dirname "$bin")/tests/dump_step" s2s/checkpoints/step_00000030.h5 s2s.h5
"$python" "$src/analysis/torch_reference.py" s2s/checkpoints/step_00000030.h5 s2s.h5 \
  --tolerance 1e-5
echo "PASS: seq2seq: PyTorch and the CPU backend agree on the loss and every gradient"

# The check can fail: a gradient off by one part in a thousand is caught.
"$python" - step.h5 <<'PY'
import sys

import h5py

with h5py.File(sys.argv[1], "r+") as f:
    g = f["grads"]["decoder.layers.1.mlp.fc.weight"]
    g[0] = g[0] * 1.001 + 1e-3
PY
rc=0
"$python" "$src/analysis/torch_reference.py" run/checkpoints/step_00000030.h5 step.h5 \
  --tolerance 1e-5 >out.txt 2>err.txt || rc=$?
if [[ $rc -ne 1 ]] || ! grep -q "decoder.layers.1.mlp.fc.weight" err.txt; then
  echo "FAIL: a perturbed gradient was not reported (exit $rc)" >&2
  exit 1
fi
echo "PASS: a perturbed gradient is reported"
