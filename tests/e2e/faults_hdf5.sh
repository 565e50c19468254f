#!/usr/bin/env bash
# Damaged HDF5 files never hang a reader, and every reader names the damage
# in one line. A finished run's metrics.h5 with 30 KB of pseudo-random bytes
# in its middle, the same in the metrics.h5 of a run killed while it wrote
# (HDF5 marks that one as still open for SWMR writing: it is read as an SWMR
# reader, whose checksum retries must be bounded), a metrics.h5 cut in half,
# and a checkpoint with 3 KB of such bytes over its metadata:
#   train --resume auto (1 rank and mpirun -np 2),
#   inspect, and eval, generate and classify of the checkpoint,
#   analysis/plot_run.py and to_tensorboard.py (python3, and Debian's
#   /usr/bin/python3 with its HDF5 1.10 where it has h5py),
#   the other Python tools (export_hf.py, label_baseline.py)
# each end (well within `timeout`) with one line naming the file, exit 2;
# the damaged bytes hit checksummed metadata or data chunks (the messages
# say which), where HDF5's own SWMR retries never end. A refused resume changes no file.
# inspect also refuses a directory and a text file with exit 2, and describes
# image and classify shards (images, their size and channels, labels).
source "$(dirname "$0")/common.sh"
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 out=$work/out.txt err=$work/err.txt
mpirun=("${MPIEXEC:-mpirun}" -q)

try_seconds=30  # the limit of `try` (common.sh)

# damage FILE OFFSET BYTES SEED: overwrites BYTES bytes at OFFSET with
# pseudo-random ones of a seeded generator (the same bytes on every run).
damage() {
  python3 - "$@" <<'PY'
import random
import sys

path, offset, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
with open(path, "r+b") as f:
    f.seek(offset)
    f.write(bytes(rng.getrandbits(8) for _ in range(count)))
PY
}

tiny=(--model lm --synthetic copy --layers 1 --d-model 32 --heads 2 --d-ff 64 --max-len 32
  --max-tokens 256 --log-every 5 --eval-every 20 --eval-batches 2 --threads 1)
"$bin" train "${tiny[@]}" --steps 60 --out run >run.log
# Killed in the checkpoint of its last step: metrics.h5 stays marked as open.
rc=0
{ MPIFORMER_TEST_KILL_IN_CHECKPOINT=60 "$bin" train "${tiny[@]}" --steps 60 --out killed \
  >killed.log 2>&1; } 2>/dev/null || rc=$?
[[ $rc -ne 0 ]] || fail "the run to kill was not killed"
check "a killed writer's metrics.h5 is marked as open for writing" python3 - killed/metrics.h5 <<'PY'
import sys

import h5py

try:
    h5py.File(sys.argv[1], "r").close()
except OSError as e:
    sys.exit(0 if "already open for write" in str(e) else f"unexpected: {e}")
sys.exit("opened as a plain reader")
PY

# 30 KB over the middle of metrics.h5 (about 100 KB: the columns' chunk
# indexes), 3 KB from 1 KB into the checkpoint (its root attributes and the
# first tensors' object headers). Each damaged directory holds run's
# checkpoints and config.ini, so that the damage alone stands in the way.
for name in run killed; do
  mkdir -p "$name-damaged/checkpoints"
  cp "$name/metrics.h5" run/config.ini "$name-damaged/"
  cp run/checkpoints/* "$name-damaged/checkpoints/"
  damage "$name-damaged/metrics.h5" 36000 30000 1
done
mkdir -p cut && cp run/metrics.h5 run/config.ini cut/ && cp -r run/checkpoints cut/
truncate -s $(($(stat -c %s cut/metrics.h5) / 2)) cut/metrics.h5
cp run/checkpoints/step_00000060.h5 damaged-ckpt.h5
damage damaged-ckpt.h5 1024 3072 2

# ---- train --resume auto on a damaged metrics.h5: one line, exit 2, nothing changed
for name in run-damaged killed-damaged; do
  for ranks in 1 2; do
    before=$(cksum "$name/metrics.h5" "$name/checkpoints"/*)
    if [[ $ranks -eq 1 ]]; then
      try "$bin" train "${tiny[@]}" --steps 80 --out "$name" --resume auto
    else
      try "${mpirun[@]}" -np 2 "$bin" train "${tiny[@]}" --steps 80 --out "$name" --resume auto
    fi
    refused "train --resume auto, $ranks rank(s), $name/metrics.h5" 2 \
      "mpiformer train: --out: $name/metrics.h5: truncated or corrupt" "checksum"
    [[ $(cksum "$name/metrics.h5" "$name/checkpoints"/*) == "$before" ]] ||
      fail "a refused resume changed $name's files"
  done
done

# ---- inspect
for file in run-damaged/metrics.h5 killed-damaged/metrics.h5 damaged-ckpt.h5; do
  try "$bin" inspect "$file"
  refused "inspect $file" 2 "mpiformer inspect: $file: truncated or corrupt" "checksum"
done
try "$bin" inspect cut/metrics.h5
refused "inspect cut/metrics.h5" 2 "cut/metrics.h5: truncated or corrupt (the file holds"
try "$bin" inspect run
refused "inspect a directory" 2 "mpiformer inspect: run: is a directory"
try "$bin" inspect run/config.ini
refused "inspect a text file" 2 "mpiformer inspect: run/config.ini: not an HDF5 file"

# ---- the commands that score or decode with a --checkpoint: the file is
# what the user gave (exit 2), as a missing one is
try "$bin" eval --checkpoint damaged-ckpt.h5 --data run --threads 1
refused "eval of a damaged checkpoint" 2 "mpiformer eval: --checkpoint: damaged-ckpt.h5: truncated or corrupt"
try "${mpirun[@]}" -np 2 "$bin" eval --checkpoint damaged-ckpt.h5 --data run --threads 1
refused "eval -np 2 of a damaged checkpoint" 2 "mpiformer eval: --checkpoint: damaged-ckpt.h5: truncated or corrupt"
try "$bin" generate --checkpoint damaged-ckpt.h5 --prompt "3 4"
refused "generate of a damaged checkpoint" 2 "mpiformer generate: --checkpoint: damaged-ckpt.h5: truncated or corrupt"
echo "a line" >line.txt
try "$bin" classify --checkpoint damaged-ckpt.h5 --input line.txt
refused "classify of a damaged checkpoint" 2 "mpiformer classify: --checkpoint: damaged-ckpt.h5: truncated or corrupt"
try "$bin" train "${tiny[@]}" --steps 80 --out fromdamaged --resume damaged-ckpt.h5
refused "train --resume of a damaged checkpoint" 2 \
  "mpiformer train: --resume: cannot resume: damaged-ckpt.h5: truncated or corrupt"
check "a refused --resume leaves no new --out" test ! -e fromdamaged

# ---- plot_run.py, to_tensorboard.py and the other Python tools, on each Python that has h5py
pythons=(python3)
if [[ -x /usr/bin/python3 && $(command -v python3) != /usr/bin/python3 ]] &&
  /usr/bin/python3 -c "import h5py, matplotlib" 2>/dev/null; then
  pythons+=(/usr/bin/python3)
else
  echo "note: no second Python with h5py (Debian's python3-h5py): checked on python3 alone"
fi
tools=$src/analysis
# For label_baseline.py: lm shards, and classify shards (one damaged).
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 >gpl.txt
"$bin" prepare --kind lm --input gpl.txt --out lm --shards 1 --vocab-size 300 \
  --valid-lines 50 >prepare-lm.log
awk '{ n = NR % 3; print (n == 0 ? "law" : n == 1 ? "code user:0.5" : "user") }' gpl.txt >gpl.labels
"$bin" prepare --kind classify --input gpl.txt --labels gpl.labels --out tagged --shards 1 \
  --vocab-size 300 --valid-lines 50 --test-lines 50 >prepare-tagged.log
cp -r tagged tagged-damaged
damage tagged-damaged/train-00000.h5 1024 3072 3
for py in "${pythons[@]}"; do
  for file in cut/metrics.h5 run-damaged/metrics.h5 killed-damaged/metrics.h5; do
    words="truncated or corrupt"
    [[ $file == cut/* ]] || words="metadata checksum"
    try "$py" "$tools/plot_run.py" "$file" -o plot.png
    refused "$py plot_run.py $file" 2 "plot_run.py: $file: truncated or corrupt" "$words"
    [[ ! -e plot.png ]] || fail "$py plot_run.py $file wrote plot.png"
    if "$py" -c "import tensorboard" 2>/dev/null; then
      try "$py" "$tools/to_tensorboard.py" "$file"
      refused "$py to_tensorboard.py $file" 2 "to_tensorboard.py: $file: truncated or corrupt" \
        "$words"
    fi
  done
  # The file marked as being written is tried again for a while, and says so.
  try "$py" "$tools/plot_run.py" killed-damaged -o plot.png
  refused "$py plot_run.py on a file being written" 2 "gave up after" "being written"
  # ...and intact, it reads as it is (an SWMR reader beside a writer that died).
  try "$py" "$tools/plot_run.py" killed -o plot.png
  check "$py plot_run.py reads a killed writer's metrics.h5 (exit $rc: $(head -c 300 "$err"))" \
    test "$rc" -eq 0
  rm -f plot.png

  try "$py" "$tools/export_hf.py" damaged-ckpt.h5 hf
  refused "$py export_hf.py of a damaged checkpoint" 2 \
    "export_hf.py: damaged-ckpt.h5: truncated or corrupt" "checksum"
  check "$py export_hf.py: nothing written for a damaged checkpoint" test ! -e hf
  try "$py" "$tools/label_baseline.py" lm
  refused "$py label_baseline.py on lm shards" 2 "lm/train-00000.h5: a shard of kind lm" \
    "classify or image"
  try "$py" "$tools/label_baseline.py" tagged-damaged
  refused "$py label_baseline.py on a damaged shard" 2 \
    "label_baseline.py: tagged-damaged/train-00000.h5: truncated or corrupt"
  try "$py" "$tools/label_baseline.py" tagged --k 1
  check "$py label_baseline.py on classify shards (exit $rc: $(head -c 300 "$err"))" \
    test "$rc" -eq 0
  try "$py" "$tools/label_baseline.py" run/config.ini
  refused "$py label_baseline.py on a file" 2 "run/config.ini: not a directory"
done

# ---- inspect describes image and classify shards
python3 - <<'PY'
import numpy as np

rng = np.random.RandomState(0)
np.savez("pictures.npz", images=rng.randint(0, 256, (60, 4, 6, 3)).astype(np.uint8),
         labels=rng.randint(0, 3, 60), label_names=np.array(["cat", "dog", "bird"]))
PY
"$bin" prepare --kind image --input pictures.npz --out pictures --shards 1 --valid-lines 6 \
  --test-lines 6 >prepare-pictures.log
try "$bin" inspect pictures/train-00000.h5
check "inspect of an image shard (exit $rc: $(head -c 300 "$err"))" test "$rc" -eq 0
for needle in "kind         image" "images       48, 4 x 6 pixels, 3 channels" \
  "labels       3 names; 48 labels on 48 examples" "dog " "cat " "bird "; do
  grep -qF -- "$needle" "$out" || fail "inspect of an image shard does not say '$needle'"
done
! grep -qE "sequences|length|nan|18446744073709551615" "$out" ||
  fail "inspect of an image shard speaks of token sequences"
try "$bin" inspect tagged/train-00000.h5
check "inspect of a classify shard (exit $rc: $(head -c 300 "$err"))" test "$rc" -eq 0
for needle in "kind         classify" "sequences    " "length       min" "labels       3 names;" \
  "soft (weight < 1)"; do
  grep -qF -- "$needle" "$out" || fail "inspect of a classify shard does not say '$needle'"
done

exit_on_failures
echo "faults_hdf5: all checks passed"
