#!/usr/bin/env python3
"""Writes scikit-learn's bundled 8x8 handwritten digits as an image
classification corpus (1,797 images, 10 classes), with no download:
load_digits reads a file shipped inside the package (Debian's python3-sklearn
or pip's scikit-learn; scripts/setup installs it).

  OUT.npz (as numpy.savez writes it, uncompressed; numpy.load reads it):
    images       uint8 (N, 8, 8): the 0..16 grey levels scaled to 0..255,
                 round(v * 255 / 16)
    labels       int64 (N,): the digit, 0..9
    label_names  (10,) unicode strings "0".."9"
  --h5 OUT.h5: the datasets images and labels, the same arrays, via h5py.

The examples are shuffled with a fixed seed (numpy RandomState(0)), so the
same package always gives the same bytes and a held-out tail is a random
sample rather than the last writers of the original set.

usage: data/extract-digits.py [OUT.npz] [--h5 OUT.h5]   (one of them at least)
"""

import argparse
import io
import os
import sys
import zipfile

import numpy as np


def load():
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        sys.exit(f"extract-digits: scikit-learn is missing ({e}): "
                 "install python3-sklearn or scikit-learn (scripts/setup does)")
    digits = load_digits()
    values = np.asarray(digits.images)
    if values.ndim != 3 or values.shape[1:] != (8, 8):
        sys.exit(f"extract-digits: unexpected image shape {values.shape}")
    levels = np.rint(values).astype(np.int64)
    if not np.array_equal(levels, values) or levels.min() < 0 or levels.max() > 16:
        sys.exit("extract-digits: expected whole grey levels 0..16")
    # round(v * 255 / 16), halves up, in integers (only v = 8 gives a half).
    images = ((levels * 255 + 8) // 16).astype(np.uint8)
    labels = np.asarray(digits.target, dtype=np.int64)
    order = np.random.RandomState(0).permutation(len(labels))
    return images[order], labels[order]


def write_npz(path, arrays):
    """What numpy.savez writes, but the same bytes under every numpy: savez
    in numpy 2 forces Zip64 headers, numpy 1 does not. Plain (stored) zip
    entries, .npy format 1.0, dated 1980-01-01."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for name, array in arrays.items():
            npy = io.BytesIO()
            np.lib.format.write_array(npy, np.ascontiguousarray(array),
                                      version=(1, 0), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o600 << 16
            z.writestr(info, npy.getvalue())
    os.replace(tmp, path)


def write_h5(path, images, labels):
    try:
        import h5py
    except ImportError as e:
        sys.exit(f"extract-digits: h5py is missing ({e}): scripts/setup installs it")
    tmp = f"{path}.tmp.{os.getpid()}"
    with h5py.File(tmp, "w") as f:
        f.create_dataset("images", data=images)
        f.create_dataset("labels", data=labels)
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(
        description="scikit-learn's 8x8 digits as .npz and/or HDF5 (no download)")
    parser.add_argument("npz", nargs="?", metavar="OUT.npz")
    parser.add_argument("--h5", metavar="OUT.h5", help="also (or only) write HDF5")
    args = parser.parse_args()
    if args.npz is None and args.h5 is None:
        parser.error("give OUT.npz, --h5 OUT.h5, or both")

    images, labels = load()
    names = np.array([str(d) for d in range(10)])
    written = []
    npz_arrays = {"images": images, "labels": labels, "label_names": names}
    for path, write in ((args.npz, lambda p: write_npz(p, npz_arrays)),
                        (args.h5, lambda p: write_h5(p, images, labels))):
        if path is None:
            continue
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        write(path)
        written.append(path)
    counts = np.bincount(labels, minlength=10)
    print(f"{', '.join(written)}: {len(labels)} images 8x8, 10 classes "
          f"({counts.min()}..{counts.max()} each)")


if __name__ == "__main__":
    main()
