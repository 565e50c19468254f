#!/usr/bin/env python3
"""Plots one or more mpiformer runs (their metrics.h5) into one PNG:
loss (train objective and NLL, eval loss and NLL), eval perplexity,
learning rate, gradient norm, tokens/s and padding efficiency (on a fixed
0.9-to-1 axis, lower only when a point is), the runs overlaid. Works while
the runs still train; a panel with nothing to show yet says so.

usage: analysis/plot_run.py RUNDIR [RUNDIR...] -o out.png [--smooth N]
           [--x step|tokens|time] [--log-loss]

--x tokens plots against the target tokens trained on so far (the sum of
/train/tokens), --x time against the wall time since the run began
(/train/elapsed_s, over every resume; files of older versions lack it).
With --smooth N the noisy series are drawn faint as logged, their moving
average over N rows over them.
"""

import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpiformer_metrics import (X_AXES, RunError, metrics_path, plot_figure,  # noqa: E402
                               read_metrics, report_fault, terminal_safe, x_values)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rundirs", nargs="+", metavar="RUNDIR")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--smooth", type=int, default=1,
                        help="moving average over N log rows for train loss and NLL, gradient "
                             "norm and tokens/s, drawn over the faint rows as logged")
    parser.add_argument("--x", choices=X_AXES, default="step",
                        help="x axis: step, target tokens seen, or elapsed wall time")
    parser.add_argument("--log-loss", action="store_true",
                        help="log-scale axes for loss and perplexity")
    args = parser.parse_args(argv)
    try:
        runs = {}
        for rundir in args.rundirs:
            label = os.path.basename(os.path.normpath(rundir))
            while label in runs:
                label += "'"
            runs[label] = read_metrics(rundir)
            try:
                x_values(runs[label], args.x)
            except RunError as e:
                raise RunError(f"{metrics_path(rundir)}: {e}") from None
        fig = plot_figure(runs, window=args.smooth, x=args.x, log_loss=args.log_loss)
    except RunError as e:
        return report_fault("plot_run.py", e)
    fig.savefig(args.output, dpi=100)
    plt.close(fig)
    rows = ", ".join(f"{label}: {len(m['train'].get('step', []))} rows" for label, m in runs.items())
    print(terminal_safe(f"wrote {args.output} ({rows})"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
