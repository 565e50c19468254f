#!/usr/bin/env bash
# The transformers example of docs/ANALYSIS.md, run verbatim: its ```python
# block of the "Hugging Face" section prints the text that the section's
# `build/mpiformer generate` command prints, on a run laid out as the README's
# First run leaves it (runs/kjv/checkpoints/step_00000200.h5 trained on the
# King James Bible shards, exported to runs/kjv/hf by the First run's own
# export line). The model is smaller than the First run's so the test is
# quick; the paths, the prompt and the flags are the documents'. The block
# runs on the Python of .deps/torch-venv (as the section says), or
# MPIFORMER_HF_PYTHON; without transformers the test is skipped (exit 77).
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
hf_python=${MPIFORMER_HF_PYTHON:-$src/.deps/torch-venv/bin/python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=$work/hf-home

# The section's code block and its indented commands (continuations joined).
section() {
  awk '/^## Hugging Face/ { inside = 1; next } /^##/ { inside = 0 } inside' "$src/docs/ANALYSIS.md"
}
section | awk '/^```python$/ { inside = 1; next } /^```$/ { inside = 0 } inside' >"$work/example.py"
section | awk '/^    / { line = substr($0, 5)
                        if (sub(/\\$/, "", line)) { pending = pending line; next }
                        print pending line; pending = "" }' |
  grep 'mpiformer generate' >"$work/generate.sh" || true
# The README's First run's export line.
awk '/^## First run/ { inside = 1; next } /^## / { inside = 0 }
     inside && /^    .*export_hf\.py/ { print substr($0, 5) }' "$src/README.md" >"$work/export.sh"
for file in example.py generate.sh; do
  [[ -s $work/$file ]] ||
    { echo "FAIL: docs/ANALYSIS.md has no $file part for this test" >&2; exit 1; }
done
[[ -s $work/export.sh ]] || { echo "FAIL: README.md has no export.sh part for this test" >&2; exit 1; }
grep -q 'model.generate(' "$work/example.py" ||
  { echo "FAIL: docs/ANALYSIS.md's example does not call model.generate()" >&2; exit 1; }
if [[ ! -x $hf_python ]] || ! "$hf_python" -c "import torch, transformers" 2>/dev/null; then
  echo "SKIP: no transformers on $hf_python: docs/ANALYSIS.md's example was not run"
  exit 77
fi

# A tree laid out as a checkout after the First run: build/ is the binary's
# directory, analysis/ the sources'.
tree=$work/tree
mkdir -p "$tree"
cd "$tree"
ln -s "$(dirname "$bin")" build
ln -s "$src/analysis" analysis
"$src/data/extract-kjv.sh" corpora/kjv.txt >/dev/null
build/mpiformer prepare --kind lm --input corpora/kjv.txt --out shards/kjv --shards 1 \
  --vocab-size 4000 --valid-lines 500 --test-lines 500 >"$work/prepare.log"
build/mpiformer train --model lm --data shards/kjv --out runs/kjv --threads 1 --layers 1 \
  --d-model 64 --heads 4 --d-ff 128 --max-len 128 --max-tokens 4096 --steps 200 --lr 3e-3 \
  --output-bias false --log-every 100 --eval-batches 2 >"$work/train.log"
bash -euo pipefail "$work/export.sh" >"$work/export.log"
bash -euo pipefail "$work/generate.sh" >"$work/ours.txt" 2>"$work/generate.log"
rc=0
"$hf_python" "$work/example.py" >"$work/theirs.txt" 2>"$work/example.log" || rc=$?
if [[ $rc -ne 0 ]]; then
  echo "FAIL: docs/ANALYSIS.md's example failed (exit $rc):" >&2
  tail -n 20 "$work/example.log" >&2
  exit 1
fi
if [[ ! -s $work/ours.txt || $(tr -d '[:space:]' <"$work/ours.txt") == "" ]]; then
  echo "FAIL: generate printed no text" >&2
  exit 1
fi
if cmp -s "$work/ours.txt" "$work/theirs.txt"; then
  echo "PASS: docs/ANALYSIS.md's transformers example prints generate's text: $(cat "$work/ours.txt")"
else
  echo "FAIL: docs/ANALYSIS.md's transformers example prints $(cat "$work/theirs.txt")" >&2
  echo "  generate prints $(cat "$work/ours.txt")" >&2
  exit 1
fi
