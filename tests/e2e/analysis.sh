#!/usr/bin/env bash
# analysis/: plot_run.py draws two real runs into one PNG (a PNG of the
# expected size that is not blank), and does so with each of its flags
# (--x tokens, --x time, --log-loss, --smooth); the figure holds the panels
# and curves the flags ask for (a gradient-norm panel, nll beside the
# label-smoothed loss, x = cumulative tokens or elapsed_s, faint raw curves
# under smoothed ones, log loss axes). A metrics file of an older version
# (without nll, elapsed_s, ...) still plots, and --x time on it is one line,
# exit 2; so is a directory without metrics (nothing written). A file
# without the label-figure columns (micro/macro P/R/F1) plots. Padding
# efficiency has a fixed y range up to 1; a panel without data (no
# evaluation yet) says "no data: ...". run_report.ipynb executes headless,
# without nbformat's MissingIDFieldWarning, on a run, on the older file and
# on the file without label columns.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt

tiny=(train --model lm --synthetic copy --layers 1 --d-model 32 --heads 2 --d-ff 64 --max-len 32
  --max-tokens 256 --steps 60 --log-every 5 --eval-every 20 --eval-batches 2 --threads 1)
"$bin" "${tiny[@]}" --out run-a --lr 1e-3 >run-a.log
"$bin" "${tiny[@]}" --out run-b --lr 3e-3 --schedule cosine --label-smoothing 0.1 >run-b.log
# run-a's metrics as versions before metrics version 2 wrote them.
mkdir old-run && cp -r run-a/metrics.h5 run-a/checkpoints old-run/
as_version_1 old-run/metrics.h5
# run-a's metrics without the label-figure columns.
mkdir nolabels-run && cp -r run-a/metrics.h5 run-a/metrics.jsonl run-a/checkpoints nolabels-run/
without_label_columns nolabels-run

# is_plot PNG: a PNG of plot_run.py's size (15 x 8 inches at 100 dpi) with ink.
is_plot() { is_png "$1" 1500 800; }

rc=0
python3 "$src/analysis/plot_run.py" run-a run-b -o curves.png --smooth 2 >"$out" 2>"$err" || rc=$?
if [[ $rc -ne 0 ]]; then
  fail "plot_run.py on two runs: exit code $rc"
else
  # A plot, with curves in both runs' colours.
  if is_plot curves.png && python3 - curves.png <<'PY'; then
import sys

import matplotlib.image as image

pixels = image.imread(sys.argv[1])
# Curves in the colours of both runs (C0 blue, C1 orange) somewhere.
rgb = pixels[..., :3]
blue = ((abs(rgb[..., 0] - 0.12) < 0.05) & (abs(rgb[..., 2] - 0.71) < 0.05)).sum()
orange = ((abs(rgb[..., 0] - 1.0) < 0.05) & (abs(rgb[..., 1] - 0.5) < 0.05)).sum()
assert blue > 200 and orange > 200, f"run colours: {blue} blue, {orange} orange pixels"
print("PASS: curves.png is a 1500x800 PNG with both runs drawn")
PY
    :
  else
    fail "curves.png is not the expected plot"
  fi
  grep -q "run-a: 12 rows, run-b: 12 rows" "$out" || fail "plot_run.py does not report 12 rows per run"
fi

# Each new flag, alone and together: exit 0 and a plot.
flag_sets=("--x step" "--x tokens" "--x time" "--log-loss" "--smooth 4 --x tokens --log-loss"
  "--smooth 3 --x time")
for flags in "${flag_sets[@]}"; do
  rc=0
  # shellcheck disable=SC2086 # the flags split into words
  python3 "$src/analysis/plot_run.py" run-a run-b -o flags.png $flags >"$out" 2>"$err" || rc=$?
  if [[ $rc -ne 0 ]]; then
    fail "plot_run.py $flags: exit code $rc"
  elif ! is_plot flags.png; then
    fail "plot_run.py $flags: flags.png is not the expected plot"
  else
    echo "PASS: plot_run.py $flags writes a plot"
  fi
  rm -f flags.png
done

# What the figure holds, through plot_figure (plot_run.py's drawing).
if python3 - "$src/analysis" <<'PY'; then
import sys

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402

sys.path.insert(0, sys.argv[1])
from mpiformer_metrics import plot_figure, read_metrics, smooth  # noqa: E402

runs = {"run-a": read_metrics("run-a"), "run-b": read_metrics("run-b")}
b = runs["run-b"]["train"]


def panels(fig):
    return {ax.get_title(): ax for ax in fig.axes}


def lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


fig = plot_figure(runs)
titles = set(panels(fig))
assert titles == {"loss", "eval perplexity", "learning rate", "gradient norm (before clipping)",
                  "tokens/s", "padding efficiency"}, titles
loss = lines(panels(fig)["loss"])
# run-b smooths its labels: its nll differs from the objective; run-a's does not.
for label in ("run-b train", "run-b train nll", "run-b eval", "run-b eval nll",
              "run-a train (loss = nll)", "run-a eval"):
    assert label in loss, f"no '{label}' curve: {sorted(loss)}"
assert "run-a train nll" not in loss
assert np.array_equal(loss["run-b train nll"].get_ydata(), b["nll"])
grad = lines(panels(fig)["gradient norm (before clipping)"])
assert np.array_equal(grad["run-b"].get_ydata(), b["grad_norm"])
assert panels(fig)["loss"].get_yscale() == "linear"

fig = plot_figure(runs, window=4, x="tokens", log_loss=True)
loss_ax = panels(fig)["loss"]
assert loss_ax.get_yscale() == "log" and panels(fig)["eval perplexity"].get_yscale() == "log"
assert loss_ax.get_xlabel() == "target tokens seen"
train = lines(loss_ax)["run-b train"]
assert np.array_equal(train.get_xdata(), np.cumsum(b["tokens"]))
assert np.allclose(train.get_ydata(), smooth(b["loss"], 4))
# Under each smoothed curve, the rows as logged, faint.
faint = [line for line in loss_ax.get_lines() if line.get_alpha() is not None
         and line.get_alpha() < 0.5 and np.array_equal(line.get_ydata(), b["loss"])]
assert len(faint) == 1, "no faint raw train loss under the smoothed one"
grad_ax = panels(fig)["gradient norm (before clipping)"]
assert any(line.get_alpha() for line in grad_ax.get_lines()), "no faint raw gradient norm"

fig = plot_figure(runs, x="time")
line = lines(panels(fig)["loss"])["run-b train"]
unit = {"elapsed (s)": 1, "elapsed (min)": 60, "elapsed (h)": 3600}[panels(fig)["loss"].get_xlabel()]
assert np.allclose(line.get_xdata() * unit, b["elapsed_s"])

# Padding efficiency: a fixed range from 0.9 (or below the lowest point, in
# steps of 0.1) to just above 1, not autoscaled around the noise.
pad = panels(plot_figure(runs))["padding efficiency"]
low, high = pad.get_ylim()
lowest = min(np.nanmin(m["train"]["padding_efficiency"]) for m in runs.values())
assert low <= min(0.9, lowest) and lowest - low <= 0.1 and 1.0 <= high <= 1.02, (low, high, lowest)

# A run read before its first evaluation: the perplexity panel says so.
early = {"attrs": runs["run-a"]["attrs"], "train": runs["run-a"]["train"],
         "eval": {name: values[:0] for name, values in runs["run-a"]["eval"].items()}}
fig = plot_figure({"early": early})
notes = {title: [t.get_text() for t in ax.texts] for title, ax in panels(fig).items()}
assert notes["eval perplexity"] and notes["eval perplexity"][0].startswith("no data: "), notes
assert not any(notes[t] for t in notes if t != "eval perplexity"), notes
print("PASS: the figure's panels and curves follow the flags")
PY
  :
else
  fail "the figure does not hold what the flags ask for"
fi

rc=0
python3 "$src/analysis/plot_run.py" nolabels-run run-b -o nolabels.png >"$out" 2>"$err" || rc=$?
if [[ $rc -eq 0 ]] && is_plot nolabels.png; then
  echo "PASS: a metrics file without the label-figure columns plots"
else
  fail "plot_run.py on a file without the label-figure columns: exit code $rc"
fi

# A file of an older version plots, except against time.
rc=0
python3 "$src/analysis/plot_run.py" old-run -o old.png --smooth 2 >"$out" 2>"$err" || rc=$?
if [[ $rc -eq 0 ]] && is_plot old.png; then
  echo "PASS: a metrics file without the newer columns plots"
else
  fail "plot_run.py on a file without the newer columns: exit code $rc"
fi
rc=0
python3 "$src/analysis/plot_run.py" old-run -o old-time.png --x time >"$out" 2>"$err" || rc=$?
expect_one_line_error "--x time without elapsed_s" 2 \
  "plot_run.py: old-run/metrics.h5: no /train/elapsed_s column" "--x step or --x tokens"
[[ ! -e old-time.png ]] || fail "a refused --x time wrote old-time.png"

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
# Every cell has an id (nbformat 4.5): no warning that one is missing.
check "nbconvert gives no MissingIDFieldWarning" not_in MissingIDFieldWarning "$err"

for run in old-run nolabels-run; do
  rc=0
  MPIFORMER_RUN=$run timeout 300 python3 -m nbconvert --to notebook --execute \
    --output-dir "$work" --output "report-$run.ipynb" "$src/analysis/run_report.ipynb" \
    >"$out" 2>"$err" || rc=$?
  if [[ $rc -ne 0 ]]; then
    fail "run_report.ipynb did not execute on $run (exit code $rc)"
  else
    echo "PASS: run_report.ipynb executes on $run"
  fi
done

exit_on_failures
echo "analysis: all checks passed"
