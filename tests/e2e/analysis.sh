#!/usr/bin/env bash
# analysis/: plot_run.py draws two real runs into one PNG (a PNG of the
# expected size that is not blank), refuses a directory without metrics
# (one line, exit 2), and run_report.ipynb executes headless on a run.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt

tiny=(train --model lm --synthetic copy --layers 1 --d-model 32 --heads 2 --d-ff 64 --max-len 32
  --max-tokens 256 --steps 60 --log-every 5 --eval-every 20 --eval-batches 2 --threads 1)
"$bin" "${tiny[@]}" --out run-a --lr 1e-3 >run-a.log
"$bin" "${tiny[@]}" --out run-b --lr 3e-3 --schedule cosine >run-b.log

rc=0
python3 "$src/analysis/plot_run.py" run-a run-b -o curves.png --smooth 2 >"$out" 2>"$err" || rc=$?
if [[ $rc -ne 0 ]]; then
  fail "plot_run.py on two runs: exit code $rc"
else
  # The PNG signature, IHDR's size (12 x 8 inches at 100 dpi), and ink.
  if python3 - curves.png <<'PY'; then
import struct
import sys

import matplotlib.image as image

data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
width, height = struct.unpack(">II", data[16:24])
assert (width, height) == (1200, 800), f"size {width}x{height}"
pixels = image.imread(sys.argv[1])
assert pixels.std() > 0.05, f"nearly blank: pixel std {pixels.std():.3f}"
# Curves in the colours of both runs (C0 blue, C1 orange) somewhere.
rgb = pixels[..., :3]
blue = ((abs(rgb[..., 0] - 0.12) < 0.05) & (abs(rgb[..., 2] - 0.71) < 0.05)).sum()
orange = ((abs(rgb[..., 0] - 1.0) < 0.05) & (abs(rgb[..., 1] - 0.5) < 0.05)).sum()
assert blue > 200 and orange > 200, f"run colours: {blue} blue, {orange} orange pixels"
print(f"PASS: curves.png is a {width}x{height} PNG with both runs drawn")
PY
    :
  else
    fail "curves.png is not the expected plot"
  fi
  grep -q "run-a: 12 rows, run-b: 12 rows" "$out" || fail "plot_run.py does not report 12 rows per run"
fi

mkdir -p empty-run
rc=0
python3 "$src/analysis/plot_run.py" run-a empty-run -o bad.png >"$out" 2>"$err" || rc=$?
expect_one_line_error "a directory without metrics.h5" 2 "plot_run.py: empty-run/metrics.h5: no such file"
[[ ! -e bad.png ]] || fail "a refused plot wrote bad.png"

rc=0
# As the README runs it: a run path relative to here, the report written here.
MPIFORMER_RUN=run-a timeout 300 python3 -m nbconvert --to notebook --execute \
  --output-dir "$work" --output report.ipynb "$src/analysis/run_report.ipynb" >"$out" 2>"$err" ||
  rc=$?
if [[ $rc -ne 0 ]]; then
  fail "run_report.ipynb did not execute (exit code $rc)"
elif ! grep -q "rms" "$work/report.ipynb" || ! grep -q "image/png" "$work/report.ipynb"; then
  fail "run_report.ipynb ran but shows no parameter table or figure"
else
  echo "PASS: run_report.ipynb executes on a run: figures and the checkpoint's tensors"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "analysis: all checks passed"
