#!/usr/bin/env python3
"""Plots data-parallel scaling from `mpiformer bench` JSON lines: tokens/s,
weak-scaling efficiency and the wait for the gradient all-reduce against
the number of ranks, one series per model and device configuration.

usage: analysis/plot_scaling.py [FILE...] -o scaling.png [--by FIELDS]

    for np in 1 2 4 8; do
      mpirun -np $np mpiformer bench --model lm --batch 8 --seq 128 ...
    done >bench.jsonl
    analysis/plot_scaling.py bench.jsonl -o scaling.png

Reads every FILE ('-' or none: standard input); lines that do not start
with '{' (mpirun's or the profile table's) are passed over. Each rank of a
bench runs its own batch, so the work grows with the ranks (weak scaling):
efficiency is tokens/s over (ranks x the tokens/s per rank at the fewest
ranks of the series). Runs repeated at one rank count are drawn as points
and their median joined. Prints the table it plots. Exit code 2: a file
that cannot be read, a line that is not a bench line, or no line at all.
"""

import argparse
import json
import math
import statistics
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

# What a bench line must hold, and what it may.
REQUIRED = ("ranks", "tokens_per_s")
# A series: the bench lines that agree on these fields (--by).
SERIES_FIELDS = ("model", "device", "precision", "parameters", "batch", "seq")


class InputError(Exception):
    """A file or line that cannot be used: one line for the user."""


def parse_lines(lines, source):
    """The bench records of `lines` (an iterable of text lines from
    `source`, for messages)."""
    records = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{source}:{number}: not a JSON line ({e.msg})") from None
        if not isinstance(record, dict):
            raise InputError(f"{source}:{number}: not a JSON object")
        missing = [field for field in REQUIRED if field not in record]
        if missing:
            raise InputError(f"{source}:{number}: not an `mpiformer bench` line "
                             f"(no {', '.join(missing)})")
        try:
            record["ranks"] = int(record["ranks"])
            record["tokens_per_s"] = float(record["tokens_per_s"])
        except (TypeError, ValueError):
            raise InputError(f"{source}:{number}: ranks and tokens_per_s must be numbers") from None
        if record["ranks"] < 1:
            raise InputError(f"{source}:{number}: ranks {record['ranks']} (must be >= 1)")
        records.append(record)
    return records


def read_records(paths):
    """Bench records of the files (none or '-': standard input)."""
    records = []
    for path in paths or ["-"]:
        if path == "-":
            records += parse_lines(sys.stdin, "<stdin>")
            continue
        try:
            with open(path, encoding="utf-8") as f:
                records += parse_lines(f, path)
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise InputError(f"{path}: cannot read ({reason})") from None
    if not records:
        raise InputError(f"no `mpiformer bench` line in {', '.join(paths) or '<stdin>'}")
    return records


def series_label(key, fields):
    parts = []
    for field, value in zip(fields, key):
        if value is None:
            continue
        if field in ("model", "device", "precision"):
            parts.append(str(value))
        elif field == "parameters" and isinstance(value, (int, float)):
            parts.append(f"{value:,} params")
        else:
            parts.append(f"{field} {value}")
    return " ".join(parts) or "all"


def _median(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(values) if values else math.nan


def summarize(records, fields=SERIES_FIELDS):
    """{label: [row per rank count, fewest first]}; a row holds ranks, runs
    and the medians of tokens_per_s, step_ms, comm_wait_ms, hidden_share
    over the runs, and efficiency (see the module's doc)."""
    grouped = {}
    for record in records:
        key = tuple(record.get(field) for field in fields)
        grouped.setdefault(key, {}).setdefault(record["ranks"], []).append(record)
    series = {}
    for key, by_ranks in grouped.items():
        rows = []
        for ranks in sorted(by_ranks):
            runs = by_ranks[ranks]
            row = {"ranks": ranks, "runs": len(runs),
                   "all_tokens_per_s": [r["tokens_per_s"] for r in runs],
                   "all_comm_wait_ms": [_number(r.get("comm_wait_ms")) for r in runs]}
            for field in ("tokens_per_s", "step_ms", "comm_wait_ms", "hidden_share"):
                row[field] = _median([_number(r.get(field)) for r in runs])
            rows.append(row)
        base = rows[0]["tokens_per_s"] / rows[0]["ranks"]
        for row in rows:
            ideal = row["ranks"] * base
            row["efficiency"] = row["tokens_per_s"] / ideal if ideal > 0 else math.nan
        label = series_label(key, fields)
        while label in series:
            label += "'"
        series[label] = rows
    return series


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def table(series):
    """The plotted figures as text."""
    lines = []
    for label, rows in series.items():
        lines.append(f"{label}:")
        lines.append(f"  {'ranks':>5} {'runs':>4} {'tokens/s':>12} {'per rank':>12} "
                     f"{'efficiency':>10} {'step ms':>9} {'comm wait ms':>12} {'hidden':>7}")
        for r in rows:
            hidden = ("-" if r["ranks"] == 1 or not math.isfinite(r["hidden_share"])
                      else f"{100 * r['hidden_share']:.1f}%")
            lines.append(f"  {r['ranks']:>5} {r['runs']:>4} {r['tokens_per_s']:>12.1f} "
                         f"{r['tokens_per_s'] / r['ranks']:>12.1f} {100 * r['efficiency']:>9.1f}% "
                         f"{r['step_ms']:>9.2f} {r['comm_wait_ms']:>12.3f} {hidden:>7}")
    return "\n".join(lines)


def plot(series, path):
    fig, (speed_ax, eff_ax, wait_ax) = plt.subplots(1, 3, figsize=(15, 4.5))
    all_ranks = sorted({r["ranks"] for rows in series.values() for r in rows})
    for i, (label, rows) in enumerate(series.items()):
        color = f"C{i % 10}"
        ranks = [r["ranks"] for r in rows]
        for r in rows:  # every run, faint; the medians joined over them
            speed_ax.plot([r["ranks"]] * r["runs"], r["all_tokens_per_s"], ".", color=color,
                          alpha=0.35)
            waits = [w for w in r["all_comm_wait_ms"] if w is not None]
            wait_ax.plot([r["ranks"]] * len(waits), waits, ".", color=color, alpha=0.35)
        speed_ax.plot(ranks, [r["tokens_per_s"] for r in rows], "o-", color=color, label=label)
        base = rows[0]["tokens_per_s"] / rows[0]["ranks"]
        speed_ax.plot(ranks, [base * n for n in ranks], ":", color=color, alpha=0.7,
                      label="_nolegend_")
        eff_ax.plot(ranks, [100 * r["efficiency"] for r in rows], "o-", color=color, label=label)
        wait_ax.plot(ranks, [r["comm_wait_ms"] for r in rows], "o-", color=color, label=label)
    speed_ax.set_title("tokens/s (dotted: linear in ranks)")
    eff_ax.set_title("weak-scaling efficiency (%)")
    eff_ax.axhline(100, color="grey", linewidth=0.8)
    wait_ax.set_title("all-reduce wait per step (ms, mean over ranks)")
    for ax in (speed_ax, eff_ax, wait_ax):
        ax.set_xlabel("ranks")
        if len(all_ranks) > 1:
            ax.set_xscale("log", base=2)
        ax.set_xticks(all_ranks)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    speed_ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="files of bench JSON lines ('-' or none: standard input)")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--by", default=",".join(SERIES_FIELDS),
                        help="comma-separated bench fields that tell series apart "
                             f"(default {','.join(SERIES_FIELDS)}; add threads to split by it)")
    args = parser.parse_args(argv)
    fields = tuple(f for f in args.by.split(",") if f)
    try:
        records = read_records(args.files)
    except InputError as e:
        print(f"plot_scaling.py: {e}", file=sys.stderr)
        return 2
    series = summarize(records, fields)
    print(table(series))
    plot(series, args.output)
    print(f"wrote {args.output} ({len(records)} bench line(s), {len(series)} series)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
