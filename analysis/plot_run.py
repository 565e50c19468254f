#!/usr/bin/env python3
"""Plots one or more mpiformer runs (their metrics.h5) into one PNG:
loss (train and eval), learning rate, tokens/s and padding efficiency
against step, the runs overlaid. Works while the runs still train.

usage: analysis/plot_run.py RUNDIR [RUNDIR...] -o out.png [--smooth N]
"""

import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpiformer_metrics import RunError, plot_runs, read_metrics  # noqa: E402


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rundirs", nargs="+", metavar="RUNDIR")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--smooth", type=int, default=1,
                        help="moving average over N log rows for train loss and tokens/s")
    args = parser.parse_args(argv)
    try:
        runs = {}
        for rundir in args.rundirs:
            label = os.path.basename(os.path.normpath(rundir))
            while label in runs:
                label += "'"
            runs[label] = read_metrics(rundir)
    except RunError as e:
        print(f"plot_run.py: {e}", file=sys.stderr)
        return 2
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    plot_runs(runs, axes, window=args.smooth)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    rows = ", ".join(f"{label}: {len(m['train'].get('step', []))} rows" for label, m in runs.items())
    print(f"wrote {args.output} ({rows})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
