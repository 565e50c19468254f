#!/usr/bin/env python3
"""Converts mpiformer runs' metrics.h5 into TensorBoard event files.

usage: analysis/to_tensorboard.py RUNDIR [RUNDIR...]
       tensorboard --logdir runs/ --samples_per_plugin scalars=0

Each run's events go to RUNDIR/tensorboard/, replacing those of an earlier
conversion, so converting again (also while the run trains: metrics.h5 is
read in SWMR mode) never duplicates points. Every numeric column but step
becomes one scalar tag, train/loss, train/nll, eval/perplexity, ..., at the
row's step; the event's wall time is the row's elapsed_s (seconds since the
run began, over every resume: TensorBoard's "relative" axis reads right,
its "wall" axis shows dates near 1970), or 0 in files without elapsed_s.
NaN marks a value not written (a column the run's version lacked, the epoch
of a synthetic task, the hidden share of one rank): such points are left
out, and a column without any value gets no tag. The run's configuration
and attributes go to the text tag run/config.

TensorBoard shows at most 1000 points of a series unless told otherwise
(--samples_per_plugin scalars=0 shows all). Needs the tensorboard package
(python3 -m pip install tensorboard). Exit code 2: a run directory that is
missing or holds no readable metrics.h5 (nothing is converted then).
"""

import argparse
import glob
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpiformer_metrics import RunError, read_metrics, report_fault, terminal_safe  # noqa: E402

# The events of a conversion end in this, so that a new one knows what to
# replace and leaves any other writer's files in the directory alone.
SUFFIX = ".mpiformer"
SUBDIRECTORY = "tensorboard"
# Attributes shown in run/config, in this order (the INI text follows).
ATTRIBUTES = ("model", "world_size", "devices", "versions", "git_commit", "resumed_at_steps")


def run_directory(path):
    """The run directory of a RUNDIR argument (a metrics.h5 path names its
    directory)."""
    return os.path.dirname(os.path.abspath(path)) if path.endswith(".h5") else path


def events_of(metrics):
    """(events, tags, left_out): events (step, wall time, [(tag, value)])
    in step order, train rows before eval rows of the same step; tags
    {tag: points}; left_out: tags of columns without any value."""
    rows = []  # (step, group order, row, wall time, [(tag, value)])
    tags, left_out = {}, []
    for order, group in enumerate(("train", "eval")):
        columns = metrics[group]
        if "step" not in columns:
            continue
        steps = np.asarray(columns["step"], dtype=np.int64)
        elapsed = columns.get("elapsed_s")
        names = [n for n in columns if n != "step" and np.issubdtype(columns[n].dtype, np.number)]
        for name in names:
            values = np.asarray(columns[name], dtype=np.float64)
            written = ~np.isnan(values)
            if not written.any():
                left_out.append(f"{group}/{name}")
            else:
                tags[f"{group}/{name}"] = int(written.sum())
        for i, step in enumerate(steps):
            wall = float(elapsed[i]) if elapsed is not None and np.isfinite(elapsed[i]) else 0.0
            values = [(f"{group}/{n}", float(columns[n][i])) for n in names]
            values = [(tag, v) for tag, v in values if not np.isnan(v)]
            if values:
                rows.append((int(step), order, i, wall, values))
    rows.sort(key=lambda r: r[:3])
    return [(step, wall, values) for step, _, _, wall, values in rows], tags, left_out


def config_text(metrics):
    """The run/config text: attributes, then the INI configuration as a
    code block (TensorBoard renders it as Markdown)."""
    attrs = metrics["attrs"]
    lines = []
    for key in ATTRIBUTES:
        if key in attrs:
            value = attrs[key]
            if isinstance(value, np.ndarray):
                value = ", ".join(str(v) for v in value.tolist()) or "none"
            lines.append(f"- **{key}**: {value}")
    config = str(attrs.get("config", "")).rstrip("\n")
    if config:
        lines += ["", "```ini", config, "```"]
    return "\n".join(lines)


def write_run(rundir, metrics, tensorboard):
    """Writes one run's events; returns (event file, tags, left_out)."""
    event_file_writer, event_pb2, summary_pb2, text_pb = tensorboard
    events, tags, left_out = events_of(metrics)
    logdir = os.path.join(rundir, SUBDIRECTORY)
    pattern = os.path.join(glob.escape(logdir), "events.out.tfevents.*" + SUFFIX)
    earlier = set(glob.glob(pattern))
    writer = event_file_writer.EventFileWriter(logdir, max_queue_size=1000, filename_suffix=SUFFIX)
    try:
        writer.add_event(event_pb2.Event(step=0, wall_time=0.0,
                                         summary=text_pb("run/config", config_text(metrics))))
        for step, wall, values in events:
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=v)
                                                 for tag, v in values])
            writer.add_event(event_pb2.Event(step=step, wall_time=wall, summary=summary))
        writer.flush()
    finally:
        writer.close()
    written = sorted(set(glob.glob(pattern)) - earlier)
    # The new file is complete: the earlier conversions go.
    for path in earlier:
        os.remove(path)
    return (written[0] if written else logdir), tags, left_out


def load_tensorboard():
    """tensorboard's writer and protos, or None when it is not installed."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer import event_file_writer
    except ImportError:
        return None
    return event_file_writer, event_pb2, summary_pb2, text_pb


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rundirs", nargs="+", metavar="RUNDIR")
    args = parser.parse_args(argv)
    tensorboard = load_tensorboard()
    if tensorboard is None:
        print("to_tensorboard.py: the tensorboard package is not installed "
              "(python3 -m pip install tensorboard)", file=sys.stderr)
        return 1
    # Every run is read before anything is written: a bad one stops all.
    runs = []
    try:
        for path in args.rundirs:
            rundir = run_directory(path)
            if not os.path.isdir(rundir):
                raise RunError(f"{path}: no such run directory")
            runs.append((rundir, read_metrics(path)))
    except RunError as e:
        return report_fault("to_tensorboard.py", e)
    total_tags = total_points = 0
    # Column names come from the files: printed terminal-safe.
    for rundir, metrics in runs:
        try:
            event_file, tags, left_out = write_run(rundir, metrics, tensorboard)
        except OSError as e:
            return report_fault("to_tensorboard.py", f"{rundir}: cannot write events ({e})", 1)
        points = sum(tags.values())
        total_tags += len(tags)
        total_points += points
        print(terminal_safe(f"{rundir}: {len(tags)} scalar tags, {points} points -> {event_file}"))
        partly = []
        for group in ("train", "eval"):
            rows = len(metrics[group].get("step", []))
            names = [tag.split("/", 1)[1] for tag in tags if tag.startswith(group + "/")]
            listed = ", ".join(names) if names else "no tags"
            print(terminal_safe(f"  {group} ({rows} rows): {listed}"))
            partly += [f"{group}/{n} {tags[group + '/' + n]} of {rows}" for n in names
                       if tags[group + "/" + n] < rows]
        if partly:
            print(terminal_safe(f"  partly written (NaN left out): {', '.join(partly)}"))
        if left_out:
            print(terminal_safe(f"  left out (no value written): {', '.join(left_out)}"))
    print(f"converted {len(runs)} run(s): {total_tags} scalar tags, {total_points} points")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
