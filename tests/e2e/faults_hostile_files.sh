#!/usr/bin/env bash
# mpiformer and the Python tools of analysis/ take HDF5 files from elsewhere
# as untrusted.
# From a tiny run's checkpoint and metrics.h5, and classify shards, h5py
# makes copies that reach outside themselves (an external link to another
# file, a virtual dataset over it, a dataset stored in a plain file beside
# them), or hold what mpiformer never writes (a soft link, an unregistered
# optional filter, a group linking to itself, groups nested 100 deep, a
# dataset declaring 4 TiB, datasets never written that together declare
# more than the file holds, strings where numbers belong, a missing
# attribute, escape sequences in attributes and names). export_hf.py,
# plot_run.py, to_tensorboard.py and label_baseline.py refuse each (within
# `timeout`) with one line naming the file and the object, exit 2, no
# traceback, nothing of the other files in what they write, and no control
# character of a file on the terminal. A metrics.h5 whose superblock says a
# writer has it open, caught cut short as a reader beside a live writer can
# catch it, is read once it is whole again, not called corrupt at once.
# mpiformer's inspect, generate, average and train (at resume, and on the
# shards) refuse the copies that reach outside themselves, one line each.
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt
tools=$src/analysis
try_seconds=60  # the limit of `try` (common.sh)

tiny=(--model lm --synthetic copy --layers 2 --heads 2 --d-ff 64 --max-len 32 --d-model 32
  --max-tokens 256 --threads 1)
# --output-bias false: a checkpoint export_hf.py exports when it is intact.
timeout 300 "$bin" train "${tiny[@]}" --steps 2 --output-bias false --out run >run.log
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >gpl.txt
awk '{ n = NR % 3; print (n == 0 ? "law" : n == 1 ? "code user:0.5" : "user") }' gpl.txt >gpl.labels
timeout 300 "$bin" prepare --kind classify --input gpl.txt --labels gpl.labels --out tagged \
  --shards 1 --vocab-size 300 --valid-lines 50 --test-lines 50 >prepare.log

# The hostile copies: ck-NAME.h5 (checkpoints), m-NAME/metrics.h5, sh-NAME/
# (the shards, train-00000.h5 hostile). What lies outside them, marked:
# outside.h5:/secret (floats 1234.5) and secret.bin (bytes SECRET-BYTES).
timeout 300 python3 - <<'PY'
import os
import shutil

import h5py
import numpy as np
from h5py import h5d, h5p, h5s, h5t, h5z

CHECKPOINT = "run/checkpoints/step_00000002.h5"
MARK = 1234.5
with h5py.File("outside.h5", "w") as f:
    f["secret"] = np.full((32, 32), MARK, dtype="<f4")
    f["column"] = np.full((1,), MARK, dtype="<f8")
    f["ids"] = np.zeros((604,), dtype="<i4")
with open("secret.bin", "wb") as f:
    f.write(b"SECRET-BYTES" * 100000)


def external_link(f, name):
    shape = f[name].shape
    del f[name]
    f[name] = h5py.ExternalLink("outside.h5", "/ids" if name.endswith("ids") else
                                "/column" if len(shape) == 1 else "/secret")


def soft_link(f, name):
    del f[name]
    f[name] = h5py.SoftLink("/optimizer/m/embed.tokens")


def virtual(f, name):
    shape, dtype = f[name].shape, f[name].dtype
    del f[name]
    layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
    source = "secret" if len(shape) == 2 else "column"
    layout[...] = h5py.VirtualSource("outside.h5", source, shape=shape)
    f.create_virtual_dataset(name, layout)


def external_storage(f, name):
    shape, dtype = f[name].shape, f[name].dtype
    del f[name]
    nbytes = int(np.prod(shape)) * dtype.itemsize
    f.create_dataset(name, shape=shape, dtype=dtype, external=[("secret.bin", 0, nbytes)])


def unknown_filter(f, name):
    """An optional filter no HDF5 has registered (32999): HDF5 writes the
    chunks unfiltered, and a reader would run whatever plugin answers."""
    data = f[name][()]
    del f[name]
    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_chunk(data.shape)
    dcpl.set_filter(32999, h5z.FLAG_OPTIONAL, (1, 2))
    dataset = h5d.create(f.id, name.encode(), h5t.py_create(data.dtype),
                         h5s.create_simple(data.shape), dcpl=dcpl)
    h5py.Dataset(dataset)[...] = data


def huge(f, name):
    del f[name]
    f.create_dataset(name, shape=(1 << 40,), dtype="<f4", chunks=(1 << 16,))


def strings(f, name):
    n = len(f[name])
    del f[name]
    f.create_dataset(name, data=np.array([b"1e3x"] * n, dtype=h5py.string_dtype()))


def cycle(f, name):
    group = name.rsplit("/", 1)[0]
    f[group + "/loop"] = f[group]


def deep(f, name):
    group = f[name.rsplit("/", 1)[0]]
    for depth in range(100):
        group = group.create_group(f"d{depth}")


def unwritten(f, name):
    """Datasets never written (they would read as fill values): each fits
    the file, together they declare twice its size."""
    group = f[name.rsplit("/", 1)[0]]
    rows = os.path.getsize(f.filename) // 8 // 16
    for i in range(32):
        group.create_dataset(f"unwritten{i:02}", shape=(rows,), dtype="<f8", chunks=(64,))


def no_vocab_size(f, name):
    del f.attrs["vocab_size"]


def escapes_in_format(f, name):
    f.attrs["format"] = np.bytes_(b"\x1b]0;owned\x07\x1b[2Jmpiformer-checkpoint")


CASES = {"extlink": external_link, "softlink": soft_link, "virtual": virtual,
         "extstorage": external_storage, "filter": unknown_filter, "huge": huge,
         "strings": strings, "cycle": cycle, "deep": deep, "unwritten": unwritten,
         "novocab": no_vocab_size,
         "escapes": escapes_in_format}


def hostile(source, copy, case, name):
    if os.path.isdir(source):
        shutil.copytree(source, copy)
        path = os.path.join(copy, "train-00000.h5")
    elif copy.endswith("/metrics.h5"):
        os.makedirs(os.path.dirname(copy))
        shutil.copy(source, copy)
        path = copy
    else:
        shutil.copy(source, copy)
        path = copy
    with h5py.File(path, "r+") as f:
        CASES[case](f, name)


for case in ("extlink", "softlink", "virtual", "filter", "huge", "strings"):
    hostile(CHECKPOINT, f"ck-{case}.h5", case, "params/embed.tokens")
hostile(CHECKPOINT, "ck-extstorage.h5", "extstorage", "params/embed.positions")
for case in ("cycle", "deep", "novocab", "escapes"):
    hostile(CHECKPOINT, f"ck-{case}.h5", case, "params/embed.tokens")
# A checkpoint of a run on shards keeps its tokenizer: here from a file beside.
shutil.copy(CHECKPOINT, "ck-tokenizer.h5")
with h5py.File("ck-tokenizer.h5", "r+") as f:
    f.create_dataset("tokenizer", shape=(60000,), dtype="u1",
                     external=[("secret.bin", 0, 60000)])

for case, name in (("extlink", "train/loss"), ("virtual", "train/lr"),
                   ("extstorage", "eval/loss"), ("filter", "train/tokens"),
                   ("huge", "train/loss"), ("strings", "train/loss"), ("cycle", "train/loss"),
                   ("deep", "eval/loss"), ("unwritten", "train/loss")):
    hostile("run/metrics.h5", f"m-{case}/metrics.h5", case, name)
# Escape sequences in attributes and in a column's name: read, and shown escaped.
os.makedirs("m-escapes")
shutil.copy("run/metrics.h5", "m-escapes/metrics.h5")
with h5py.File("m-escapes/metrics.h5", "r+") as f:
    for key in ("model", "run_id", "devices"):
        f.attrs[key] = np.bytes_(b"\x1b]0;owned\x07\x1b[31mred")
    f.attrs["config"] = np.bytes_(b"model = lm\n\x1b[2J\x1b[H# wiped\n")
    f["train/\x1b[2Jwiped"] = np.zeros(len(f["train/step"]))

for case in ("extlink", "strings", "huge", "cycle"):
    hostile("tagged", f"sh-{case}", case, "labels/ids")
shutil.copytree("tagged", "sh-escapes")
with h5py.File("sh-escapes/train-00000.h5", "r+") as f:
    f.attrs["kind"] = np.bytes_(b"\x1b[31mred\x1b]0;owned\x07")
PY

# refused_hostile WHAT NEEDLE...: the command just run (try) refused with one
# line holding every NEEDLE, exit 2, no traceback, no control character of a
# file on the terminal.
refused_hostile() {
  local what=$1
  shift
  refused "$what" 2 "$@"
  ! grep -q Traceback "$err" || fail "$what: a traceback"
  ! LC_ALL=C grep -q '[[:cntrl:]]' "$out" "$err" || fail "$what: control characters on the terminal"
}

outside="refusing a file that reaches outside itself"

# exports PY: export_hf.py of each hostile checkpoint.
exports() {
  local py=$1 case needles needle
  check "$py export_hf.py exports the intact checkpoint" \
    timeout 60 "$py" "$tools/export_hf.py" run/checkpoints/step_00000002.h5 hf-intact --overwrite
  while read -r case needles; do
    IFS='|' read -ra needle <<<"$needles"
    rm -rf "hf-$case"
    try "$py" "$tools/export_hf.py" "ck-$case.h5" "hf-$case"
    refused_hostile "$py export_hf.py ck-$case.h5" "export_hf.py: ck-$case.h5: " "${needle[@]}"
    check "$py export_hf.py ck-$case.h5 writes nothing" test ! -e "hf-$case"
  done <<EOF
extlink /params/embed.tokens is an external link; $outside
softlink /params/embed.tokens is a soft link
virtual /params/embed.tokens is a virtual dataset|$outside
extstorage /params/embed.positions is a dataset stored in external files; $outside
tokenizer /tokenizer is a dataset stored in external files; $outside
filter /params/embed.tokens is filtered by HDF5 filter 32999
huge /params/embed.tokens is declared as 4398046511104 bytes
strings /params/embed.tokens holds strings, not numbers
cycle /params/loop is a second link to /params
deep is nested more than 64 groups deep
novocab has no attribute 'vocab_size'
escapes not an mpiformer checkpoint|\x1b]0;owned\x07\x1b[2Jmpiformer-checkpoint
EOF
  # What lies outside never reaches an export (were one written).
  check "$py: no export holds the bytes of outside.h5 or secret.bin" timeout 60 python3 - <<'PY'
import glob
import struct
import sys

marks = (struct.pack("<f", 1234.5) * 4, b"SECRET-BYTES")
held = [p for p in glob.glob("hf-*/*") if any(m in open(p, "rb").read() for m in marks)]
sys.exit(f"{held} hold them" if held else 0)
PY
}

# plots PY: plot_run.py and to_tensorboard.py (where PY has tensorboard) of
# each hostile metrics.h5.
plots() {
  local py=$1 case needles needle tensorboard=false
  "$py" -c "import tensorboard" 2>/dev/null && tensorboard=true ||
    echo "note: $py has no tensorboard package: to_tensorboard.py is not checked on it"
  while read -r case needles; do
    IFS='|' read -ra needle <<<"$needles"
    try "$py" "$tools/plot_run.py" "m-$case" -o "plot-$case.png"
    refused_hostile "$py plot_run.py m-$case" "plot_run.py: m-$case/metrics.h5: " "${needle[@]}"
    check "$py plot_run.py m-$case draws nothing" test ! -e "plot-$case.png"
    if $tensorboard; then
      try "$py" "$tools/to_tensorboard.py" "m-$case"
      refused_hostile "$py to_tensorboard.py m-$case" "to_tensorboard.py: m-$case/metrics.h5: " \
        "${needle[@]}"
      check "$py to_tensorboard.py m-$case converts nothing" test ! -e "m-$case/tensorboard"
    fi
  done <<EOF
extlink /train/loss is an external link; $outside
virtual /train/lr is a virtual dataset|$outside
extstorage /eval/loss is a dataset stored in external files; $outside
filter /train/tokens is filtered by HDF5 filter 32999
huge /train/loss is declared as
strings /train/loss holds strings, not numbers
cycle /train/loop is a second link to /train
deep is nested more than 64 groups deep
unwritten /train/unwritten|bytes can hold beside the
EOF
  # Escape sequences in its attributes and a column's name: a file that
  # reads, its text shown escaped.
  try "$py" "$tools/plot_run.py" m-escapes -o plot-escapes.png
  check "$py plot_run.py reads a metrics.h5 with escapes (exit $rc: $(head -c 300 "$err"))" \
    test "$rc" -eq 0
  ! LC_ALL=C grep -q '[[:cntrl:]]' "$out" "$err" ||
    fail "$py plot_run.py m-escapes: control characters on the terminal"
  if $tensorboard; then
    try "$py" "$tools/to_tensorboard.py" m-escapes
    check "$py to_tensorboard.py reads a metrics.h5 with escapes (exit $rc)" \
      test "$rc" -eq 0
    ! LC_ALL=C grep -q '[[:cntrl:]]' "$out" "$err" ||
      fail "$py to_tensorboard.py m-escapes: control characters on the terminal"
    check "$py to_tensorboard.py shows the column's name escaped" grep -qF '\x1b[2Jwiped' "$out"
  fi
}

# baselines PY: label_baseline.py of each hostile shard set.
baselines() {
  local py=$1 case needles needle
  while read -r case needles; do
    IFS='|' read -ra needle <<<"$needles"
    try "$py" "$tools/label_baseline.py" "sh-$case"
    refused_hostile "$py label_baseline.py sh-$case" \
      "label_baseline.py: sh-$case/train-00000.h5: " "${needle[@]}"
  done <<EOF
extlink /labels/ids is an external link; $outside
strings /labels/ids holds strings, not numbers
huge /labels/ids is declared as
cycle /labels/loop is a second link to /labels
escapes a shard of kind \x1b[31mred\x1b]0;owned\x07, without labels
EOF
}

# torn_read PY: a metrics.h5 being written, caught cut short (its superblock
# claims more bytes than it holds, as beside a writer that has yet to write
# them), is tried again, and read once it is whole. killed/metrics.h5: a run
# killed while it wrote leaves it marked as open for writing.
torn_read() {
  check "$1: a torn read of a metrics.h5 being written is tried again" \
    timeout 60 "$1" - "$tools" killed/metrics.h5 <<'PY'
import os
import shutil
import sys
import threading

sys.path.insert(0, sys.argv[1])
from mpiformer_metrics import RunError, read_metrics  # noqa: E402

path = sys.argv[2]
whole = path + ".whole"
shutil.copy(path, whole)
with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)
# Whole again after 0.5 s, as the writer finishes what it began.
threading.Timer(0.5, os.replace, (whole, path)).start()
try:
    metrics = read_metrics(path)
except RunError as e:
    sys.exit(f"not tried again: {e}")
sys.exit(0 if len(metrics["train"]["step"]) > 0 else "no rows read")
PY
}

rc=0
{ MPIFORMER_TEST_KILL_IN_CHECKPOINT=2 timeout 300 "$bin" train "${tiny[@]}" --steps 2 --out killed \
  >killed.log 2>&1; } 2>/dev/null || rc=$?
[[ $rc -ne 0 ]] || fail "the run to kill was not killed"

# Each Python with h5py: the one first on PATH, and Debian's (HDF5 1.10).
pythons=(python3)
if [[ -x /usr/bin/python3 && $(command -v python3) != /usr/bin/python3 ]] &&
  /usr/bin/python3 -c "import h5py, matplotlib" 2>/dev/null; then
  pythons+=(/usr/bin/python3)
fi
for py in "${pythons[@]}"; do
  exports "$py"
  plots "$py"
  baselines "$py"
  torn_read "$py"
done

# ---- mpiformer itself: every command that reads the hostile checkpoints,
# metrics and shards refuses what reaches outside the file, with one line
# naming the file and the object, before reading a byte of it.
while read -r case object; do
  for command in "inspect ck-$case.h5" "generate --checkpoint ck-$case.h5 --prompt 3" \
    "average --out averaged-$case.h5 ck-$case.h5 run/checkpoints/step_00000002.h5"; do
    read -ra words <<<"$command"
    try "$bin" "${words[@]}"
    refused "mpiformer $command" nonzero "ck-$case.h5: $object" "$outside"
  done
  check "average ck-$case.h5 writes nothing" test ! -e "averaged-$case.h5"
done <<EOF
extlink /params/embed.tokens is an external link
softlink /params/embed.tokens is a soft link
virtual /params/embed.tokens is a virtual dataset
extstorage /params/embed.positions is stored in external files
filter /params/embed.tokens is filtered by HDF5 filter 32999
tokenizer /tokenizer is stored in external files
EOF
mkdir -p resumed-extlink && cp -r run/. resumed-extlink/ && cp m-extlink/metrics.h5 resumed-extlink/
try "$bin" train "${tiny[@]}" --output-bias false --steps 4 --out resumed-extlink --resume auto
refused "train --resume auto beside a metrics.h5 with an external link" nonzero \
  "resumed-extlink/metrics.h5: /train/loss is an external link"
try "$bin" train --model classify --data sh-extlink --layers 2 --heads 2 --d-ff 64 --d-model 32 \
  --max-tokens 256 --threads 1 --steps 2 --out shards-extlink
refused "train on shards with an external link" nonzero \
  "sh-extlink/train-00000.h5: /labels/ids is an external link"
# Shards whose /tokenizer is stored in the file beside them: a run on them
# would copy those bytes into every checkpoint.
cp -r tagged sh-tokenizer
python3 - <<'PY'
import h5py

with h5py.File("sh-tokenizer/train-00000.h5", "r+") as f:
    del f["tokenizer"]
    f.create_dataset("tokenizer", shape=(60000,), dtype="u1", external=[("secret.bin", 0, 60000)])
PY
try "$bin" train --model classify --data sh-tokenizer --layers 2 --heads 2 --d-ff 64 --d-model 32 \
  --max-tokens 256 --threads 1 --steps 2 --out shards-tokenizer
refused "train on shards whose tokenizer lies outside" nonzero \
  "sh-tokenizer/train-00000.h5: /tokenizer is stored in external files"
check "no checkpoint holds the outside file's bytes" \
  not_in SECRET-BYTES <(cat ./*/checkpoints/*.h5 2>/dev/null)
exit_on_failures
echo "faults_hostile_files: all checks passed"
