#!/usr/bin/env python3
"""The baseline a multi-label classifier must beat: predict the K labels most
frequent in the training shards for every example, whatever its text.

    analysis/label_baseline.py DATA_DIR [--split valid|test] [--k K]

Prints micro and macro precision, recall and F1 on the split for K = 1..10
(or the given K), as `mpiformer eval` counts them (macro over the labels that
occur in the truth or the predictions; a label is true at weight >= 0.5),
then the K with the best micro-F1. Reads the shards with h5py only.
"""
import argparse
import glob
import os
import sys

import h5py
import numpy as np


def label_matrix(path):
    """(N, K) bool: label k is true for example i (weight >= 0.5)."""
    with h5py.File(path, "r") as f:
        k = int(f.attrs["num_labels"])
        ids = f["labels/ids"][:]
        weights = f["labels/weights"][:]
        offsets = f["labels/offsets"][:].astype(np.int64)
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
    train = sorted(glob.glob(os.path.join(args.data, "train-*.h5")))
    held = sorted(glob.glob(os.path.join(args.data, args.split + "-*.h5")))
    if not train or not held:
        sys.exit(f"label_baseline.py: {args.data} has no train or {args.split} shards")
    frequency = sum(label_matrix(p).sum(0) for p in train)
    truth = np.concatenate([label_matrix(p) for p in held])
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


if __name__ == "__main__":
    main()
