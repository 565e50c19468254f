"""Reading an mpiformer run: RUNDIR/metrics.h5 and its checkpoints.

metrics.h5 is written in HDF5 SWMR mode, so it can be read while the run
trains; columns grow one at a time, so a row caught half-written is left
out (every column is cut to the shortest).
"""

import os

import h5py
import numpy as np

METRICS_FORMAT = "mpiformer-metrics"
CHECKPOINT_FORMAT = "mpiformer-checkpoint"


class RunError(Exception):
    """A run directory or file that cannot be read: one line for the user."""


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def metrics_path(rundir):
    return rundir if rundir.endswith(".h5") else os.path.join(rundir, "metrics.h5")


def _columns(group):
    names = list(group.keys())
    data = {}
    for name in names:
        dataset = group[name]
        dataset.refresh()  # SWMR: see what the writer has flushed since opening
        data[name] = dataset[()]
    n = min((len(v) for v in data.values()), default=0)
    return {name: np.asarray(v[:n]) for name, v in data.items()}


def read_metrics(rundir):
    """{'attrs': {...}, 'train': {column: array}, 'eval': {column: array}}."""
    path = metrics_path(rundir)
    if not os.path.isfile(path):
        raise RunError(f"{path}: no such file (is {rundir} a run directory?)")
    try:
        f = h5py.File(path, "r", libver="latest", swmr=True)
    except OSError as e:
        raise RunError(f"{path}: not a readable HDF5 file ({e})") from None
    with f:
        if _text(f.attrs.get("format", "")) != METRICS_FORMAT:
            raise RunError(f"{path}: not an mpiformer metrics file")
        attrs = {k: (_text(v) if isinstance(v, (bytes, str)) else v) for k, v in f.attrs.items()}
        return {"attrs": attrs, "train": _columns(f["train"]), "eval": _columns(f["eval"])}


def checkpoints(rundir):
    """Checkpoint files of a run, oldest first."""
    directory = os.path.join(rundir, "checkpoints")
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if n.startswith("step_") and n.endswith(".h5"))
    return [os.path.join(directory, n) for n in names]


def read_checkpoint(path, group="params"):
    """({tensor name: float32 array}, root attributes) of a checkpoint."""
    with h5py.File(path, "r") as f:
        if _text(f.attrs.get("format", "")) != CHECKPOINT_FORMAT:
            raise RunError(f"{path}: not an mpiformer checkpoint")
        attrs = {k: (_text(v) if isinstance(v, (bytes, str)) else v) for k, v in f.attrs.items()}
        tensors = {name: f[group][name][()] for name in sorted(f[group].keys())}
    return tensors, attrs


def layer_of(name):
    """The layer a tensor belongs to: 'decoder.layers.1.mlp.fc.weight' -> 'decoder.layers.1'."""
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        return ".".join(parts[: i + 2])
    return parts[0]


def smooth(values, window):
    """Trailing moving average over `window` rows (1: unchanged)."""
    values = np.asarray(values, dtype=float)
    if window <= 1 or len(values) == 0:
        return values
    kernel = np.ones(min(window, len(values)))
    sums = np.convolve(values, kernel)[: len(values)]
    counts = np.convolve(np.ones(len(values)), kernel)[: len(values)]
    return sums / counts


def plot_runs(runs, axes, window=1):
    """Draws runs {label: read_metrics(...)} on a 2x2 grid of axes:
    loss (train and eval), learning rate, tokens/s, padding efficiency."""
    (loss_ax, lr_ax), (speed_ax, pad_ax) = axes
    for i, (label, m) in enumerate(runs.items()):
        color = f"C{i % 10}"
        train, evaluation = m["train"], m["eval"]
        step = train.get("step", np.array([]))
        loss_ax.plot(step, smooth(train.get("loss", []), window), color=color, label=f"{label} train")
        if len(evaluation.get("step", [])):
            loss_ax.plot(evaluation["step"], evaluation["loss"], "o--", color=color, markersize=3,
                         label=f"{label} eval")
        lr_ax.plot(step, train.get("lr", []), color=color, label=label)
        speed_ax.plot(step, smooth(train.get("tokens_per_s", []), window), color=color, label=label)
        pad_ax.plot(step, train.get("padding_efficiency", []), color=color, label=label)
    for ax, title in ((loss_ax, "loss"), (lr_ax, "learning rate"), (speed_ax, "tokens/s"),
                      (pad_ax, "padding efficiency")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
