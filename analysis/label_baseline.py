#!/usr/bin/env python3
"""The baseline a multi-label classifier must beat: predict the K labels most
frequent in the training shards for every example, whatever its text.

    analysis/label_baseline.py DATA_DIR [--split valid|test] [--k K]

Prints micro and macro precision, recall and F1 on the split for K = 1..10
(or the given K), as `mpiformer eval` counts them (macro over the labels that
occur in the truth or the predictions; a label is true at weight >= 0.5),
then the K with the best micro-F1. Reads the shards with h5py (through
analysis/mpiformer_metrics.py). A shard that cannot be read, or one without
labels (lm, seq2seq), is one line naming it, exit 2.
"""
import argparse
import glob
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpiformer_metrics import (RunError, file_format, group_of, h5_file, int_attr,  # noqa: E402
                               numbers, report_fault)

SHARD_FORMAT = "mpiformer-shard"
LABELLED_KINDS = ("classify", "image")


def name_count(label_names):
    """How many names /label_names' bytes hold: lines, the last one
    without its newline (as src/io/label_names.cpp splits them)."""
    text = bytes(np.asarray(label_names, dtype=np.uint8))
    return text.count(b"\n") + (not text.endswith(b"\n")) if text else 0


def label_matrix(path):
    """(N, K) bool: label k is true for example i (weight >= 0.5). A shard
    that cannot be read, or one without labels, raises RunError."""
    with h5_file(path, "shard file") as f:
        if file_format(f) != SHARD_FORMAT:
            raise RunError(f"{path}: not an mpiformer shard")
        kind = f.attrs["kind"] if "kind" in f.attrs else b"?"
        kind = (kind.decode(errors="backslashreplace") if isinstance(kind, bytes)
                else str(kind)).rstrip(" ")
        if kind not in LABELLED_KINDS or "num_labels" not in f.attrs or "labels" not in f:
            raise RunError(f"{path}: a shard of kind {kind}, without labels: the baseline reads "
                           "the shards of prepare --kind classify or image")
        k = int_attr(f, "num_labels")
        # As the trainer reads it: one name per label (bounds the matrix below).
        names = name_count(numbers(f["label_names"]))
        if k < 1 or k != names:
            raise RunError(f"{path}: num_labels {k}, but /label_names holds {names} names")
        labels = group_of(f, "labels")
        ids = numbers(labels["ids"]).astype(np.int64)
        weights = numbers(labels["weights"])
        offsets = numbers(labels["offsets"]).astype(np.int64)
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(ids) or len(weights) != len(ids) \
            or np.any(np.diff(offsets) < 0) or np.any((ids < 0) | (ids >= k)):
        raise RunError(f"{path}: its /labels are inconsistent (offsets, or ids not below "
                       f"num_labels {k})")
    truth = np.zeros((len(offsets) - 1, k), dtype=bool)
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    keep = weights >= 0.5
    truth[rows[keep], ids[keep]] = True
    return truth


def figures(truth, predicted):
    tp = (truth & predicted).sum(0).astype(float)
    fp = (~truth & predicted).sum(0).astype(float)
    fn = (truth & ~predicted).sum(0).astype(float)

    def ratio(a, b):
        return np.divide(a, b, out=np.zeros_like(a, dtype=float), where=b > 0)

    occurs = tp + fp + fn > 0
    micro_p = ratio(np.array(tp.sum()), np.array(tp.sum() + fp.sum()))
    micro_r = ratio(np.array(tp.sum()), np.array(tp.sum() + fn.sum()))
    micro_f1 = ratio(np.array(2 * tp.sum()), np.array(2 * tp.sum() + fp.sum() + fn.sum()))
    macro = [ratio(tp, tp + fp)[occurs].mean(), ratio(tp, tp + fn)[occurs].mean(),
             ratio(2 * tp, 2 * tp + fp + fn)[occurs].mean()]
    return [float(micro_p), float(micro_r), float(micro_f1)] + [float(m) for m in macro]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="a directory of classify or image shards")
    parser.add_argument("--split", default="valid", choices=["valid", "test"])
    parser.add_argument("--k", type=int, default=0, help="only this K (0: 1..10)")
    args = parser.parse_args()
    if not os.path.isdir(args.data):
        what = "not a directory" if os.path.exists(args.data) else "no such directory"
        return report_fault("label_baseline.py", f"{args.data}: {what}")
    train = sorted(glob.glob(os.path.join(args.data, "train-*.h5")))
    held = sorted(glob.glob(os.path.join(args.data, args.split + "-*.h5")))
    if not train or not held:
        return report_fault("label_baseline.py",
                            f"{args.data} has no train or {args.split} shards")
    try:
        train_truth = [label_matrix(p) for p in train]
        held_truth = [label_matrix(p) for p in held]
    except RunError as e:
        return report_fault("label_baseline.py", e)
    if len({m.shape[1] for m in train_truth + held_truth}) > 1:
        return report_fault("label_baseline.py", f"{args.data}: its train and {args.split} "
                            "shards disagree on num_labels")
    frequency = sum(m.sum(0) for m in train_truth)
    truth = np.concatenate(held_truth)
    order = np.argsort(-frequency, kind="stable")
    best = None
    for k in [args.k] if args.k else range(1, 11):
        predicted = np.zeros_like(truth)
        predicted[:, order[:k]] = True
        f = figures(truth, predicted)
        print(f"top-{k} baseline on {args.split} ({len(truth)} examples): "
              f"micro P/R/F1 {f[0]:.4f} {f[1]:.4f} {f[2]:.4f} | "
              f"macro P/R/F1 {f[3]:.4f} {f[4]:.4f} {f[5]:.4f}")
        if best is None or f[2] > best[1]:
            best = (k, f[2])
    print(f"best: top-{best[0]} micro-F1 {best[1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
